"""free_port: a port for a child to listen on, out of the kernel's way."""

from __future__ import annotations

import socket

import pytest

from periscope.devkit import launch
from periscope.devkit.launch import FIRST_PORT, ephemeral_range, free_port


def test_the_port_is_below_the_range_outgoing_connections_take_and_can_be_bound() -> None:
    low, high = ephemeral_range()
    assert 0 < low <= high
    ports = {free_port() for _ in range(20)}
    assert all(FIRST_PORT <= p < low for p in ports)
    assert len(ports) > 1  # chosen at random, not the same one to every caller
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))
            s.listen()


def test_a_port_someone_listens_on_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        other = free_port()
        picks = iter([taken, taken, other])
        monkeypatch.setattr(launch.random, "randrange", lambda *_: next(picks))
        assert free_port() == other


def test_without_room_below_the_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "ephemeral_range", lambda: (FIRST_PORT + 10, 60999))
    monkeypatch.setattr(launch.random, "randrange", lambda *_: pytest.fail("picked below the range"))
    assert free_port() >= FIRST_PORT + 10
