"""The id index against a reference model (a dict of hash -> set of refs): any interleaving of
puts, removes and lookups, including across rebuilds and a reopen, answers the same; tombstones
never accumulate beyond what the live chains need."""

from __future__ import annotations

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
