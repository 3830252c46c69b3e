"""`periscope up` and `periscope report` (CONTRACTS.md): every input is checked before anything starts."""

from __future__ import annotations

import errno
import json
import os
import socket
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from click.decorators import FC

from periscope.cli.errors import InputError
from periscope.cli.terminal import shown
from periscope.core.duration import parse_duration_ms
from periscope.sim.cluster.model import ClusterModel
from periscope.sim.controlplane.build import ControlPlaneUnavailable, check_buildable
from periscope.sim.report.accounting import compare
from periscope.sim.report.score import ReportOptions, Row, Truth, build_report
from periscope.sim.report.text import format_report, live_snapshots, read_jsonl
from periscope.sim.scenario import ScenarioError, builtin_names, load_scenario
from periscope.sim.up import UpOptions, run_up, snapshots_path, usage_path
from periscope.sim.up.limits import DEFAULT_LIMITS, LimitExceeded, UpLimits, check_limits


# click's own checks (IntRange, Path(writable=True)) word a failure as "Invalid value for ..." and neither
# try a port nor look for a new file's directory; these keep the one-line `<flag> <value>: <problem>` form.
def _duration(flag: str, text: str) -> int:
    try:
        ms = parse_duration_ms(text)
    except ValueError as e:
        raise InputError(f"{flag} {shown(text)}: {e}") from None
    if ms <= 0:
        raise InputError(f"{flag} {shown(text)}: must be longer than 0s")
    return ms


def _port_free(flag: str, port: int) -> None:
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            why = "already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
            raise InputError(
                f"{flag} {port}: 127.0.0.1:{port} is {why} (choose another, or 0 for any)"
            ) from None


def _writable(flag: str, path: Path) -> None:
    try:
        parent = path.resolve().parent
        is_dir, parent_is_dir = path.is_dir(), parent.is_dir()
    except OSError as e:  # a name too long, a loop of links
        raise InputError(f"{flag} {path}: {e.strerror or e}") from None
    if is_dir:
        raise InputError(f"{flag} {path}: is a directory, not a file")
    if not parent_is_dir:
        raise InputError(f"{flag} {path}: directory {parent} does not exist")
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise InputError(f"{flag} {path}: cannot write ({e.strerror or e})") from None


def _port_option(flag: str, default: int, what: str) -> Callable[[FC], FC]:
    """`--api-port` and `--broker-port`: one port on 127.0.0.1, 0 for any free one."""
    text = f"Port of {what} on 127.0.0.1 (0 = any free port)."
    return click.option(flag, type=click.IntRange(0, 65535), default=default, help=text)


def _kafka_toolchain() -> None:
    """`--broker kafka` without java (or, before the first use, mvn) is one line naming what is missing."""
    from periscope.devkit.apache_kafka import KafkaUnavailable, distribution

    try:
        distribution()
    except KafkaUnavailable as e:
        raise InputError(f"--broker kafka: {e}") from None


@click.command("up", context_settings={"show_default": True})
@click.option(
    "--scenario",
    default="demo",
    metavar="NAME|PATH",
    help=f"Built-in scenario ({', '.join(builtin_names())}) or a scenario YAML file.",
)
@_port_option("--api-port", 8080, "the HTTP API")
@_port_option("--broker-port", 9092, "the Kafka broker")
@click.option(
    "--broker",
    type=click.Choice(("embedded", "kafka")),
    default="embedded",
    help="The broker to run: the embedded one (no JVM, in memory) or Apache Kafka (KRaft) from the "
    "project's cached distribution (needs java; mvn on first use).",
)
@click.option(
    "--speed",
    type=click.FloatRange(0, 100, min_open=True),
    default=1.0,
    help="Run the simulated clock this many times faster than real time.",
)
@click.option("--idle-window", default="10m", help="Window for allocated-but-idle.")
@click.option(
    "--retention",
    default="1h",
    metavar="DURATION|0",
    help="History the broker keeps (replay and usage reach this far back). Apache Kafka deletes older "
    "records; the embedded broker cannot, so it is replaced by a fresh one this often (the services restart "
    "for a few seconds), which bounds its memory. 0 keeps everything (memory grows for as long as up runs).",
)
@click.option(
    "--idle-threshold",
    type=click.FloatRange(0, 100),
    default=5.0,
    help="Mean util (%) under which a held GPU counts as idle.",
)
@click.option(
    "--truth",
    type=click.Path(path_type=Path),
    help="Write the ground truth as JSON lines here (and the API, sampled per tick, beside it).",
)
@click.option("--exit-at-end", is_flag=True, help="Stop everything when the scenario's duration ends.")
@click.option(
    "--api-auth",
    is_flag=True,
    help="Access control on the API: bearer tokens of the scenario's users, checked with TokenReview and "
    "SubjectAccessReview against the simulated apiserver, or the real one with --apiserver kube "
    "(try --scenario tenants).",
)
@click.option(
    "--apiserver",
    type=click.Choice(("sim", "kube")),
    default="sim",
    help="sim: the simulated apiserver. kube: a real kube-apiserver with etcd, built from source with Go "
    "(cached after the first build), holds the simulated cluster; the watcher and --api-auth use it.",
)
@click.option(
    "--log-level",
    type=click.Choice(("debug", "info", "warning", "error"), case_sensitive=False),
    default="warning",
    help="Log level of the services (their lines are prefixed [name]).",
)
@click.option(
    "--secure",
    is_flag=True,
    help="Serve the broker only over TLS (fresh certificates). Embedded: mutual TLS through a proxy, one "
    "certificate for every service; NOT protected: the embedded broker itself still answers in plaintext, "
    "with no certificate, on a loopback port of its own, so any process on this machine can read and write "
    "every topic there (the network cannot). Kafka: TLS + SASL/SCRAM-SHA-512 on Kafka's own listener (no "
    "plaintext port), a principal per service with ACLs; prints `kafka credentials: DIR`.",
)
@click.option("--max-nodes", type=click.IntRange(1, 10_000), default=DEFAULT_LIMITS.nodes,
              help="Refuse a scenario with more nodes (each is a probe process of about 70 MiB).")
@click.option("--max-gpus", type=click.IntRange(1, 1_000_000), default=DEFAULT_LIMITS.gpus,
              help="Refuse a scenario with more GPUs in all.")
@click.option("--max-pods", type=click.IntRange(1, 10_000_000), default=DEFAULT_LIMITS.pods,
              help="Refuse a scenario with more pods.")
@click.pass_context
def up(ctx: click.Context, idle_window: str, retention: str, log_level: str, max_nodes: int, max_gpus: int,
       max_pods: int, **flags: Any) -> None:
    """Run the embedded stack (broker, probes, watcher, joiner, API) against a simulated cluster."""
    opts = UpOptions(**flags, log_level=log_level.upper())  # the other flags are UpOptions' own fields
    try:
        scenario = load_scenario(opts.scenario)
        check_limits(scenario, UpLimits(nodes=max_nodes, gpus=max_gpus, pods=max_pods))
        model = ClusterModel(scenario)
    except (ScenarioError, LimitExceeded) as e:
        raise InputError(str(e)) from None
    if opts.api_auth and not any(u.cluster for u in model.scenario.users):
        raise InputError(f"--api-auth: scenario {model.scenario.name} has no user with cluster: true")
    if opts.apiserver == "kube" and opts.speed != 1:
        raise InputError(f"--apiserver kube: --speed {opts.speed:g}: a real apiserver stamps objects "
                         "with real time, so the simulated clock must run at speed 1")
    if opts.apiserver == "kube":
        try:
            check_buildable()
        except ControlPlaneUnavailable as e:
            raise InputError(f"--apiserver kube: {e}") from None
    window_ms = _duration("--idle-window", idle_window)
    retention_ms = 0 if retention.strip() == "0" else _duration("--retention", retention)
    if 0 < retention_ms < 60_000:
        raise InputError(f"--retention {shown(retention)}: at least 1m (or 0 to keep everything)")
    _port_free("--api-port", opts.api_port)
    _port_free("--broker-port", opts.broker_port)
    if opts.api_port and opts.api_port == opts.broker_port:
        raise InputError(f"--api-port {opts.api_port}: the broker uses that port too")
    if opts.truth is not None:
        _writable("--truth", opts.truth)
        # The simulator writes it from its own working directory: name it absolutely.
        opts = replace(opts, truth=opts.truth.resolve())
    if opts.broker == "kafka":
        _kafka_toolchain()
    ctx.exit(run_up(replace(opts, idle_window_ms=window_ms, retention_ms=retention_ms), model))


@click.command("report", context_settings={"show_default": True})
@click.option(
    "--truth",
    "truth_path",
    type=click.Path(path_type=Path),
    required=True,
    help="Truth file written by `periscope up --truth`.",
)
@click.option(
    "--snapshots",
    type=click.Path(path_type=Path),
    help="API snapshots recorded by `up --truth` [default: <truth>.api.jsonl beside it].",
)
@click.option("--api", metavar="URL", help="Score one live snapshot of this API instead.")
@click.option(
    "--usage",
    "usage_file",
    type=click.Path(path_type=Path),
    help="`periscope usage --by namespace --format json` over the run, for the accounting section "
    "[default: <truth>.usage.json beside it, which `up --truth --exit-at-end` writes, when present].",
)
@click.option(
    "--allowance",
    type=click.IntRange(0, 100),
    default=2,
    help="Convergence allowance in ticks after each change.",
)
@click.option(
    "--baseline-lag",
    default="30s",
    help="How old the name-join baseline's data is (the incumbent's collect interval).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def report(
    truth_path: Path,
    snapshots: Path | None,
    api: str | None,
    usage_file: Path | None,
    allowance: int,
    baseline_lag: str,
    as_json: bool,
) -> None:
    """Score a simulated run against its ground truth, next to a name-join baseline."""
    lag_ms = 0 if baseline_lag.strip() in ("0", "0s") else _duration("--baseline-lag", baseline_lag)
    try:
        truth = Truth(_read("truth file", truth_path))
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"truth file {truth_path}: {e}") from None
    if api is not None:
        try:
            snaps = live_snapshots(api)
        except Exception as e:  # any transport or decode failure is bad input here
            raise InputError(f"--api {api}: cannot read the API ({type(e).__name__}: {e})") from None
    else:
        snaps = _read("snapshots file", snapshots or snapshots_path(truth_path))
    result = build_report(truth, snaps, ReportOptions(allowance_ticks=allowance, baseline_lag_ms=lag_ms))
    result["accounting"] = _accounting(truth, usage_file, truth_path)
    click.echo(json.dumps(result, indent=2) if as_json else format_report(result))


def _accounting(truth: Truth, given: Path | None, truth_path: Path) -> Row | None:
    """The accounting section: `periscope usage`'s answer against the truth (None without one)."""
    path = given or usage_path(truth_path)
    if given is None and not path.is_file():
        return None
    what = f"usage file {path}"
    if not path.is_file():
        raise InputError(f"{what}: no such file")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return compare(truth, doc)
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
        raise InputError(f"{what}: {e}") from None


def _read(what: str, path: Path) -> list[Row]:
    if not os.path.isfile(path):
        raise InputError(f"{what} {path}: no such file")
    try:
        return read_jsonl(path)
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{what} {e}") from None
