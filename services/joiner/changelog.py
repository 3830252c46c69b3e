"""The changelogged tables: engine state <-> table records (one record per node, one per pod UID,
consistent after any crash), and the tables as the worker writes them.

A node's state is split (periscope.core.snapshot) into a node part, kept in the nodes table under the
node name, and each pod's rows, kept in the pods table under the pod UID. Kafka without transactions
cannot write several records atomically, so one persist is numbered (`seq`) and ordered:

1. every changed pod record is written with its new rows *and* the rows of its previous version;
2. once those are durable (and fenced, see services.joiner.delivery), the node record (carrying `seq` and
   the list of pods with rows) is written.

On recovery the node record is the truth: each listed pod takes the newest of its two versions that is
not newer than the node record. A crash between the steps therefore yields the previous persist as a
whole, never a mix in which samples are counted twice or lost.

Records are JSON, zlib-compressed with a preset dictionary (services.joiner.packing: a pod record in a
quarter of its size; the tables' latest values stay in the worker's memory, and each persist goes through
the changelog); records compressed without the dictionary, and uncompressed ones, are read as well.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import zlib
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from periscope.core.engine import NodeState, new_state
from periscope.core.snapshot import from_parts, to_parts
from services.joiner.delivery import RecordBatches
from services.joiner.packing import pack, unpack

log = logging.getLogger(__name__)

FORMAT = 1
FENCE_KEY = b"\x00fence/"  # no node name or pod UID starts with a NUL byte


def _dumps(obj: Any) -> bytes:
    # orjson: a sixth of the standard encoder's time, on every persist of a node. Same JSON but for
    # how some numbers are spelled (1e-05 / 0.00001), read back as the same numbers. It would write a
    # non-finite number as null where json refused it: the decoder lets none into the state.
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)


@dataclass(slots=True)
class PodVersion:
    """A pod's part as last written: the JSON of its rows and last publication (periscope.core.snapshot)
    is not kept as such, but as a digest (is the next persist's JSON the same?) and a place in a
    compressed pod record that holds it verbatim (the next record carries it as its previous version):
    the record the table holds anyway, so a version costs the worker some 100 bytes, not the JSON."""

    seq: int  # persist that wrote these rows
    digest: bytes  # of the JSON
    packed: bytes  # a compressed record holding the JSON at [at, at + size) once decompressed
    at: int
    size: int
    stale: bool = False  # the table holds a newer, unconfirmed record: rewrite it on the next persist

    def rows(self) -> bytes:
        return unpack(self.packed)[self.at:self.at + self.size]


def _digest(blob: bytes) -> bytes:
    return hashlib.blake2b(blob, digest_size=16).digest()


def pod_version(seq: int, blob: bytes, record: bytes, *, stale: bool = False,
                inflated: bytes | None = None) -> PodVersion:
    """The version whose JSON is `blob`, as it lies in the pod record `record` (its rows, or when
    `stale` its previous version); packed on its own where the record does not hold it verbatim.
    `inflated`: the record decompressed, where the caller has it."""
    if inflated is not None:
        data = inflated if record[:1] != b"{" else b""
    else:
        try:
            data = unpack(record)
        except zlib.error:  # an uncompressed record
            data = b""
    at = data.rfind(blob) if stale else data.find(blob)
    if at < 0:  # another writer's formatting, or an uncompressed record
        record, at = pack(blob), 0
    return PodVersion(seq, _digest(blob), record, at, len(blob), stale)


@dataclass(slots=True)
class Persist:
    """What one persist writes, in order: pod records, then the node record, then tombstones."""

    seq: int
    pods: dict[str, bytes]  # pod UID -> pod record (changed pods only)
    node: bytes  # node record
    removed: list[str]  # pod UIDs whose rows are gone: delete after the node record is durable
    processed_ms: int


@dataclass(slots=True)
class Restored:
    state: NodeState
    seq: int
    versions: dict[str, PodVersion] = field(default_factory=dict)


class StateError(ValueError):
    """A table record is not in a format this joiner can read."""


def pod_record(node: str, uid: str, seq: int, rows: bytes, prev: PodVersion | None) -> PodVersion:
    """The pod record of persist `seq` (`packed`): `rows`, and the previous version's rows."""
    head = _dumps({"format": FORMAT, "node": node, "uid": uid, "seq": seq})[:-1] + b',"rows":'
    prev_seq = b"null" if prev is None else str(prev.seq).encode()
    prev_rows = b"null" if prev is None else prev.rows()
    record = pack(head + rows + b',"prev_seq":' + prev_seq + b',"prev":' + prev_rows + b"}")
    return PodVersion(seq, _digest(rows), record, len(head), len(rows))


def plan_persist(state: NodeState, seq: int, versions: dict[str, PodVersion]) -> Persist:
    """Snapshot `state` as persist number `seq`; update `versions` to what it writes."""
    node_part, pod_parts = to_parts(state, native=True)  # _dumps writes the records in it
    pods: dict[str, bytes] = {}
    for uid, rows in pod_parts.items():
        blob = _dumps(rows)
        old = versions.get(uid)
        if old is not None and not old.stale and old.size == len(blob) and old.digest == _digest(blob):
            continue
        version = versions[uid] = pod_record(state.node, uid, seq, blob, old)
        pods[uid] = version.packed
    removed = sorted(set(versions) - set(pod_parts))
    for uid in removed:
        del versions[uid]
    node = pack(_dumps({"format": FORMAT, "node": state.node, "seq": seq, "pods": sorted(pod_parts),
                         "state": node_part}))
    return Persist(seq=seq, pods=pods, node=node, removed=removed, processed_ms=state.processed_ms)


def load_record(data: bytes, what: str = "record") -> dict[str, Any]:
    """A node or pod record as written by plan_persist (compressed or not)."""
    return _load(data, what)[0]


def _load(data: bytes, what: str) -> tuple[dict[str, Any], bytes]:
    """The record and its JSON text."""
    try:
        text = data if data[:1] == b"{" else unpack(data)
        obj = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, zlib.error) as e:
        raise StateError(f"{what}: not JSON ({e})") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise StateError(f"{what}: unsupported record format")
    return obj, text


def restore(node: str, node_record: bytes | None, get_pod: Callable[[str], bytes | None]) -> Restored:
    """Rebuild a node's engine state from its node record and its pods' records (a fresh state if none)."""
    if node_record is None:
        return Restored(new_state(node), 0)
    rec = load_record(node_record, f"node record {node!r}")
    seq = int(rec["seq"])
    pod_parts: dict[str, Any] = {}
    versions: dict[str, PodVersion] = {}
    for uid in rec["pods"]:
        raw = get_pod(uid)
        if raw is None:
            log.warning("node %s: record of pod %s is missing; its rows start over", node, uid)
            continue
        prec, text = _load(raw, f"pod record {uid!r}")
        if int(prec["seq"]) <= seq:
            rows = pod_parts[uid] = prec["rows"]
            versions[uid] = pod_version(int(prec["seq"]), _dumps(rows), raw, inflated=text)
        elif prec["prev_seq"] is not None and int(prec["prev_seq"]) <= seq:
            # The last persist wrote this pod but died before its node record: use the version before.
            rows = pod_parts[uid] = prec["prev"]
            versions[uid] = pod_version(int(prec["prev_seq"]), _dumps(rows), raw, stale=True, inflated=text)
        else:
            log.warning("node %s: pod %s has no version as old as persist %d; its rows start over",
                        node, uid, seq)
    try:
        state = from_parts(rec["state"], pod_parts)
    except (KeyError, TypeError, ValueError) as e:
        raise StateError(f"node record {node!r}: {type(e).__name__}: {e}") from None
    return Restored(state, seq, versions)


def encode_mark(as_of_ms: int) -> bytes:
    return str(as_of_ms).encode()


def decode_mark(data: bytes | None) -> int:
    if not data:
        return 0
    try:
        return int(data)
    except ValueError:
        return 0


Write = tuple[bytes, bytes | None, int]  # key, value (None: a tombstone), partition


class TableIO(Protocol):
    """A changelogged table written with an explicit partition (outside any stream event)."""

    def get(self, key: bytes) -> bytes | None: ...
    def put(self, key: bytes, value: bytes, partition: int) -> Awaitable[Any]: ...
    # (key, value, partition) records in one hand-over; partition -> awaitable of its records' delivery.
    def put_many(self, items: list[tuple[bytes, bytes, int]]) -> dict[int, Awaitable[Any]]: ...
    def delete(self, key: bytes, partition: int) -> Awaitable[Any]: ...
    def fence(self, partition: int) -> Awaitable[Any]: ...
    # (key, partition) of the records held for `partitions`: recovered from the changelog or written here.
    def keys_on(self, partitions: Collection[int]) -> list[tuple[bytes, int]]: ...


class ChangelogTable:
    """A Faust table written with an explicit partition, so timers and persist tasks (which run
    outside any stream event) can write; each write returns the changelog record's delivery future."""

    def __init__(self, table: Any, batches: RecordBatches, fences: bool, *, listed: bool = False) -> None:
        self.table = table
        self.batches = batches
        self.fences = fences
        # Writes not yet handed to the producer, in the order they were made, and the task handing them
        # over: all that waited is handed over at once (a record batch per partition for many writes).
        self._queued: list[tuple[Sequence[Write], dict[int, asyncio.Future[None]]]] = []
        self._writer: asyncio.Future[None] | None = None
        self._sending: set[asyncio.Future[None]] = set()
        # key -> partition of the records written here; kept only for a table asked `keys_on` (`listed`).
        self._written: dict[bytes, int] | None = {} if listed else None

    def keys_on(self, partitions: Collection[int]) -> list[tuple[bytes, int]]:
        # The memory store knows the partition of what it recovered; what this worker wrote since, it
        # knows itself (a key moves partition only if the input topics are not co-partitioned).
        if self._written is None:
            raise TypeError("keys_on needs a table created with listed=True")
        store = self.table.data
        where = {**getattr(store, "_key_partition", {}), **self._written}
        return sorted((k, p) for k, p in where.items()
                      if p in partitions and not k.startswith(FENCE_KEY) and store.get(k) is not None)

    def get(self, key: bytes) -> bytes | None:
        value = self.table.data.get(key)
        return value if isinstance(value, bytes) else None

    def put(self, key: bytes, value: bytes, partition: int) -> Any:
        # Not through Faust's per-message buffer: when that holds more than 100 messages (a persist's
        # pod records), Faust stops handing input records over until it drained.
        return self.put_many([(key, value, partition)])[partition]

    def put_many(self, items: Sequence[Write]) -> dict[int, Awaitable[Any]]:
        """Write (key, value, partition) records (value None: a tombstone), handed to the producer with
        the other writes waiting then, as record batches per partition (a send each through Faust costs
        a buffered message, a future and a callback); partition -> delivery of its records. The values
        are raw bytes, as the table's changelog holds them (key_type/value_type bytes)."""
        data, written = self.table.data, self._written
        for key, value, partition in items:
            if value is None:  # a tombstone (delete)
                data.pop(key, None)
                if written is not None:
                    written.pop(key, None)
                continue
            data[key] = value
            if written is not None:
                written[key] = partition
        loop = asyncio.get_running_loop()
        done: dict[int, asyncio.Future[None]] = {p: loop.create_future() for _, _, p in items}
        self._queued.append((items, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write())
        return dict(done)

    async def _write(self) -> None:
        """Hand what was queued to the producer, in order (so a key's last record is its newest), all of
        it at once; its deliveries are awaited aside, so the next writes are handed over meanwhile. (A
        record batch each made every write wait for its partition's previous batch to leave: a worker
        catching up on hundreds of nodes persisted slower than it read, and held their input records.)"""
        while self._queued:
            taken, self._queued = self._queued, []
            try:
                topic = self.table.changelog_topic.get_topic_name()
                sent = await self.batches.send_to(
                    [(topic, p, key, value) for items, _ in taken for key, value, p in items])
            except BaseException as e:
                error = e if isinstance(e, Exception) else RuntimeError("write abandoned")
                for _, done in [*taken, *self._queued]:
                    for fut in done.values():
                        if not fut.done():
                            fut.set_exception(error)
                self._queued = []
                raise
            by_partition: dict[int, list[Any]] = {}
            for partition, fut in sent:
                by_partition.setdefault(partition, []).append(fut)
            self._aside(self._delivered(by_partition, [done for _, done in taken]))

    def _aside(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    @staticmethod
    async def _delivered(by_partition: dict[int, list[Any]], waiting: list[dict[int, asyncio.Future[None]]]
                         ) -> None:
        """Settle each write's per-partition delivery once its partition's record batches are delivered."""
        for partition, futs in by_partition.items():
            try:
                await asyncio.gather(*futs)
                error: BaseException | None = None
            except Exception as e:
                error = e
            for done in waiting:
                fut = done.get(partition)
                if fut is not None and not fut.done():
                    if error is None:
                        fut.set_result(None)
                    else:
                        fut.set_exception(error)

    def delete(self, key: bytes, partition: int) -> Any:
        # (The same path as the writes, so a key's tombstone and records keep their order.)
        return self.put_many([(key, None, partition)])[partition]

    def fence(self, partition: int) -> Any:
        """Append a record that only marks a point in the changelog partition, for brokers whose end
        offsets can hide the last records of a batch (periscope.bus.profile); else nothing to wait for."""
        if not self.fences:
            return _no_fence()
        return self.put(FENCE_KEY + str(partition).encode(), b"1", partition)


async def _no_fence() -> None:
    """What a fence is on a broker that does not need one: nothing to wait for."""
