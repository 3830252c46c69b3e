"""The node's dcgm-exporter as a telemetry source: DCGM's profiling fields per GPU and per MIG instance.

NVML reports no utilization on a MIG instance; DCGM's profiling (DCP) fields do, per GPU instance, and
the GPU Operator runs dcgm-exporter on every GPU node. The probe scrapes it (PERISCOPE_DCGM_EXPORTER_URL,
off by default) on its own interval, off the telemetry tick, parses the profiling fields' series of
the Prometheus text by hand (the rest is only counted) and maps each series to a
device the probe already knows from NVML: a series without `GPU_I_ID` to the physical GPU its `UUID`
names, one with `GPU_I_ID` to the MIG instance (parent `UUID`, GPU instance ID). DCGM's ratios (0-1)
become percent. Format facts and their sources: tests/unit/data/corpus/dcgm/exporter.yaml.

What can go wrong is a health state, never a crash: `unavailable` (refused, timed out, HTTP error),
`corrupt` (not Prometheus text, or larger than the size bound); the last good values are used until
two scrapes in a row failed to renew them, then dropped (never reused).
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import httpx

from periscope.core.model import DcgmProfile, DeviceSample, SourceHealth

SOURCE = "dcgm"
# DCGM field name -> DcgmProfile attribute. Newer go-dcgm names (kept by DCGM as aliases) map alike.
FIELDS: dict[str, str] = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_engine_active_pct",
    "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO": "gr_engine_active_pct",
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active_pct",
    "DCGM_FI_PROF_SM_OCCUPANCY": "sm_occupancy_pct",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active_pct",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active_pct",
}
PROFILE_ATTRS = ("gr_engine_active_pct", "sm_active_pct", "sm_occupancy_pct", "tensor_active_pct",
                 "dram_active_pct")
NO_PROFILING = ("the exporter reports no DCGM_FI_PROF_* field: DCGM's profiling module is off, its "
                "counters file leaves them out, or the GPU does not support profiling (before Volta)")


class ExporterError(Exception):
    """The exporter could not be read (`state` is the health state it means)."""

    def __init__(self, state: str, detail: str) -> None:
        super().__init__(detail)
        self.state = state


@dataclass(frozen=True, slots=True)
class Reading:
    """One profiling series: the device it names and its value in percent."""

    attr: str  # a DcgmProfile attribute
    uuid: str  # the physical GPU (for a MIG instance: its parent)
    gi: int | None  # GPU instance ID for a MIG instance, else None
    pct: float


_WANTED = tuple(FIELDS)
# One series line of the text format (0.0.4): name, optional {label="value",...}, value, optional
# timestamp. Label values may hold any character, with \\, \" and \n escaped.
_PAIR = r'[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"[^"\\]*(?:\\.[^"\\]*)*"'
_SERIES = re.compile(
    rf'([a-zA-Z_:][a-zA-Z0-9_:]*)'
    rf'(?:[ \t]*\{{([ \t]*(?:{_PAIR}[ \t]*(?:,[ \t]*{_PAIR}[ \t]*)*(?:,[ \t]*)?)?)\}})?'
    r'[ \t]+([^ \t]+)(?:[ \t]+-?[0-9]+)?')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"')
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m[1], "\\" + m[1]), value, flags=re.S)


def _series(line: str) -> tuple[str, dict[str, str], float]:
    """Name, labels (values still escaped: see _unescape) and value of one series line; ValueError when
    it is not one."""
    m = _SERIES.fullmatch(line)
    if m is None or "_" in m[3]:  # float() takes 1_0; the text format does not
        raise ValueError(f"not a series line: {line[:80]!r}")
    return m[1], _labels(m[2]) if m[2] else {}, float(m[3])


def _labels(block: str) -> dict[str, str]:
    """The labels of a block `_SERIES` matched. Without a backslash no value holds a quote, so the
    quotes split it into names (with their `,` and `=`) and values: twice as fast as the regex."""
    if "\\" in block:
        return dict(_LABEL.findall(block))
    parts = block.split('"')
    return dict(zip([p.strip(" \t,=") for p in parts[0::2]], parts[1::2], strict=False))


def parse(text: str) -> tuple[list[Reading], int]:
    """The profiling readings of one exposition, and how many DCGM series it held in all.

    Only the lines of the fields the probe reads are parsed (by hand: an exporter shows a dozen fields
    or more per device, and prometheus_client's parser took ~140 us a line, 40 ms for a MIG node's
    profiling lines; see bench/README.md, `probe_dcgm_scrape_mig_ms`); the rest are only counted.
    ExporterError("corrupt") when such a line is not a series of the text format or the text holds no
    DCGM series at all (an HTML error page from a proxy parses as nothing). A series without a UUID,
    with a GPU_I_ID that is not a number, or a ratio outside 0..1 (NaN included) is skipped."""
    out: list[Reading] = []
    series = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("DCGM_"):
            continue
        series += 1
        if not line.startswith(_WANTED):
            continue
        try:
            name, labels, value = _series(line)
        except ValueError as e:
            raise ExporterError("corrupt", f"not Prometheus text: {str(e)[:120]}") from None
        attr = FIELDS.get(name)
        if attr is None:
            continue
        uuid = _unescape(labels.get("UUID") or labels.get("uuid") or "")  # `uuid`: --use-old-namespace
        raw_gi = labels.get("GPU_I_ID", "")  # digits need no unescaping; anything else is skipped
        if not uuid or (raw_gi and not raw_gi.isdigit()):
            continue
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            continue
        out.append(Reading(attr, uuid, int(raw_gi) if raw_gi else None, round(value * 100.0, 3)))
    if not series:
        raise ExporterError("corrupt", "no DCGM_* series in the exposition")
    return out, series


def profiles(readings: Iterable[Reading], devices: Sequence[DeviceSample]) -> dict[str, DcgmProfile]:
    """DcgmProfile per device UUID (GPU-... or MIG-...) for the devices NVML listed. A reading that
    names no known device is left out; where several series name one device (the exporter copies a
    shared GPU's series for each pod), the first counts."""
    gpus = {d.uuid for d in devices if not d.parent_uuid}
    instances = {(d.parent_uuid, d.mig.gi): d.uuid for d in devices if d.parent_uuid and d.mig is not None}
    values: dict[str, dict[str, float]] = {}
    for r in readings:
        key = (instances.get((r.uuid, r.gi)) if r.gi is not None
               else r.uuid if r.uuid in gpus else None)
        if key is not None:
            values.setdefault(key, {}).setdefault(r.attr, r.pct)
    return {uuid: DcgmProfile(**v) for uuid, v in values.items()}


def annotate(devices: Sequence[DeviceSample], by_uuid: dict[str, DcgmProfile]) -> tuple[DeviceSample, ...]:
    """The devices with their DCGM profile set (unchanged where there is none)."""
    return tuple(replace(d, dcgm=p) if (p := by_uuid.get(d.uuid)) is not None else d for d in devices)


Fetch = Callable[[str, float, int], str]


def http_fetch(url: str, timeout_s: float, max_bytes: int, client: httpx.Client | None = None) -> str:
    """GET `url` within `timeout_s` in all (connect, headers and body) and at most `max_bytes`; with
    `client`, on its kept-alive connection (a probe scrapes every few seconds: no new client each time)."""
    deadline = time.monotonic() + timeout_s
    try:
        with contextlib.ExitStack() as stack:
            c = client or stack.enter_context(httpx.Client(timeout=timeout_s, follow_redirects=False))
            r = stack.enter_context(c.stream("GET", url, headers={"Accept": "text/plain"}, timeout=timeout_s))
            if r.status_code != 200:
                raise ExporterError("unavailable", f"HTTP {r.status_code} from {url}")
            body = bytearray()
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise ExporterError("corrupt", f"exposition larger than {max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise ExporterError("unavailable", f"scrape took longer than {timeout_s:g}s")
    except httpx.HTTPError as e:
        raise ExporterError("unavailable", f"{type(e).__name__} from {url}: {str(e)[:120]}") from None
    return body.decode("utf-8", errors="replace")


class DcgmSource:
    """Scrapes the exporter (call `scrape` every `interval_s`, in a worker thread) and hands the
    telemetry loop the values still fresh (`annotate`). Values count as older than two scrapes, and are
    dropped, once two scrapes in a row failed to renew them, or once they are older than two intervals
    plus two timeouts (a scrape loop that stalled)."""

    def __init__(self, url: str, interval_s: float, timeout_s: float, max_bytes: int,
                 fetch: Fetch | None = None, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.url, self.interval_s, self.timeout_s, self.max_bytes = url, interval_s, timeout_s, max_bytes
        self._client: httpx.Client | None = None
        self._fetch: Fetch = fetch or self._http
        self._now = monotonic
        self._readings: list[Reading] = []
        self._at: float | None = None  # when the readings were scraped (monotonic)
        self._misses = 0  # failed scrapes since the readings were taken
        self.health = SourceHealth(SOURCE, "unavailable", "not scraped yet")
        self.last_result = ""  # ok | unavailable | corrupt (for the scrape counter)
        self.last_duration_s = 0.0

    def _http(self, url: str, timeout_s: float, max_bytes: int) -> str:
        if self._client is None:
            self._client = httpx.Client(timeout=timeout_s, follow_redirects=False)
        return http_fetch(url, timeout_s, max_bytes, self._client)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def scrape(self) -> None:
        started = self._now()
        try:
            readings, _ = parse(self._fetch(self.url, self.timeout_s, self.max_bytes))
        except ExporterError as e:
            self._failed(e.state, str(e))
        except Exception as e:  # anything else the exporter does wrong: a state, not a crash
            self._failed("unavailable", f"{type(e).__name__}: {str(e)[:120]}")
        else:
            self._readings, self._at, self._misses, self.last_result = readings, self._now(), 0, "ok"
            self.health = SourceHealth(SOURCE, "ok", "" if readings else NO_PROFILING)
        self.last_duration_s = self._now() - started

    def _failed(self, state: str, detail: str) -> None:
        self._misses += 1
        self.last_result = state
        self.health = SourceHealth(SOURCE, state, detail)

    def fresh(self) -> list[Reading]:
        """The last readings unless older than two scrapes (see the class); afterwards nothing."""
        limit = 2 * (self.interval_s + self.timeout_s)
        if self._at is None or self._misses >= 2 or self._now() - self._at > limit:
            self._readings, self._at = [], None
            return []
        return self._readings

    def annotate(self, devices: Sequence[DeviceSample]) -> tuple[DeviceSample, ...]:
        readings = self.fresh()
        return annotate(devices, profiles(readings, devices)) if readings else tuple(devices)
