"""The API under load with access control on: 50 concurrent clients, each sending one request after
another for a while, spread over every endpoint, /v1/owners (a replay of the broker per query)
included. Recorded: p50/p99 per endpoint and overall, the share of 429s (overall and on /v1/owners),
5xx answers, and the slowest request (no request may wait unboundedly: /v1/owners gives up after its
timeout, and everything else is answered from the view).

One child process serves bench.api's static view (pods in 20 namespaces, as bench.api_auth) with
PERISCOPE_API_AUTH=kubernetes against the simulated apiserver over HTTP, and the shipped limits of
/v1/owners, which replays a small synthetic history published to the benchmarks' broker. The clients
run in this process: half a cluster-wide user, half a user of two namespaces (who gets 403 on the
cluster-scoped /v1/policy and /metrics, as documented). A handful of `at` instants repeat, as
dashboards and scripts repeat them, so the owners cache and the shared replays are part of the picture.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import random
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

from bench.api import feed, template
from bench.api_auth import NAMESPACES, TENANT_NAMESPACES, _renamespaced
from bench.common import Figure, Goal, percentile, rounded
from bench.workload import NodeShape, node_name

CLIENTS = 50
GOAL = Goal("<", 1000.0, "p99 under 1 s for 50 clients on every endpoint, auth on")
TOKENS = ("ops-token", "alice-token")  # cluster-wide, two namespaces


def _serve(rows: int, history_min: int, settings: dict[str, str], conn: Connection) -> None:
    import logging

    from periscope.sim.apiserver import FakeApiServer
    from periscope.sim.scenario import UserSpec
    from services.api.server import ApiServer
    from services.api.settings import ApiSettings
    from services.api.view import View

    logging.disable(logging.WARNING)
    shape = NodeShape()
    view = View()
    feed(view, range(rows // shape.gpus), template(history_min, shape), shape, _renamespaced)
    users = (UserSpec(name="alice", token="alice-token", namespaces=TENANT_NAMESPACES),
             UserSpec(name="ops", token="ops-token", cluster=True))

    async def main() -> None:
        with FakeApiServer(users=users) as apiserver, tempfile.TemporaryDirectory() as tmp:
            kubeconfig = apiserver.write_kubeconfig(Path(tmp) / "kubeconfig")
            server = ApiServer(ApiSettings(api_host="127.0.0.1", api_port=0, log_level="WARNING",
                                           api_auth="kubernetes", kubeconfig=str(kubeconfig), **settings),
                               view, consume=False)
            conn.send({"url": await server.start(), "rows": view.row_count(),
                       "pods": sorted(view.pods)[:50], "gpus": sorted(view.gpus)[:50],
                       "owners": server.owner_queries.limits})
            await asyncio.get_running_loop().run_in_executor(None, conn.recv)
            await server.stop()

    asyncio.run(main())


def _paths(info: dict[str, Any], nodes: list[str], instants: list[str], rng: random.Random) -> list[str]:
    node, ns = rng.choice(nodes), f"team-{rng.randrange(NAMESPACES):02d}"
    # Listings a page at a time, as the web view, `periscope top` and scripts read them.
    return [
        "/v1/pods?limit=100", f"/v1/pods?node={node}", f"/v1/pods?namespace={ns}&limit=100",
        f"/v1/pods/{rng.choice(info['pods'])}", "/v1/gpus?limit=100", f"/v1/gpus/{rng.choice(info['gpus'])}",
        "/v1/idle?limit=100", "/v1/idle?window=10m&threshold_pct=5&limit=100", "/v1/xid?since=1h&limit=100",
        "/v1/findings?limit=100", "/v1/policy", "/metrics", f"/v1/owners?at={rng.choice(instants)}",
        "/healthz", "/readyz",
    ]


def _endpoint(path: str) -> str:
    base = path.split("?", 1)[0]
    for prefix in ("/v1/pods/", "/v1/gpus/"):
        if base.startswith(prefix):
            return prefix + "{id}"
    return base


async def _load(url: str, info: dict[str, Any], nodes: list[str], instants: list[str],
                seconds: float) -> list[tuple[str, int, float]]:
    out: list[tuple[str, int, float]] = []
    stop_at = time.perf_counter() + seconds

    async def client(i: int) -> None:
        rng = random.Random(i)
        headers = {"Authorization": f"Bearer {TOKENS[i % 2]}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as c:
            while time.perf_counter() < stop_at:
                path = rng.choice(_paths(info, nodes, instants, rng))
                t = time.perf_counter()
                r = await c.get(path)
                await r.aread()
                out.append((_endpoint(path), r.status_code, (time.perf_counter() - t) * 1000))

    await asyncio.gather(*(client(i) for i in range(CLIENTS)))
    return out


def measure(rows: int, history_min: int, bootstrap: str, instants: list[str], seconds: float,
            settings: dict[str, str]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    # Not daemonic: the API replays /v1/owners in worker processes of its own.
    proc = ctx.Process(target=_serve, args=(rows, history_min, settings, child))
    proc.start()
    try:
        if not parent.poll(600):
            raise RuntimeError("API server did not start")
        info = parent.recv()
        nodes = [node_name(i) for i in range(rows // NodeShape().gpus)]
        with httpx.Client(base_url=info["url"], timeout=60,
                          headers={"Authorization": f"Bearer {TOKENS[1]}"}) as warm:
            warm.get("/v1/pods").raise_for_status()  # the namespaced user's reviews, once
        started = time.perf_counter()
        samples = asyncio.run(_load(info["url"], info, nodes, instants, seconds))
        wall = time.perf_counter() - started
        parent.send("stop")
        proc.join(30)
    finally:
        if proc.is_alive():
            proc.terminate()
            proc.join(10)
    lat = [ms for _, _, ms in samples]
    codes = Counter(code for _, code, _ in samples)
    per: dict[str, dict[str, Any]] = {}
    for ep in sorted({e for e, _, _ in samples}):
        mine = [(code, ms) for e, code, ms in samples if e == ep]
        ms_ = [ms for _, ms in mine]
        per[ep] = {"requests": len(mine), "p50_ms": percentile(ms_, 50), "p99_ms": percentile(ms_, 99),
                   "max_ms": max(ms_), "codes": dict(Counter(code for code, _ in mine))}
    owners = per.get("/v1/owners", {"requests": 0, "codes": {}})
    return {
        "rows": info["rows"], "requests": len(samples), "seconds": wall, "rate_per_s": len(samples) / wall,
        "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99), "max_ms": max(lat),
        "codes": dict(codes), "share_429": codes[429] / len(samples),
        "owners_share_429": owners["codes"].get(429, 0) / max(1, owners["requests"]),
        "server_errors": sum(n for c, n in codes.items() if c >= 500),
        "owners_limits": asdict(info["owners"]),
        "by_endpoint": per,
    }


def run(rows: int, history_min: int, bootstrap: str, spec_start_ms: int, spec_ms: int,
        seconds: float) -> tuple[list[Figure], dict[str, Any]]:
    from periscope.wirejson import rfc3339

    instants = [rfc3339(spec_start_ms + spec_ms * k // 6) for k in range(1, 6)]
    from bench.common import PROFILE

    settings = {"kafka_bootstrap": bootstrap, "kafka_profile": PROFILE.name}
    r = measure(rows, history_min, bootstrap, instants, seconds, settings)
    setup = {
        "rows": r["rows"], "clients": CLIENTS, "seconds": rounded(r["seconds"]),
        "endpoints": "every /v1 endpoint, /metrics, /healthz, /readyz, /v1/owners (5 instants, repeated)",
        "auth": "PERISCOPE_API_AUTH=kubernetes against the simulated apiserver over HTTP; half the "
                f"clients cluster-wide, half a user of {len(TENANT_NAMESPACES)} of {NAMESPACES} namespaces",
        "owners_limits": r["owners_limits"],
        "codes": r["codes"],
    }
    brief = f"{CLIENTS} clients, every endpoint incl. /v1/owners, auth on, {r['rows']:,} rows"
    limit = ("one event loop serves everything; /v1/owners replays the broker (2 at once, 8 waiting, "
             "429 beyond)")
    figures = [
        Figure("api_load_p99_ms", r["p99_ms"], "ms", setup, limit, GOAL, [r["p99_ms"]], brief),
        Figure("api_load_share_429", r["share_429"], "ratio", setup, "/v1/owners' queue bound", None,
               [r["share_429"]], brief),
        Figure("api_load_owners_share_429", r["owners_share_429"], "ratio", setup,
               "/v1/owners' queue bound", None, [r["owners_share_429"]], brief),
        Figure("api_load_max_ms", r["max_ms"], "ms", setup, "/v1/owners' timeout", None, [r["max_ms"]],
               brief),
        Figure("api_load_requests_per_s", r["rate_per_s"], "req/s", setup, limit, None, [r["rate_per_s"]],
               brief),
    ]
    print(f"api_load: {r['requests']:,} requests from {CLIENTS} clients in {r['seconds']:.1f}s: p50 "
          f"{r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.0f} ms; 429s "
          f"{100 * r['share_429']:.1f}% (/v1/owners {100 * r['owners_share_429']:.1f}%); "
          f"5xx {r['server_errors']}")
    return figures, r
