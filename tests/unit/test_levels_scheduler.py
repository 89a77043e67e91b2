"""The levels scheduler's ``due`` and ``ack_many`` (which read queue files directly, a file at a
time, in C or with the Python twins in ``sidecar.levels.queue``) against the straightforward
one-entry-at-a-time versions they replaced: for any interleaving of adds, cancels, due calls with
any limit (tiny queue files, so runs cross file boundaries; tiny log segments, so releases are
spread over several) and batches of acks, both hand out the same records in the same order and
end in the same state — cursors, queue-file entries and the commit log's live counts — and
nothing is handed out before its due time."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.levels.queue import DELIVERED, NO_POS, PENDING
from sidecar.levels.scheduler import _IDX_BITS, _IDX_MASK, LevelsScheduler
from sidecar.store import codec
from sidecar.store.codec import MESSAGE
from sidecar.store.log import CommitLog

LEVELS = (1000, 5000, 10000)
SEGMENT = 1024  # a handful of records per segment


def _append(log: CommitLog, due: int, level: int) -> int:
    return log.append(
        codec.head(
            rtype=MESSAGE, due_ms=due, enqueue_ms=0, src_offset=log.appended, src_partition=0, target_partition=-1,
            retry_count=0, level=level,
        ),
        b"id-%d" % log.appended, b"out", None, b"v" * 40, b"\x00\x00",
    )


def reference_finish(s: LevelsScheduler, acked: list[set[int]], n: int, idx: int) -> None:
    """The done cursor as it was: a set of the acked indexes above ``done`` per level."""
    lv = s.levels[n]
    if idx != lv.done:
        acked[n].add(idx)
        return
    while True:
        pos, _due, _state = lv.queue.read(lv.done)
        if pos != NO_POS:
            s.log.release(pos)
        lv.done += 1
        if lv.done not in acked[n]:
            break
        acked[n].discard(lv.done)


def reference_due(s: LevelsScheduler, acked: list[set[int]], now_ms: int, limit: int) -> list[tuple[int, Any]]:
    out: list[tuple[int, Any]] = []
    heads = sorted((lv.queue.due_of(lv.send), n) for n, lv in enumerate(s.levels) if lv.send < lv.write)
    for head_due, n in heads:
        if head_due > now_ms or len(out) >= limit:
            break
        lv = s.levels[n]
        while lv.send < lv.write and len(out) < limit:
            idx = lv.send
            pos, due, state = lv.queue.read(idx)
            if due > now_ms and state == PENDING:
                break
            lv.send = idx + 1
            if state != PENDING:
                reference_finish(s, acked, n, idx)
                continue
            out.append(((n << _IDX_BITS) | idx, s.log.read(pos)))
    return out


def reference_ack_many(s: LevelsScheduler, acked: list[set[int]], refs: list[int]) -> None:
    for ref in refs:
        n, idx = ref >> _IDX_BITS, ref & _IDX_MASK
        lv = s.levels[n]
        if idx < lv.done or idx >= lv.send:
            continue
        lv.queue.set_state(idx, DELIVERED)
        reference_finish(s, acked, n, idx)


_add = st.tuples(st.just("add"), st.integers(0, 3), st.integers(0, 20_000))
ops = st.lists(
    st.one_of(
        _add,
        _add,
        st.tuples(st.just("due"), st.integers(0, 3_000), st.integers(1, 7)),
        st.tuples(st.just("ack"), st.integers(0, 10), st.integers(0, 3)),
        st.tuples(st.just("ack1"), st.integers(0, 10), st.just(0)),  # the single ``ack``
        st.tuples(st.just("cancel"), st.integers(0, 40), st.just(0)),
        st.tuples(st.just("stray"), st.integers(0, 40), st.just(0)),  # an ack for any ref, handed out or not
    ),
    min_size=20,
    max_size=150,
)


@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
@settings(max_examples=200, deadline=None)
@given(program=ops)
def test_due_and_ack_many_match_the_reference(native: bool, program: list[tuple[str, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        logs = CommitLog(Path(d1), SEGMENT), CommitLog(Path(d2), SEGMENT)
        for lg in logs:
            list(lg.recover(None, None))
        fast = LevelsScheduler(Path(d1), logs[0], LEVELS, entries_per_file=4, native=native)
        ref = LevelsScheduler(Path(d2), logs[1], LEVELS, entries_per_file=4, native=False)
        now, handed = 0, []
        acked: list[set[int]] = [set() for _ in ref.levels]
        for op, a, b in program:
            if op == "add":
                due = now + b if a else now  # level 0: due now
                pos = _append(logs[0], due, a)
                assert _append(logs[1], due, a) == pos
                assert fast.add(due, a, pos) == ref.add(due, a, pos)
            elif op == "due":
                now += a
                got, want = fast.due(now, b), reference_due(ref, acked, now, b)
                assert got == want
                for r, _p in got:
                    lv = fast.levels[r >> _IDX_BITS]
                    assert lv.queue.read(r & _IDX_MASK)[1] <= now, "never early"
                handed += [r for r, _p in got]
            elif op == "ack" and handed:
                batch = handed[a % len(handed) :][: b + 1]
                handed = [r for r in handed if r not in batch]
                fast.ack_many(batch)
                reference_ack_many(ref, acked, batch)
            elif op == "ack1" and handed:
                r = handed.pop(a % len(handed))
                fast.ack(r)
                reference_ack_many(ref, acked, [r])
            elif op == "cancel":
                r = ((a % 4) << _IDX_BITS) | (a // 4)
                assert fast.cancel(r) == ref.cancel(r)
            elif op == "stray":
                r = ((a % 4) << _IDX_BITS) | (a // 4)
                handed = [h for h in handed if h != r]
                fast.ack_many([r])
                reference_ack_many(ref, acked, [r])
            for x, y in zip(fast.levels, ref.levels, strict=True):
                assert (x.done, x.send, x.write) == (y.done, y.send, y.write)
                # the state bytes say what the set held: finished entries above done
                finished = {i for i, _p, _d, st_ in x.queue.scan(x.done, x.send) if st_ != PENDING}
                assert finished == acked[fast.levels.index(x)]
                assert (x.queue.dirty_from, x.queue.dirty_to) == (y.queue.dirty_from, y.queue.dirty_to)
            assert logs[0].live == logs[1].live
        for x, y in zip(fast.levels, ref.levels, strict=True):
            assert list(x.queue.scan(x.done, x.write)) == list(y.queue.scan(y.done, y.write))
        for lg in logs:
            lg.close()
