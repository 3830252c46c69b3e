"""The services `periscope up` runs against the simulated cluster: one probe per node, the watcher, the
joiner and the API, each as the command line and PERISCOPE_* settings (lower-case, without the
prefix) its process is started with. Each child's settings are checked with that child's own settings
class (periscope.config.env_for): a misspelt or refused one fails here, not silently in the child. The
broker and clock settings every child shares are added by the `Stack`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic_settings import BaseSettings

from periscope.config import SettingsError, env_for
from periscope.core.duration import format_duration_ms
from periscope.core.engine import DEFAULT_CONFIG
from periscope.devkit.launch import free_port
from periscope.settings.api import ApiSettings
from periscope.settings.joiner import JoinerSettings
from periscope.settings.probe import ProbeSettings
from periscope.settings.watcher import WatcherSettings
from periscope.sim.scenario import Scenario

if TYPE_CHECKING:  # the stack imports this module
    from periscope.sim.up.stack import UpOptions

Service = tuple[str, list[str], dict[str, str]]
JOINER_APP_ID = "periscope-up"  # its consumer group and the prefix of its changelog topics


@dataclass(frozen=True, slots=True)
class Tuning:
    """What the stack derives from the scenario and the speed, shared by several services."""

    run_dir: Path  # each child's working directory lies below it
    idle_bucket_ms: int  # the joiner's aggregation window
    stale_after: str  # seconds without an output after which a service counts as stale
    heartbeat_ms: int  # the joiner republishes unchanged outputs this often (event time)

    @classmethod
    def derive(cls, run_dir: Path, tick_ms: int, opts: UpOptions) -> Tuning:
        # The aggregation window: fine enough that idleness is decided within a few ticks. The joiner
        # republishes unchanged outputs every second sample, so that data newer than a fault shows
        # within the five ticks the report allows for recovery. Samples are stamped when the probe
        # takes them, not on the tick, so two ticks apart can read a few ms short of two ticks: a
        # heartbeat of exactly two ticks then waited for a third (a whole tick later, under load more
        # often); one and a half ticks falls due on the second sample with up to half a tick of
        # jitter. Ten ticks and three heartbeats without an output (at least 5 s of real time) mean
        # stale, so a quiet cluster does not flap /readyz.
        heartbeat_ms = 2 * tick_ms - tick_ms // 2
        stale_s = max(5000.0, 10 * tick_ms / opts.speed, 3 * heartbeat_ms / opts.speed)
        bucket_ms = max(tick_ms, min(60_000, opts.idle_window_ms // 5))
        return cls(run_dir, bucket_ms, seconds(stale_s), heartbeat_ms)


def checked(name: str, cls: type[BaseSettings], values: dict[str, Any]) -> dict[str, str]:
    """`values` as the child's PERISCOPE_* settings, checked with its class; SettingsError naming the
    child (the stack reports it as an UpError)."""
    try:
        return env_for(cls, **values)
    except SettingsError as e:
        raise SettingsError(f"{name}: {e}") from None


def py(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


def seconds(ms: float) -> str:
    """A duration setting in seconds, as short as it can be written (`0.5`, `2`)."""
    return f"{ms / 1000:.6f}".rstrip("0").rstrip(".") or "0"


def services(
    opts: UpOptions, scenario: Scenario, ready: dict[str, Any], api_url: str, tune: Tuning
) -> list[Service]:
    """Every service, in start order; `ready` is what the simulator wrote once its cluster was up."""
    cli = "periscope.cli.main"
    out: list[Service] = []
    for node, paths in ready["nodes"].items():
        probe = {
            "node_name": node,
            "kubelet_root": paths["kubelet_root"],
            "podresources_socket": paths["socket"],
            "checkpoint_path": paths["checkpoint"],
            "proc_root": paths["proc_root"],
            "nvml_backend": f"fake:{paths['nvml_state']}",
            "tick": seconds(scenario.tick_ms / opts.speed),
            "allocation_interval": seconds(5 * scenario.tick_ms / opts.speed),
            "health_port": str(free_port()),
            "stale_after": tune.stale_after,
        }
        if paths.get("dcgm_exporter_url"):  # the node's simulated dcgm-exporter: MIG util, profiling
            probe["dcgm_exporter_url"] = paths["dcgm_exporter_url"]
            probe["dcgm_interval"] = probe["tick"]  # the fake refreshes every tick: so does the probe
        out.append((f"probe/{node}", py(cli, "probe"), checked(f"probe/{node}", ProbeSettings, probe)))
    watcher = {"kubeconfig": ready["kubeconfig"], "health_port": str(free_port())}
    out.append(("watcher", py(cli, "watch"), checked("watcher", WatcherSettings, watcher)))
    # Event-time knobs scale with the speed: reordering between topics of up to 0.5 s of real time is
    # `speed` times that in event time. A short session timeout keeps a joiner restart quick (one
    # worker: there is no one to rebalance with): the embedded broker holds a group's first JoinGroup
    # for half of it in whole seconds, so 2 s joins in 1 s (3 s took 2).
    joiner = {
        "app_id": JOINER_APP_ID,
        "web_host": "127.0.0.1",
        "web_port": str(free_port()),
        "data_dir": str(tune.run_dir / "joiner" / "data"),
        "window": seconds(tune.idle_bucket_ms),
        "lateness": seconds(max(float(DEFAULT_CONFIG.lateness_ms), 500 * opts.speed)),
        "heartbeat": seconds(tune.heartbeat_ms),
        "session_timeout": "2",
        "stale_after": tune.stale_after,
        "idle_window": format_duration_ms(opts.idle_window_ms),
        "idle_threshold": f"{opts.idle_threshold:g}",
    }
    out.append(("joiner", py(cli, "join"), checked("joiner", JoinerSettings, joiner)))
    api_port = api_url.rsplit(":", 1)[1]
    # /v1/idle judges by the joiner's idle rule where a query names none: the same two settings.
    api = {"api_host": "127.0.0.1", "api_port": api_port, "api_stale_after": tune.stale_after,
           "idle_window": joiner["idle_window"], "idle_threshold": joiner["idle_threshold"]}
    if opts.api_auth:
        api |= {"api_auth": "kubernetes", "kubeconfig": ready.get("api_kubeconfig") or ready["kubeconfig"]}
    out.append(("api", py(cli, "api"), checked("api", ApiSettings, api)))
    return out
