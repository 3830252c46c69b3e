"""The API over a real broker and real HTTP: joiner outputs produced onto the topics show up in every
endpoint; a restarted API rebuilds the same view; /readyz turns 200 only once the view caught up.

The broker is shared by the whole test run, so every test scopes its data (namespace, node, UIDs) by
the `unique` fixture and asserts only on that slice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import httpx

from periscope.bus import topics as t
from periscope.bus.clients import Kafka
from periscope.bus.codec import decode_dead_letter
from periscope.bus.producer import Publisher
from periscope.core.model import (
    DeviceInventory,
    Finding,
    GpuInfo,
    MigDeviceInfo,
    MigRef,
    MigState,
    NodeEvent,
    PolicyEvent,
    XidRef,
)
from periscope.settings.api import ApiSettings
from services.api.server import ApiServer
from tests.kafka_tier import settings_of
from tests.unit.test_api_samples import MIN, T0, gpu, idle_windows, meta, owner, pod, row, xid


@asynccontextmanager
async def running_api(kafka: Kafka, unique: str) -> AsyncIterator[tuple[ApiServer, httpx.AsyncClient]]:
    settings = ApiSettings(
        api_port=0, **settings_of(kafka), api_group_prefix=f"test-api-{unique}-", log_level="warning",
        api_future_skew="2h",  # the policies below are stamped an hour ahead, to be the newest
    )
    server = ApiServer(settings)
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            yield server, c
    finally:
        await server.stop()


async def eventually(probe: Callable[[], Awaitable[Any]], timeout_s: float = 30) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = await probe()
        if result:
            return result
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def ready(c: httpx.AsyncClient) -> None:
    async def probe() -> bool:
        return (await c.get("/readyz")).status_code == 200

    await eventually(probe)


def ids(unique: str) -> dict[str, str]:
    return {
        "ns": f"ns-{unique}",
        "node": f"node-{unique}",
        "uid": f"uid-{unique}",
        "mig_uid": f"mig-{unique}",
        "gpu": f"GPU-{unique}-0",
        "gpu_b": f"GPU-{unique}-1",
        "mig": f"MIG-{unique}-a",
    }


async def produce_cluster(kafka: Kafka, unique: str) -> None:
    i = ids(unique)
    ns, node = i["ns"], i["node"]
    busy_old = pod(i["uid"], ns, "train-0", node, row(i["gpu"], util_pct=10.0), as_of=T0 - MIN)
    busy = pod(
        i["uid"],
        ns,
        "train-0",
        node,
        row(
            i["gpu"],
            util_pct=1.0,
            idle=True,
            # What the joiner says of a row at 1 % since it was first seen (its windows below): idle
            # since then; the API judges by the same rule over those windows and must agree.
            idle_since_ms=T0 - 30 * MIN,
            avg_util_pct=1.0,
            wasted_gpu_hours=1 / 2,
        ),
    )
    # The joiner sends each window once, when it closes (the first sample of the next window), in a
    # record of its own; its newest record (`busy`) carries none, and the API keeps the merged history.
    closing = [
        replace(busy, rows=(replace(busy.rows[0], windows=(w,)),), as_of_ms=w.start_ms + MIN)
        for w in idle_windows(1.0, 30, end=T0 - MIN)
    ]
    mig_ref = MigRef(i["mig"], "1g.10gb", 1, 0)
    mig = pod(
        i["mig_uid"],
        ns,
        "serve-0",
        node,
        row(i["mig"], gpu_uuid=i["gpu_b"], sharing="mig", util_pct=None, mig=mig_ref),
    )
    o_busy = owner(i["uid"], ns, "train-0", i["gpu"])
    o_mig = owner(i["mig_uid"], ns, "serve-0", i["mig"])
    g0 = gpu(i["gpu"], node, 0, o_busy, last_xid=XidRef(79, T0 - 5 * MIN))
    g1 = gpu(
        i["gpu_b"],
        node,
        1,
        sharing="mig",
        mig_devices=(MigState(i["mig"], "1g.10gb", 1, 0, 512.0, 9856.0, (o_mig,)),),
    )
    x = xid(i["gpu"], T0 - 5 * MIN, 79, o_busy, node=node)
    idle_f = Finding(
        kind="idle",
        key=i["uid"],
        node=node,
        at_ms=T0,
        id=f"idle/{i['uid']}/cuda/{i['gpu']}",
        pod_uid=i["uid"],
        namespace=ns,
        pod="train-0",
        container="cuda",
        device_id=i["gpu"],
    )
    now = int(time.time() * 1000) + 3_600_000  # newer than any policy another test may have sent
    policy = PolicyEvent(
        meta=meta(now, "cluster"),
        crd="installed",
        name=f"cp-{unique}",
        state="ready",
        namespace="gpu-operator",
        components=(("dcgmExporter", False),),
    )
    # The probe's inventory: the API believes GPU states only of GPUs some inventory reported.
    inventory = DeviceInventory(meta(T0 - 60 * MIN, node), (
        GpuInfo(i["gpu"], 0, "NVIDIA A100-SXM4-80GB"),
        GpuInfo(i["gpu_b"], 1, "NVIDIA A100-SXM4-80GB", mig_enabled=True,
                mig_devices=(MigDeviceInfo(i["mig"], "1g.10gb", 1, 0),)),
    ))
    async with Publisher(kafka, f"test-{unique}") as p:
        await p.send(t.INVENTORY, node, inventory)
        for c in closing:
            await p.send(t.ATTRIBUTION, i["uid"], c)
        await p.send(t.ATTRIBUTION, i["uid"], closing[-2])  # at-least-once: a window sent again
        await p.send(t.ATTRIBUTION, i["uid"], busy)
        await p.send(t.ATTRIBUTION, i["uid"], busy_old)  # late, older state: must not win
        await p.send(t.ATTRIBUTION, i["mig_uid"], mig)
        await p.send(t.ATTRIBUTION, i["mig_uid"], mig)  # duplicate delivery
        await p.send(t.GPUS, i["gpu"], g0)
        await p.send(t.GPUS, i["gpu_b"], g1)
        await p.send(t.FINDINGS, i["gpu"], x)
        await p.send(t.FINDINGS, i["uid"], idle_f)
        await p.send(t.FINDINGS, i["uid"], replace(idle_f, active=False, at_ms=T0 + MIN))
        await p.send(t.NODES, node, NodeEvent(meta=meta(now, node), name=node))
        await p.send(t.POLICY, "cluster", policy)


async def snapshot(c: httpx.AsyncClient, unique: str) -> dict[str, Any]:
    i = ids(unique)
    out = {}
    for name, url in (
        ("pods", f"/v1/pods?namespace={i['ns']}"),
        ("gpus", f"/v1/gpus?node={i['node']}"),
        ("idle", f"/v1/idle?namespace={i['ns']}"),
        ("xid", f"/v1/xid?node={i['node']}"),
        ("findings", f"/v1/findings?node={i['node']}"),
        ("pod", f"/v1/pods/{i['uid']}"),
    ):
        r = await c.get(url)
        assert r.status_code == 200, (url, r.text)
        body = r.json()
        out[name] = body.get("items", body)
    return out


async def test_outputs_show_up_in_every_endpoint_and_survive_a_restart(any_broker: Kafka, unique: str
                                                                       ) -> None:
    i = ids(unique)
    await produce_cluster(any_broker, unique)
    async with running_api(any_broker, unique) as (_, c):
        await ready(c)  # caught up with what was produced before start: everything is there
        first = await snapshot(c, unique)
        pods = first["pods"]
        assert [(r["pod_uid"], r["device_id"]) for r in pods] == [
            (i["mig_uid"], i["mig"]),
            (i["uid"], i["gpu"]),
        ]
        serve, train = pods
        assert train["util_pct"] == 1.0 and train["idle"] is True  # the older state did not win
        assert serve["mig"] == {"uuid": i["mig"], "profile": "1g.10gb", "gi": 1, "ci": 0}
        assert serve["gpu_uuid"] == i["gpu_b"] and serve["util_pct"] is None
        assert first["pod"]["rows"][0]["device_id"] == i["gpu"] and first["pod"]["node"] == i["node"]
        merged = first["pod"]["rows"][0]["windows"]  # every window once, in order, from 30 records
        assert [w["start"] for w in merged][::29] == ["2026-11-22T03:35:00.000Z", "2026-11-22T04:04:00.000Z"]
        assert len(merged) == 30 and {w["avg_util_pct"] for w in merged} == {1.0}

        g0, g1 = first["gpus"]
        assert g0["gpu_uuid"] == i["gpu"] and [o["pod_uid"] for o in g0["owners"]] == [i["uid"]]
        assert g0["last_xid"] == {"code": 79, "at": "2026-11-22T04:00:06.789Z"}
        assert [o["pod_uid"] for o in g1["mig_devices"][0]["owners"]] == [i["mig_uid"]]

        (idle,) = first["idle"]
        assert idle["pod_uid"] == i["uid"] and idle["idle_since"] == "2026-11-22T03:35:06.789Z"
        recomputed = (await c.get(f"/v1/idle?namespace={i['ns']}&threshold_pct=5&window=10m")).json()["items"]
        assert [r["pod_uid"] for r in recomputed] == [i["uid"]]

        (x,) = first["xid"]
        assert x["code"] == 79 and x["gpu_uuid"] == i["gpu"] and x["owners"][0]["pod_uid"] == i["uid"]
        idle_findings = [f for f in first["findings"] if f["kind"] == "idle"]
        assert [f["active"] for f in idle_findings] == [False]  # the clearing upserted the finding

        policy = (await c.get("/v1/policy")).json()
        assert policy["cluster_policy"] == {"name": f"cp-{unique}", "state": "ready"}
        dcgm = next(comp for comp in policy["components"] if comp["name"] == "dcgmExporter")
        assert dcgm["intended"] == "disabled"

        metrics = (await c.get("/metrics")).text
        assert f'pod_uid="{i["uid"]}"' in metrics and "periscope_api_records_consumed_total" in metrics
        assert (await c.get("/healthz")).json() == {"status": "ok"}

        # Records produced while running are applied live.
        async with Publisher(any_broker, f"test-{unique}-2") as p:
            await p.send(
                t.ATTRIBUTION,
                i["uid"],
                pod(i["uid"], i["ns"], "train-0", i["node"], row(i["gpu"], util_pct=66.0), as_of=T0 + MIN),
            )

        async def updated() -> bool:
            r = (await c.get(f"/v1/pods/{i['uid']}")).json()
            return bool(r["rows"][0]["util_pct"] == 66.0)

        await eventually(updated)
        # A newer record without windows replaced the row's numbers and kept its windows.
        assert (await c.get(f"/v1/pods/{i['uid']}")).json()["rows"][0]["windows"] == merged
        before_restart = await snapshot(c, unique)

    async with running_api(any_broker, f"{unique}-again") as (_, c2):
        await ready(c2)
        assert await snapshot(c2, unique) == before_restart


async def test_readyz_turns_200_only_after_catching_up(any_broker: Kafka, unique: str) -> None:
    ns, n = f"bulk-{unique}", 1500
    pods = [
        (
            f"u-{unique}-{k:04d}",
            pod(f"u-{unique}-{k:04d}", ns, f"p-{k:04d}", f"node-{unique}", row(f"GPU-{unique}-{k % 8}")),
        )
        for k in range(n)
    ]
    async with Publisher(any_broker, f"test-{unique}") as p:
        await p.send_many(t.ATTRIBUTION, pods)
    async with running_api(any_broker, unique) as (server, c):
        while (r := await c.get("/readyz")).status_code != 200:
            assert r.status_code == 503 and r.json()["ready"] is False
            assert (await c.get("/healthz")).status_code == 200
            await asyncio.sleep(0.005)
        # The first 200 already sees every record produced before start.
        body = (await c.get(f"/v1/pods?namespace={ns}")).json()
        assert len(body["items"]) == n
        assert r.json()["group_id"].startswith(f"test-api-{unique}-")
        assert server.consumer is not None and server.consumer.status.ready


async def test_unreachable_broker_is_healthy_but_not_ready(unique: str) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    async with running_api(Kafka(dead), unique) as (_, c):
        await asyncio.sleep(0.5)
        assert (await c.get("/healthz")).status_code == 200
        r = await c.get("/readyz")
        assert r.status_code == 503 and r.json()["ready"] is False

        async def has_error() -> bool:
            return bool((await c.get("/readyz")).json()["error"])

        await eventually(has_error, 15)


async def test_undecodable_records_become_dead_letters(any_broker: Kafka, unique: str) -> None:
    key = f"garbage-{unique}".encode()
    async with Publisher(any_broker, f"test-{unique}") as p:
        await p.send_raw(t.ATTRIBUTION.name, key, b"\xff\x00 not protobuf")
        await p.send(t.ATTRIBUTION, f"ok-{unique}", pod(f"ok-{unique}", f"ns-{unique}"))
    async with running_api(any_broker, unique) as (_, c):
        await ready(c)
        assert [r["pod_uid"] for r in (await c.get(f"/v1/pods?namespace=ns-{unique}")).json()["items"]] == [
            f"ok-{unique}"
        ]
        metrics = (await c.get("/metrics")).text
        dead = [ln for ln in metrics.splitlines() if ln.startswith("periscope_api_dead_letters_total")]
        assert dead and float(dead[0].split()[-1]) >= 1
    consumer = any_broker.consumer(t.DEADLETTER.name, client_id=f"test-{unique}")
    await consumer.start()
    try:

        async def found() -> bool:
            batches = await consumer.getmany(timeout_ms=200)
            return any(
                r.key == key and decode_dead_letter(r.value).service == "api"
                for recs in batches.values()
                for r in recs
            )

        await eventually(found, 20)
    finally:
        await consumer.stop()
