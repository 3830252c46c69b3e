"""`periscope replay` end to end: an hour of a 50-node, 8-GPU cluster through the broker and the CLI.

Every input event of `periscope.devkit.workload.generate(spec)` is published to a fresh broker (the
embedded one or Apache Kafka, bench.common.PROFILE) the way the probes and the watcher publish them
(protobuf through periscope.bus.codec, key = node name, the registry's topics and partition counts,
batched as the broker profile says: one record per batch on the embedded broker, normal batches with
compression on Kafka), each record stamped with its event time, as if the hour had been recorded
live: run.py places the hour so that it ended a minute before the run (`recent_start_ms`). Apache
Kafka deletes by record time: with the input topics' 7-day retention, an hour stamped with the
generator's fixed epoch (weeks back) is deleted whole, active segment included, at the broker's first
retention check (30 s after it starts, then every 5 minutes), while it is being published or replayed.
Then the real command runs in its own process,

    python -m periscope.cli.main replay --bootstrap B --from START --to START+1h --format json

with its output to a file: with its default workers (one per CPU) and, paired and alternating, with
`--workers 1` as the same run's baseline. Measured: publishing (records, seconds), the command's wall
time and peak memory, and from its stderr summary the device samples it replayed, the seconds spent
replaying and its phases (reading; replaying: the core plus rendering each node's records into the
spool, in the workers, as much of it as was left once reading ended (with workers, each partition's
nodes replay while the next is read); writing: the merge into the document), which split the wall
time. The output is read back (line by line: it is gigabytes at full size) to check that it is
attribution: items by kind, pods attributed, GPUs with an owner. The section fails if the command
exits non-zero, replays fewer device samples than the spec holds, prints no attribution, or prints
different documents in its runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import common
from bench.common import (
    Figure,
    Goal,
    broker_label,
    end_offsets,
    kafka,
    kafka_env,
    median,
    proc_cpu_s,
    proc_rss_bytes,
    rounded,
)
from bench.common import broker as bench_broker
from periscope.bus import codec, topics
from periscope.bus.producer import Publisher
from periscope.contract.values import rfc3339
from periscope.core.model import NodeInput, PodEvent
from periscope.devkit.workload import ClusterSpec, generate
from periscope.replay.runner import node_of

ROOT = Path(__file__).resolve().parent.parent
TOPIC_OF: dict[str, topics.Topic] = {t.message: t for t in topics.NODE_INPUTS}
CHUNK = 5000  # events handed to the producer per round (one send_many per topic)
# On the embedded broker one record per batch, as the probes and the watcher send them there (the
# profile's one_record_batches), but thousands in flight: it reports a partition's end offset as its
# last batch's base offset + 1, so records batched behind that one would lie past the end replay reads
# to; with batches of a few records (aiokafka's default 16 KiB holds 8 telemetry records) replay would
# lose up to 7 per partition, with 1 MiB batches nearly all. One-record batches publish ~3x slower
# (~3,500 records/s). On Apache Kafka the profile's batching (linger, 256 KiB batches, lz4).
TIMEOUT_S = 1800.0
_SUMMARY = re.compile(r"read (\d+) record\(s\), (\d+) event\(s\); (\d+) device sample\(s\) in ([\d.]+)s "
                      r"\((\d+) device samples/s\); (\d+) bad record\(s\) skipped; ([\d.]+)s in all"
                      r"(?:; reading ([\d.]+)s, replaying ([\d.]+)s, writing ([\d.]+)s)?")

GOAL = Goal(">=", 30_000, ">= 30,000 device-samples/s")
BROKER_SETUP = {"embedded": "embedded (Tansu, memory storage)",
                "kafka": "Apache Kafka (KRaft, one node, log on the local disk)"}


def recent_start_ms(duration_ms: int, now_ms: int | None = None) -> int:
    """Start of a range of `duration_ms` that ended a minute before now, on a whole second."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return (now_ms - duration_ms - 60_000) // 1000 * 1000


def topic_of(ev: NodeInput) -> topics.Topic:
    return TOPIC_OF[type(ev).__name__]


async def publish(bootstrap: str, spec: ClusterSpec, chunk: int = CHUNK) -> dict[str, Any]:
    """Publish every event of the spec in event-time order; returns counts and seconds."""
    by_topic: dict[topics.Topic, list[tuple[str, object]]] = {}
    counts: Counter[str] = Counter()
    pods: set[str] = set()
    started = time.perf_counter()
    async with Publisher(kafka(bootstrap), "bench-replay-hour") as pub:

        async def flush() -> None:
            for topic, items in by_topic.items():
                await pub.send_many(topic, items, event_time=True)
            by_topic.clear()

        for n, ev in enumerate(generate(spec), 1):
            topic = topic_of(ev)
            by_topic.setdefault(topic, []).append((node_of(ev), ev))
            counts[topic.name] += 1
            if isinstance(ev, PodEvent):
                pods.add(ev.pod.uid)
            if n % chunk == 0:
                await flush()
        await flush()
        sent = pub.sent
    seconds = time.perf_counter() - started
    stored = sum([await end_offsets(bootstrap, t.name) for t in topics.NODE_INPUTS])
    return {"records": sent, "stored": stored, "seconds": seconds, "by_topic": dict(counts),
            "pods": len(pods)}


def encode_cost(spec: ClusterSpec, events: int = 20_000) -> tuple[float, float]:
    """(seconds, bytes) per record of encoding the spec's first events, as the publisher does."""
    sample = [ev for _, ev in zip(range(events), generate(spec), strict=False)]
    t = time.perf_counter()
    size = sum(len(codec.encode(ev)) for ev in sample)
    return (time.perf_counter() - t) / len(sample), size / len(sample)


def scan_timeline(path: Path) -> dict[str, Any]:
    """What a `--format json` timeline holds, read a line at a time (each item is one line of the
    `"items"` array; the rest of the document is laid out as json.dumps(indent=2) would)."""
    kinds: Counter[str] = Counter()
    findings: Counter[str] = Counter()
    pods: set[str] = set()
    gpus: set[str] = set()
    owned: set[str] = set()
    skeleton: list[str] = []
    in_items = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not in_items:
                if line.startswith('  "items": [') and line.rstrip() != '  "items": [],':
                    in_items = True
                    line = '  "items": [],\n'
                skeleton.append(line)
                continue
            if line.startswith("  ]"):
                in_items = False
                continue
            item = json.loads(line.strip().rstrip(","))
            kind, key = item["kind"], item["key"]
            kinds[kind] += 1
            if kind == "attribution":
                pods.add(key)
            elif kind == "gpu":
                gpus.add(key)
                if item["owners"]:
                    owned.add(key)
            elif kind == "finding":
                findings[item["finding"]] += 1
    doc = json.loads("".join(skeleton))
    return {"items": sum(kinds.values()), "by_kind": dict(kinds), "findings": dict(findings),
            "pods": len(pods), "gpus": len(gpus), "gpus_with_owner": len(owned), "stats": doc["stats"],
            "from": doc["from"], "to": doc["to"]}


def replay_cli(bootstrap: str, from_ms: int, to_ms: int, out: Path, timeout_s: float = TIMEOUT_S,
               workers: int | None = None) -> dict[str, Any]:
    """Run `periscope replay` for [from, to] with JSON output to `out` (`--workers` if given); wall time,
    first output byte, peak memory (the largest of the process and its workers) and CPU (with its
    workers') of the process, and its stderr summary."""
    err_path = out.with_suffix(".stderr")
    argv = [sys.executable, "-m", "periscope.cli.main", "replay", "--bootstrap", bootstrap,
            "--from", rfc3339(from_ms), "--to", rfc3339(to_ms), "--format", "json",
            *(["--workers", str(workers)] if workers is not None else [])]
    with open(out, "wb") as stdout, open(err_path, "wb") as stderr:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, cwd=ROOT,
                                env={**os.environ, **kafka_env()})
        first_byte: float | None = None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            now = time.perf_counter()
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                break
            if first_byte is None and out.stat().st_size > 0:
                first_byte = now - started
            if now - started > timeout_s:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"periscope replay did not finish in {timeout_s:.0f}s")
            time.sleep(0.05)
    wall = now - started
    err = err_path.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"periscope replay exited {proc.returncode}: {err.strip()[-2000:]}")
    m = _SUMMARY.search(err)
    if m is None:
        raise RuntimeError(f"periscope replay printed no speed summary: {err.strip()[-2000:]}")
    records, events, device_samples, core_s, speed, bad, total_s, read_s, replay_s, write_s = m.groups()
    phases = {} if read_s is None else {"read_s": float(read_s), "replay_s": float(replay_s),
                                        "write_s": float(write_s)}
    return {"argv": argv[3:], "wall_s": wall, "first_byte_s": first_byte if first_byte is not None else wall,
            "records": int(records), "events": int(events), "device_samples": int(device_samples),
            "core_s": float(core_s), "reported_device_samples_per_s": int(speed), "bad_records": int(bad),
            "in_all_s": float(total_s), "peak_rss_bytes": usage.ru_maxrss * 1024,
            "cpu_s": usage.ru_utime + usage.ru_stime, "output_bytes": out.stat().st_size,
            "summary": m.group(0), **phases}


def digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def run(spec: ClusterSpec, tmp: Path, baseline: Figure | None = None, repeats: int = 1
        ) -> tuple[list[Figure], dict[str, Any]]:
    """Publish the spec to a fresh broker of the current kind (bench.common.PROFILE), then replay it
    with the CLI `repeats` times each with its default workers (one per CPU) and with `--workers 1`,
    paired and alternating; check that every run printed the same document, and that it is
    attribution; measure."""
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / "replay.json"
    from_ms, to_ms = spec.start_ms, spec.start_ms + spec.duration_ms
    runs: dict[str, list[dict[str, Any]]] = {"parallel": [], "one_process": []}
    digests: set[str] = set()
    scan: dict[str, Any] = {}
    with bench_broker(tmp) as broker:
        assert broker.pid is not None
        cpu0 = proc_cpu_s(broker.pid)
        pub = asyncio.run(publish(broker.bootstrap, spec))
        cpu1 = proc_cpu_s(broker.pid)
        pub["broker_cpu_s"], pub["broker_rss_bytes"] = cpu1 - cpu0, proc_rss_bytes(broker.pid)
        for _ in range(repeats):
            for mode, workers in (("one_process", 1), ("parallel", None)):
                load = os.getloadavg()[0]
                before = proc_cpu_s(broker.pid)
                try:
                    cli = replay_cli(broker.bootstrap, from_ms, to_ms, out, workers=workers)
                    digests.add(digest(out))
                    if mode == "parallel" and not scan:
                        scan = scan_timeline(out)
                finally:
                    out.unlink(missing_ok=True)
                cli["broker_cpu_s"], cli["load_average_1m_before"] = proc_cpu_s(broker.pid) - before, load
                runs[mode].append(cli)
    if len(digests) != 1:
        raise RuntimeError(f"the runs printed {len(digests)} different documents (one process and parallel)")
    by_wall = sorted(runs["parallel"], key=lambda c: c["wall_s"])
    cli = by_wall[len(by_wall) // 2]  # the median run speaks for the phases
    if pub["stored"] != pub["records"]:
        raise RuntimeError(f"published {pub['records']} records but the broker holds {pub['stored']}")
    in_json = scan["stats"]["device_samples"]
    if cli["device_samples"] != spec.device_samples or in_json != spec.device_samples:
        raise RuntimeError(f"periscope replay replayed {cli['device_samples']} device samples "
                           f"(JSON stats: {in_json}), the spec holds {spec.device_samples}")
    if not scan["items"] or not scan["pods"] or not scan["gpus_with_owner"]:
        raise RuntimeError(f"periscope replay returned no attribution: {scan}")
    encode_s, record_bytes = encode_cost(spec)
    figs, details = figures(spec, pub, cli, scan, baseline, encode_s=encode_s, record_bytes=record_bytes)
    walls = [c["wall_s"] for c in runs["parallel"]]
    for f in figs:  # every repeat, not only the median run the setup describes
        if f.key == "replay_hour_device_samples_per_s":
            f.runs = [spec.device_samples / w for w in walls]
        elif f.key == "replay_hour_speedup_vs_realtime":
            f.runs = [spec.duration_ms / 1000 / w for w in walls]
    return [*figs, *paired(spec, runs)], {**details, "runs": runs}


def paired(spec: ClusterSpec, runs: dict[str, list[dict[str, Any]]]) -> list[Figure]:
    """The one-process runs (the same run's baseline) and the ratio of each pair."""
    par = [spec.device_samples / c["wall_s"] for c in runs["parallel"]]
    one = [spec.device_samples / c["wall_s"] for c in runs["one_process"]]
    ratios = [p / o for p, o in zip(par, one, strict=True)]
    command = "python -m periscope.cli.main " + " ".join(runs["one_process"][0]["argv"]) + " > file"
    loads = [rounded(c["load_average_1m_before"]) for m in runs.values() for c in m]
    setup = {"command": command,
             "runs_min_median_max": {"parallel": _mmm(par), "one_process": _mmm(one)},
             "ratio_min_median_max": _mmm(ratios),
             "cpu_s": {"parallel": [rounded(c["cpu_s"]) for c in runs["parallel"]],
                       "one_process": [rounded(c["cpu_s"]) for c in runs["one_process"]]},
             "load_average_1m_before": loads,
             "same_document": "every run printed the same bytes (blake2b of the output)"}
    brief = "the same command with --workers 1, paired and alternating with the default (a worker per CPU)"
    return [
        Figure("replay_hour_one_process_device_samples_per_s", median(one), "device-samples/s", setup,
               "CPU, one Python process (see replay_hour_device_samples_per_s)", None, one, brief),
        Figure("replay_hour_parallel_vs_one_process_ratio", median(ratios), "x", setup,
               "the reading (one process: aiokafka, decoding headers) and the merge stay serial; the "
               "machine is shared", None, ratios, "replay_hour / replay_hour_one_process, paired runs"),
    ]


def _mmm(xs: list[float]) -> dict[str, float | None]:
    s = sorted(xs)
    return {"min": rounded(s[0]), "median": rounded(median(s)), "max": rounded(s[-1])} if s else {}


def _mem(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def figures(spec: ClusterSpec, pub: dict[str, Any], cli: dict[str, Any], scan: dict[str, Any],
            baseline: Figure | None, *, encode_s: float, record_bytes: float
            ) -> tuple[list[Figure], dict[str, Any]]:
    wall, core = cli["wall_s"], cli["core_s"]
    if "read_s" in cli:  # the command's own account of its phases
        start = max(0.0, wall - cli["in_all_s"])  # interpreter start and imports
        read = start + cli["read_s"]
        render = max(0.0, cli["replay_s"] - core)  # node by node, into the spool
        write = cli["write_s"]  # merging the spool into the document
    else:  # split by the first output byte
        read = max(0.0, cli["first_byte_s"] - core)  # process start, read + decode, sort
        render, write = 0.0, max(0.0, wall - cli["first_byte_s"])  # render + write the JSON
    speed = spec.device_samples / wall
    simulated_s = spec.duration_ms / 1000
    shape = (f"{spec.nodes} nodes x {spec.gpus_per_node} GPUs x {simulated_s / 60:g} min of "
             f"{spec.tick_ms / 1000:g} s ticks")
    setup: dict[str, Any] = {
        "cluster": shape + f"; a pod per GPU, replaced every {spec.pod_lifetime_ms // 60_000} min "
                           f"(same name, new UID); allocation snapshot every {spec.alloc_every_ms // 1000} s",
        "device_samples": spec.device_samples,
        "events_published": pub["records"],
        "events_by_topic": pub["by_topic"],
        "publish_s": round(pub["seconds"], 2),
        "publish_records_per_s": round(pub["records"] / pub["seconds"]),
        "publish_bytes_about": round(pub["records"] * record_bytes),
        "broker": BROKER_SETUP[common.PROFILE.name] + "; fresh; registry topics (4 partitions)",
        "broker_rss_bytes_after_publish": pub["broker_rss_bytes"],
        "broker_cpu_s_during_publish": round(pub["broker_cpu_s"], 2),
        "command": "python -m periscope.cli.main " + " ".join(cli["argv"]) + " > file",
        "replay_wall_s": round(wall, 2),
        "replay_read_s": round(read, 2),
        "replay_core_s": round(core, 2),
        "replay_render_json_s": round(render, 2),
        "replay_write_json_s": round(write, 2),
        "replay_cpu_s": round(cli["cpu_s"], 2),
        "replay_peak_rss_bytes": cli["peak_rss_bytes"],
        "broker_cpu_s_during_replay": round(cli["broker_cpu_s"], 2),
        "records_read": cli["records"],
        "events_replayed": cli["events"],
        "device_samples_replayed": cli["device_samples"],
        "cli_summary": cli["summary"],
        "output_bytes": cli["output_bytes"],
        "output_items": scan["items"],
        "output_by_kind": scan["by_kind"],
        "findings": scan["findings"],
        "pods_attributed": scan["pods"],
        "pods_published": pub["pods"],
        "gpus": scan["gpus"],
        "gpus_with_owner": scan["gpus_with_owner"],
    }
    if baseline is not None and baseline.value:
        setup["vs_in_memory_replay"] = {
            baseline.key: rounded(baseline.value),
            "ratio": rounded(speed / baseline.value),
            "note": "same run; the in-memory figure is the static cluster of periscope.devkit.workload "
                    "(no pod churn), protobuf bytes in memory to the JSON document, no broker",
        }
    # With workers, the replaying phase (the core and rendering JSON, in the workers) is one share.
    one = cli["argv"][-2:] == ["--workers", "1"]
    shares = {"reading (start, fetch, decode)": read}
    if one:
        shares |= {"the core": core, "rendering JSON": render}
    else:
        shares["replaying (the core and rendering JSON, in the workers)"] = core + render
    shares["writing JSON"] = write
    top = max(shares, key=lambda k: shares[k])
    items, size = scan["items"], cli["output_bytes"]
    limit = (f"CPU: the command and its workers used {cli['cpu_s'] / wall:.0%} of a core over {wall:.0f} s; "
             + ", ".join(f"{k} {v / wall:.0%}" for k, v in shares.items())
             + f" (most: {top}). Replaying runs at {cli['reported_device_samples_per_s']:,} device samples/s "
             f"and emits {items / spec.device_samples:.1f} JSON items per device sample, "
             f"~{size / max(1, items):.0f} bytes each ({size / 1e9:.2f} GB in all). "
             f"Peak memory {_mem(cli['peak_rss_bytes'])} (the largest process): the events of the range "
             "(telemetry as read, each node's freed once it is replayed); each worker spools its nodes' "
             "items to a file")
    encode_share = encode_s * pub["records"] / pub["seconds"]
    batching = ("one record per batch, as the services send them there (the embedded broker's end offset "
                "counts a multi-record last batch as one record, so replay would miss the rest)"
                if common.PROFILE.one_record_batches else
                "records batched as the services send them to Kafka (linger, 256 KiB batches, lz4)")
    pub_limit = (f"CPU, this Python process: protobuf encoding is {encode_share:.0%} of the time "
                 f"(~{record_bytes:.0f} bytes a record), the rest is aiokafka's per-record send path; "
                 f"{batching}; the broker used {pub['broker_cpu_s']:.1f} CPU s in {pub['seconds']:.0f} s")
    brief = (f"{shape} published to {broker_label()}, then `periscope replay --format json` "
             "in its own process")
    figs = [
        Figure("replay_hour_device_samples_per_s", speed, "device-samples/s", setup, limit, GOAL, [speed],
               brief + "; device samples / the command's wall time"),
        Figure("replay_hour_speedup_vs_realtime", simulated_s / wall, "x", setup,
               "see replay_hour_device_samples_per_s", None, [simulated_s / wall],
               f"{simulated_s:g} s simulated / {wall:.0f} s of `periscope replay` wall time"),
        Figure("replay_hour_publish_records_per_s", pub["records"] / pub["seconds"], "records/s",
               {k: setup[k] for k in ("cluster", "events_published", "events_by_topic", "publish_s",
                                      "publish_bytes_about", "broker", "broker_rss_bytes_after_publish",
                                      "broker_cpu_s_during_publish")},
               pub_limit, None, [pub["records"] / pub["seconds"]],
               f"{pub['records']:,} records of {shape} through periscope.bus.producer.Publisher "
               "(record time = event time)"),
    ]
    details = {"publish": pub, "replay": cli, "output": scan}
    return figs, details
