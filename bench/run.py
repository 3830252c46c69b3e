"""Periscope benchmarks: `make bench` (everything, a few minutes) and `bench/run.py --quick` (about 90 s).

Prints a table and writes bench/results.json: every figure as a top-level number, and under "figures"
its unit, goal, the repeats its median came from, its setup and what limits it. Sections:

  replay       offline replay through the pure core (and the core after an hour of history)
  replay_hour  `periscope replay` end to end: an hour of 50 nodes x 8 GPUs published to the embedded
               broker, then rebuilt by the CLI in its own process (JSON to a file)
  probe        probe CPU per tick, 8 GPUs x 64 processes on the fake NVML
  api          GET /v1/pods?node= and /v1/gpus latency at 10,000 and 100,000 rows; memory per row
  api_auth     p99 of /v1/pods?node= with access control on (warm review cache) vs off
  api_load     50 concurrent clients on every endpoint incl. /v1/owners, access control on: p99, 429s
  joiner       one Faust worker's sustained rate vs a bare consumer on the same topic; two workers on the
               same backlog; memory per row
  freshness    probe sample time -> visible in /v1/pods under live load, vs dcgm-exporter + Prometheus

Options: --quick (small sizes, one repeat), --only SECTION[,SECTION], --profile (also profile the joiner
with py-spy and the core with cProfile into bench/profile.json), --markdown (print the README table of
an existing results.json and exit).
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Run as a script, this folder would come first on sys.path and its modules would shadow the standard
# library's (profile, used by cProfile): import them as the `bench` package from the repository root.
HERE = Path(__file__).resolve().parent
sys.path[:] = [str(HERE.parent), *(p for p in sys.path if Path(p or ".").resolve() != HERE)]

from bench.common import Figure, machine, rounded  # noqa: E402
from bench.common import broker as bench_broker  # noqa: E402
from bench.report import markdown, table  # noqa: E402

SECTIONS = ("replay", "replay_hour", "probe", "api", "api_auth", "api_load", "joiner", "freshness")


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
    repeats: int


FULL = Plan(replay_nodes=32, replay_ticks=300, hour_nodes=50, hour_s=3600, steady_nodes=2, steady_min=60,
            steady_measure_min=5,
            probe_ticks=100, probe_tick_s=0.5, probe_span_s=12, api_sizes=(10_000, 100_000),
            api_history_min=60, api_requests=100, api_full_lists=3, joiner_nodes=50, joiner_ticks=250,
            live_nodes=100, markers=10, real_probes=5,
            fresh_warm_s=10, fresh_span_s=60, hop_n=30, outage_s=60, repeats=3)
QUICK = Plan(replay_nodes=8, replay_ticks=120, hour_nodes=4, hour_s=300, steady_nodes=1, steady_min=10,
             steady_measure_min=2,
             probe_ticks=20, probe_tick_s=0.25, probe_span_s=2.5, api_sizes=(10_000,), api_history_min=10,
             api_requests=20, api_full_lists=1, joiner_nodes=10, joiner_ticks=60, live_nodes=20, markers=5,
             real_probes=2,
             fresh_warm_s=4, fresh_span_s=14, hop_n=8, outage_s=0, repeats=1)


class Bench:
    def __init__(self, plan: Plan, tmp: Path) -> None:
        self.plan = plan
        self.tmp = tmp
        self.figures: dict[str, Figure] = {}
        self.details: dict[str, Any] = {}

    def add(self, figures: list[Figure]) -> None:
        for f in figures:
            self.figures[f.key] = f

    def replay(self) -> None:
        from bench import replay

        p = self.plan
        self.add(replay.run(p.replay_nodes, p.replay_ticks, p.repeats))
        self.add(replay.parallel(p.replay_nodes, p.replay_ticks, p.repeats))
        self.add(list(replay.steady_state(p.steady_nodes, p.steady_min, p.steady_measure_min)))

    def replay_hour(self) -> None:
        from bench import replay_hour
        from periscope.replay.synthetic import ClusterSpec

        p = self.plan
        spec = ClusterSpec(nodes=p.hour_nodes, duration_ms=p.hour_s * 1000)
        figures, details = replay_hour.run(spec, self.tmp / "replay-hour",
                                           baseline=self.figures.get("replay_parallel_device_samples_per_s"),
                                           repeats=p.repeats)
        self.add(figures)
        self.details["replay_hour"] = _round_tree(details)

    def probe(self) -> None:
        from bench import probe

        p = self.plan
        fig, breakdown = probe.sample_cpu(self.tmp / "probe-sample", p.probe_ticks, max(3, p.repeats))
        self.add([fig])
        with bench_broker(self.tmp) as broker:
            self.add([probe.service_cpu(self.tmp / "probe-service", broker.bootstrap, p.probe_tick_s,
                                        warm_s=3, span_s=p.probe_span_s)])
        self.details["probe_sample_breakdown_ms"] = {k: rounded(v) for k, v in breakdown.items()}

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
        from periscope.replay.synthetic import ClusterSpec

        p = self.plan
        spec = ClusterSpec(nodes=4, duration_ms=600_000)  # history for /v1/owners to replay
        with bench_broker(self.tmp) as broker:
            asyncio.run(replay_hour.publish(broker.bootstrap, spec))
            seconds = 10.0 if p is QUICK else 30.0
            figures, details = api_load.run(p.api_sizes[0], p.api_history_min, broker.bootstrap,
                                            spec.start_ms, spec.duration_ms, seconds)
        self.add(figures)
        self.details["api_load"] = _round_tree(details)

    def joiner(self) -> None:
        from bench import joiner

        p = self.plan
        with bench_broker(self.tmp) as broker:
            figures, details = asyncio.run(joiner.throughput(
                broker.bootstrap, broker.pid, self.tmp, p.joiner_nodes, p.joiner_ticks, p.repeats,
                timeout_s=240))
        rss = next(f for f in figures if f.key == "joiner_bytes_per_row")
        figures.remove(rss)  # the steady-state figure from the replay section is the headline
        rss.key = "joiner_rss_bytes_per_row"
        self.add([*figures, rss])
        self.details["joiner_runs"] = details["runs"]
        self.details["joiner_two_worker_runs"] = details["two_worker_runs"]
        from bench import joiner_baseline  # the joiner against a bare loop over its own parts

        with bench_broker(self.tmp) as broker:
            figures, details = asyncio.run(joiner_baseline.compare(
                broker.bootstrap, broker.pid, self.tmp, p.joiner_nodes, p.joiner_ticks, p.repeats,
                timeout_s=240))
        self.add(figures)
        self.details["joiner_bare_loop_pairs"] = details["pairs"]

    def freshness(self) -> None:
        from bench import freshness
        from bench.outage import catch_up

        p = self.plan
        rate = self.figures.get("joiner_device_samples_per_s")
        nodes = p.live_nodes
        if rate is not None and rate.value:
            nodes = max(p.markers, min(p.live_nodes, int(0.5 * rate.value / 8)))  # at most half of capacity
        with bench_broker(self.tmp) as broker:
            outage = None
            if p.outage_s and broker.pid is not None:
                pid = broker.pid

                def outage(url: str, namespace: str) -> Any:
                    return catch_up(pid, url, namespace, p.outage_s)

            figures, details = asyncio.run(freshness.run(broker.bootstrap, self.tmp, nodes, p.markers,
                                                         p.real_probes, p.fresh_warm_s, p.fresh_span_s,
                                                         outage=outage))
            hops = {f"fetch_max_wait_ms={w}":
                    rounded(asyncio.run(freshness.hop_latency(broker.bootstrap, w, p.hop_n)))
                    for w in (500, 20)}
        for f in figures:
            if f.key.startswith("freshness_p"):
                f.setup["broker_hop_median_ms"] = hops
                f.limit += (f"; one broker hop (produce -> waiting consumer) takes "
                            f"{hops['fetch_max_wait_ms=500']} ms at aiokafka's default "
                            "fetch_max_wait_ms=500 on the embedded broker, "
                            f"{hops['fetch_max_wait_ms=20']} ms at 20")
        self.add(figures)
        self.details["freshness_ages_s"] = details["ages_s"]

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one repeat (about 90 s)")
    ap.add_argument("--only", default="", help=f"comma-separated sections of {','.join(SECTIONS)}")
    ap.add_argument("--profile", action="store_true", help="also profile the joiner and the core")
    ap.add_argument("--out", default=str(HERE / "results.json"), help="where to write the results")
    ap.add_argument("--markdown", action="store_true", help="print the README table of --out and exit")
    args = ap.parse_args(argv)
    if args.markdown:
        try:
            print(markdown(json.loads(Path(args.out).read_text())))
        except (OSError, ValueError) as e:
            print(f"bench: cannot read {args.out}: {e}", file=sys.stderr)
            return 2
        return 0
    only = [s for s in args.only.split(",") if s] or list(SECTIONS)
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        print(f"bench: unknown section {unknown[0]!r} (sections: {', '.join(SECTIONS)})", file=sys.stderr)
        return 2
    plan = QUICK if args.quick else FULL
    started = time.monotonic()
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="periscope-bench-") as tmp:
        bench = Bench(plan, Path(tmp))
        steps: list[tuple[str, Callable[[], None]]] = [(s, getattr(bench, s)) for s in SECTIONS if s in only]
        for name, step in steps:
            t = time.monotonic()
            print(f"bench: {name} ...", file=sys.stderr, flush=True)
            try:
                step()
            except Exception as e:  # one broken section must not hide the others' figures
                errors[name] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
            print(f"bench: {name} done in {time.monotonic() - t:.1f}s", file=sys.stderr, flush=True)
        prof = bench.profile() if args.profile else None
    wall = time.monotonic() - started
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "mode": "quick" if args.quick else "full",
        "sections": only,
        "wall_s": round(wall, 1),
        "machine": machine(),
        "source": _source_state(),
        **{k: rounded(f.value) for k, f in bench.figures.items()},
        "figures": {k: f.as_json() for k, f in bench.figures.items()},
        "details": bench.details,
        "errors": errors,
    }
    Path(args.out).write_text(json.dumps(results, indent=1, default=str) + "\n")
    if prof is not None:
        (HERE / "profile.json").write_text(json.dumps(prof, indent=1, default=str) + "\n")
    print(table(results))
    print(f"\nwrote {args.out} in {wall:.0f}s" + (f"; errors in: {', '.join(errors)}" if errors else ""))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
