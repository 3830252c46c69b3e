"""What access control costs a request: p99 of GET /v1/pods?node=N with auth off, and with
PERISCOPE_API_AUTH=kubernetes and a warm review cache, as a cluster-wide user and as a user of two
namespaces out of twenty.

The view is bench.api's view (one pod per GPU, fed as the joiner publishes), with node i's pods in
namespace team-(i mod 20). One child process serves it twice, from one uvicorn server with access
control off and one with it on; the reviews go over HTTP to the simulated apiserver (TokenReview,
SubjectAccessReview) in that process. Every queried node is one of the namespaced user's, so the three
variants return the same rows; rounds interleave the variants so a busy machine slows all three alike.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import random
import tempfile
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

from bench.api import _time_queries, feed, template
from bench.common import Figure, Goal, median, percentile, rounded
from bench.workload import NodeShape, node_name
from periscope.core.model import GpuState, Owner, PodAttribution

NAMESPACES = 20
TENANT_NAMESPACES = ("team-00", "team-01")
GOAL = Goal("<", 2.0, "p99 with auth on (warm cache) within 2x of auth off")
VARIANTS = {"off": None, "cluster": "ops-token", "tenant": "alice-token"}


def _namespace(i: int) -> str:
    return f"team-{i % NAMESPACES:02d}"


def _renamespaced(i: int, objs: list[Any]) -> list[Any]:
    ns = _namespace(i)
    out: list[Any] = []
    for o in objs:
        if isinstance(o, PodAttribution):
            out.append(replace(o, namespace=ns))
        elif isinstance(o, GpuState):
            out.append(replace(o, owners=tuple(replace(w, namespace=ns) for w in o.owners)))
        else:
            out.append(o)
    assert all(isinstance(w, Owner) for o in out if isinstance(o, GpuState) for w in o.owners)
    return out


def _serve(rows: int, history_min: int, conn: Connection) -> None:
    import logging

    from periscope.settings.api import ApiSettings
    from periscope.sim.apiserver import FakeApiServer
    from periscope.sim.scenario import UserSpec
    from services.api.server import ApiServer
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
            base = {"api_host": "127.0.0.1", "api_port": 0, "log_level": "WARNING"}
            off = ApiServer(ApiSettings(**base), view, consume=False)
            on = ApiServer(ApiSettings(**base, api_auth="kubernetes", kubeconfig=str(kubeconfig)), view,
                           consume=False)
            conn.send({"off": await off.start(), "on": await on.start(), "rows": view.row_count()})
            await asyncio.get_running_loop().run_in_executor(None, conn.recv)
            await off.stop()
            await on.stop()

    asyncio.run(main())


def _nodes(rows: int) -> list[str]:
    tenant = {int(ns.split("-")[1]) for ns in TENANT_NAMESPACES}
    return [node_name(i) for i in range(rows // NodeShape().gpus) if i % NAMESPACES in tenant]


def measure(rows: int, history_min: int, requests: int, rounds: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(rows, history_min, child), daemon=True)
    proc.start()
    try:
        if not parent.poll(600):
            raise RuntimeError("API servers did not start")
        info = parent.recv()
        rng = random.Random(rows)
        nodes = _nodes(rows)
        clients = {
            v: httpx.Client(base_url=info["off" if token is None else "on"], timeout=60,
                            headers={} if token is None else {"Authorization": f"Bearer {token}"})
            for v, token in VARIANTS.items()
        }
        p99s: dict[str, list[float]] = {v: [] for v in VARIANTS}
        p50s: dict[str, list[float]] = {v: [] for v in VARIANTS}
        try:
            for c in clients.values():  # warm: connections, rendered rows, every review cached
                _time_queries(c, [f"/v1/pods?node={n}" for n in nodes[:20]])
            for _ in range(rounds):
                paths = [f"/v1/pods?node={rng.choice(nodes)}" for _ in range(requests)]
                for v, c in clients.items():
                    lat = _time_queries(c, paths)
                    p99s[v].append(percentile(lat, 99))
                    p50s[v].append(percentile(lat, 50))
            bodies = {v: c.get(f"/v1/pods?node={nodes[0]}").json()["items"] for v, c in clients.items()}
        finally:
            for c in clients.values():
                c.close()
        assert bodies["off"] == bodies["cluster"] == bodies["tenant"] and bodies["off"], "variants differ"
        parent.send("stop")
        proc.join(30)
        return {"rows": info["rows"], "p99_ms": {v: median(x) for v, x in p99s.items()},
                "p50_ms": {v: median(x) for v, x in p50s.items()},
                "rounds_p99_ms": {v: [rounded(y) for y in x] for v, x in p99s.items()}}
    finally:
        if proc.is_alive():
            proc.terminate()
            proc.join(10)


def run(rows: int, history_min: int, requests: int, rounds: int) -> tuple[list[Figure], dict[str, Any]]:
    r = measure(rows, history_min, requests, rounds)
    p99 = r["p99_ms"]
    ratio = max(p99["cluster"], p99["tenant"]) / p99["off"]
    setup = {
        "rows": rows,
        "query": "GET /v1/pods?node=N, N a random node whose namespace the namespaced user may read "
                 "(8 rows per response, identical for every variant)",
        "requests": f"{requests} per variant per round, one at a time, keep-alive; rounds interleave the "
                    f"variants; median over {rounds} rounds of each round's p99",
        "auth": f"PERISCOPE_API_AUTH=kubernetes against the simulated apiserver over HTTP, cache warm; "
                f"users: cluster-wide, and {len(TENANT_NAMESPACES)} of {NAMESPACES} namespaces",
        "p99_ms": {k: rounded(v) for k, v in p99.items()},
    }
    brief = (f"{rows:,} rows in {NAMESPACES} namespaces; /v1/pods?node=; auth on (warm cache, slower of a "
             "cluster-wide and a 2-namespace user) vs off")
    limit = "a SHA-256 of the token and a few dict lookups per request; no apiserver call while warm"
    figures = [
        Figure("api_auth_p99_ratio", ratio, "x", setup, limit, GOAL, [ratio], brief),
        Figure("api_auth_p99_ms", max(p99["cluster"], p99["tenant"]), "ms", setup, limit, None,
               [max(p99["cluster"], p99["tenant"])], brief),
        Figure("api_auth_off_p99_ms", p99["off"], "ms", setup, "as api_p99_ms", None, [p99["off"]],
               f"{rows:,} rows; /v1/pods?node= with auth off, interleaved with the auth-on runs"),
    ]
    print(f"api_auth: p99 off {p99['off']:.2f} ms, cluster-wide {p99['cluster']:.2f} ms, "
          f"namespaced {p99['tenant']:.2f} ms: ratio {ratio:.2f}x (goal < 2x)")
    return figures, r
