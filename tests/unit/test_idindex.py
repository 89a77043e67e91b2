"""The id index against a reference model (a dict of hash -> set of refs): any interleaving of
puts, removes and lookups, including across rebuilds and a reopen, answers the same; tombstones
never accumulate beyond what the live chains need."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.store.idindex import EMPTY, HEADER_SIZE, SLOT, TOMB, IdIndex

# Few distinct hashes with shared low bits: long probe chains and collisions on purpose.
hashes = st.integers(0, 40).map(lambda k: 2 + (k % 5) + (k // 5) * 64)
ops = st.lists(st.tuples(st.sampled_from(["put", "remove", "find"]), hashes, st.integers(1, 6)), max_size=300)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_matches_reference(program: list[tuple[str, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        ix = IdIndex(Path(d), initial_capacity=16)
        ref: dict[int, set[int]] = {}
        for op, h, r in program:
            if op == "put":
                ix.put(h, r)
                ref.setdefault(h, set()).add(r)
            elif op == "remove":
                assert ix.remove(h, r) == (r in ref.get(h, set()))
                ref.get(h, set()).discard(r)
            else:
                assert sorted(ix.find(h)) == sorted(ref.get(h, set()))
        assert ix.live == sum(len(v) for v in ref.values())
        slots = [SLOT.unpack_from(ix.f.buf, HEADER_SIZE + i * 16)[0] for i in range(ix.cap)]
        assert ix.tombs == slots.count(TOMB)
        # a tombstone is never the last slot of a chain (those are emptied on delete)
        for i, h in enumerate(slots):
            if h == TOMB:
                assert slots[(i + 1) % ix.cap] != EMPTY
        ix.flush()
        ix.close()
        again = IdIndex(Path(d))
        again.restore(None)
        for h, refs in ref.items():
            assert sorted(again.find(h)) == sorted(refs)
        assert again.live == ix.live
        again.close()


def _exact(ix: IdIndex) -> tuple[int, int]:
    slots = [SLOT.unpack_from(ix.f.buf, HEADER_SIZE + i * 16)[0] for i in range(ix.cap)]
    return ix.cap - slots.count(EMPTY) - slots.count(TOMB), slots.count(TOMB)


def _apply(ix: IdIndex, ref: dict[int, set[int]], op: str, h: int, r: int) -> None:
    if op == "put":
        ix.put(h, r)
        ref.setdefault(h, set()).add(r)
    elif op == "remove":
        assert ix.remove(h, r) == (r in ref.get(h, set()))
        ref.get(h, set()).discard(r)
    else:
        assert sorted(ix.find(h)) == sorted(ref.get(h, set()))


@settings(max_examples=300, deadline=None)
@given(ops, ops, st.integers(1, 4))
def test_background_recount_after_a_crash_ends_exact(before: list[tuple[str, int, int]],
                                                     after: list[tuple[str, int, int]], step: int) -> None:
    """Counts restored from a checkpoint miss what changed after it; the background recount,
    interleaved with puts and removes in both the counted and the uncounted part of the table,
    ends with the exact counts."""
    with tempfile.TemporaryDirectory() as d:
        ix = IdIndex(Path(d), initial_capacity=256 if step > 1 else 64)  # mostly without a rebuild
        ref: dict[int, set[int]] = {}
        half = len(before) // 2
        for op, h, r in before[:half]:
            _apply(ix, ref, op, h, r)
        ck = ix.state()  # the checkpoint
        for op, h, r in before[half:]:  # after it: survives the kill in the mapping, not in ck
            _apply(ix, ref, op, h, r)
        ix.close()
        again = IdIndex(Path(d), count_at_open=0)
        again.restore(ck)
        assert again.counting == (ck["cap"] == again.cap)  # a rebuild after the checkpoint: counted at once
        for op, h, r in after:
            _apply(again, ref, op, h, r)
            again.recount_step(step)
        while not again.recount_step(step):
            pass
        assert not again.counting
        assert (again.live, again.tombs) == _exact(again)
        assert again.live == sum(len(v) for v in ref.values())
        again.close()


def test_count_range_finds_exactly_the_empty_and_tombstone_hashes() -> None:
    """Zero bytes everywhere else (in hashes, in refs, a tombstone before an empty slot) must not
    make ``bytes.count`` match across a slot boundary."""
    with tempfile.TemporaryDirectory() as d:
        ix = IdIndex(Path(d), initial_capacity=64)
        tricky = [2, 1 << 56, 0x0100000000000000 + 2, 256, 1 << 8, (1 << 63) + 1]
        plan = [EMPTY, TOMB, EMPTY, TOMB, TOMB, *tricky, EMPTY, TOMB, *tricky, TOMB] * 2
        for i, h in enumerate(plan):
            SLOT.pack_into(ix.f.buf, HEADER_SIZE + i * 16, h, 0 if i % 3 else 1 << 56)
        SLOT.pack_into(ix.f.buf, HEADER_SIZE + 63 * 16, TOMB, 0)  # the last slot, before the first
        assert ix._count_range(0, ix.cap) == _exact(ix)
        assert ix._count_range(3, 40) == (
            sum(1 for h in plan[3:40] if h > TOMB), sum(1 for h in plan[3:40] if h == TOMB)
        )
        ix.close()


def test_background_recount_exact_under_random_interleavings(tmp_path: Path) -> None:
    """Seeded companion of the property test with longer programs: inserts that reuse tombstones
    and deletes that clear them, on both sides of the recount cursor."""
    rng = random.Random(7)
    for case in range(200):
        d = tmp_path / str(case)
        d.mkdir()
        ix = IdIndex(d, initial_capacity=256)
        p_put = rng.uniform(0.4, 0.7)

        def op(ix: IdIndex, p_put: float = p_put) -> None:
            k = rng.randint(0, 40)
            h, r = 2 + (k % 5) + (k // 5) * 64, rng.randint(1, 6)
            if rng.random() < p_put:
                ix.put(h, r)
            else:
                ix.remove(h, r)

        for _ in range(100):
            op(ix)
        ck = ix.state()
        for _ in range(50):
            op(ix)
        ix.close()
        again = IdIndex(d, count_at_open=0)
        again.restore(ck)
        step = rng.randint(1, 4)
        for _ in range(200):
            op(again)
            again.recount_step(step)
        while not again.recount_step(step):
            pass
        assert (again.live, again.tombs) == _exact(again), f"case {case}"
        again.close()
