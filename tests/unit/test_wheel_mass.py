"""Mass expiry on virtual time: 200,000 records due in the same ms, read in bounded chunks, with a
crash in the middle of the slot that redelivers only what was not acknowledged."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path
from typing import Any

from sidecar.store import codec
from sidecar.store.log import CommitLog
from sidecar.wheel import WheelScheduler

T0 = 1_700_000_000_000
N = 200_000
CHUNK = 5_000
SEG = 16 << 20
KW: dict[str, Any] = {"precision_ms": 10, "window_ms": 60_000, "bucket_width_ms": 30_000, "entries_per_file": 1 << 16}


def _open(root: Path, ckpt: dict[str, Any] | None) -> tuple[CommitLog, WheelScheduler]:
    log = CommitLog(root, SEG)
    w = WheelScheduler(root, log, **KW)
    w.restore(ckpt["sched"] if ckpt else None)
    if ckpt:
        live = {int(k): int(v) for k, v in ckpt["log"]["live"].items()}
        assert list(log.recover(int(ckpt["log"]["head"]), live)) == []
    else:
        list(log.recover(None, None))
    return log, w


def _checkpoint(log: CommitLog, w: WheelScheduler) -> dict[str, Any]:
    log.flush()
    w.flush()
    ck = {"log": log.state(), "sched": w.state()}
    log.reclaim()
    w.reclaim()
    return ck


def test_mass_expiry_in_chunks_and_a_crash_mid_slot(tmp_path: Path) -> None:
    log, w = _open(tmp_path, None)
    w.due(T0, 1)
    due = T0 + 1_000
    t = time.perf_counter()
    for i in range(N):
        pos = log.append(
            codec.head(
                rtype=codec.MESSAGE, due_ms=due, enqueue_ms=T0, src_offset=i, src_partition=0, target_partition=-1,
                retry_count=0, level=0,
            ),
            b"%d" % i, b"t", None, None, b"",
        )
        w.add(due, 0, pos)
    add_s = time.perf_counter() - t
    ck = _checkpoint(log, w)
    assert w.pending() == {"wheel": N, "bucket": 0}
    assert w.due(due - 1, CHUNK) == []

    acked = bytearray(N)  # flat bookkeeping, so the memory measured is the scheduler's
    held: list[int] = []  # handed out, never acked: in flight at the crash
    handed = bytearray(N)
    peak = 0
    t = time.perf_counter()
    for n in range(25):  # 125,000 handed out; the checkpoint after 20 chunks
        if n == 10:  # memory over chunks 10..12: the scheduler keeps nothing per record
            tracemalloc.start()
        out = w.due(due, CHUNK)
        assert len(out) == CHUNK
        ids = [int(bytes(rec.id)) for _ref, rec in out]
        assert ids == list(range(n * CHUNK, (n + 1) * CHUNK)), "arrival order, chunk after chunk"
        for k, (ref, _rec) in enumerate(out):
            handed[ids[k]] = 1
            if k in (17, 4242) and n in (3, 22):
                held.append(ids[k])
            else:
                w.ack(ref)
                acked[ids[k]] = 1
        del out, ids
        if n == 12:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        if n == 19:
            ck = _checkpoint(log, w)
            assert w.pending()["wheel"] == N - (3 * CHUNK + 17)  # done stops at the first held record
    chunk_s = time.perf_counter() - t
    assert peak < 8 << 20, f"memory must stay flat while reading the slot (peak {peak} bytes)"
    assert ck["sched"]["done"][2] >= 3 * CHUNK + 17 - 1, "the cursor inside the slot is checkpointed"

    # crash: no flush, no checkpoint; the files keep what the process wrote (page cache)
    w.close()
    log.close()
    log, w = _open(tmp_path, ck)
    redelivered: list[int] = []
    calls = 0
    while (nxt := w.next_due_ms()) is not None and nxt <= due:  # as the event loop does
        out = w.due(due, CHUNK)  # may be empty while it skips acked entries (bounded work per call)
        calls += 1
        for ref, rec in out:
            redelivered.append(int(bytes(rec.id)))
            w.ack(ref)
    assert sorted(redelivered) == sorted(held + [i for i in range(N) if not handed[i]])
    assert len(redelivered) == N - 125_000 + 4, "only what was never acknowledged comes back"
    assert not any(acked[i] for i in redelivered)
    assert calls < 40
    w.due(due + 10, 1)
    _checkpoint(log, w)
    assert w.pending() == {"wheel": 0, "bucket": 0}
    assert all(v == 0 for v in log.live.values())
    assert len(w.tl.files) <= 1
    w.close()
    log.close()
    rates = f"append+add {N / add_s:,.0f}/s; due+ack {125_000 / chunk_s:,.0f}/s"
    print(f"\n{rates}; peak {peak >> 10} KiB per 5,000-record chunk")
