"""bench.workload.watch: a wait of the bench fails at once when a watched process has ended."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from confluent_kafka import Producer

import bench.cli as bench_cli
from bench.workload import BenchError, disk_low, flush_watched, unwatch_all, wait_until, watch


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    unwatch_all()
    yield
    unwatch_all()


class _Stuck:
    """A producer whose records never leave (its broker is gone)."""

    def __init__(self) -> None:
        self.calls = 0

    def flush(self, timeout: float) -> int:
        self.calls += 1
        time.sleep(min(timeout, 0.01))
        return 5


def test_a_wait_fails_at_once_when_a_watched_process_ended() -> None:
    state = {"dead": False}
    watch(lambda: "the broker exited with status -9" if state["dead"] else None)
    wait_until("a ready thing", lambda: True, timeout_s=1)  # nothing ended: the wait goes as before
    state["dead"] = True
    t0 = time.monotonic()
    with pytest.raises(BenchError, match="exited with status -9"):
        wait_until("a thing that never comes", lambda: False, timeout_s=60, interval_s=0.01)
    assert time.monotonic() - t0 < 5


def test_without_a_watch_a_wait_times_out_as_before() -> None:
    with pytest.raises(BenchError, match="timed out"):
        wait_until("a thing that never comes", lambda: False, timeout_s=0.05, interval_s=0.01)


def test_the_preload_flush_stops_on_the_watch() -> None:
    stuck = _Stuck()
    assert flush_watched(cast(Producer, stuck), 0.05) == 5  # nothing watched: the whole timeout
    watch(lambda: "gone")
    calls = stuck.calls
    with pytest.raises(BenchError, match="gone"):
        flush_watched(cast(Producer, stuck), 300)
    assert stuck.calls - calls == 1


def test_disk_low_names_the_file_system_and_the_way_out(tmp_path: Path) -> None:
    assert disk_low(tmp_path, min_free=0) is None
    why = disk_low(tmp_path, min_free=1 << 62)
    assert why is not None and str(tmp_path) in why and "--workdir" in why and "MiB free" in why
    assert disk_low(tmp_path / "gone", min_free=1 << 62) is None  # unreadable: not the bench's call


def test_the_bench_refuses_to_start_on_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_cli, "disk_low", functools.partial(disk_low, min_free=1 << 62))
    out = tmp_path / "report.json"
    rc = bench_cli.bench_main(["throughput", "--json", str(out), "--workdir", str(tmp_path / "w")])
    assert rc == 2 and not out.exists()
    assert "GiB: free some space" in capsys.readouterr().err
    assert (tmp_path / "w").is_dir(), "an explicit --workdir is the caller's, never removed"
