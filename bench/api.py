"""HTTP API latency at 10,000 and 100,000 pod-device rows, and the API's memory per row.

The view is filled with what the joiner publishes: one template node is run through the pure core for
`history_min` minutes of 1 s ticks. The joiner sends each tumbling window once, when it closes, and
republishes a pod on change or heartbeat, so every node gets, minute by minute, a copy of each of its
pods' records that delivered a newly closed window (carrying that window only), and at the end its pods'
last records without windows (a heartbeat) and its GPUs' last GpuStates. The view must therefore merge
and keep an hour of windows per row itself, as a live API does. Each node's copies have their own pod
UIDs, names and GPU UUIDs; the last records are decoded per node (decoding gives every node its own
objects, as the consumer does). A real uvicorn server (services.api.server.ApiServer, no consumer)
serves the view from a child process; this process sends requests one at a time over keep-alive HTTP
and times each, body included.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing as mp
import os
import random
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

import httpx

from bench.common import API_ROW_GOAL, Figure, Goal, median, percentile, proc_rss_bytes, rounded
from bench.workload import NodeShape, cluster_events, gpu_uuid, node_name, pod_name, pod_uid
from periscope.bus import codec, topics
from periscope.core import engine
from periscope.core.model import GpuState, Owner, PodAttribution
from periscope.core.rows import RowConfig

GOAL = Goal("<", 10.0, "< 10 ms at 100,000 rows")
QUERIES = ("/v1/pods?node=", "/v1/gpus?node=", "/v1/gpus?limit=100")


@dataclass(frozen=True)
class Template:
    """Node 0's outputs over the history, reduced to what the API's memory depends on."""

    closes: list[list[PodAttribution]]  # per minute, the records that delivered newly closed windows
    pods: list[bytes]  # each pod's last PodAttribution without windows (a heartbeat), encoded
    gpus: list[bytes]  # each GPU's last GpuState, encoded


def template(history_min: int, shape: NodeShape) -> Template:
    """Run node 0 through the core for `history_min` minutes. A window counts as closed once the
    record's time is past its end (the open window is never delivered); each is delivered once."""
    window_ms = RowConfig().window_ms
    st = engine.new_state(node_name(0))
    last: dict[str, Any] = {}
    sent: set[tuple[str, str, str, int]] = set()
    closes: dict[int, list[PodAttribution]] = {}
    for _, ev in cluster_events(1, max(2, history_min * 60), shape):
        for o in engine.apply(st, ev):
            last[engine.output_key(o)] = o
            if not isinstance(o, PodAttribution):
                continue
            rows, fresh = [], False
            for r in o.rows:
                new = tuple(w for w in r.windows if w.start_ms + window_ms <= o.as_of_ms
                            and (o.pod_uid, r.container, r.device_id, w.start_ms) not in sent)
                sent.update((o.pod_uid, r.container, r.device_id, w.start_ms) for w in new)
                fresh = fresh or bool(new)
                rows.append(replace(r, windows=new))
            if fresh:
                closes.setdefault(o.as_of_ms, []).append(replace(o, rows=tuple(rows)))
    pods = [codec.encode(replace(o, rows=tuple(replace(r, windows=()) for r in o.rows)))
            for o in last.values() if isinstance(o, PodAttribution)]
    gpus = [codec.encode(o) for o in last.values() if isinstance(o, GpuState)]
    return Template([closes[t] for t in sorted(closes)], pods, gpus)


def _index_of_gpu(uuid: str, shape: NodeShape) -> int:
    return next(g for g in range(shape.gpus) if gpu_uuid(0, g) == uuid)


def _as_node(i: int, pa: PodAttribution, shape: NodeShape) -> PodAttribution:
    p = _TEMPLATE_PODS.get(pa.pod_uid)
    if p is None:
        p = _TEMPLATE_PODS[pa.pod_uid] = next(p for p in range(shape.gpus) if pod_uid(0, p) == pa.pod_uid)
    rows = []
    for r in pa.rows:
        g = _TEMPLATE_GPUS.get(r.gpu_uuid)
        if g is None:
            g = _TEMPLATE_GPUS[r.gpu_uuid] = _index_of_gpu(r.gpu_uuid, shape)
        uuid = gpu_uuid(i, g)
        rows.append(replace(r, device_id=uuid, gpu_uuid=uuid))
    return replace(pa, pod_uid=pod_uid(i, p), pod=pod_name(i, p), node=node_name(i), rows=tuple(rows))


_TEMPLATE_PODS: dict[str, int] = {}  # node 0's pod UID -> pod index
_TEMPLATE_GPUS: dict[str, int] = {}  # node 0's GPU UUID -> GPU index


def node_outputs(i: int, pods: list[bytes], gpus: list[bytes], shape: NodeShape) -> list[Any]:
    """Node i's copy of the template's last outputs: fresh objects, own identities."""
    out: list[Any] = []
    node = node_name(i)
    for data in pods:
        out.append(_as_node(i, codec.decode(topics.ATTRIBUTION, data), shape))
    for data in gpus:
        gs: GpuState = codec.decode(topics.GPUS, data)
        g = _index_of_gpu(gs.gpu_uuid, shape)
        owners = tuple(Owner(pod_uid(i, g), o.namespace, pod_name(i, g), o.container, gpu_uuid(i, g))
                       for o in gs.owners)
        out.append(replace(gs, node=node, gpu_uuid=gpu_uuid(i, g), owners=owners))
    return out


Adjust = Callable[[int, list[Any]], list[Any]]


def feed(view: Any, nodes: Iterable[int], t: Template, shape: NodeShape,
         adjust: Adjust = lambda _, objs: objs) -> None:
    """Apply to `view` what the joiner publishes for `nodes` over the template's history, in event-time
    order: each minute's window-closing records of every node, then every node's last records.
    Only the last records are decoded per node: the earlier ones are replaced by them, and their
    windows are kept by the view in its own form."""
    nodes = list(nodes)
    for batch in t.closes:
        for i in nodes:
            for o in adjust(i, [_as_node(i, pa, shape) for pa in batch]):
                view.apply(o)
    for i in nodes:
        for o in adjust(i, node_outputs(i, t.pods, t.gpus, shape)):
            view.apply(o)


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
    from periscope.settings.api import ApiSettings
    from services.api.view import View

    logging.disable(logging.WARNING)
    shape = NodeShape()
    tpl = template(history_min, shape)
    gc.collect()
    rss0 = proc_rss_bytes(os.getpid())
    view = View()
    t = time.perf_counter()
    feed(view, range(rows // shape.gpus), tpl, shape)
    build_s = time.perf_counter() - t
    gc.collect()
    rss1 = proc_rss_bytes(os.getpid())
    for k in view.row_keys():
        view.row_json(k)  # what a full /v1/pods listing leaves cached
    gc.collect()
    rss2 = proc_rss_bytes(os.getpid())
    windows = sum(len(view.windows(k)) for k in view.row_keys()) / max(1, view.row_count())

    async def main() -> None:
        settings = ApiSettings(api_host="127.0.0.1", api_port=0, log_level="WARNING")
        shipped = ApiServer(settings, view, consume=False)
        nodelay = _NoDelayServer(settings, view, consume=False)
        urls = {"shipped": await shipped.start(), "nodelay": await nodelay.start()}
        conn.send({"urls": urls, "rows": view.row_count(), "gpus": len(view.gpus), "build_s": build_s,
                   "rss_before": rss0, "rss_view": rss1, "rss_rendered": rss2, "windows_per_row": windows})
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
        # Filling 100,000 rows takes about a minute on a quiet machine; far longer on a shared, loaded one.
        if not parent.poll(1800):
            raise RuntimeError("API server did not start")
        info = parent.recv()
        nodes = rows // NodeShape().gpus
        result: dict[str, Any] = {"rows": info["rows"], "gpus": info["gpus"], "build_s": info["build_s"],
                                  "windows_per_row": info["windows_per_row"]}
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
        "view": f"{top // 8} nodes x 8 GPUs, one pod per GPU; fed as the joiner publishes: each 1-min window "
                f"once as it closes (one record per pod per minute for {history_min} min), then each pod's "
                "last record without windows and each GPU's last state; the view merges and keeps "
                f"{big['windows_per_row']:.0f} windows per row",
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
                "rows_windows": f"{big['windows_per_row']:.1f} one-minute windows per row, merged by the "
                                f"view from {history_min} min of records that each delivered one closed "
                                "window",
                "view_only_bytes_per_row": rounded(big["bytes_per_row_view"])},
               "each row keeps its pod's and GPU's latest state packed (one bytes object each, ~350 "
               "and ~300 bytes, unpacked on read), its windows packed (20-44 bytes each, exact) and "
               "deflated once 8 are held (the regular simulated telemetry shrinks to ~5 bytes a window; "
               "real telemetry deflates less), its keys and index entries, and its unique strings (pod "
               "UID, name, GPU UUID); rendered rows are cached for at most 4,096 rows", API_ROW_GOAL,
               [big["bytes_per_row_rendered"]],
               f"API process RSS growth / rows at {top:,} rows, {big['windows_per_row']:.0f} merged windows "
               "per row, each row rendered once"),
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
