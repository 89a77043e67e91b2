"""The bench servers' listener ports (:mod:`bench.ports`): below the kernel's ephemeral range, where
no client socket is given them while a server restarts, and free when chosen."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import ports


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.fixture
def held() -> Iterator[int]:
    """A port below the ephemeral range that this test holds bound (not listening) throughout."""
    low, _ = ports.ephemeral_range()
    with socket.socket() as s:
        for port in range(low - 1, ports.LOWEST - 1, -1):
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            yield port
            return
    pytest.skip("no bindable port below the ephemeral range")


def test_the_port_is_below_the_ephemeral_range_and_bindable() -> None:
    low, _ = ports.ephemeral_range()
    if low <= ports.LOWEST:
        pytest.skip(f"this machine's ephemeral range starts at {low}")
    for _ in range(20):
        port = ports.listener_port()
        assert ports.LOWEST <= port < low
        assert bindable(port)


def test_the_ephemeral_range_is_read_from_proc_or_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("40000\t50000\n")
    monkeypatch.setattr(ports, "RANGE_FILE", range_file)
    assert ports.ephemeral_range() == (40000, 50000)
    range_file.write_text("garbage\n")
    assert ports.ephemeral_range() == ports.DEFAULT_EPHEMERAL
    monkeypatch.setattr(ports, "RANGE_FILE", tmp_path / "missing")
    assert ports.ephemeral_range() == ports.DEFAULT_EPHEMERAL


def test_a_port_in_use_is_not_returned(held: int, monkeypatch: pytest.MonkeyPatch) -> None:
    low, _ = ports.ephemeral_range()
    candidates: Iterator[int] = iter([held, held, *range(ports.LOWEST, low)])  # the held one first, twice
    asked: list[tuple[int, int]] = []

    def choose(a: int, b: int) -> int:
        asked.append((a, b))
        return next(candidates)

    monkeypatch.setattr("bench.ports.random.randint", choose)
    port = ports.listener_port()
    assert port != held
    assert len(asked) >= 3  # the held port was tried twice and passed over
    assert asked[0] == (ports.LOWEST, low - 1)
    assert bindable(port)


def test_no_free_port_is_a_clear_error(held: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bench.ports.random.randint", lambda a, b: held)
    with pytest.raises(RuntimeError, match="no free loopback port"):
        ports.listener_port()


@pytest.mark.parametrize("low", [1024, 20000])
def test_an_ephemeral_range_starting_too_low_falls_back_to_the_kernels_choice(
        low: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (low, 65535))

    def choose(a: int, b: int) -> int:
        raise AssertionError(f"a random port in {a}-{b}: no range below {low} to pick from")

    monkeypatch.setattr("bench.ports.random.randint", choose)
    port = ports.listener_port()
    assert 0 < port < 65536
    assert bindable(port)


def test_the_lowest_possible_range_is_still_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ephemeral range starting at 20001 leaves just 20000 (if it is free)."""
    if not bindable(ports.LOWEST):
        pytest.skip(f"port {ports.LOWEST} is taken on this machine")
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (ports.LOWEST + 1, 65535))
    assert ports.listener_port() == ports.LOWEST
