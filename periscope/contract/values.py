"""The renderings every output kind shares, so the HTTP API and replay agree to the byte: times, numbers,
identity strings, MIG references, owners.

Times are Unix ms inside and RFC 3339 UTC with milliseconds outside; JSON has no NaN or Infinity, so a
non-finite reading is written as null (as good as no reading). What is unknown is null: a time of 0,
an empty identity string.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, Field

from periscope.core.model import MigRef, Owner

Json = dict[str, Any]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@lru_cache(maxsize=16384)
def _second(s: int) -> str:
    # isoformat, not strftime("%Y"): the C library writes year 1 as "1", RFC 3339 wants "0001".
    return (_EPOCH + timedelta(seconds=s)).replace(tzinfo=None).isoformat(timespec="seconds")


@lru_cache(maxsize=65536)
def rfc3339(ms: int) -> str:
    """Unix ms -> '2026-11-22T04:05:06.789Z'. Integer arithmetic (no float drift); cached because a
    listing or a replay's timeline repeats the same few sample times across thousands of records."""
    sec, milli = divmod(ms, 1000)
    return f"{_second(sec)}.{milli:03d}Z"


def time_json(ms: int) -> str | None:
    """An event time as written out: 0 (unknown) and times past year 9999 are null."""
    if not ms:
        return None
    try:
        return rfc3339(ms)
    except OverflowError:
        return None


# The instants `rfc3339` can write: years 1 to 9999 in UTC.
MIN_TIME_MS = -62_135_596_800_000  # 0001-01-01T00:00:00.000Z
MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


def parse_time_ms(text: str) -> int:
    """RFC 3339 (a 'Z' or an offset; naive means UTC) -> Unix ms; ValueError when it is not one, or
    when it is an instant outside years 1-9999 in UTC (which could not be written back)."""
    shown = repr(text) if len(text) <= 40 else f"{text[:30]!r}... ({len(text)} characters)"
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"not an RFC 3339 time: {shown} (use e.g. 2026-11-22T04:05:06Z)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    delta = t - _EPOCH
    ms = delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000
    if not MIN_TIME_MS <= ms <= MAX_TIME_MS:
        raise ValueError(f"out of range: {shown} is outside 0001-01-01T00:00:00Z..9999-12-31T23:59:59Z")
    return ms


def num(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def text(s: str) -> str | None:
    """An identity string (pod UID, namespace, GPU UUID, ...): "" means unknown, written as null."""
    return s or None


class Mig(BaseModel):
    uuid: str | None
    profile: str | None
    gi: int
    ci: int


def mig_json(mig: MigRef | None) -> Json | None:
    if mig is None:
        return None
    return {"uuid": mig.uuid or None, "profile": mig.profile or None, "gi": mig.gi, "ci": mig.ci}


class OwnerRef(BaseModel):
    """A pod container holding a device (or, under `monitors`, watching one)."""

    pod_uid: str | None = Field(description="null when the holder could not be told apart by UID")
    namespace: str | None
    pod: str | None
    container: str | None
    device_id: str | None


def owner_json(o: Owner) -> Json:
    return {"pod_uid": o.pod_uid or None, "namespace": o.namespace or None, "pod": o.pod or None,
            "container": o.container or None, "device_id": o.device_id or None}


def owners_json(owners: tuple[Owner, ...]) -> list[Json]:
    return [owner_json(o) for o in owners]
