"""Where `periscope up` keeps the simulated nodes' files: on the memory file system when it has room, so
that a neighbour's fsyncs cannot stall the fake hardware (docs/scenarios.md); else in up's own
directory."""

from __future__ import annotations

from pathlib import Path

from periscope.sim.up.stack import memory_dir


def test_a_fresh_directory_on_the_memory_file_system(tmp_path: Path) -> None:
    made = [memory_dir(tmp_path, need=1) for _ in range(2)]
    assert made[0] is not None and made[1] is not None and made[0] != made[1]
    assert all(d.parent == tmp_path and d.name.startswith("periscope-up-sim-") and d.is_dir()
               for d in made if d is not None)


def test_none_without_room_or_without_the_file_system(tmp_path: Path) -> None:
    assert memory_dir(tmp_path, need=1 << 62) is None  # a container's 64 MiB /dev/shm, say
    assert memory_dir(tmp_path / "absent", need=1) is None
    assert list(tmp_path.iterdir()) == []
