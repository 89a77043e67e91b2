"""The staged id index against a reference model (a dict of hash -> set of refs), on virtual time,
with its merge passes run by hand: any interleaving of puts, removes, cuts, passes, checkpoints
and crashes answers as the model says (store/idindex.py's module docstring: removes of scheduler
refs may be seen late, until their pass; removed pre-cancels never are); the counts a pass takes
are exact; growth, journals and the format of the earlier versions."""

from __future__ import annotations

import os
import random
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from sidecar.store import idgrowth, idjournal, idpass
from sidecar.store import idindex as idindex_mod
from sidecar.store.idgrowth import Growth
from sidecar.store.idindex import HEADER_SIZE, PRECANCEL, IdIndex
from sidecar.store.idprobe import count_range
from sidecar.store.idslot import EMPTY, SLOT, TOMB, tag, tags_of
from sidecar.store.mapped import deferred_sync, header_bytes
from tests.infra import unavailable
from tests.unit.helpers.id_passes import HandPass, run_pass

# Few distinct hashes with shared low bits: long probe chains and collisions on purpose; their top
# bits (the tags') shared by some, not all.
hashes = st.integers(0, 40).map(lambda k: 2 + (k % 5) + (k // 5) * 64 + ((k % 3) << 57))
refs = st.one_of(st.integers(1, 6), st.integers(1, 3).map(lambda r: PRECANCEL | r))
ops = st.lists(st.tuples(st.sampled_from(["put", "put", "remove", "find", "cut", "pass", "flush"]), hashes, refs),
               max_size=300)


@pytest.fixture(autouse=True)
def _hand_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Growth, "pass_class", HandPass)
    monkeypatch.setattr(idgrowth, "CUT_MIN", 8)


def _settle(ix: IdIndex, now: int) -> None:
    """Cut and merge until the stages are empty: the table alone answers."""
    for _ in range(3):
        run_pass(ix)
        ix.growth.cut(force=True)
        run_pass(ix)
    ix.step(now, 1 << 40)


def _slots(ix: IdIndex) -> list[tuple[int, int]]:
    return [SLOT.unpack_from(ix.f.buf, HEADER_SIZE + i * 16) for i in range(ix.cap)]


def _exact(ix: IdIndex) -> tuple[int, int]:
    hs = [h for h, _r in _slots(ix)]
    return ix.cap - hs.count(EMPTY) - hs.count(TOMB), hs.count(TOMB)


def _open(d: Path, state: dict[str, Any] | None = None, native: bool = True, cap: int = 16) -> IdIndex:
    ix = IdIndex(d, initial_capacity=cap, native=native)
    ix.restore(state)
    ix.step(1, 1 << 40)
    return ix


def _check(ix: IdIndex, model: dict[int, set[int]], late: dict[int, set[int]]) -> None:
    """find answers the model, plus only scheduler refs removed since their pass (``late``); the
    table's tags, once built, mirror its slots (no pass runs here between the hand-run ones)."""
    if ix.tags is not None:
        assert ix.tags[: ix.cap] == tags_of(h for h, _r in _slots(ix)) and len(ix.tags) == ix.cap
    for h in set(model) | set(late):
        got = set(ix.find(h))
        want = model.get(h, set())
        assert want <= got, (h, want, got)
        extra = got - want
        assert not {r for r in extra if r & PRECANCEL}, f"a removed pre-cancel is visible: {extra}"
        assert extra <= late.get(h, set()), (h, extra)


@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
@settings(max_examples=120, deadline=None)
@given(program=ops)
def test_matches_reference(native: bool, program: list[tuple[str, int, int]]) -> None:
    if native and idindex_mod._native is None:
        unavailable("the C extension sidecar._native")
    with tempfile.TemporaryDirectory() as d:
        ix = _open(Path(d), native=native)
        model: dict[int, set[int]] = {}
        late: dict[int, set[int]] = {}
        for op, h, r in program:
            if op == "put":
                ix.put(h, r)
                model.setdefault(h, set()).add(r)
            elif op == "remove":
                seen = r in ix.find(h)
                ix.remove(h, r)
                if r in model.get(h, set()):
                    assert seen
                elif r & PRECANCEL or r not in late.get(h, set()):  # (a late one may still be seen)
                    assert not seen
                if r in model.get(h, set()):
                    model[h].discard(r)
                    if not r & PRECANCEL:
                        late.setdefault(h, set()).add(r)
            elif op == "cut":
                ix.growth.cut(force=True)
            elif op == "pass":
                run_pass(ix)
            elif op == "flush":
                ix.flush()
                ix.state()
                ix.reclaim()
            _check(ix, model, late)
        _settle(ix, 2)
        assert (ix.tags is not None) == native  # built by the passes, with the accelerator only
        _check(ix, model, late)
        for h in set(model) | set(late):
            assert sorted(ix.find(h)) == sorted(model.get(h, set()))
        assert (ix.table_live, ix.table_tombs) == _exact(ix)
        assert ix.table_live == sum(len(v) for v in model.values())
        assert (ix.table_live + ix.table_tombs) * 2 <= ix.cap
        ix.close()


@settings(max_examples=150, deadline=None)
@given(program=ops, crash_at=st.integers(0, 300), run_last=st.booleans())
def test_a_crash_anywhere_in_the_cycle_recovers_the_checkpointed_index(
    program: list[tuple[str, int, int]], crash_at: int, run_last: bool
) -> None:
    """Checkpoints (flush, state, reclaim) among the operations; a crash (no flush) at any point:
    with a pass sealed and not run, run and not noticed, a growth not yet named. Reopened from
    the last checkpoint, every pair present at the checkpoint and not removed since is found,
    nothing never inserted is, and the counts are exact once the pass re-run is done."""
    with tempfile.TemporaryDirectory() as d:
        ix = _open(Path(d))
        model: dict[int, set[int]] = {}
        ever: dict[int, set[int]] = {}
        state: dict[str, Any] | None = None
        at_ck: dict[int, set[int]] = {}
        gone: set[tuple[int, int]] = set()  # removed since the checkpoint
        for op, h, r in program[:crash_at]:
            if op == "put":
                ix.put(h, r)
                model.setdefault(h, set()).add(r)
                ever.setdefault(h, set()).add(r)
            elif op == "remove":
                ix.remove(h, r)
                model.get(h, set()).discard(r)
                gone.add((h, r))
            elif op == "cut":
                ix.growth.cut(force=True)
            elif op == "pass":
                run_pass(ix)
            elif op == "flush":
                with deferred_sync() as batch:
                    ix.flush()
                state = ix.state()
                batch.run()
                ix.reclaim()
                at_ck = {k: set(v) for k, v in model.items()}
                gone = set()
        if run_last and isinstance(ix.growth.running, HandPass) and not ix.growth.running.done:
            ix.growth.running.run_now()  # the pass ran; the crash came before the loop noticed it
        ix.close()  # the kill: nothing flushed since the checkpoint
        again = _open(Path(d), state)
        _settle(again, 3)
        for h in set(ever):
            got = set(again.find(h))
            # a remove after the checkpoint may have reached the table (a pass ran): the store's
            # replay puts back what is still pending
            assert {r for r in at_ck.get(h, set()) if (h, r) not in gone} <= got, h
            assert got <= ever[h], h
        assert (again.table_live, again.table_tombs) == _exact(again)
        assert (again.table_live + again.table_tombs) * 2 <= again.cap
        again.close()  # a second crash before any checkpoint: the same checkpoint opens again
        third = _open(Path(d), state)
        _settle(third, 4)
        for h in set(ever):
            assert {r for r in at_ck.get(h, set()) if (h, r) not in gone} <= set(third.find(h)), h
        named = {g for g, _n in third.state()["journals"]}
        assert set(idjournal.generations(Path(d))) <= named | {g for g in third._merged}
        third.close()


def test_growth_rebuilds_off_the_loop_and_names_the_table_at_the_flush(tmp_path: Path) -> None:
    ix = _open(tmp_path)
    for i in range(30):
        ix.put(1000 + i * 17, i + 1)
    ix.growth.cut(force=True)
    assert ix.growth.running is not None and ix.growth.running.grow == 128 and ix.growth.running.new is not None
    new = ix.growth.running.new
    run_pass(ix)
    assert ix.cap == 128 and ix.grown == 1 and ix.f.path == new
    assert not ix.merging
    assert (tmp_path / "ids.idx").stat().st_size == HEADER_SIZE + 16 * 16
    with deferred_sync() as batch:
        ix.flush()
    batch.run()
    assert (tmp_path / "ids.idx").stat().st_size == HEADER_SIZE + 128 * 16 and not new.exists()
    ck = ix.state()
    assert ck["cap"] == 128 and ck["live"] == 30
    ix.reclaim()
    ix.close()
    again = _open(tmp_path, ck)
    for i in range(30):
        assert again.find(1000 + i * 17) == [i + 1]
    again.close()


def test_a_tag_takes_254_values_so_an_absent_id_matches_1_in_252_slots() -> None:
    """The tag of an occupied slot is the hash's top byte, 0 and 1 folded onto 2 and 3: every byte
    but EMPTY and TOMB is used. Two random ids' tags match 260/65536 = 1/252 of the time (with
    0x80 and the top 7 bits: 1/128); a new id's duplicate check reads the table only on a match."""
    assert {tag(v << 56 | 2) for v in range(256)} == set(range(2, 256))
    assert tag(EMPTY) == EMPTY and tag(TOMB) == TOMB and tag(2) == 2 and tag(1 << 56) == 3
    rng = random.Random(25)
    n = 400_000
    matches = sum(tag(rng.getrandbits(64) | 2) == tag(rng.getrandbits(64) | 2) for _ in range(n))
    # expected n/252 = 1587 (sd ~40); 7 bits would give n/128 = 3125
    assert 1400 < matches < 1780, matches


def test_the_tags_are_built_by_the_first_pass_and_follow_the_growths(tmp_path: Path) -> None:
    """No tags at the open (the table is probed without them); the first pass builds them whole,
    chunks it changed or not; a growth's pass builds the grown table's; a failed pass leaves the
    tags it did not build; the reopened index again has none until its first pass."""
    if idindex_mod._native is None:
        unavailable("the C extension sidecar._native")
    ix = _open(tmp_path)
    assert ix.tags is None
    ix.put(1000, 1)
    ix.growth.cut(force=True)
    tags = ix.growth.running.tags if ix.growth.running is not None else None
    assert tags is not None and len(tags) == 16 and tags[:] == bytes(16)  # fresh: not the loop's yet
    assert ix.tags is None and ix.find(1000) == [1]
    run_pass(ix)
    assert ix.tags is tags and tags[:] == tags_of(h for h, _r in _slots(ix))
    ix.put(2000 | 5 << 57, 2)
    ix.growth.cut(force=True)
    assert ix.growth.running is not None and ix.growth.running.tags is tags  # in place: the loop probes them meanwhile
    run_pass(ix)
    assert tags[:] == tags_of(h for h, _r in _slots(ix)) and ix.find(2000 | 5 << 57) == [2]
    for i in range(30):
        ix.put(3000 + i * 17 + (i << 57), i + 1)
    ix.growth.cut(force=True)
    assert ix.growth.running is not None and ix.growth.running.grow == 128 and ix.growth.running.tags is not tags
    run_pass(ix)
    assert ix.cap == 128 and ix.tags is not None and len(ix.tags) == 128 and tags.closed
    assert ix.tags[:] == tags_of(h for h, _r in _slots(ix))
    for i in range(30):
        assert ix.find(3000 + i * 17 + (i << 57)) == [i + 1]
    # a pass that fails: fresh tags it was building are dropped, the table's stay as they were
    built = ix.tags
    ix.put(9000, 9)
    ix.growth.cut(force=True)
    p = ix.growth.running
    assert isinstance(p, HandPass) and p.tags is built
    p.error, p.done = OSError(5, "EIO"), True
    ix.growth.poll()
    assert ix.tags is built and not built.closed and ix.find(9000) == [9]
    with deferred_sync() as batch:
        ix.flush()
    batch.run()
    ck = ix.state()
    ix.close()
    assert built.closed
    again = _open(tmp_path, ck)
    assert again.tags is None and again.merging  # the checkpoint's journals: merged again, tags built
    assert again.find(9000) == [9] and again.find(3001 + 16 + (1 << 57)) == [2]
    run_pass(again)
    assert again.tags is not None and again.tags[:] == tags_of(h for h, _r in _slots(again))
    assert again.find(9000) == [9]
    again.close()


def test_a_pass_started_before_the_flushs_rename_ran_merges_into_the_grown_table(tmp_path: Path) -> None:
    """A flush queues the grown table's rename to ``ids.idx`` in its checkpoint's sync batch (run
    later, on the flusher). A pass cut meanwhile must merge into the grown table, not open
    ``ids.idx`` while it is still the old, smaller one (a short read: the pass failed with EIO and
    waited 5 s to run again, its stage doubling on the loop meanwhile; seen in the 1M-record bench
    runs). Either way round the rename falls, the pass finds the table the index maps."""
    for rename_first in (False, True):
        d = tmp_path / str(rename_first)
        d.mkdir()
        ix = _open(d)
        for i in range(30):
            ix.put(1000 + i * 17, i + 1)
        ix.growth.cut(force=True)
        run_pass(ix)
        assert ix.cap == 128
        grown = ix.f.path
        with deferred_sync() as batch:
            ix.flush()
        assert ix.f.path == grown  # still its name: the rename has not run
        for i in range(20):
            ix.put(5000 + i * 13, 100 + i)
        ix.growth.cut(force=True)
        p = ix.growth.running
        assert p is not None and not p.grow  # merged in place, into the grown table
        if rename_first:
            batch.run()  # renamed between the cut and the pass's open
            assert ix.f.path == d / "ids.idx"
        assert run_pass(ix)
        assert p.error is None, p.error
        if not rename_first:
            batch.run()
        assert ix.f.path == d / "ids.idx" and not grown.exists()
        assert (d / "ids.idx").stat().st_size == HEADER_SIZE + 128 * 16
        _settle(ix, 2)
        for i in range(30):
            assert ix.find(1000 + i * 17) == [i + 1]
        for i in range(20):
            assert ix.find(5000 + i * 13) == [100 + i]
        ix.close()


def test_a_growth_the_checkpoint_never_saw_is_dropped_and_merged_again(tmp_path: Path) -> None:
    ix = _open(tmp_path)
    for i in range(4):
        ix.put(500 + i, i + 1)
    with deferred_sync() as batch:
        ix.flush()
    ck = ix.state()
    batch.run()
    for i in range(40):
        ix.put(1000 + i * 17, i + 1)
    ix.growth.cut(force=True)
    new = ix.growth.running.new if ix.growth.running is not None else None
    assert new is not None
    run_pass(ix)
    assert new.exists()
    ix.close()  # killed before the flush that names it
    again = _open(tmp_path, ck)
    assert not new.exists() and again.cap == 16
    _settle(again, 2)
    for i in range(4):
        assert again.find(500 + i) == [i + 1]
    assert all(again.find(1000 + i * 17) == [] for i in range(40))  # after the checkpoint: replayed by the store
    again.close()


def test_growths_no_flush_named_are_deleted_with_their_journals(tmp_path: Path) -> None:
    """A store checkpointed rarely (a standby restoring from its changelog) grows and merges with no
    flush between: each grown table replaces the last (deleted), merged journals no checkpoint named
    go at once, and the flush names the newest table."""
    ix = _open(tmp_path)
    for round_ in range(3):
        for i in range(40 * 4 ** round_):
            ix.put(1_000_000 * (round_ + 1) + i * 17, i + 1)
        ix.growth.cut(force=True)
        run_pass(ix)
        ix.reclaim()
    assert ix.grown == 3 and ix.cap >= 1024
    assert sorted(p.name for p in tmp_path.glob("ids.idx.next.*")) == [ix.f.path.name]
    assert idjournal.generations(tmp_path) == [ix.gen.g if ix.gen is not None else -1]
    with deferred_sync() as batch:
        ix.flush()
    batch.run()
    assert not list(tmp_path.glob("ids.idx.next.*"))
    ck = ix.state()
    ix.reclaim()
    ix.close()
    again = _open(tmp_path, ck)
    assert again.cap == ck["cap"] and again.find(3_000_000 + 17) == [2]
    again.close()


def test_a_slow_pass_grows_the_stage_and_loses_nothing(tmp_path: Path) -> None:
    ix = _open(tmp_path, cap=1 << 10)
    ix.growth.cut(force=True)  # a pass that never finishes
    stage = ix.gen.stage.cap if ix.gen is not None else 0
    for i in range(stage):
        ix.put(10_000 + i * 7919, i + 1)
    assert ix.gen is not None and ix.gen.stage.cap > stage
    for i in range(stage):
        assert ix.find(10_000 + i * 7919) == [i + 1]
    _settle(ix, 2)
    assert ix.table_live == stage
    ix.close()


def test_a_grown_stage_warns_only_once_it_is_as_large_as_the_table(tmp_path: Path) -> None:
    """A pass outrun by a burst doubles the stage at info; the doubling that makes the stage as
    large as the table (the index's memory doubled: passes behind for long) is the warning."""
    ix = _open(tmp_path, cap=1 << 15)
    ix.growth.cut(force=True)  # a pass that never finishes
    assert ix.gen is not None and ix.gen.stage.cap < ix.cap
    n = 0
    with capture_logs() as logs:
        while ix.gen.stage.cap < ix.cap:
            ix.put(50_000 + n * 7919, n + 1)
            n += 1
    grown = [(e["log_level"], e["capacity"], e["table_capacity"]) for e in logs if e["event"] == "ids.stage_grown"]
    assert len(grown) >= 2, grown
    assert {level for level, cap, table in grown[:-1]} == {"info"} and all(cap < table for _l, cap, table in grown[:-1])
    assert grown[-1] == ("warning", ix.cap, ix.cap)
    assert [cap for _l, cap, _t in grown] == [grown[0][1] << k for k in range(len(grown))]
    assert all(ix.find(50_000 + i * 7919) == [i + 1] for i in range(n))
    ix.close()


def test_expired_pre_cancels_leave_with_a_pass_unprobed(tmp_path: Path) -> None:
    ix = IdIndex(tmp_path, initial_capacity=16)
    ix.restore(None)
    t0 = 1_000_000
    ix.step(t0, 60_000)
    for i in range(5):
        ix.put(300 + i, PRECANCEL | (t0 + i))
    ix.put(400, 7)
    assert ix.precancels() == 5
    ix.step(t0 + 30_000, 60_000)  # a cut (CUT_S) merges them into the table
    run_pass(ix)
    assert ix.precancels() == 5 and ix.swept == 0
    ix.step(t0 + 60_003, 60_000)  # not a cut yet: the table is idle
    assert ix.growth.running is None
    ix.step(t0 + int(idgrowth.IDLE_PASS_S * 1000) + 30_001, 60_000)  # the idle pass sweeps
    run_pass(ix)
    assert ix.precancels() == 0 and ix.swept == 5 and ix.find(400) == [7]
    ix.close()


class _Blocker:
    """A job on the real pass workers that runs until released: another index's pass in flight."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.finished = threading.Event()
        self.error: Exception | None = None

    def run(self) -> None:
        self.release.wait(30)


def test_cuts_by_age_take_turns_with_the_other_indexes_passes(tmp_path: Path) -> None:
    """While another index's pass runs in the process, a generation due only by its age waits
    (up to twice CUT_S); one whose stage is full is cut at once; once that pass ends, the age cut
    is taken at the next step. _Workers.busy counts the passes submitted and not finished."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = IdIndex(tmp_path / "a", initial_capacity=16)
    b = IdIndex(tmp_path / "b", initial_capacity=16)
    t0 = 1_000_000
    for ix in (a, b):
        ix.restore(None)
        ix.step(t0, 60_000)
    a.put(1000, 1)
    cut_s = int(idgrowth.CUT_S * 1000)
    busy0 = idpass.WORKERS.busy
    other = _Blocker()
    idpass.WORKERS.submit(other)  # type: ignore[arg-type]
    try:
        assert idpass.WORKERS.busy == busy0 + 1
        assert a.step(t0 + cut_s, 60_000) == 0 and a.growth.running is None  # due by age: waits its turn
        assert a.step(t0 + 2 * cut_s - 1, 60_000) == 0
        for i in range(idgrowth.cut_ops(b.cap)):
            b.put(2000 + i, i + 1)
        assert b.step(t0 + 1, 60_000) == idgrowth.cut_ops(b.cap)  # full: cut at once
        run_pass(b)
    finally:
        other.release.set()
    assert other.finished.wait(10)
    assert idpass.WORKERS.busy == busy0
    assert a.step(t0 + 2 * cut_s - 1, 60_000) == 1 and a.growth.running is not None  # its turn now
    run_pass(a)
    assert a.find(1000) == [1]
    a.put(1001, 2)
    a.step(t0 + 2 * cut_s, 60_000)
    other = _Blocker()
    idpass.WORKERS.submit(other)  # type: ignore[arg-type]
    try:
        assert a.step(t0 + 3 * cut_s, 60_000) == 0  # another turn to wait for
        assert a.step(t0 + 4 * cut_s, 60_000) == 1  # twice CUT_S: cut, busy or not
    finally:
        other.release.set()
    assert other.finished.wait(10)
    run_pass(a)
    assert a.find(1001) == [2]
    a.close()
    b.close()


def test_a_removed_pre_cancel_is_hidden_until_its_pass(tmp_path: Path) -> None:
    ix = _open(tmp_path)
    pre = PRECANCEL | 123
    ix.put(77, pre)
    _settle(ix, 2)
    assert ix.find(77) == [pre]
    ix.remove(77, pre)
    assert ix.find(77) == [] and ix.precancels() == 0
    assert [r for h, r in _slots(ix) if h == 77] == [pre]  # still in the table: the pass takes it out
    _settle(ix, 3)
    assert ix.find(77) == [] and not ix._shadow
    assert [r for h, r in _slots(ix) if h == 77] == []
    ix.close()


def test_merged_journals_go_once_no_checkpoint_names_them(tmp_path: Path) -> None:
    ix = _open(tmp_path)
    ix.put(5, 1)
    g0 = ix.gen.g if ix.gen is not None else -1
    ix.growth.cut(force=True)
    with deferred_sync() as batch:
        ix.flush()
    ck = ix.state()
    batch.run()
    assert next(g for g, _n in ck["journals"]) == g0  # the sealed one, its pass not done
    run_pass(ix)
    ix.reclaim()  # the checkpoint named it: it stays
    assert g0 in idjournal.generations(tmp_path)
    with deferred_sync() as batch:
        ix.flush()
    ck = ix.state()
    batch.run()
    assert g0 not in [g for g, _n in ck["journals"]]
    ix.reclaim()
    assert g0 not in idjournal.generations(tmp_path)
    ix.close()


def test_a_journal_torn_inside_its_checkpointed_length_is_refused(tmp_path: Path) -> None:
    ix = _open(tmp_path)
    ix.put(5, 1)
    with deferred_sync() as batch:
        ix.flush()
    ck = ix.state()
    batch.run()
    ix.close()
    g, n = ck["journals"][-1]
    path = idjournal.path_of(tmp_path, g)
    raw = bytearray(path.read_bytes())
    raw[n - 3] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(idindex_mod.StoreError, match=r"ids\.jnl"):
        _open(tmp_path, ck)


def _write_table(path: Path, cap: int, base: int, slots: dict[int, tuple[int, int]]) -> None:
    raw = bytearray(HEADER_SIZE + cap * 16)
    raw[:HEADER_SIZE] = header_bytes(idindex_mod.MAGIC, 2, 16, cap, base)
    for i, (h, r) in slots.items():
        SLOT.pack_into(raw, HEADER_SIZE + i * 16, h, r)
    path.write_bytes(bytes(raw))


def test_an_earlier_format_mid_migration_is_finished_at_open(tmp_path: Path) -> None:
    """Version 2 wrote the table in place and grew by migrating into ``ids.idx.next.<n>``; its
    checkpoint names the migration. The open finishes it (the old slots past the cursor copied),
    names the table ``ids.idx`` and counts it."""
    rng = random.Random(3)
    old = {i: (2 + rng.randrange(1 << 40), i + 1) for i in rng.sample(range(64), 20)}
    _write_table(tmp_path / "ids.idx", 64, 0, old)
    new: dict[int, tuple[int, int]] = {}
    for i, (h, r) in old.items():  # the cursor at 32: slots below it were copied
        if i < 32:
            k = h & 127
            while k in new:
                k = (k + 1) & 127
            new[k] = (h, r)
    _write_table(tmp_path / "ids.idx.next.1", 128, 64, new)
    state = {"cap": 128, "live": len(new), "tombs": 0, "next": "ids.idx.next.1", "from": 64, "cursor": 32, "left": 9}
    ix = _open(tmp_path, state)
    assert ix.cap == 128 and not (tmp_path / "ids.idx.next.1").exists()
    assert os.path.getsize(tmp_path / "ids.idx") == HEADER_SIZE + 128 * 16
    for h, r in old.values():
        assert ix.find(h) == [r]
    assert (ix.table_live, ix.table_tombs) == (20, 0)
    ix.close()


def test_count_range_finds_exactly_the_empty_and_tombstone_hashes(tmp_path: Path) -> None:
    """Zero bytes everywhere else (in hashes, in refs, a tombstone before an empty slot) must not
    make ``bytes.count`` match across a slot boundary."""
    ix = _open(tmp_path, cap=64)
    tricky = [2, 1 << 56, 0x0100000000000000 + 2, 256, 1 << 8, (1 << 63) + 1]
    plan = [EMPTY, TOMB, EMPTY, TOMB, TOMB, *tricky, EMPTY, TOMB, *tricky, TOMB] * 2
    buf = bytearray(HEADER_SIZE + 64 * 16)
    for i, h in enumerate(plan):
        SLOT.pack_into(buf, HEADER_SIZE + i * 16, h, 0 if i % 3 else 1 << 56)
    SLOT.pack_into(buf, HEADER_SIZE + 63 * 16, TOMB, 0)  # the last slot, before the first
    live = sum(1 for h in plan if h > TOMB)
    assert count_range(buf, 0, 64) == (live, sum(1 for h in plan if h == TOMB) + 1)
    assert count_range(buf, 3, 40) == (
        sum(1 for h in plan[3:40] if h > TOMB), sum(1 for h in plan[3:40] if h == TOMB)
    )
    ix.close()
