"""`periscope usage` over a real broker: the period's GPU-hours per group equal what the core charges the
same events, the groups add up to the printed total, CSV loads as a table, a price file adds the cost,
and bad input is one line with exit status 2.

The broker is shared with other tests: this module's event times are later than every earlier
module's (see tests/integration/test_replay.py), and each test uses its own node and namespaces.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import json
import zlib
from pathlib import Path

import pytest

from periscope.bus.clients import Kafka
from periscope.cli.main import main
from periscope.contract.values import rfc3339
from periscope.core.engine import apply, flush, new_state
from periscope.core.gpuhours import Account, RowTally
from periscope.core.model import AllocationSnapshot, NodeInput, PodAttribution, PodEvent
from periscope.settings.replay import ReplaySettings
from tests.integration.test_replay import publish
from tests.unit.core_builders import alloc, ck, dev, gpu, inventory, pod, pr, tel, uid
from tests.unit.test_replay_owners import relocate

BASE = 2_100_000_000_000  # later than test_replay's events; a whole minute
S = 1000
MIN = 60 * S
FROM, TO = BASE + MIN, BASE + 6 * MIN


@pytest.fixture(autouse=True)
def _settings(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    callspec = getattr(request.node, "callspec", None)
    kind = callspec.params.get("broker_kind", "embedded") if callspec else "embedded"
    monkeypatch.setenv("PERISCOPE_KAFKA_PROFILE", kind)
    monkeypatch.setenv("PERISCOPE_IDLE_WINDOW", "2m")  # so that an idle pod shows within the period
    monkeypatch.setenv("PERISCOPE_REPLAY_WORKERS", "1")


def owned(ev: PodEvent, kind: str, name: str, **labels: str) -> PodEvent:
    info = dataclasses.replace(ev.pod, owner_kind=kind, owner_name=name, labels=tuple(sorted(labels.items())))
    return dataclasses.replace(ev, pod=info)


def scenario(node: str) -> list[NodeInput]:
    """GPU 0: a training Job at 80 % for the whole period; GPU 1: a notebook at 1 % (idle once the
    2-minute idle window has passed), then, from 3 min, a web pod at 40 %. Samples every second from
    a minute before the period to a minute after it."""
    g0, g1 = gpu(0), gpu(1)
    t0 = 0  # the period is [1 min, 6 min)
    evs: list[NodeInput] = [
        inventory(t0, gpus=2),
        owned(pod(1, "train-x7k2p", t0, ns=f"ml-{node}"), "Job", "train", team="a"),
        owned(pod(2, "notebook", t0, ns=f"nb-{node}"), "", "", team="b"),
        owned(pod(2, "notebook", t0, ns=f"nb-{node}", deleted_at=4 * MIN), "", "", team="b"),
        owned(pod(3, "web-6d4f8-abcde", 4 * MIN, ns=f"ml-{node}"), "ReplicaSet", "web-6d4f8", team="a"),
        alloc(t0, ck(uid(1), (g0,)), pr(f"ml-{node}", "train-x7k2p", (g0,)),
              ck(uid(2), (g1,)), pr(f"nb-{node}", "notebook", (g1,))),
        alloc(4 * MIN, ck(uid(1), (g0,)), pr(f"ml-{node}", "train-x7k2p", (g0,)),
              ck(uid(3), (g1,)), pr(f"ml-{node}", "web-6d4f8-abcde", (g1,))),
    ]
    for t in range(t0 + S, 7 * MIN, S):
        web = t >= 4 * MIN
        evs.append(tel(t, dev(g0, 80.0, fb=4096.0, power=300.0), dev(g1, 40.0 if web else 1.0, index=1)))
    evs.sort(key=lambda e: e.meta.time_ms)
    return [own_uids(relocate(e, node, BASE), node) for e in evs]


def own_uids(ev: NodeInput, node: str) -> NodeInput:
    """The event with its pods' UIDs made this node's own: tests share the broker and the period, and
    `--by pod` groups by UID, as UIDs are unique in a cluster."""
    def mine(u: str) -> str:
        return u and f"{zlib.crc32(node.encode()):08x}{u[8:]}"

    if isinstance(ev, PodEvent):
        return dataclasses.replace(ev, pod=dataclasses.replace(ev.pod, uid=mine(ev.pod.uid)))
    if isinstance(ev, AllocationSnapshot):
        entries = tuple(dataclasses.replace(e, pod_uid=mine(e.pod_uid)) for e in ev.entries)
        return dataclasses.replace(ev, entries=entries)
    return ev


def core_totals(events: list[NodeInput]) -> dict[str, Account]:
    """What the core charges the same events, per namespace, windows starting in [FROM, TO)."""
    config = ReplaySettings().engine_config()
    state = new_state(events[0].meta.node)
    outs = []
    for e in events:
        o = apply(state, e, config)
        outs += o
    outs += flush(state, config)
    tallies: dict[tuple[str, str], RowTally] = {}
    for o in outs:
        if isinstance(o, PodAttribution):
            for r in o.rows:
                key = (o.namespace, r.device_id + o.pod_uid)
                tallies.setdefault(key, RowTally(FROM, TO)).add_all(r.windows)
    for (pod_uid, _, device), row in state.rows.items():
        tallies.setdefault((row.namespace, device + pod_uid), RowTally(FROM, TO)).add_all(row.unpublished())
    out: dict[str, Account] = {}
    for (ns, _), tally in tallies.items():
        out.setdefault(ns, Account()).add(tally.total())
    return out


def usage(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["usage", "--quiet", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_usage_per_namespace_is_what_the_core_charges_and_reconciles(
        any_broker: Kafka, unique: str, capsys: pytest.CaptureFixture[str]) -> None:
    node = f"usage-{unique}"
    events = scenario(node)
    asyncio.run(publish(any_broker, node, events))
    code, out, err = usage(capsys, "--bootstrap", any_broker.bootstrap, "--from", rfc3339(FROM),
                           "--to", rfc3339(TO), "--by", "namespace", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    mine = {g["key"]: g for g in doc["groups"] if g["key"].endswith(node)}
    want = core_totals(events)
    assert set(mine) == set(want) == {f"ml-{node}", f"nb-{node}"}
    for ns, acct in want.items():
        assert {k: v for k, v in mine[ns].items() if k not in ("key", "pods")} == acct.to_json(priced=False)
    ml, nb = mine[f"ml-{node}"], mine[f"nb-{node}"]
    # Each window holds the time within it (a sample's gap is split at a window's start), so the period's
    # windows hold 1:00 .. 6:00: 5 minutes of a whole GPU at 80 %, and on the other the web pod at 40 %
    # from its creation at 4:00: 2:00.
    assert ml["allocated_gpu_hours"] == pytest.approx((300 + 120) / 3600, abs=1e-6)
    assert ml["used_gpu_hours"] == pytest.approx((300 * 0.8 + 120 * 0.4) / 3600, abs=1e-6)
    assert ml["pods"] == 2 and ml["idle_gpu_hours"] == 0
    # The notebook: held at 1 % until its deletion at 4:00 (1:00 .. 4:00 in the period); idle once the
    # 2-minute window passed, its whole run booked where the verdict was reached, inside the period.
    assert nb["allocated_gpu_hours"] == pytest.approx(180 / 3600, abs=1e-6)
    assert nb["idle_gpu_hours"] == pytest.approx(239 / 3600, abs=1e-6)  # 0:01 .. 4:00 (a node's first
    # sample has no previous one: it is charged nothing)
    # whole GPUs: the baseline agrees
    assert ml["request_gpu_hours"] == pytest.approx(ml["allocated_gpu_hours"], abs=1e-6)
    total = doc["total"]
    for k in ("allocated_gpu_hours", "used_gpu_hours", "idle_gpu_hours", "memory_gib_hours", "energy_wh"):
        assert sum(g[k] for g in doc["groups"]) == pytest.approx(total[k], abs=1e-6 * len(doc["groups"]))
    assert doc["from"] == rfc3339(FROM) and doc["by"] == "namespace" and total["cost"] is None


def test_workload_label_csv_and_price_file(broker: Kafka, unique: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    node = f"usage-{unique}"
    asyncio.run(publish(broker, node, scenario(node)))
    prices = tmp_path / "prices.yaml"
    prices.write_text("currency: EUR\nNVIDIA A100-SXM4-80GB: 2.5\n")
    span = ("--bootstrap", broker.bootstrap, "--from", rfc3339(FROM), "--to", rfc3339(TO))
    code, out, err = usage(capsys, *span, "--by", "workload", "--format", "json", "--price-file", str(prices))
    assert code == 0, err
    doc = json.loads(out)
    work = {g["key"]: g for g in doc["groups"] if node in g["key"]}
    assert set(work) == {f"ml-{node}/Job/train", f"ml-{node}/ReplicaSet/web-6d4f8", f"nb-{node}/Pod/notebook"}
    job = work[f"ml-{node}/Job/train"]
    assert job["cost"] == pytest.approx(job["allocated_gpu_hours"] * 2.5, abs=1e-4)
    assert doc["currency"] == "EUR"
    code, out, err = usage(capsys, *span, "--by", "label:team", "--format", "csv")
    assert code == 0, err
    table = list(csv.DictReader(io.StringIO(out)))
    assert list(table[0])[:3] == ["key", "pods", "allocated_gpu_hours"]
    teams = {r["key"]: r for r in table}
    assert {"a", "b"} <= set(teams) and teams["a"]["cost"] == ""
    code, out, err = usage(capsys, *span, "--by", "pod")
    assert code == 0, err
    assert "TOTAL (cluster)" in out and f"nb-{node}/notebook" in out


@pytest.mark.parametrize(("args", "message"), [
    (("--by", "team"), "--by: unknown grouping 'team'"),
    (("--from", rfc3339(TO), "--to", rfc3339(FROM)), "is not before --to"),
    (("--from", "yesterday"), "--from:"),
    (("--price-file", "/nonexistent/prices.yaml"), "price file /nonexistent/prices.yaml: no such file"),
])
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    base = {"--from": rfc3339(FROM), "--to": rfc3339(TO)}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    code, out, err = usage(capsys, "--bootstrap", "127.0.0.1:1", *(x for kv in base.items() for x in kv))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_a_price_file_without_a_price_for_a_model_it_meets_is_refused(
        broker: Kafka, unique: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = f"usage-{unique}"
    asyncio.run(publish(broker, node, scenario(node)))
    prices = tmp_path / "prices.yaml"
    prices.write_text("Tesla T4: 0.35\n")
    span = ("--bootstrap", broker.bootstrap, "--from", rfc3339(FROM), "--to", rfc3339(TO))
    code, _, err = usage(capsys, *span, "--price-file", str(prices))
    assert code == 2 and "no price for GPU model 'NVIDIA A100-SXM4-80GB'" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("Tesla T4: cheap\n")
    code, _, err = usage(capsys, *span, "--price-file", str(bad))
    assert code == 2 and "Tesla T4: not a price" in err
