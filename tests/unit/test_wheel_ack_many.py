"""``WheelScheduler.ack_many`` (the batch path, with the handed-out check inlined) against one
``ack`` per ref: two wheels fed the same records, clock steps and acks (handed-out refs, refs not
handed out yet, acked twice, bogus) stay identical, state, pending counts and timer-log bytes."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.helpers.wheel_env import T0, Env

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(-30, 350).map(lambda x: x * 10 - x % 3)),  # many ties
        st.tuples(st.just("due"), st.integers(0, 400), st.integers(1, 4)),
        st.tuples(st.just("ack"), st.lists(st.integers(0, 1 << 30), max_size=12), st.integers(0, 3)),
        st.tuples(st.just("checkpoint")),
    ),
    max_size=60,
)


def _files(e: Env) -> dict[int, bytes]:
    return {f: bytes(m.buf) for f, m in e.w.tl.files.items()}


@settings(max_examples=150, deadline=None)
@given(ops=OPS)
def test_ack_many_is_ack_of_each_ref(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        one, many = Env(Path(d1)), Env(Path(d2))
        now = T0
        handed: list[int] = []
        added: list[int] = []
        for op in ops:
            if op[0] == "add":
                refs = {one.add(now + op[1], now), many.add(now + op[1], now)}
                assert len(refs) == 1
                added.append(refs.pop())
            elif op[0] == "due":
                now += op[1]
                a, b = one.w.due(now, op[2]), many.w.due(now, op[2])
                assert [r for r, _ in a] == [r for r, _ in b]
                handed += [r for r, _ in a]
            elif op[0] == "ack":
                pool = handed + added
                refs = [pool[i % len(pool)] for i in op[1]] if pool else []
                refs += [-1, 1 << 40, (1 << 62) | 12345][: op[2]]
                for r in refs:
                    one.w.ack(r)
                many.w.ack_many(refs)
            else:
                one.checkpoint()
                many.checkpoint()
            assert one.w.state() == many.w.state()
            assert one.w.tl.dirty == many.w.tl.dirty
            assert _files(one) == _files(many)
