"""The repeats of one allocation run, packed: sorted (time, epoch, seq) keys as zigzag varint deltas.

A node's probe re-sends an unchanged allocation snapshot every few seconds; the engine keeps, per run of
equal content, the keys of those repeats for an hour (so a late snapshot of other content can split the
run exactly where it belongs). As tuples that was ~160 bytes a repeat; packed it is ~4. Snapshots
nearly always arrive in order, which appends in O(1); anything else unpacks, edits and packs again.
"""

from __future__ import annotations

import base64
from bisect import bisect_right, insort
from collections.abc import Iterable, Iterator

AllocKey = tuple[int, int, int]  # (time_ms, epoch, seq)


def _put(buf: bytearray, v: int) -> None:
    z = v << 1 if v >= 0 else (-v << 1) - 1  # zigzag: small magnitudes of either sign stay short
    while z >= 0x80:
        buf.append((z & 0x7F) | 0x80)
        z >>= 7
    buf.append(z)


def _values(buf: bytes | bytearray) -> Iterator[int]:
    z = shift = 0
    for b in buf:
        z |= (b & 0x7F) << shift
        if b & 0x80:
            shift += 7
            continue
        yield (z >> 1) ^ -(z & 1)
        z = shift = 0


class Repeats:
    """A sorted set of allocation keys."""

    __slots__ = ("_buf", "_last", "_n")

    def __init__(self, keys: Iterable[AllocKey] = ()) -> None:
        self._buf = bytearray()
        self._last: AllocKey = (0, 0, 0)
        self._n = 0
        for k in sorted(keys):
            self._append(k)

    def _append(self, key: AllocKey) -> None:
        for v, prev in zip(key, self._last, strict=True):
            _put(self._buf, v - prev)
        self._last = key
        self._n += 1

    def __iter__(self) -> Iterator[AllocKey]:
        vals = _values(self._buf)
        t = e = s = 0
        for _ in range(self._n):
            t, e, s = t + next(vals), e + next(vals), s + next(vals)
            yield (t, e, s)

    def __len__(self) -> int:
        return self._n

    def __contains__(self, key: object) -> bool:
        if not self._n or not isinstance(key, tuple) or key > self._last:
            return False
        return key in list(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Repeats) and self._n == other._n and self._buf == other._buf

    def __repr__(self) -> str:
        return f"Repeats({list(self)!r})"

    def add(self, key: AllocKey) -> None:
        if not self._n or key > self._last:
            self._append(key)
            return
        keys = list(self)
        insort(keys, key)
        self._reset(keys)

    def split_after(self, key: AllocKey) -> list[AllocKey]:
        """Remove and return the keys after `key`, in order."""
        if not self._n or key >= self._last:
            return []
        keys = list(self)
        j = bisect_right(keys, key)
        self._reset(keys[:j])
        return keys[j:]

    def _reset(self, keys: list[AllocKey]) -> None:
        self._buf, self._last, self._n = bytearray(), (0, 0, 0), 0
        for k in keys:
            self._append(k)

    def to_text(self) -> str:
        """The packed form, for the persisted state (base64 of the varint deltas)."""
        return base64.b64encode(self._buf).decode("ascii")

    @classmethod
    def from_text(cls, text: str) -> Repeats:
        r = cls()
        buf = base64.b64decode(text)
        vals = list(_values(buf))
        if len(vals) % 3:
            raise ValueError("allocation repeats: not whole (time, epoch, seq) keys")
        r._buf, r._n = bytearray(buf), len(vals) // 3
        t = e = s = 0
        for i in range(0, len(vals), 3):
            t, e, s = t + vals[i], e + vals[i + 1], s + vals[i + 2]
        r._last = (t, e, s)
        return r
