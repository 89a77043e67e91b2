"""The levels scheduler's ``due`` and ``ack_many`` (which read queue files directly, a file at a
time) against the straightforward one-entry-at-a-time versions they replaced: for any
interleaving of adds, cancels, due calls with any limit (tiny queue files, so runs cross file
boundaries) and batches of acks, both hand out the same records in the same order and end in the
same state, and nothing is handed out before its due time."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.levels.queue import PENDING
from sidecar.levels.scheduler import _IDX_BITS, _IDX_MASK, LevelsScheduler

LEVELS = (1000, 5000, 10000)


class FakeLog:
    """Records are their log positions; nothing to release."""

    def read(self, pos: int) -> int:
        return pos

    def release(self, pos: int) -> None:
        pass


def reference_due(s: LevelsScheduler, now_ms: int, limit: int) -> list[tuple[int, Any]]:
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
                s._finish(lv, idx)
                continue
            out.append(((n << _IDX_BITS) | idx, s.log.read(pos)))
    return out


def reference_ack_many(s: LevelsScheduler, refs: list[int]) -> None:
    for ref in refs:
        s.ack(ref)


_add = st.tuples(st.just("add"), st.integers(0, 3), st.integers(0, 20_000))
ops = st.lists(
    st.one_of(
        _add,
        _add,
        st.tuples(st.just("due"), st.integers(0, 3_000), st.integers(1, 7)),
        st.tuples(st.just("ack"), st.integers(0, 10), st.integers(0, 3)),
        st.tuples(st.just("cancel"), st.integers(0, 40), st.just(0)),
        st.tuples(st.just("stray"), st.integers(0, 40), st.just(0)),  # an ack for any ref, handed out or not
    ),
    min_size=20,
    max_size=150,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_due_and_ack_many_match_the_reference(program: list[tuple[str, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        fast = LevelsScheduler(Path(d1), FakeLog(), LEVELS, entries_per_file=4)  # type: ignore[arg-type]
        ref = LevelsScheduler(Path(d2), FakeLog(), LEVELS, entries_per_file=4)  # type: ignore[arg-type]
        now, pos, handed = 0, 8, []
        for op, a, b in program:
            if op == "add":
                due = now + b if a else now  # level 0: due now
                assert fast.add(due, a, pos) == ref.add(due, a, pos)
                pos += 8
            elif op == "due":
                now += a
                got, want = fast.due(now, b), reference_due(ref, now, b)
                assert got == want
                for r, _p in got:
                    lv = fast.levels[r >> _IDX_BITS]
                    assert lv.queue.read(r & _IDX_MASK)[1] <= now, "never early"
                handed += [r for r, _p in got]
            elif op == "ack" and handed:
                batch = handed[a % len(handed) :][: b + 1]
                handed = [r for r in handed if r not in batch]
                fast.ack_many(batch)
                reference_ack_many(ref, batch)
            elif op == "cancel":
                r = ((a % 4) << _IDX_BITS) | (a // 4)
                assert fast.cancel(r) == ref.cancel(r)
            elif op == "stray":
                r = ((a % 4) << _IDX_BITS) | (a // 4)
                handed = [h for h in handed if h != r]
                fast.ack_many([r])
                reference_ack_many(ref, [r])
            for x, y in zip(fast.levels, ref.levels, strict=True):
                assert (x.done, x.send, x.write, x.acked) == (y.done, y.send, y.write, y.acked)
        for x, y in zip(fast.levels, ref.levels, strict=True):
            assert list(x.queue.scan(x.done, x.write)) == list(y.queue.scan(y.done, y.write))
