"""The next file of a level queue and of the timer log is created on the page thread before the
appends reach it (``mapped.Spare``): the loop takes it; when it is not there in time, failed, or
was asked for nothing, the loop creates the file itself, and no two threads ever create the same
file."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from sidecar.levels.queue import LevelQueue
from sidecar.store import codec
from sidecar.store.log import AHEAD_BYTES, CommitLog
from sidecar.store.mapped import HEADER_SIZE, MappedFile, PageWorker, Spare, discard_mapped, page_worker
from sidecar.wheel.layout import TimerLog
from tests.unit.helpers.pages import needs_populate, resident

PER = 64  # entries per file: the next file is asked for from entry 32 on


def _who_creates(monkeypatch: pytest.MonkeyPatch, cls: Any, fail_on_page_thread: bool = False) -> list[tuple[int, str]]:
    """Record (first, thread name) for every file ``cls`` creates."""
    made: list[tuple[int, str]] = []
    real = cls._create

    def create(self: Any, first: int) -> MappedFile:
        name = threading.current_thread().name
        if fail_on_page_thread and name == "kds-pages":
            raise OSError(28, "No space left on device")
        f = real(self, first)
        made.append((first, name))
        return f

    monkeypatch.setattr(cls, "_create", create)
    return made


def _settle(pages: PageWorker) -> None:
    """Let the page thread finish what it was asked (closing it waits; the next request restarts it)."""
    pages.close()


def test_a_level_queue_takes_the_next_file_the_page_thread_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _who_creates(monkeypatch, LevelQueue)
    pages = page_worker()
    q = LevelQueue(tmp_path / "q", PER, pages)
    nxt = tmp_path / "q" / f"{PER:020d}.q"
    for i in range(PER // 2 - 1):
        q.write(i, 64 + i, 1000 + i)
    _settle(pages)
    assert not nxt.exists()  # not half-way yet: nothing asked
    for i in range(PER // 2 - 1, PER):
        q.write(i, 64 + i, 1000 + i)
    _settle(pages)
    assert nxt.exists() and PER not in q.files  # made ahead, not yet taken
    assert made == [(0, threading.current_thread().name), (PER, "kds-pages")]
    q.write(PER, 1, 2)  # the first append into it takes it: no creation on the loop
    assert len(made) == 2 and q.spare.made == 1
    assert q.created  # the directory is synced by the next flush all the same
    q.flush()
    q.close()
    again = LevelQueue(tmp_path / "q", PER)
    assert sorted(again.files) == [0, PER]
    assert again.read(PER)[:2] == (1, 2) and again.read(5)[:2] == (69, 1005)
    again.close()
    pages.close()


def test_a_take_before_the_page_thread_got_to_it_creates_on_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _who_creates(monkeypatch, LevelQueue)
    pages = page_worker()
    release = threading.Event()
    pages.call(release.wait)  # the page thread is busy with something else
    q = LevelQueue(tmp_path / "q", PER, pages)
    for i in range(PER + 3):
        q.write(i, 64 + i, 1000 + i)
    release.set()
    _settle(pages)
    # the request was cancelled by the take: the loop created the file, the thread skipped it
    assert [t for _f, t in made] == [threading.current_thread().name] * 2
    assert q.spare.made == 0
    assert [q.read(i)[0] for i in (0, PER - 1, PER + 2)] == [64, 64 + PER - 1, 64 + PER + 2]
    q.close()
    pages.close()


def test_a_failed_creation_on_the_page_thread_is_left_to_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _who_creates(monkeypatch, LevelQueue, fail_on_page_thread=True)
    pages = page_worker()
    q = LevelQueue(tmp_path / "q", PER, pages)
    for i in range(PER - 1):
        q.write(i, 64 + i, 1000 + i)
    _settle(pages)
    assert PER not in q.files and not (tmp_path / "q" / f"{PER:020d}.q").exists()
    q.write(PER - 1, 1, 1)
    q.write(PER, 2, 2)
    assert [f for f, _t in made] == [0, PER] and q.spare.made == 0
    assert q.read(PER)[:2] == (2, 2)
    q.close()
    pages.close()


def test_a_file_made_and_never_taken_is_deleted_at_close(tmp_path: Path) -> None:
    pages = page_worker()
    q = LevelQueue(tmp_path / "q", PER, pages)
    for i in range(PER // 2 + 1):
        q.write(i, 64 + i, 1000 + i)
    _settle(pages)
    nxt = tmp_path / "q" / f"{PER:020d}.q"
    assert nxt.exists()
    q.flush()
    q.close()
    assert not nxt.exists()
    pages.close()


def test_a_spare_a_crash_left_is_opened_and_written_like_any_file(tmp_path: Path) -> None:
    pages = page_worker()
    q = LevelQueue(tmp_path / "q", PER, pages)
    for i in range(PER - 2):
        q.write(i, 64 + i, 1000 + i)
    _settle(pages)
    q.flush()
    # killed here: the queue is never closed, the spare stays on disk with its header
    again = LevelQueue(tmp_path / "q", PER, pages)
    assert sorted(again.files) == [0, PER]
    for i in range(PER - 2, PER + 2):
        again.write(i, 7 + i, 8 + i)
    assert again.read(PER + 1)[:2] == (7 + PER + 1, 8 + PER + 1)
    again.flush()
    again.close()
    pages.close()


def test_the_timer_log_takes_the_next_file_the_page_thread_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _who_creates(monkeypatch, TimerLog)
    pages = page_worker()
    tl = TimerLog(tmp_path / "tl", PER, pages)
    for i in range(PER):
        tl.append(i, 1000 + i, 64 + i, 0, 0)
        tl.prefault(i + 1)  # as the ring does after each append near the asked window's end
    _settle(pages)
    assert made == [(0, threading.current_thread().name), (PER, "kds-pages")]
    assert tl.append(PER, 5, 6, 0, 0)  # a new file for the ring's books, taken
    assert len(made) == 2 and tl.spare.made == 1 and tl.dir_dirty
    assert tl.read(PER)[:2] == (5, 6)
    tl.flush()
    tl.close()
    pages.close()


def test_a_spare_asked_for_another_file_is_deleted(tmp_path: Path) -> None:
    made: list[int] = []
    pages = page_worker()

    def make(first: int) -> MappedFile:
        made.append(first)
        return LevelQueue._file(q, first, True)

    q = LevelQueue(tmp_path / "q", PER)
    spare = Spare(pages, make, discard_mapped)
    spare.ask(PER)
    _settle(pages)
    assert (tmp_path / "q" / f"{PER:020d}.q").exists()
    spare.ask(2 * PER)  # the owner moved on (a restore): the first one goes
    _settle(pages)
    assert not (tmp_path / "q" / f"{PER:020d}.q").exists()
    assert spare.take(PER) is None
    f = spare.take(2 * PER)
    assert f is not None and made == [PER, 2 * PER]
    f.close()
    assert spare.take(2 * PER) is None  # taken once
    spare.close()
    q.close()
    pages.close()


def test_without_a_page_thread_nothing_is_asked(tmp_path: Path) -> None:
    q = LevelQueue(tmp_path / "q", PER)
    for i in range(PER + 1):
        q.write(i, 64 + i, 1000 + i)
    assert sorted(q.files) == [0, PER] and q.spare.made == 0
    q.close()


SEG = 1 << 14


def _append(log: CommitLog, n: int) -> int:
    return log.append(
        codec.head(
            rtype=codec.MESSAGE, due_ms=1000 + n, enqueue_ms=n, src_offset=n, src_partition=0, target_partition=-1,
            retry_count=0, level=1,
        ),
        b"r", b"t", None, bytes([n % 251 + 1]) * 300, b"",
    )


def test_the_commit_log_takes_the_next_segment_the_page_thread_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _who_creates(monkeypatch, CommitLog)
    pages = page_worker()
    log = CommitLog(tmp_path, SEG, pages)
    list(log.recover(None, None))
    positions = []
    while log.head < SEG // 2:
        positions.append(_append(log, len(positions)))
    positions.append(_append(log, len(positions)))  # past half-way: the next segment is asked for
    _settle(pages)
    assert made == [(0, threading.current_thread().name), (1, "kds-pages")] and 1 not in log.segments
    while log.head < SEG:
        positions.append(_append(log, len(positions)))  # the roll takes it
    assert len(made) == 2 and log.spare.made == 1 and positions[-1] // SEG == 1
    state = log.state()
    log.flush()
    log.close()
    again = CommitLog(tmp_path, SEG)
    assert [p for p, _r in again.recover(HEADER_SIZE, None)] == positions
    assert again.head == int(str(state["head"]))
    again.close()
    pages.close()


@needs_populate
def test_the_next_segments_first_pages_are_faulted_in_when_it_is_made(tmp_path: Path) -> None:
    """The page thread that makes the next segment ahead also faults in its first AHEAD_BYTES (not
    only from its first append on): the first appends into it then find their pages mapped."""
    seg = 1 << 22  # AHEAD_BYTES (4 MiB) is the whole segment: the header's page and the rest
    pages = page_worker()
    log = CommitLog(tmp_path, seg, pages)
    list(log.recover(None, None))
    n = 0
    while log.head < seg // 2 + 4096:
        _append(log, n)
        n += 1
    _settle(pages)
    spare = tmp_path / "log" / f"{seg:020d}.log"
    assert spare.exists() and 1 not in log.segments
    assert resident(spare) >= min(AHEAD_BYTES, seg) - HEADER_SIZE, "its first pages are mapped before any append"
    while log.head < seg + 3 * 4096:  # the roll takes it; its records read back as written
        _append(log, n)
        n += 1
    assert log.spare.made == 1 and 1 in log.segments
    log.close()
    pages.close()


def test_a_torn_tail_before_a_spare_segment_is_cut_not_refused(tmp_path: Path) -> None:
    """Killed with the next segment made ahead and a record half-written at the head: the spare
    holds nothing and goes, and the torn record is the last segment's torn tail, as without it."""
    pages = page_worker()
    log = CommitLog(tmp_path, SEG, pages)
    list(log.recover(None, None))
    positions = []
    while log.head < SEG * 3 // 4:
        positions.append(_append(log, len(positions)))
    _settle(pages)
    spare = tmp_path / "log" / f"{SEG:020d}.log"
    assert spare.exists()
    log.flush()
    # killed in the middle of the last record: its second half never got in
    seg0 = tmp_path / "log" / f"{0:020d}.log"
    data = bytearray(seg0.read_bytes())
    last = positions[-1]
    data[last + 100 : log.head] = bytes(log.head - last - 100)
    seg0.write_bytes(data)
    again = CommitLog(tmp_path, SEG)
    assert [p for p, _r in again.recover(HEADER_SIZE, None)] == positions[:-1]
    assert again.head == last and [t.position for t in again.truncations] == [last]
    assert sorted(again.segments) == [0] and not spare.exists()
    assert _append(again, 7) == last
    again.close()
    pages.close()


def test_the_id_index_takes_the_next_journal_the_page_thread_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sidecar.store import idjournal
    from sidecar.store.idindex import IdIndex

    made: list[tuple[int, str]] = []
    real = idjournal.JournalWriter.__init__

    def init(self: idjournal.JournalWriter, directory: Path, g: int) -> None:
        made.append((g, threading.current_thread().name))
        real(self, directory, g)

    monkeypatch.setattr(idjournal.JournalWriter, "__init__", init)
    pages = page_worker()
    ix = IdIndex(tmp_path, pages=pages)
    ix.restore(None)
    _settle(pages)
    loop = threading.current_thread().name
    assert made == [(1, loop), (2, "kds-pages")]  # the open generation's, and the next one's ahead
    assert idjournal.path_of(tmp_path, 2).exists()
    ix.put(12345, 7)
    ix.step(1_000, 5_000)
    assert ix.growth.cut(force=True) == 1  # generation 2 opens: its journal is taken, 3 is asked for
    _settle(pages)
    assert made == [(1, loop), (2, "kds-pages"), (3, "kds-pages")]
    ix.wait()
    assert ix.find(12345) == [7]
    ix.close()
    assert not idjournal.path_of(tmp_path, 3).exists()  # made and never taken: deleted at close
    pages.close()
    # a journal made ahead that a crash left is named by no checkpoint: the next open deletes it
    idjournal.JournalWriter(tmp_path, 9).close()
    again = IdIndex(tmp_path)
    again.restore(None)
    assert not idjournal.path_of(tmp_path, 9).exists()
    again.close()
