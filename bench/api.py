"""HTTP API latency at 10,000 and 100,000 pod-device rows, and the API's memory per row.

The view is filled with what the joiner publishes in steady state: one template node is run through
the pure core for `history_min` minutes of 1 s ticks (so every row carries its per-minute windows), its
last PodAttribution and GpuState records are encoded, and each simulated node gets a decoded copy with
its own pod UIDs, names and GPU UUIDs (decoding gives every node its own objects, as the consumer does).
A real uvicorn server (services.api.server.ApiServer, no consumer) serves the view from a child
process; this process sends requests one at a time over keep-alive HTTP and times each, body included.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing as mp
import os
import random
import socket
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

import httpx

from bench.common import Figure, Goal, median, percentile, proc_rss_bytes, rounded
from bench.workload import NodeShape, cluster_events, gpu_uuid, node_name, pod_name, pod_uid
from periscope.bus import codec, topics
from periscope.core import engine
from periscope.core.model import GpuState, Owner, PodAttribution

GOAL = Goal("<", 50.0, "< 50 ms at 100,000 rows")
QUERIES = ("/v1/pods?node=", "/v1/gpus?node=", "/v1/gpus?limit=100")


def template(history_min: int, shape: NodeShape) -> tuple[list[bytes], list[bytes]]:
    """Encoded last PodAttribution per pod and GpuState per GPU of node 0 after `history_min` minutes."""
    st = engine.new_state(node_name(0))
    last: dict[str, Any] = {}
    for _, ev in cluster_events(1, max(2, history_min * 60), shape):
        for o in engine.step(st, ev)[1]:
            last[engine.output_key(o)] = o
    pods = [codec.encode(o) for o in last.values() if isinstance(o, PodAttribution)]
    gpus = [codec.encode(o) for o in last.values() if isinstance(o, GpuState)]
    return pods, gpus


def _index_of_gpu(uuid: str, shape: NodeShape) -> int:
    return next(g for g in range(shape.gpus) if gpu_uuid(0, g) == uuid)


def node_outputs(i: int, pods: list[bytes], gpus: list[bytes], shape: NodeShape) -> list[Any]:
    """Node i's copy of the template outputs: fresh objects, own identities."""
    out: list[Any] = []
    node = node_name(i)
    for data in pods:
        pa: PodAttribution = codec.decode(topics.ATTRIBUTION, data)
        p = next(p for p in range(shape.gpus) if pod_uid(0, p) == pa.pod_uid)
        rows = tuple(replace(r, device_id=gpu_uuid(i, g), gpu_uuid=gpu_uuid(i, g))
                     for r in pa.rows for g in (_index_of_gpu(r.gpu_uuid, shape),))
        out.append(replace(pa, pod_uid=pod_uid(i, p), pod=pod_name(i, p), node=node, rows=rows))
    for data in gpus:
        gs: GpuState = codec.decode(topics.GPUS, data)
        g = _index_of_gpu(gs.gpu_uuid, shape)
        owners = tuple(Owner(pod_uid(i, g), o.namespace, pod_name(i, g), o.container, gpu_uuid(i, g))
                       for o in gs.owners)
        out.append(replace(gs, node=node, gpu_uuid=gpu_uuid(i, g), owners=owners))
    return out


def _nodelay_socket(host: str) -> socket.socket:
    """A listening socket created with proto=IPPROTO_TCP: asyncio then sets TCP_NODELAY on each accepted
    connection (it checks the proto), so a response's header and body writes are not held by Nagle."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def _serve(rows: int, history_min: int, conn: Connection) -> None:
    """Child process: build the view, report memory, serve until told to stop."""
    import logging

    from services.api.server import ApiServer

    class _NoDelayServer(ApiServer):
        def bind(self) -> socket.socket:
            if self._sock is None:
                self._sock = _nodelay_socket(self.settings.api_host)
            return self._sock
    from services.api.settings import ApiSettings
    from services.api.view import View

    logging.disable(logging.WARNING)
    shape = NodeShape()
    pods, gpus = template(history_min, shape)
    gc.collect()
    rss0 = proc_rss_bytes(os.getpid())
    view = View()
    t = time.perf_counter()
    for i in range(rows // shape.gpus):
        for o in node_outputs(i, pods, gpus, shape):
            view.apply(o)
    build_s = time.perf_counter() - t
    gc.collect()
    rss1 = proc_rss_bytes(os.getpid())
    for k in view.row_keys():
        view.row_json(k)  # what a full /v1/pods listing leaves cached
    gc.collect()
    rss2 = proc_rss_bytes(os.getpid())

    async def main() -> None:
        settings = ApiSettings(api_host="127.0.0.1", api_port=0, log_level="WARNING")
        shipped = ApiServer(settings, view, consume=False)
        nodelay = _NoDelayServer(settings, view, consume=False)
        urls = {"shipped": await shipped.start(), "nodelay": await nodelay.start()}
        conn.send({"urls": urls, "rows": view.row_count(), "gpus": len(view.gpus), "build_s": build_s,
                   "rss_before": rss0, "rss_view": rss1, "rss_rendered": rss2})
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        await shipped.stop()
        await nodelay.stop()

    asyncio.run(main())


def _time_queries(client: httpx.Client, paths: list[str]) -> list[float]:
    out = []
    for p in paths:
        t = time.perf_counter()
        r = client.get(p)
        r.read()
        out.append((time.perf_counter() - t) * 1000)
        if r.status_code != 200:
            raise RuntimeError(f"GET {p}: HTTP {r.status_code}: {r.text[:200]}")
    return out


def _latencies(url: str, nodes: int, requests: int, rounds: int, full_lists: int, seed: int
               ) -> dict[str, Any]:
    rng = random.Random(seed)
    out: dict[str, Any] = {}
    with httpx.Client(base_url=url, timeout=120) as client:
        _time_queries(client, ["/healthz"] * 20 + [f"/v1/pods?node={node_name(0)}"] * 5)
        for q in QUERIES:
            p50s, p99s = [], []
            for _ in range(rounds):
                if q.endswith("="):
                    paths = [q + node_name(rng.randrange(nodes)) for _ in range(requests)]
                else:
                    paths = [q] * requests
                lat = _time_queries(client, paths)
                p50s.append(percentile(lat, 50))
                p99s.append(percentile(lat, 99))
            out[q] = {"p50_ms": median(p50s), "p99_ms": median(p99s),
                      "rounds_p99_ms": [rounded(x) for x in p99s]}
        for q in ("/v1/gpus", "/v1/pods"):
            lat = _time_queries(client, [q] * full_lists)
            out[q + " (all, unpaged)"] = {"p50_ms": median(lat), "max_ms": max(lat)}
    return out


def measure(rows: int, history_min: int, requests: int, rounds: int, full_lists: int) -> dict[str, Any]:
    """Latencies (ms) per query at one view size, for the server as shipped and with TCP_NODELAY,
    and the serving process's memory."""
    ctx = mp.get_context("spawn")  # a clean interpreter: memory and GC are the server's own
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(rows, history_min, child), daemon=True)
    proc.start()
    try:
        if not parent.poll(600):
            raise RuntimeError("API server did not start")
        info = parent.recv()
        nodes = rows // NodeShape().gpus
        result: dict[str, Any] = {"rows": info["rows"], "gpus": info["gpus"], "build_s": info["build_s"]}
        for variant, url in info["urls"].items():
            result[variant] = _latencies(url, nodes, requests, rounds, full_lists, rows)
        result["bytes_per_row_view"] = (info["rss_view"] - info["rss_before"]) / info["rows"]
        result["bytes_per_row_rendered"] = (info["rss_rendered"] - info["rss_before"]) / info["rows"]
        parent.send("stop")
        proc.join(30)
        return result
    finally:
        if proc.is_alive():
            proc.terminate()
            proc.join(10)


def run(sizes: tuple[int, ...], history_min: int, requests: int, rounds: int, full_lists: int
        ) -> tuple[list[Figure], dict[str, Any]]:
    by_size = {n: measure(n, history_min, requests, rounds, full_lists) for n in sizes}
    top = max(sizes)
    big = by_size[top]
    heads = ("/v1/pods?node=", "/v1/gpus?node=")
    p50 = max(big["shipped"][q]["p50_ms"] for q in heads)
    p99 = max(big["shipped"][q]["p99_ms"] for q in heads)
    p99_nodelay = max(big["nodelay"][q]["p99_ms"] for q in heads)
    setup: dict[str, Any] = {
        "rows": top,
        "queries": "GET /v1/pods?node=N and GET /v1/gpus?node=N, N a random node of 8 GPUs / 8 rows; "
                   "the figure is the slower of the two",
        "requests": f"{requests} per query per round, one at a time, keep-alive, httpx client in "
                    f"another process on the same machine; median of {rounds} rounds",
        "view": f"{top // 8} nodes x 8 GPUs, one pod per GPU; rows carry {history_min} min of 1-min windows",
        "server": "services.api.server.ApiServer (uvicorn, 1 worker), static view (no consumer writing)",
    }
    brief = (f"{top:,} rows ({top // 8:,} nodes x 8 GPUs); /v1/pods?node= and /v1/gpus?node=, slower of "
             "the two; "
             f"{requests} requests x {rounds} rounds over keep-alive HTTP; uvicorn in its own process")
    limit = "per-request FastAPI/uvicorn/httpx overhead (~1 ms); rows rendered on first read, then cached"
    if p99 - p99_nodelay > 20:
        limit = (
            "TCP Nagle + delayed ACK: the API's listening socket is no longer created with IPPROTO_TCP, so "
            "asyncio does not set TCP_NODELAY on accepted connections; uvicorn writes headers and body "
            "separately and the "
            f"body waits ~40 ms for the client's ACK. Same server with TCP_NODELAY: p99 {p99_nodelay:.1f} ms"
        )
    figures = [
        Figure("api_p50_ms", p50, "ms", setup, limit, None, [p50], brief),
        Figure("api_p99_ms", p99, "ms", setup, limit, GOAL, [p99], brief),
        Figure("api_p99_ms_nodelay", p99_nodelay, "ms",
               {**setup, "server": setup["server"] + "; listening socket created with IPPROTO_TCP so "
                                                     "accepted connections get TCP_NODELAY"},
               "per-request FastAPI/uvicorn/httpx overhead", GOAL, [p99_nodelay],
               brief + "; the same server with TCP_NODELAY on accepted connections"),
        Figure("api_bytes_per_row", big["bytes_per_row_rendered"], "bytes/row",
               {"rows": top, "what": "RSS growth of the API process from an empty view to the filled view "
                                     "with every row rendered once (the JSON cache of a full listing)",
                "rows_windows": f"{history_min} one-minute windows per row",
                "view_only_bytes_per_row": rounded(big["bytes_per_row_view"])},
               "each row keeps its PodAttribution with every window, plus the cached JSON row", None,
               [big["bytes_per_row_rendered"]],
               f"API process RSS growth / rows at {top:,} rows, {history_min} windows per row, each row "
               "rendered once"),
    ]
    for n, r in by_size.items():
        if n == top:
            continue
        at = {**setup, "rows": n, "view": setup["view"].replace(f"{top // 8} nodes", f"{n // 8} nodes")}
        b = brief.replace(f"{top:,} rows ({top // 8:,} nodes", f"{n:,} rows ({n // 8:,} nodes")
        for q in ("p50", "p99"):
            v = max(r["shipped"][h][f"{q}_ms"] for h in heads)
            figures.append(Figure(f"api_{q}_ms_at_{n // 1000}k_rows", v, "ms", at, limit, None, [v], b))
    return figures, {str(n): r for n, r in by_size.items()}
