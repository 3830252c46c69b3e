"""The API under load with access control on: 50 concurrent clients, each sending one request after
another for a while, spread over every endpoint, /v1/owners (a replay of the broker per query)
included (/metrics by one client scraping every 5 s, as Prometheus does: it renders the whole view).
Recorded: p50/p99 per endpoint and overall, the share of 429s (overall and on /v1/owners),
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

CLIENTS = 50  # one of them is a Prometheus scraping /metrics every SCRAPE_S
SCRAPE_S = 5.0
GOAL = Goal("<", 1000.0, "p99 under 1 s for 50 clients on every endpoint, auth on")
TOKENS = ("ops-token", "alice-token")  # cluster-wide, two namespaces


def _serve(rows: int, history_min: int, settings: dict[str, Any], conn: Connection) -> None:
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


def _paths(info: dict[str, Any], nodes: list[str], instants: list[str], rng: random.Random,
           owners: bool = True) -> list[str]:
    node, ns = rng.choice(nodes), f"team-{rng.randrange(NAMESPACES):02d}"
    # Listings a page at a time, as the web view, `periscope top` and scripts read them.
    return [
        "/v1/pods?limit=100", f"/v1/pods?node={node}", f"/v1/pods?namespace={ns}&limit=100",
        f"/v1/pods/{rng.choice(info['pods'])}", "/v1/gpus?limit=100", f"/v1/gpus/{rng.choice(info['gpus'])}",
        "/v1/idle?limit=100", "/v1/idle?window=10m&threshold_pct=5&limit=100", "/v1/xid?since=1h&limit=100",
        "/v1/findings?limit=100", "/v1/policy", "/healthz", "/readyz",
        *([f"/v1/owners?at={rng.choice(instants)}"] if owners else []),
    ]


def _endpoint(path: str) -> str:
    base = path.split("?", 1)[0]
    for prefix in ("/v1/pods/", "/v1/gpus/"):
        if base.startswith(prefix):
            return prefix + "{id}"
    return base


async def _load(url: str, info: dict[str, Any], nodes: list[str], instants: list[str],
                seconds: float, owners: bool) -> list[tuple[str, int, float]]:
    out: list[tuple[str, int, float]] = []
    stop_at = time.perf_counter() + seconds

    async def client(i: int) -> None:
        rng = random.Random(i)
        headers = {"Authorization": f"Bearer {TOKENS[i % 2]}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as c:
            while time.perf_counter() < stop_at:
                path = rng.choice(_paths(info, nodes, instants, rng, owners))
                t = time.perf_counter()
                r = await c.get(path)
                await r.aread()
                out.append((_endpoint(path), r.status_code, (time.perf_counter() - t) * 1000))

    async def prometheus() -> None:
        # /metrics renders the whole view (seconds at 100,000 rows): it is scraped, not polled in a loop.
        headers = {"Authorization": f"Bearer {TOKENS[0]}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as c:
            while time.perf_counter() < stop_at:
                t = time.perf_counter()
                r = await c.get("/metrics")
                await r.aread()
                out.append(("/metrics", r.status_code, (time.perf_counter() - t) * 1000))
                await asyncio.sleep(max(0.0, SCRAPE_S - (time.perf_counter() - t)))

    await asyncio.gather(prometheus(), *(client(i) for i in range(CLIENTS - 1)))
    return out


async def _burst(url: str, start_ms: int, span_ms: int) -> list[tuple[str, int, float]]:
    """Every client asks /v1/owners at once, each for another instant (no cache, no sharing)."""
    from periscope.wirejson import rfc3339

    async def one(i: int) -> tuple[str, int, float]:
        async with httpx.AsyncClient(base_url=url, timeout=120,
                                     headers={"Authorization": f"Bearer {TOKENS[i % 2]}"}) as c:
            t = time.perf_counter()
            at = rfc3339(start_ms + span_ms * (i + 1) // (CLIENTS + 1))
            r = await c.get("/v1/owners", params={"at": at})
            await r.aread()
            return "/v1/owners", r.status_code, (time.perf_counter() - t) * 1000

    return list(await asyncio.gather(*(one(i) for i in range(CLIENTS))))


def measure(rows: int, history_min: int, bootstrap: str, instants: list[str], seconds: float,
            settings: dict[str, Any], span: tuple[int, int]) -> dict[str, Any]:
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
        phases = {}
        for owners in (False, True):  # the view endpoints alone, then with replays among them
            started = time.perf_counter()
            samples = asyncio.run(_load(info["url"], info, nodes, instants, seconds, owners))
            phases["with_owners" if owners else "without_owners"] = _summary(
                samples, time.perf_counter() - started)
        started = time.perf_counter()
        burst = asyncio.run(_burst(info["url"], *span))
        phases["owners_burst"] = _summary(burst, time.perf_counter() - started)
        parent.send("stop")
        proc.join(30)
    finally:
        if proc.is_alive():
            proc.terminate()
            proc.join(10)
    return {"rows": info["rows"], "owners_limits": asdict(info["owners"]), **phases}


def _summary(samples: list[tuple[str, int, float]], wall: float) -> dict[str, Any]:
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
        "requests": len(samples), "seconds": wall, "rate_per_s": len(samples) / wall,
        "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99), "max_ms": max(lat),
        "codes": dict(codes), "share_429": codes[429] / len(samples),
        "owners_share_429": owners["codes"].get(429, 0) / max(1, owners["requests"]),
        "server_errors": sum(n for c, n in codes.items() if c >= 500),
        "by_endpoint": per,
    }


def run(rows: int, history_min: int, bootstrap: str, spec_start_ms: int, spec_ms: int,
        seconds: float) -> tuple[list[Figure], dict[str, Any]]:
    from periscope.wirejson import rfc3339

    instants = [rfc3339(spec_start_ms + spec_ms * k // 6) for k in range(1, 6)]
    from bench.common import PROFILE

    settings = {"kafka_bootstrap": bootstrap, "kafka_profile": PROFILE.name}
    r = measure(rows, history_min, bootstrap, instants, seconds, settings, (spec_start_ms, spec_ms))
    w, wo, b = r["with_owners"], r["without_owners"], r["owners_burst"]
    setup = {
        "rows": r["rows"], "clients": CLIENTS, "seconds_per_phase": rounded(w["seconds"]),
        "endpoints": "every /v1 endpoint (listings a page of 100 at a time), /healthz, /readyz; /metrics "
                     f"scraped by one client every {SCRAPE_S:g} s; second phase: /v1/owners too (5 instants, "
                     "repeated)",
        "auth": "PERISCOPE_API_AUTH=kubernetes against the simulated apiserver over HTTP; half the "
                f"clients cluster-wide, half a user of {len(TENANT_NAMESPACES)} of {NAMESPACES} namespaces",
        "owners_limits": r["owners_limits"],
        "codes": {"without_owners": wo["codes"], "with_owners": w["codes"], "owners_burst": b["codes"]},
    }
    brief = f"{CLIENTS} clients, every endpoint incl. /v1/owners, auth on, {r['rows']:,} rows"
    limit = ("one event loop serves everything; /v1/owners replays in worker processes (2 at once, 8 "
             "waiting, 429 beyond), which compete with it for the CPUs")
    figures = [
        Figure("api_load_p99_ms", w["p99_ms"], "ms", setup, limit, GOAL, [w["p99_ms"]], brief),
        Figure("api_load_without_owners_p99_ms", wo["p99_ms"], "ms", setup, "one event loop", GOAL,
               [wo["p99_ms"]], f"{CLIENTS} clients, every endpoint but /v1/owners, auth on"),
        Figure("api_load_share_429", w["share_429"], "ratio", setup, "/v1/owners' queue bound", None,
               [w["share_429"]], brief),
        Figure("api_load_owners_share_429", w["owners_share_429"], "ratio", setup,
               "/v1/owners' queue bound", None, [w["owners_share_429"]], brief),
        Figure("api_load_max_ms", max(w["max_ms"], wo["max_ms"]), "ms", setup, "/v1/owners' timeout", None,
               [max(w["max_ms"], wo["max_ms"])], brief),
        Figure("api_owners_burst_share_429", b["share_429"], "ratio", setup, "/v1/owners' queue bound", None,
               [b["share_429"]], f"{CLIENTS} /v1/owners queries at once, each for another instant"),
        Figure("api_owners_burst_max_ms", b["max_ms"], "ms", setup, "/v1/owners' timeout", None,
               [b["max_ms"]], f"{CLIENTS} /v1/owners queries at once, each for another instant"),
        Figure("api_load_requests_per_s", w["rate_per_s"], "req/s", setup, limit, None, [w["rate_per_s"]],
               brief),
    ]
    for name, x in (("without /v1/owners", wo), ("with /v1/owners", w), ("/v1/owners burst", b)):
        print(f"api_load {name}: {x['requests']:,} requests from {CLIENTS} clients in {x['seconds']:.1f}s: "
              f"p50 {x['p50_ms']:.1f} ms, p99 {x['p99_ms']:.1f} ms, max {x['max_ms']:.0f} ms; 429s "
              f"{100 * x['share_429']:.1f}% (/v1/owners {100 * x['owners_share_429']:.1f}%); "
              f"5xx {x['server_errors']}")
    return figures, r
