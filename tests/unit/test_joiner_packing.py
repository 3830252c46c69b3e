"""Table records compressed with a preset dictionary: read back whatever wrote them, and smaller."""

from __future__ import annotations

import re
import uuid
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from periscope.core.engine import new_state
from services.joiner import packing
from services.joiner.changelog import StateError, load_record, plan_persist, restore
from tests.unit.test_joiner_state import NODE, Tables, feed, sample, setup_events

# The Adler-32 of the first dictionary as records on disk name it: editing the dictionary would make
# every record written with it unreadable (add a new one instead).
FIRST_DICTIONARY = 0xF1BDB328
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_the_first_dictionary_is_never_edited_and_new_records_name_the_newest() -> None:
    assert FIRST_DICTIONARY in packing.DICTIONARIES
    packed = packing.pack(b'{"format":1}')
    assert packed[1] & 0x20  # FDICT
    assert int.from_bytes(packed[2:6], "big") == list(packing.DICTIONARIES)[-1]  # the last one added


@given(st.binary(max_size=4096))
def test_any_bytes_come_back(data: bytes) -> None:
    assert packing.unpack(packing.pack(data)) == data


def test_records_compressed_without_a_dictionary_still_read() -> None:
    record = b'{"format":1,"node":"n","seq":3,"pods":[]}'
    assert packing.unpack(zlib.compress(record, 1)) == record
    assert load_record(zlib.compress(record, 6)) == {"format": 1, "node": "n", "seq": 3, "pods": []}


def test_an_unknown_dictionary_or_a_cut_record_is_a_clear_error() -> None:
    c = zlib.compressobj(1, zdict=b"some other dictionary")
    foreign = c.compress(b'{"format":1}') + c.flush()
    with pytest.raises(zlib.error, match="needs dictionary"):
        packing.unpack(foreign)
    with pytest.raises(StateError, match="not JSON"):
        load_record(foreign, "node record")
    with pytest.raises(zlib.error):
        packing.unpack(packing.pack(b'{"format":1,"node":"n"}' * 20)[:-6])


def _real_uids(record: bytes) -> bytes:
    """The builders' UIDs are alike; real ones are random (what a dictionary cannot guess)."""
    fresh: dict[str, str] = {}
    return UUID.sub(lambda m: fresh.setdefault(m.group(0), str(uuid.uuid4())), record.decode()).encode()


def test_pod_records_take_far_less_than_compressed_alone_and_restore_the_same() -> None:
    state = feed(new_state(NODE), [*setup_events(), *(sample(t, 50.0 + t) for t in range(2, 25))])
    plan = plan_persist(state, 1, {})
    for rec in plan.pods.values():
        raw = _real_uids(packing.unpack(rec))
        assert len(packing.pack(raw)) < 0.75 * len(zlib.compress(raw, packing.LEVEL))
    tables = Tables()
    tables.write(plan)
    back, seq, _ = tables.restore()
    assert seq == 1 and back.rows == state.rows
    assert restore(NODE, plan.node, plan.pods.get).state.rows == state.rows
