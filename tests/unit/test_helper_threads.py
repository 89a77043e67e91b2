"""Helper threads demoted to SCHED_BATCH, the loop thread left alone (sidecar/runtime/threads.py)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from sidecar.runtime import threads
from sidecar.runtime.threads import HelperThreads
from tests.infra import needs, unavailable


def _allowed() -> bool:
    """Whether this machine lets a thread of ours become SCHED_BATCH (a seccomp profile may not)."""
    if not threads.supported():
        return False
    result: list[bool] = []

    def probe() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
            result.append(True)
        except PermissionError:
            result.append(False)

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return result == [True]


needs_batch = needs(_allowed(), "Linux SCHED_BATCH for one thread (/proc/self/task, and permission)")


class _Parked(threading.Thread):
    """A thread that reports its native id and waits until released."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.tid = 0
        self.ready = threading.Event()
        self.release = threading.Event()

    def run(self) -> None:
        self.tid = threading.get_native_id()
        self.ready.set()
        self.release.wait(30)


def _start() -> _Parked:
    t = _Parked()
    t.start()
    assert t.ready.wait(10)
    return t


@needs_batch
def test_helpers_become_batch_and_the_loop_thread_does_not() -> None:
    loop_tid = threading.get_native_id()
    assert os.sched_getscheduler(loop_tid) == os.SCHED_OTHER
    first = _start()
    try:
        h = HelperThreads()
        assert h.demote() >= 1
        assert os.sched_getscheduler(first.tid) == os.SCHED_BATCH
        assert os.sched_getscheduler(loop_tid) == os.SCHED_OTHER
        # a thread started later (librdkafka connecting to another broker) is caught by the next call
        later = _start()
        try:
            assert os.sched_getscheduler(later.tid) == os.SCHED_OTHER  # inherited from this thread
            assert h.demote() == 1  # only the new one: the others are remembered
            assert os.sched_getscheduler(later.tid) == os.SCHED_BATCH
            assert h.demote() == 0
        finally:
            later.release.set()
            later.join()
    finally:
        first.release.set()
        first.join()
        os.sched_setscheduler(loop_tid, os.SCHED_OTHER, os.sched_param(0))


@needs_batch
def test_disabled_leaves_every_thread_alone() -> None:
    t = _start()
    try:
        assert HelperThreads(enabled=False).demote() == 0
        assert os.sched_getscheduler(t.tid) == os.SCHED_OTHER
    finally:
        t.release.set()
        t.join()


@needs(threads.supported(), "Linux SCHED_BATCH and /proc/self/task")
def test_a_refused_call_is_logged_once_and_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def refuse(tid: int, policy: int, param: object) -> None:
        calls.append(tid)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    a, b = _start(), _start()
    try:
        with capture_logs() as logs:
            assert HelperThreads().demote() == 0
        assert {a.tid, b.tid} <= set(calls)
        assert [ev["event"] for ev in logs] == ["threads.demote_failed"]
    finally:
        for t in (a, b):
            t.release.set()
            t.join()


@needs_batch
def test_demote_self_in_a_thread_pool_initializer() -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, initializer=threads.demote_self) as pool:
        assert pool.submit(os.sched_getscheduler, 0).result() == os.SCHED_BATCH
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller's thread is not touched


@needs_batch
def test_the_sidecar_flusher_is_batch_unless_none(tmp_path: Path) -> None:
    from sidecar.config import Settings
    from sidecar.engine.loop import Sidecar

    for mode, policy in (("flusher", os.SCHED_BATCH), ("all", os.SCHED_BATCH), ("none", os.SCHED_OTHER)):
        sc = Sidecar(Settings(data_dir=str(tmp_path / mode), bootstrap_servers="127.0.0.1:1", helper_threads=mode))
        try:
            assert sc.durability.flusher.submit(os.sched_getscheduler, 0).result() == policy, mode
        finally:
            sc.durability.flusher.shutdown(wait=True)


@needs_batch
@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
def test_the_id_index_pass_runs_on_a_batch_worker(tmp_path: Path, native: bool) -> None:
    """The merge pass never preempts the loop and never holds the GIL at idle priority (threads.py,
    "Idle threads"): it runs on a kept worker thread at SCHED_BATCH (its native work at SCHED_IDLE
    on a thread of its own: test_idx_merge.py), kept from one pass to the next, and the loop's
    thread keeps its policy."""
    from sidecar.store import idgrowth, idindex, idpass

    if native and idindex._native is None:
        unavailable("the C extension sidecar._native")
    seen: list[tuple[int, int]] = []

    class Probe(idpass.Pass):
        def merge(self) -> None:
            seen.append((os.sched_getscheduler(0), threading.get_native_id()))
            super().merge()

    ix = idindex.IdIndex(tmp_path, native=native)
    ix.growth.pass_class = Probe
    ix.restore(None)
    ix.step(1, 1 << 40)
    threads_before = threading.active_count()  # the index's worker waits already
    for k in range(2):
        ix.put(12345 + k, 7)
        ix.step(2 + (k + 1) * int(idgrowth.CUT_S * 1000), 1 << 40)  # the generation is due: cut, pass started
        ix.wait()
    assert [policy for policy, _tid in seen] == [os.SCHED_BATCH] * 2
    assert threading.get_native_id() not in {tid for _policy, tid in seen}
    assert threading.active_count() == threads_before  # no thread started for a pass
    assert ix.passes == 2 and ix.find(12345) == [7] and ix.find(12346) == [7]
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    ix.close()


def test_a_pass_that_raises_fails_and_the_workers_run_the_next(tmp_path: Path) -> None:
    """A pass raising something other than a disk error (a bug) counts as a failed pass, retried
    after RETRY_S like one; the worker thread that ran it lives on (no thread lost from the pool)."""
    from sidecar.store import idgrowth, idindex, idpass

    calls: list[int] = []

    class Buggy(idpass.Pass):
        def merge(self) -> None:
            calls.append(threading.get_native_id())
            if len(calls) == 1:
                raise ValueError("a bug")
            super().merge()

    ix = idindex.IdIndex(tmp_path, native=False)
    ix.growth.pass_class = Buggy
    ix.restore(None)
    ix.step(1, 1 << 40)
    threads_before = threading.active_count()
    ix.put(12345, 7)
    now = 1 + int(idgrowth.CUT_S * 1000)
    with capture_logs() as logs:
        ix.step(now, 1 << 40)  # cut: the pass raises
        ix.wait()
    assert [e["error"] for e in logs if e["event"] == "ids.pass_failed"] == ["id index pass: ValueError('a bug')"]
    assert ix.passes == 0
    now += int(idgrowth.RETRY_S * 1000) + 1
    ix.step(now, 1 << 40)  # the sealed generation's pass again
    ix.wait()
    assert ix.passes == 1 and ix.find(12345) == [7] and len(calls) == 2
    assert threading.active_count() == threads_before
    ix.close()
