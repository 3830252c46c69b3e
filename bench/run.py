"""Periscope benchmarks: `make bench` (everything, on both brokers) and `bench/run.py --quick`.

Prints a table and writes bench/results.json: every figure as a top-level number, and under "figures"
its unit, the broker it went through, goal, the repeats its median came from (and their min and max),
the same-run figure it is compared with, its setup and what limits it. Sections:

  replay       offline replay through the pure core (and the core after an hour of history); the JSON
               path of `periscope replay` in a worker process per CPU, paired with one process
  replay_hour  `periscope replay` end to end: an hour of 50 nodes x 8 GPUs published to the broker, then
               rebuilt by the CLI in its own process (JSON to a file)
  probe        probe CPU per tick, 8 GPUs x 64 processes on the fake NVML, publishing to the broker;
               the CPU of one dcgm-exporter scrape's parse + map (8 GPUs, and 8 GPUs x 7 MIG instances)
  api          GET /v1/pods?node= and /v1/gpus latency at 10,000 and 100,000 rows; memory per row
  api_auth     p99 of /v1/pods?node= with access control on (warm review cache) vs off
  api_load     50 concurrent clients on every endpoint incl. /v1/owners (a replay of the broker per
               query), access control on: p99, 429s
  joiner       one Faust worker's sustained rate vs a bare consumer on the same topic; three workers on
               the same backlog (12 input partitions); memory per row
  freshness    probe sample time -> visible in /v1/pods under live load, vs dcgm-exporter + Prometheus;
               one figure per consecutive span of one live run (as many spans as repeats), median
  eos          Faust's exactly_once vs at_least_once on Apache Kafka, a minimal worker (bench/eos.py)

The sections that go through a broker (replay_hour, probe, api_load, joiner, freshness) run once per
broker of --broker (embedded, kafka or both; default both), the embedded broker first, each on a fresh
broker.
Figures measured on the embedded broker keep their names; those measured on Apache Kafka are named
`kafka_<name>`, and every figure says its broker. eos runs on Apache Kafka only.

Options: --quick (small sizes, one repeat), --only SECTION[,SECTION], --broker embedded|kafka|both,
--profile (also profile the joiner with py-spy and the core with cProfile into bench/profile.json),
--markdown (print the table of every figure of an existing results.json and exit), --readme (write the
README's summary table from it and exit), --merge (put the figures of the sections run into the existing
--out, each naming its run, instead of replacing it; --note says why).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Run as a script, this folder would come first on sys.path and its modules would shadow the standard
# library's (profile, used by cProfile): import them as the `bench` package from the repository root.
HERE = Path(__file__).resolve().parent
sys.path[:] = [str(HERE.parent), *(p for p in sys.path if Path(p or ".").resolve() != HERE)]

from bench import common  # noqa: E402
from bench.common import Figure, load, machine, rounded  # noqa: E402
from bench.common import broker as bench_broker  # noqa: E402
from bench.report import markdown, table, with_summary  # noqa: E402

SECTIONS = ("replay", "replay_hour", "probe", "api", "api_auth", "api_load", "joiner", "freshness", "eos")
BROKER_SECTIONS = ("replay_hour", "probe", "api_load", "joiner", "freshness")  # run once per broker
KAFKA_ONLY = ("eos",)  # what only Apache Kafka has (transactions)
BROKERS = ("embedded", "kafka")
JOINER_PARTITIONS = 12  # input partitions of the joiner section: enough for its three workers
# replay_hour's figures, and the replay section's of the same work in memory (no broker) they are
# compared with.
IN_MEMORY_TWINS = {"replay_hour_device_samples_per_s": "replay_parallel_device_samples_per_s",
                   "replay_hour_one_process_device_samples_per_s": "replay_one_process_device_samples_per_s"}
# Figures of a broker section that do not depend on the broker: kept once, under their own name.
BROKERLESS = ("incumbent_staleness_p50_s", "incumbent_staleness_p99_s", "probe_sample_cpu_ms_per_tick",
              "probe_dcgm_scrape_ms", "probe_dcgm_bare_split_ms", "probe_dcgm_scrape_mig_ms",
              "probe_dcgm_bare_split_mig_ms")


def keyed(key: str, broker: str | None) -> str:
    """A figure's name in the results: measured on Apache Kafka, `kafka_<key>`; else the key itself."""
    return f"kafka_{key}" if broker == "kafka" and key not in BROKERLESS else key


@dataclass(frozen=True)
class Plan:
    replay_nodes: int
    replay_ticks: int
    hour_nodes: int  # replay_hour: nodes x 8 GPUs x hour_s of 1 s ticks
    hour_s: int
    steady_nodes: int
    steady_min: int
    steady_measure_min: int
    probe_ticks: int
    probe_tick_s: float
    probe_span_s: float
    api_sizes: tuple[int, ...]
    api_history_min: int
    api_requests: int
    api_full_lists: int
    joiner_nodes: int
    joiner_ticks: int
    live_nodes: int
    markers: int
    real_probes: int
    fresh_warm_s: float
    fresh_span_s: float
    hop_n: int
    outage_s: float  # broker pause in the freshness run (0: none); catch-up time from resume to fresh
    eos_nodes: int  # eos: telemetry backlog of eos_nodes x eos_ticks records
    eos_ticks: int
    eos_live_rate: int  # records/s in the live phase, for eos_live_s
    eos_live_s: float
    repeats: int
    # The joiner/bare-loop pairs behind the goal's ratio: on a shared machine the ratio of one pair
    # moved by 0.23 between pairs of one run (1.13-1.36, three pairs on 2026-12-01), more than its
    # distance to the goal; the median of five is steadier.
    joiner_pairs: int


FULL = Plan(replay_nodes=32, replay_ticks=300, hour_nodes=50, hour_s=3600, steady_nodes=2, steady_min=60,
            steady_measure_min=5,
            probe_ticks=100, probe_tick_s=0.5, probe_span_s=12, api_sizes=(10_000, 100_000),
            api_history_min=60, api_requests=100, api_full_lists=3, joiner_nodes=50, joiner_ticks=250,
            live_nodes=100, markers=10, real_probes=5,
            fresh_warm_s=10, fresh_span_s=60, hop_n=30, outage_s=60, eos_nodes=50, eos_ticks=200,
            eos_live_rate=200, eos_live_s=10, repeats=3, joiner_pairs=5)
# Quick freshness spans 30 s: the real probes' steady rows are published at the joiner's 5 s heartbeat,
# so 2 probes give about a dozen headline samples (20 s gave 4-6 once a worker on Apache Kafka had joined
# its group, under the 5 the section needs).
QUICK = Plan(replay_nodes=8, replay_ticks=120, hour_nodes=4, hour_s=300, steady_nodes=1, steady_min=10,
             steady_measure_min=2,
             probe_ticks=20, probe_tick_s=0.25, probe_span_s=2.5, api_sizes=(10_000,), api_history_min=10,
             api_requests=20, api_full_lists=1, joiner_nodes=10, joiner_ticks=60, live_nodes=20, markers=5,
             real_probes=2,
             fresh_warm_s=4, fresh_span_s=30, hop_n=8, outage_s=0, eos_nodes=10, eos_ticks=100,
             eos_live_rate=50, eos_live_s=5, repeats=1, joiner_pairs=1)


class Bench:
    """Runs sections; a broker section runs on the broker kind `self.broker` (set per run by main)."""

    def __init__(self, plan: Plan, tmp: Path) -> None:
        self.plan = plan
        self.tmp = tmp
        self.figures: dict[str, Figure] = {}
        self.details: dict[str, Any] = {}
        self.broker: str | None = None  # the broker kind of the section now running; None: no broker

    def key(self, key: str) -> str:
        return keyed(key, self.broker)

    def add(self, figures: list[Figure]) -> None:
        """Name each figure for the broker it went through (and the same-run figure it is compared
        with, when that came from the same section); figures that do not depend on it are kept once."""
        own = {f.key for f in figures}
        for f in figures:
            if f.key in BROKERLESS and f.key in self.figures:
                continue
            if f.key not in BROKERLESS:
                f.broker = self.broker
            if f.baseline in own:
                f.baseline = self.key(f.baseline)
            f.key = self.key(f.key)
            self.figures[f.key] = f

    def detail(self, name: str, value: Any) -> None:
        self.details[self.key(name)] = value

    def dir(self, section: str) -> Path:
        """A directory of its own for a section on the current broker (service logs, data dirs)."""
        path = self.tmp / (section if self.broker is None else f"{section}-{self.broker}")
        path.mkdir(parents=True, exist_ok=True)
        return path

    def in_memory_baselines(self, figures: list[Figure]) -> None:
        """Compare replay_hour's figures with the replay section's of the same run (when it ran): the
        same work in memory, without a broker."""
        for f in figures:
            twin = IN_MEMORY_TWINS.get(f.key)
            if twin is not None and twin in self.figures:
                f.baseline = twin

    def replay(self) -> None:
        from bench import replay

        p = self.plan
        self.add(replay.run(p.replay_nodes, p.replay_ticks, p.repeats))
        self.add(replay.parallel(p.replay_nodes, p.replay_ticks, p.repeats))
        self.add(list(replay.steady_state(p.steady_nodes, p.steady_min, p.steady_measure_min,
                                           repeats=p.repeats)))

    def replay_hour(self) -> None:
        from bench import replay_hour
        from periscope.devkit.workload import ClusterSpec

        p = self.plan
        spec = ClusterSpec(nodes=p.hour_nodes, duration_ms=p.hour_s * 1000,
                           start_ms=replay_hour.recent_start_ms(p.hour_s * 1000))
        figures, details = replay_hour.run(spec, self.dir("replay-hour"),
                                           baseline=self.figures.get("replay_parallel_device_samples_per_s"),
                                           repeats=p.repeats)
        self.in_memory_baselines(figures)
        self.add(figures)
        self.detail("replay_hour", _round_tree(details))

    def probe(self) -> None:
        from bench import probe

        p = self.plan
        if "probe_sample_cpu_ms_per_tick" not in self.figures:  # the same on every broker: once
            fig, breakdown = probe.sample_cpu(self.tmp / "probe-sample", p.probe_ticks, max(3, p.repeats))
            self.add([fig])
            self.details["probe_sample_breakdown_ms"] = {k: rounded(v) for k, v in breakdown.items()}
            from bench import dcgm_scrape  # parse + map of one dcgm-exporter scrape: no broker either

            self.add(dcgm_scrape.run(p.probe_ticks, max(3, p.repeats)))
        with bench_broker(self.tmp) as broker:
            self.add([probe.service_cpu(self.dir("probe-service"), broker.bootstrap,
                                        p.probe_tick_s, warm_s=3, span_s=p.probe_span_s)])

    def api(self) -> None:
        from bench import api

        p = self.plan
        figures, by_size = api.run(p.api_sizes, p.api_history_min, p.api_requests, p.repeats,
                                   p.api_full_lists)
        self.add(figures)
        self.details["api_by_rows"] = _round_tree(by_size)

    def api_auth(self) -> None:
        from bench import api_auth

        p = self.plan
        figures, details = api_auth.run(p.api_sizes[0], p.api_history_min, 5 * p.api_requests, 2 * p.repeats)
        self.add(figures)
        self.details["api_auth"] = _round_tree(details)

    def api_load(self) -> None:
        from bench import api_load, replay_hour
        from periscope.devkit.workload import ClusterSpec

        p = self.plan
        # History for /v1/owners to replay, ending a minute ago: Apache Kafka would delete records
        # stamped with the generator's fixed epoch (weeks back) by retention while they are read.
        spec = ClusterSpec(nodes=4, duration_ms=600_000, start_ms=replay_hour.recent_start_ms(600_000))
        with bench_broker(self.tmp) as broker:
            asyncio.run(replay_hour.publish(broker.bootstrap, spec))
            seconds = 10.0 if p is QUICK else 30.0
            figures, details = api_load.run(p.api_sizes[0], p.api_history_min, broker.bootstrap,
                                            spec.start_ms, spec.duration_ms, seconds)
        for f in figures:
            if f.key == "api_load_p99_ms":  # the same clients and endpoints without /v1/owners
                f.baseline = "api_load_without_owners_p99_ms"
        self.add(figures)
        self.detail("api_load", _round_tree(details))

    def joiner(self) -> None:
        from bench import joiner

        p = self.plan
        with bench_broker(self.tmp, partitions=JOINER_PARTITIONS) as broker:
            figures, details = asyncio.run(joiner.throughput(
                broker.bootstrap, broker.pid, self.dir("joiner"), p.joiner_nodes, p.joiner_ticks, p.repeats,
                timeout_s=240))
        rss = next(f for f in figures if f.key == "joiner_bytes_per_row")
        figures.remove(rss)  # the steady-state figure from the replay section is the headline
        rss.key = "joiner_rss_bytes_per_row"
        self.add([*figures, rss])
        self.detail("joiner_runs", details["runs"])
        self.detail("joiner_three_worker_runs", details["three_worker_runs"])
        from bench import joiner_baseline  # the joiner against a bare loop over its own parts

        with bench_broker(self.tmp, partitions=JOINER_PARTITIONS) as broker:
            figures, details = asyncio.run(joiner_baseline.compare(
                broker.bootstrap, broker.pid, self.dir("joiner-baseline"), p.joiner_nodes, p.joiner_ticks,
                p.joiner_pairs, timeout_s=240))
        self.add(figures)
        self.detail("joiner_bare_loop_pairs", details["pairs"])

    def freshness(self) -> None:
        from bench import freshness
        from bench.outage import catch_up

        p = self.plan
        rate = self.figures.get(self.key("joiner_device_samples_per_s"))
        nodes = p.live_nodes
        if rate is not None and rate.value:
            nodes = max(p.markers, min(p.live_nodes, int(0.5 * rate.value / 8)))  # at most half of capacity
        with bench_broker(self.tmp) as broker:
            outage = None
            if p.outage_s and broker.pid is not None:
                pid = broker.pid

                def outage(url: str, namespace: str) -> Any:
                    return catch_up(pid, url, namespace, p.outage_s)

            figures, details = asyncio.run(freshness.run(
                broker.bootstrap, self.dir("freshness"), nodes, p.markers, p.real_probes, p.fresh_warm_s,
                p.fresh_span_s, outage=outage, spans=p.repeats))
            hops = {f"fetch_max_wait_ms={w}":
                    rounded(asyncio.run(freshness.hop_latency(broker.bootstrap, w, p.hop_n)))
                    for w in (500, 20)}
        for f in figures:
            if f.key.startswith("freshness_p"):
                f.setup["broker_hop_median_ms"] = hops
                f.limit += (f"; one broker hop (produce -> waiting consumer) takes "
                            f"{hops['fetch_max_wait_ms=500']} ms at aiokafka's default "
                            f"fetch_max_wait_ms=500 on {common.broker_label()}, "
                            f"{hops['fetch_max_wait_ms=20']} ms at 20")
        self.add(figures)
        self.detail("freshness_ages_s", details["ages_s"])

    def eos(self) -> None:
        from bench import eos

        p = self.plan
        with bench_broker(self.tmp) as broker:
            figures, details = asyncio.run(eos.compare(
                broker.bootstrap, broker.pid, self.dir("eos"), p.eos_nodes, p.eos_ticks, p.repeats,
                p.eos_live_rate, p.eos_live_s))
        self.add(figures)
        self.details["eos_runs"] = _round_tree(details)

    def profile(self) -> dict[str, Any]:
        from bench import hotspots, joiner

        p = self.plan
        out: dict[str, Any] = {"core_steady_state": hotspots.core_profile()}
        with bench_broker(self.tmp) as broker:
            load = asyncio.run(joiner.preload(broker.bootstrap, p.joiner_nodes, p.joiner_ticks,
                                              joiner.NodeShape()))
            out["joiner_worker"] = asyncio.run(hotspots.joiner_profile(
                broker.bootstrap, self.tmp, load["device_samples"], timeout_s=300))
        return out


def _source_state() -> dict[str, Any]:
    """The commit measured, and which project files differed from it (uncommitted work)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=HERE.parent, capture_output=True, text=True, timeout=10,
                                  check=False).stdout.rstrip("\n")
        except (OSError, subprocess.SubprocessError):
            return ""

    changed = [line[3:] for line in git("status", "--porcelain", "--", "periscope", "services").splitlines()]
    return {"commit": git("rev-parse", "--short", "HEAD").strip(), "uncommitted": sorted(changed)}


def _round_tree(x: Any) -> Any:
    if isinstance(x, float):
        return rounded(x)
    if isinstance(x, dict):
        return {k: _round_tree(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round_tree(v) for v in x]
    return x


def _brokers(choice: str | None) -> tuple[list[str], str]:
    """The broker kinds to run on, and why Apache Kafka was left out (empty if it was not). Without
    --broker both are used where Apache Kafka can run here; asked for by name, it must."""
    from periscope.devkit.apache_kafka import KafkaUnavailable, distribution

    kinds = list(BROKERS) if choice in (None, "both") else [choice]
    if "kafka" in kinds:
        try:
            distribution()
        except KafkaUnavailable as e:
            if choice is not None:
                raise
            return ["embedded"], str(e)
    return kinds, ""


def _steps(only: list[str], brokers: list[str]) -> list[tuple[str, str | None]]:
    """(section, broker) in run order: each broker section on each broker in turn (so both brokers'
    figures of a section are taken close together), the others once."""
    out: list[tuple[str, str | None]] = []
    for s in SECTIONS:
        if s not in only:
            continue
        if s in KAFKA_ONLY:
            out += [(s, "kafka")] if "kafka" in brokers else []
        elif s in BROKER_SECTIONS:
            out += [(s, b) for b in brokers]
        else:
            out.append((s, None))
    return out


def compared(figures: dict[str, dict[str, Any]]) -> None:
    """Resolve each figure's same-run baseline to its value and ratio, and set beside each Apache Kafka
    figure the embedded broker's figure of the same name, when both ran."""
    def against(key: str, value: float | None) -> dict[str, Any] | None:
        other = figures.get(key)
        if other is None or other["value"] is None:
            return None
        ratio = value / other["value"] if value is not None and other["value"] else None
        return {"figure": key, "value": other["value"], "ratio": rounded(ratio)}

    for key, f in figures.items():
        if isinstance(f.get("baseline"), str):
            f["baseline"] = against(f["baseline"], f["value"])
        if f.get("broker") == "kafka" and key.startswith("kafka_"):
            f["vs_embedded"] = against(key.removeprefix("kafka_"), f["value"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    ap.add_argument("--only", default="", help=f"comma-separated sections of {','.join(SECTIONS)}")
    ap.add_argument("--broker", choices=[*BROKERS, "both"], default=None,
                    help="the broker(s) the broker sections run on (default: both, where Kafka can run)")
    ap.add_argument("--profile", action="store_true", help="also profile the joiner and the core")
    ap.add_argument("--out", default=str(HERE / "results.json"), help="where to write the results")
    ap.add_argument("--markdown", action="store_true",
                    help="print the table of every figure in --out and exit")
    ap.add_argument("--readme", action="store_true",
                    help="write the README's summary table from --out and exit")
    ap.add_argument("--merge", action="store_true",
                    help="put this run's figures into the existing --out (a section run again) instead of "
                         "replacing it; each figure keeps the run it came from")
    ap.add_argument("--note", default="", help="with --merge: why the sections ran again (kept with the run)")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad input, with its usage line
        return int(e.code or 0)
    if args.markdown:
        try:
            print(markdown(json.loads(Path(args.out).read_text()), _shown(Path(args.out))))
        except (OSError, ValueError) as e:
            print(f"bench: cannot read {args.out}: {e}", file=sys.stderr)
            return 2
        return 0
    if args.readme:
        return _write_readme(Path(args.out))
    only = [s for s in args.only.split(",") if s] or list(SECTIONS)
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        print(f"bench: unknown section {unknown[0]!r} (sections: {', '.join(SECTIONS)})", file=sys.stderr)
        return 2
    try:
        brokers, kafka_skipped = _brokers(args.broker)
    except Exception as e:  # KafkaUnavailable: one line saying what is missing
        print(f"bench: {e}", file=sys.stderr)
        return 2
    if kafka_skipped:
        print(f"bench: Apache Kafka left out: {kafka_skipped}", file=sys.stderr)
    plan = QUICK if args.quick else FULL
    load_before = load()
    started = time.monotonic()
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="periscope-bench-") as tmp:
        bench = Bench(plan, Path(tmp))
        steps = _steps(only, brokers)
        for name, kind in steps:
            label = name if kind is None else f"{name} [{kind}]"
            t = time.monotonic()
            print(f"bench: {label} ...", file=sys.stderr, flush=True)
            bench.broker = kind
            if kind is not None:
                common.use_broker(kind)  # type: ignore[arg-type]
            try:
                getattr(bench, name)()
            except Exception as e:  # one broken section must not hide the others' figures
                errors[name if kind is None else f"{name}[{kind}]"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
            print(f"bench: {label} done in {time.monotonic() - t:.1f}s", file=sys.stderr, flush=True)
        bench.broker = None
        common.use_broker(brokers[0])  # type: ignore[arg-type]
        prof = bench.profile() if args.profile else None
    wall = time.monotonic() - started
    figures = {k: f.as_json() for k, f in bench.figures.items()}
    compared(figures)
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "mode": "quick" if args.quick else "full",
        "sections": only,
        "brokers": {b: _broker_setup(b) for b in brokers if any(kind == b for _, kind in steps)},
        "kafka_left_out": kafka_skipped or None,
        "wall_s": round(wall, 1),
        "machine": {**machine(), "load_before": load_before, "load_after": load()},
        "source": _source_state(),
        **{k: rounded(f.value) for k, f in bench.figures.items()},
        "figures": figures,
        "details": bench.details,
        "errors": errors,
    }
    if args.merge and Path(args.out).exists():
        results = merged(json.loads(Path(args.out).read_text()), results, args.note)
    Path(args.out).write_text(json.dumps(results, indent=1, default=str) + "\n")
    if prof is not None:
        (HERE / "profile.json").write_text(json.dumps(prof, indent=1, default=str) + "\n")
    print(table(results))
    print(f"\nwrote {args.out} in {wall:.0f}s" + (f"; errors in: {', '.join(errors)}" if errors else ""))
    return 1 if errors else 0


def merged(old: dict[str, Any], new: dict[str, Any], note: str = "") -> dict[str, Any]:
    """`old` results with `new`'s figures and details in place of theirs: each figure taken names its run
    (`setup.run`), and `partial_runs` lists the runs merged in, newest first, with `note`."""
    run = {k: new[k] for k in ("date", "mode", "machine", "source")}
    out = {**old, "figures": dict(old.get("figures", {})), "details": dict(old.get("details", {}))}
    for key, fig in new.get("figures", {}).items():
        setup = fig.get("setup") if isinstance(fig.get("setup"), dict) else {}
        out["figures"][key] = {**fig, "setup": {**setup, "run": run}}
        out[key] = fig.get("value")
    out["details"].update(new.get("details", {}))
    entry = {**run, "sections": new.get("sections", []), "wall_s": new.get("wall_s"),
             "errors": new.get("errors", {}), "note": note, "figures": sorted(new.get("figures", {}))}
    out["partial_runs"] = [entry, *old.get("partial_runs", [])]
    return out


def _write_readme(results: Path, readme: Path = HERE.parent / "README.md") -> int:
    """Rewrite the README's summary table from `results` (bench/report.py: HEADLINES)."""
    try:
        text = with_summary(readme.read_text(), json.loads(results.read_text()))
    except (OSError, ValueError) as e:
        print(f"bench: cannot write the README's table from {results}: {e}", file=sys.stderr)
        return 2
    readme.write_text(text)
    print(f"bench: wrote the summary table of {readme.name} from {_shown(results)}")
    return 0


def _shown(path: Path) -> str:
    """A results file as the README names it: relative to the repository when it lies inside."""
    try:
        return str(path.resolve().relative_to(HERE.parent))
    except ValueError:
        return str(path)


def _broker_setup(kind: str) -> str:
    if kind == "embedded":
        return "the embedded broker (Tansu, memory storage), a fresh one per section"
    from periscope.devkit.apache_kafka import _HEAP_MB, kafka_version

    return (f"Apache Kafka {kafka_version()} (KRaft, one node that is broker and controller, {_HEAP_MB} MiB "
            "heap, log on the local disk), a fresh one per section")


if __name__ == "__main__":
    sys.exit(main())
