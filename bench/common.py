"""Shared pieces of the benchmarks: a measured figure with its goal and setup, medians of repeats,
percentiles, CPU/memory probes of this machine, free ports."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from periscope.bus import topics
from periscope.bus.clients import Kafka
from periscope.bus.profile import EMBEDDED, BrokerProfile, profile
from periscope.bus.security import PLAINTEXT, KafkaSecurity
from periscope.devkit.brokers import BrokerKind, LocalBroker


@dataclass(frozen=True, slots=True)
class Goal:
    """A design goal to report against (never a test assertion)."""

    op: str  # ">=" or "<"
    value: float
    text: str

    def met(self, x: float | None) -> bool | None:
        if x is None:
            return None
        return x >= self.value if self.op == ">=" else x < self.value


# Memory goals of a pod-device row (KiB: 8 KiB = 8,192 bytes); `<` a byte above means "at most".
JOINER_ROW_GOAL = Goal("<", 8193, "<= 8 KiB (8,192 bytes) per row")
API_ROW_GOAL = Goal("<", 2049, "<= 2 KiB (2,048 bytes) per row")


@dataclass(slots=True)
class Figure:
    key: str
    value: float | None
    unit: str
    setup: dict[str, Any]
    limit: str = ""  # what bounds the figure, in words
    goal: Goal | None = None
    runs: list[float] = field(default_factory=list)  # the repeats the median came from
    brief: str = ""  # the setup in a few words, for the README table
    baseline: str | None = None  # the key of the same-run figure this one is compared with
    broker: str | None = None  # the broker it was measured through (run.py sets it); None: no broker

    def as_json(self) -> dict[str, Any]:
        runs = [r for r in self.runs if r == r]  # NaN: a repeat that could not be timed
        return {
            "value": rounded(self.value),
            "unit": self.unit,
            "broker": self.broker,
            "goal": None if self.goal is None else self.goal.text,
            "goal_met": None if self.goal is None else self.goal.met(self.value),
            "min": rounded(min(runs)) if runs else None,
            "max": rounded(max(runs)) if runs else None,
            "runs": [rounded(r) for r in self.runs],
            "baseline": self.baseline,
            "brief": self.brief,
            "setup": self.setup,
            "limit": self.limit,
        }


def rounded(x: float | None, digits: int = 4) -> float | None:
    if x is None:
        return None
    if abs(x) >= 100:
        return round(x, 1)
    return float(f"{x:.{digits}g}")


def median(xs: Iterable[float]) -> float:
    return statistics.median(list(xs))


def percentile(xs: Iterable[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sample."""
    s = sorted(xs)
    if not s:
        raise ValueError("percentile of an empty sample")
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def repeat(n: int, measure: Callable[[], float]) -> list[float]:
    """Run a measurement n times (each from a collected heap) and return every result."""
    out = []
    for _ in range(n):
        gc.collect()
        out.append(measure())
    return out


class CpuTimer:
    """CPU seconds of this thread between enter and exit."""

    def __enter__(self) -> CpuTimer:
        self.start = time.thread_time()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.thread_time() - self.start


class MachineSpeed:
    """The CPU time a fixed piece of Python takes in this process, a few times a second while something
    else is measured: the machine's speed at those moments. On a shared 2-CPU machine it moves by up to
    2x from one second to the next (other tenants, caches, clocks), which two runs seconds apart each see
    only part of; a ratio of two runs whose speeds differ by that much says little about the code.
    Costs about 6 ms of this process's CPU each `every_s` (a 1 ms sample reads the VM's CPU accounting
    more than the machine: it jumps by 40 % between consecutive samples on an idle machine)."""

    WORK = 100_000  # loop iterations: about 6 ms of CPU

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s = every_s
        self.ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def sample_ms(cls) -> float:
        acc = 0
        with CpuTimer() as cpu:
            for i in range(cls.WORK):
                acc += i * i
        return 1000 * cpu.seconds

    async def _run(self) -> None:
        while True:
            self.ms.append(self.sample_ms())
            await asyncio.sleep(self.every_s)

    async def __aenter__(self) -> MachineSpeed:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def summary(self) -> dict[str, float | None]:
        """The fixed work's CPU ms: least (the machine at its fastest), median and most."""
        if not self.ms:
            return {"fixed_work_ms_min": None, "fixed_work_ms_median": None, "fixed_work_ms_max": None}
        return {"fixed_work_ms_min": min(self.ms), "fixed_work_ms_median": median(self.ms),
                "fixed_work_ms_max": max(self.ms)}


def proc_cpu_s(pid: int) -> float:
    """user+system CPU seconds a process has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


_SKIP = (type, ModuleType, FrameType)


def deep_size(root: object) -> int:
    """Bytes of every object reachable from `root` (sys.getsizeof, each object once).

    Classes, modules and frames are not followed: they are shared with the rest of the program. A
    dict's keys are: the garbage collector's walk, which finds the rest, skips the keys of a dict whose
    keys are all strings (they cannot form cycles).
    """
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SKIP):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
        if type(obj) is dict:
            stack.extend(obj)
    return total


def load() -> dict[str, Any]:
    """The machine's load now: `uptime` as it prints it, and the 1, 5 and 15 minute load averages
    (processes running or waiting for a core; other work on a shared machine shows here)."""
    try:
        done = subprocess.run(["uptime"], capture_output=True, text=True, timeout=5, check=False)
        line = done.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        line = ""
    return {"uptime": line, "load_average_1_5_15_min": [round(x, 2) for x in os.getloadavg()]}


def machine() -> dict[str, Any]:
    model = platform.processor() or ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
    }


# The security settings of every benchmark Kafka client (periscope.bus.security). The benchmarks run
# their own plaintext broker; a run against a secured broker sets this once.
SECURITY: KafkaSecurity = PLAINTEXT
# The broker the benchmarks run on now (run.py --broker, one kind after the other): its profile decides
# how every client behaves, and bench.common.broker starts one of its kind.
PROFILE: BrokerProfile = EMBEDDED
LABELS: dict[str, str] = {"embedded": "the embedded broker", "kafka": "Apache Kafka"}


def use_broker(kind: BrokerKind) -> None:
    """Run what follows on brokers of this kind."""
    global PROFILE
    PROFILE = profile(kind)


def broker_label() -> str:
    """The current broker kind in words, for setups and limits ("the embedded broker", "Apache Kafka")."""
    return LABELS[PROFILE.name]


def kafka_security() -> KafkaSecurity:
    return SECURITY


def kafka(bootstrap: str) -> Kafka:
    """The connection every benchmark client is built from."""
    return Kafka(bootstrap, SECURITY, PROFILE)


def kafka_env() -> dict[str, str]:
    """The PERISCOPE_* settings a benchmark's service process needs for the broker's profile."""
    return {"PERISCOPE_KAFKA_PROFILE": PROFILE.name}


async def end_offsets(bootstrap: str, topic: str) -> int:
    """Sum of the end offsets of every partition of `topic` (records ever written to it)."""
    from aiokafka import TopicPartition

    from periscope.bus.admin import partition_counts

    parts = (await partition_counts(kafka(bootstrap), [topic])).get(topic, 0)
    consumer = kafka(bootstrap).consumer(client_id="bench-end-offsets")
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(parts)])
        return sum(ends.values())
    finally:
        await consumer.stop()


async def _leaders_ready(bootstrap: str) -> None:
    """Wait until every partition of every topic answers: Apache Kafka returns from CreateTopics
    before its partitions have leaders that take writes (NOT_LEADER_OR_FOLLOWER for a second or two,
    which producers retry with warnings); asking for end offsets waits that out."""
    from aiokafka import TopicPartition

    from periscope.bus.admin import partition_counts

    counts = await partition_counts(kafka(bootstrap), [t.name for t in topics.ALL])
    consumer = kafka(bootstrap).consumer(client_id="bench-ready")
    await consumer.start()
    try:
        await consumer.end_offsets([TopicPartition(t, p) for t, n in counts.items() for p in range(n)])
    finally:
        await consumer.stop()


@contextlib.contextmanager
def broker(tmp: Path, partitions: int | None = None) -> Iterator[LocalBroker]:
    """A broker of the benchmarks' kind (PROFILE), every topic created (node-keyed inputs and outputs
    with `partitions` each; default the deployment's), stopped and its data removed at the end."""
    from periscope.bus.admin import DEFAULT_PLAN, TopicPlan, ensure_topics

    where = Path(tempfile.mkdtemp(prefix="broker-", dir=tmp))
    b = LocalBroker(PROFILE.name, where)
    b.start()
    try:
        plan = DEFAULT_PLAN if partitions is None else TopicPlan(partitions=partitions)
        asyncio.run(ensure_topics(kafka(b.bootstrap), plan=plan))
        if PROFILE.name == "kafka":  # the embedded broker's topics take writes once created
            asyncio.run(_leaders_ready(b.bootstrap))
        yield b
    finally:
        b.stop()
        shutil.rmtree(where, ignore_errors=True)  # Apache Kafka keeps what it was sent on disk
