"""The C side of the staged id index: ``_native.idx_apply`` (a journal's records applied to an
in-memory table) against a reference built from the index's Python probes, the same bytes and
the same count deltas; the journal records ``_native.idx_remove_delivered`` returns for a settled
batch against the id hash computed in Python; and the C intake's additions (``ingest_run`` /
``restore_run``): the tables probed for presence only (an id there stops the run; nothing of
them is copied or written) and the journal, driven with a store's own state as
``PartitionStore.ingest_many`` / ``restore_many`` build it. The journal tests check that every
record the C loop stores is journaled in order, and that a journal too small stops the run
before the record that does not fit with nothing lost: calling again with room ends with the
same files and state as one call with room for all."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar import contract as c
from sidecar.store import codec
from sidecar.store.codec import native
from sidecar.store.idindex import HEADER_SIZE
from sidecar.store.idprobe import py_apply, py_id_hash, py_put
from sidecar.store.idslot import EMPTY, PRECANCEL, REMOVE_MARK, SLOT, SLOT_SIZE, TOMB, tags_of
from sidecar.store.intake_layout import Common
from sidecar.store.partition import PartitionStore
from tests.infra import needs_native
from tests.unit.helpers.intake import Msg, files, ingest_store, state

pytestmark = needs_native

T0 = 1_700_000_000_000
TOPIC = "in"


# -- idx_apply ---------------------------------------------------------------------------------------
def counts(buf: bytes | bytearray, cap: int, hs: int = HEADER_SIZE) -> tuple[int, int]:
    """(live, tombstone) slots of a table, counted."""
    hashes = [SLOT.unpack_from(buf, hs + k * SLOT_SIZE)[0] for k in range(cap)]
    return sum(h > TOMB for h in hashes), sum(h == TOMB for h in hashes)


def records(ops: list[tuple[int, int, bool]]) -> bytes:
    return b"".join((REMOVE_MARK if rm else b"") + SLOT.pack(h, ref) for h, ref, rm in ops)


@st.composite
def journals(draw: Any) -> tuple[int, list[tuple[int, int, bool]], list[tuple[int, int, bool]]]:
    """(capacity, the ops that make the starting table, the journal's ops). Hashes share a few home
    slots (the last ones too: chains wrap), pairs repeat (inserts of a present pair, removes of an
    absent one). Inserts in all stay below the capacity, so every probe meets an empty slot."""
    cap = draw(st.sampled_from([2, 4, 8, 16, 64]))
    homes = draw(st.lists(st.integers(0, cap - 1), min_size=1, max_size=4))
    pairs = draw(st.lists(
        st.tuples(st.sampled_from(homes), st.integers(1, 3), st.sampled_from([0, 1, 2, PRECANCEL | 5, 1 << 62 | 7])),
        min_size=1, max_size=8,
    ))
    pool = [(home + k * cap, ref) for home, k, ref in pairs]  # hash >= cap >= 2
    ops = draw(st.lists(st.tuples(st.sampled_from(pool), st.booleans()), max_size=3 * cap))
    out: list[tuple[int, int, bool]] = []
    puts = 0
    for (h, ref), rm in ops:
        if not rm:
            if puts + 1 >= cap:
                continue
            puts += 1
        out.append((h, ref, rm))
    split = draw(st.integers(0, len(out)))
    return cap, out[:split], out[split:]


def _table(cap: int, ops: list[tuple[int, int, bool]], hs: int = HEADER_SIZE) -> bytearray:
    buf = bytearray(HEADER_SIZE + cap * SLOT_SIZE)
    py_apply(buf, cap - 1, records(ops))
    return bytearray(bytes(range(hs))) + buf[HEADER_SIZE:]


@settings(max_examples=400, deadline=None)
@given(journals(), st.sampled_from([HEADER_SIZE, 0, 40]))
def test_apply_matches_the_python_probes(case: tuple[int, Any, Any], hs: int) -> None:
    assert native is not None
    cap, before, journal = case
    ref_buf = _table(cap, before)  # the reference's own header size
    got = _table(cap, before, hs)
    recs = records(journal)
    expect = py_apply(ref_buf, cap - 1, recs)
    start = counts(got, cap, hs)
    assert native.idx_apply(got, hs, cap - 1, recs) == expect
    assert got[:hs] == bytes(range(hs))  # the header is left alone
    assert got[hs:] == ref_buf[HEADER_SIZE:]
    after = counts(got, cap, hs)
    assert (after[0] - start[0], after[1] - start[1]) == expect  # the deltas are the table's


def test_apply_writes_what_idx_put_and_idx_remove_write() -> None:
    """Record for record, the slots the one-pair calls write, with their count changes."""
    assert native is not None
    rng = random.Random(7)
    cap = 32
    a, b = bytearray(HEADER_SIZE + cap * SLOT_SIZE), bytearray(HEADER_SIZE + cap * SLOT_SIZE)
    live = tombs = 0
    pool = [(rng.choice((5, 6, 31)) + cap * rng.randint(1, 4), rng.randint(0, 2)) for _ in range(12)]
    for _ in range(400):
        h, ref = rng.choice(pool)
        if rng.random() < 0.5 and live + tombs < cap - 2:
            off = native.idx_put(b, HEADER_SIZE, cap - 1, h, ref)
            d = (int(off != 0), -int(off < 0))
            rec = SLOT.pack(h, ref)
        else:
            out = native.idx_remove(b, HEADER_SIZE, cap - 1, h, ref)
            d = (0, 0) if out is None else (-1, out[1])
            rec = REMOVE_MARK + SLOT.pack(h, ref)
        assert native.idx_apply(a, HEADER_SIZE, cap - 1, rec) == d
        assert a == b
        live, tombs = live + d[0], tombs + d[1]
    assert counts(a, cap) == (live, tombs)


def test_apply_of_delivered_records_is_idx_remove_delivered() -> None:
    """A settled batch's journal records (removes), applied, write what ``idx_remove_delivered`` does."""
    assert native is not None
    cap = 64
    recs = [_record(b"id-%d" % i) for i in range(20)]
    pairs = [(i % 3, rec) for i, rec in enumerate(recs)]
    a = bytearray(HEADER_SIZE + cap * SLOT_SIZE)
    for ref, rec in pairs[:15]:  # five of them not in the table: no-ops
        py_put(a, cap - 1, py_id_hash(rec.id), ref)
    b = bytearray(a)
    removed, tombs, journal = native.idx_remove_delivered(b, HEADER_SIZE, cap - 1, pairs)
    assert native.idx_apply(a, HEADER_SIZE, cap - 1, journal) == (-removed, tombs)
    assert removed == 15 and a == b


def test_apply_refuses_bad_input_before_any_write() -> None:
    assert native is not None
    cap = 8
    buf = _table(cap, [(10, 1, False), (18, 2, False)])
    keep = bytes(buf)
    ok = SLOT.pack(26, 3)
    with pytest.raises(ValueError, match="16-byte"):
        native.idx_apply(buf, HEADER_SIZE, cap - 1, ok + b"\x00")
    malformed = (
        SLOT.pack(EMPTY, 1),  # an empty slot's hash
        SLOT.pack(TOMB, 1),  # a marker with a ref
        REMOVE_MARK,  # a marker without its pair
        REMOVE_MARK + SLOT.pack(TOMB, 0),  # a marker's pair with a marker's hash
        REMOVE_MARK + SLOT.pack(EMPTY, 5),
    )
    for bad in malformed:  # refused, the records before it too
        with pytest.raises(ValueError, match="malformed"):
            native.idx_apply(buf, HEADER_SIZE, cap - 1, ok + bad)
    for hs, mask in ((HEADER_SIZE, 6), (HEADER_SIZE, 15), (-1, 7), (len(buf) + 16, 0), (HEADER_SIZE + 1, 7)):
        with pytest.raises(ValueError, match="does not hold the table"):
            native.idx_apply(buf, hs, mask, ok)
    with pytest.raises(BufferError):
        native.idx_apply(bytes(buf), HEADER_SIZE, cap - 1, ok)  # read-only
    with pytest.raises(TypeError):
        native.idx_apply(buf, HEADER_SIZE, cap - 1)  # type: ignore[call-arg]
    assert buf == keep
    assert native.idx_apply(buf, HEADER_SIZE, cap - 1, b"") == (0, 0)
    assert buf == keep


def test_apply_on_a_table_without_an_empty_slot_raises_and_ends() -> None:
    """Where the Python probes would never end (no empty slot on the probe), idx_apply raises;
    what it finds before going round (a present pair) it still handles. The records before the
    refused one stay applied (the caller drops the stage)."""
    assert native is not None
    cap = 4
    full = [(8 + k, 1, False) for k in range(cap)]  # every slot live
    buf = _table(cap, full)
    keep = bytes(buf)
    with pytest.raises(RuntimeError, match="record 0: the table has no empty slot"):
        native.idx_apply(buf, HEADER_SIZE, cap - 1, SLOT.pack(12, 1))  # an absent pair's insert
    with pytest.raises(RuntimeError, match="no empty slot"):
        native.idx_apply(buf, HEADER_SIZE, cap - 1, REMOVE_MARK + SLOT.pack(12, 1))  # an absent pair's remove
    assert buf == keep
    assert native.idx_apply(buf, HEADER_SIZE, cap - 1, SLOT.pack(9, 1)) == (0, 0)  # present: a no-op
    # a tombstone but no empty slot: a new pair is refused too (the Python probe would not end)
    assert native.idx_apply(buf, HEADER_SIZE, cap - 1, REMOVE_MARK + SLOT.pack(9, 1)) == (-1, 1)
    assert counts(buf, cap) == (3, 1)
    with pytest.raises(RuntimeError, match="record 2: the table has no empty slot"):
        native.idx_apply(buf, HEADER_SIZE, cap - 1, REMOVE_MARK + SLOT.pack(10, 1) + SLOT.pack(13, 5))
    assert counts(buf, cap) == (2, 2)  # record 0 was applied


# -- idx_remove_delivered's journal -------------------------------------------------------------------
def _record(rid: bytes) -> Any:
    assert native is not None
    return native.Record(0, codec.MESSAGE, T0, T0, 0, 0, 0, 0, 0, rid, b"out", None, b"v", b"")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, (1 << 64) - 1), st.binary(max_size=300)), max_size=30))
def test_delivered_records_are_removes_of_the_id_hashes(items: list[tuple[int, bytes]]) -> None:
    """Every ref is kept whole (bucket refs use bit 62, pre-cancels bit 63): the remove is marked by
    the record before it."""
    assert native is not None
    pairs = [(ref, _record(rid)) for ref, rid in items]
    expect = b"".join(REMOVE_MARK + SLOT.pack(py_id_hash(rid), ref) for ref, rid in items)
    cap = 64  # an empty table: every remove is journaled, found or not
    assert native.idx_remove_delivered(bytearray(HEADER_SIZE + cap * SLOT_SIZE), HEADER_SIZE, cap - 1,
                                       pairs) == (0, 0, expect)


def test_remove_delivered_refuses_what_is_not_a_settled_batch() -> None:
    assert native is not None
    rec = _record(b"x")
    cap = 8
    buf = bytearray(HEADER_SIZE + cap * SLOT_SIZE)
    for bad in ([(1, b"x")], [(1,)], [(1, rec, 2)], [[1, rec]], [(-1, rec)]):
        with pytest.raises((TypeError, OverflowError)):
            native.idx_remove_delivered(buf, HEADER_SIZE, cap - 1, bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        native.idx_remove_delivered(buf, HEADER_SIZE, cap - 1, ((1, rec),))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        native.idx_remove_delivered(buf, HEADER_SIZE, cap - 1)  # type: ignore[call-arg]
    assert native.idx_remove_delivered(buf, HEADER_SIZE, cap - 1, []) == (0, 0, b"")


# -- the C intake: ingest_run / restore_run with the store's own state ---------------------------------
def _store(root: Path, scheduler: str) -> PartitionStore:
    return ingest_store(root, scheduler)[1]


class Run:
    """One C call as ``ingest_many`` / ``restore_many`` make it, from the store's own state, with
    the id index's optional buffers this test chooses: ``old`` / ``old2`` (a table and its mask,
    replacing what the store hands over), ``room`` (the journal's bytes: a prefix of the store's
    own journal buffer, so it takes what the loop wrote), ``set`` (state values
    written before the call). After the call the store takes the state back as those do."""

    def __init__(self, store: PartitionStore, msgs: list[Any], start: int, *, restore: bool = False,
                 room: int | None = None, old: tuple[bytearray, int] | None = None,
                 old2: tuple[bytearray, int] | None = None, set_: dict[int, int] | None = None,
                 tags: Any = "own") -> None:
        assert native is not None
        self.end, self.journal, self.full = start, b"", False
        sched = store.sched.intake_begin()
        if sched is None:  # the scheduler's file is not there yet: the reference path creates it
            return
        st, bufs = sched
        st[Common.HEADER_SIZE] = HEADER_SIZE
        st[Common.NEXT_OFFSET] = -1
        st[Common.MAX_SRC_OFFSET] = -1
        st[Common.MAX_RECORD_BYTES] = store.rules.max_record_bytes
        st[Common.MAX_DELAY_MS] = store.rules.max_delay_ms
        seg = store.log.intake_state(st)
        ids: Any = store.ids
        n = len(msgs) - start
        idx = ids.intake_state(st, n)  # the staged index: its own tables and journal
        o1, o2, jnl, own_tags = ids.intake_bufs()
        if tags == "own":  # the store's, unless the test hands over a table of its own
            tags = own_tags if old is None and old2 is None else None
        self.jnl_at = st[Common.IDX_JNL_AT]
        jview = memoryview(jnl)[: self.jnl_at + (SLOT_SIZE * n if room is None else room)]
        if old is not None:
            o1 = old[0]
            st[Common.IDX_OLD_MASK] = old[1]
        if old2 is not None:
            o2 = old2[0]
            st[Common.IDX_OLD2_MASK] = old2[1]
        for k, v in (set_ or {}).items():
            st[k] = v
        first = store.log.head
        given: dict[str, Any] = dict(seg_buf=seg, idx_buf=idx, st=st, sched_bufs=bufs, idx_old_buf=o1, idx_old2_buf=o2,
                     idx_jnl_buf=jview, idx_tags_buf=tags)
        if restore:
            end = native.restore_run(msgs, start, native.RestoreRun(**given, partition=store.partition, end=-1))
        else:
            end = native.ingest_run(msgs, start, native.IngestRun(
                **given, now=T0, partition=store.partition, id_prefix=store.id_prefix,
                checked_targets=store.rules.checked_targets, no_headers=b"\x00\x00", topic=None, direct=None,
            ))
        self.end, self.st = end, st
        self.journal = bytes(jview[self.jnl_at: st[Common.IDX_JNL_AT]])
        self.full = st[Common.IDX_JNL_AT] + SLOT_SIZE > len(jview)
        jview.release()
        count = end - start
        if count:
            if not restore:
                store.counters.ingested += count
                store.counters.scheduled += count
                store.next_offset = st[Common.NEXT_OFFSET]
            store.dirty = True
            store.log.intake_restore(st, count)
            ids.intake_restore(st)
            store.sched.intake_end(st, count)
            if restore:
                store.covered(st[Common.MAX_SRC_OFFSET])
        assert store.log.head >= first


def _reference(store: PartitionStore, m: Any, restore: bool) -> None:
    """One message through the reference path (the loop's ``ingest`` / the restorer's)."""
    if restore:
        if m.value() is None:
            store.restore_remove(m.key())
        else:
            store.restore_put(m.key(), m.value(), T0)
        return
    ts_type, ts = m.timestamp()
    store.ingest_fields(TOPIC, m.offset(), ts if ts_type else T0, m.key(), m.value(), m.headers(), T0)


def feed(store: PartitionStore, msgs: list[Any], room: int, restore: bool = False) -> tuple[bytes, list[int]]:
    """All of ``msgs``: C runs with a journal of ``room`` bytes, again from where a run stopped
    while its journal was full, else the stopping message through the reference path. Returns the
    journal records of every run, in order, and the messages the C runs stored."""
    journal, stored = b"", []
    i = 0
    while i < len(msgs):
        run = Run(store, msgs, i, restore=restore, room=room)
        assert run.end >= i
        assert len(run.journal) == SLOT_SIZE * (run.end - i)  # one record per message stored
        journal += run.journal
        stored += range(i, run.end)
        if run.end < len(msgs) and not run.full:
            _reference(store, msgs[run.end], restore)
            i = run.end + 1
        else:
            assert run.end > i or room < SLOT_SIZE
            i = run.end
    return journal, stored


def ingress(n: int, seed: int) -> list[Any]:
    """Plain requests (the C loop's), with some it leaves to the reference path: an id already
    pending (a replace), a cancel, a level beyond the last one."""
    rng = random.Random(seed)
    msgs: list[Any] = []
    for off in range(n):
        h: list[tuple[str, bytes | None]] = [(c.TARGET_TOPIC, b"out"),
                                             (c.DELAY_MS, str(rng.choice((0, 40, 999, 4000, 30_000))).encode())]
        r = rng.random()
        if r < 0.08:
            h.append((c.ID, b"dup-%d" % rng.randint(0, 2)))
        elif r < 0.12:
            h = [(c.CANCEL, b"in:0:%d" % rng.randint(0, off))]
        msgs.append(Msg(0, off, (1, T0 - rng.randint(0, 500)), b"k%d" % off, bytes(rng.randint(0, 300)), h))
    return msgs


def changelog(n: int, seed: int) -> list[Any]:
    """Changelog puts (the C loop's), with tombstones and puts of an id already pending."""
    rng = random.Random(seed)
    msgs: list[Any] = []
    for off in range(n):
        rid = b"in:0:%d" % (rng.randint(0, off) if rng.random() < 0.08 else off + 1000)
        if rng.random() < 0.05:
            msgs.append(Msg(0, off, (1, T0), rid, None, None))
            continue
        raw = codec.encode(
            codec.head(
                rtype=codec.MESSAGE, due_ms=T0 + rng.choice((40, 999, 30_000)), enqueue_ms=T0, src_offset=off,
                src_partition=0, target_partition=-1, retry_count=0, level=0,
            ),
            rid, b"out", b"k", bytes(rng.randint(0, 200)), b"\x00\x00",
        )
        msgs.append(Msg(0, off, (1, T0), rid, raw, None))
    return msgs


def _named(store: PartitionStore, m: Any, restore: bool) -> list[bytes]:
    """The ids a message names: its own, or a cancel's target."""
    if restore:
        return [m.key()]
    return [bytes(v) for name, v in m.headers() if name == c.CANCEL and v] or [_rid(store, m, restore)]


def _rid(store: PartitionStore, m: Any, restore: bool) -> bytes:
    if restore:
        rid: bytes = m.key()
        return rid
    for name, v in m.headers():
        if name == c.ID and v:
            return bytes(v)
    return store.id_prefix + b"%d" % m.offset()


@pytest.mark.parametrize("restore", [False, True], ids=["ingest_run", "restore_run"])
@pytest.mark.parametrize("scheduler", ["wheel", "levels"])
@pytest.mark.parametrize("room_records", [1, 3, 7])
def test_the_journal_holds_every_insert_and_a_full_one_loses_nothing(
    tmp_path: Path, scheduler: str, restore: bool, room_records: int
) -> None:
    msgs = (changelog if restore else ingress)(160, room_records)
    roomy = _store(tmp_path / "roomy", scheduler)
    small = _store(tmp_path / "small", scheduler)
    j_roomy, s_roomy = feed(roomy, msgs, SLOT_SIZE * len(msgs), restore)
    j_small, s_small = feed(small, msgs, SLOT_SIZE * room_records, restore)
    assert len(s_roomy) > 100  # the C loop took most of them
    # a full journal only splits the runs: the same records stored by the C loop, journaled alike
    assert s_small == s_roomy
    assert j_small == j_roomy
    records_ = [SLOT.unpack_from(j_roomy, k) for k in range(0, len(j_roomy), SLOT_SIZE)]
    seen: dict[bytes, int] = {}  # every id a message names, and how often
    for m in msgs:
        for rid in _named(roomy, m, restore):
            seen[rid] = seen.get(rid, 0) + 1
    for k, (h, ref) in zip(s_roomy, records_, strict=True):
        rid = _rid(roomy, msgs[k], restore)
        assert h == py_id_hash(rid)  # in message order
        if seen[rid] == 1:  # not replaced, cancelled or removed since: still the entry
            assert roomy.ids.find(h) == [ref], rid
    assert state(small) == state(roomy)
    for s in (roomy, small):
        s.checkpoint(fsync=True)
    assert state(small) == state(roomy)
    a, b = files(tmp_path / "small"), files(tmp_path / "roomy")
    assert a.keys() == b.keys()
    for name in a:
        assert a[name] == b[name], name
    roomy.close()
    small.close()


@pytest.mark.parametrize("restore", [False, True], ids=["ingest_run", "restore_run"])
def test_a_journal_with_no_room_stops_before_the_first_record(tmp_path: Path, restore: bool) -> None:
    store = _store(tmp_path, "levels")
    msgs = plain_msgs(30, restore)
    feed(store, msgs[:1], SLOT_SIZE, restore)  # the queue file the reference path creates
    files_before, state_before = files(tmp_path), state(store)
    for room in (0, 15):
        run = Run(store, msgs, 1, restore=restore, room=room)
        assert (run.end, run.journal, run.full) == (1, b"", True)
    assert state(store) == state_before and files(tmp_path) == files_before  # nothing written
    run = Run(store, msgs, 1, restore=restore, room=16 * 2 + 7)
    assert run.end == 3 and len(run.journal) == 32 and run.full
    store.close()


def test_no_journal_is_kept_at_a_negative_position(tmp_path: Path) -> None:
    """st[IDX_JNL_AT] < 0: the buffer is not used and the run is not limited by it."""
    store = _store(tmp_path, "levels")
    msgs = plain_msgs(20, False)
    feed(store, msgs[:1], SLOT_SIZE)
    run = Run(store, msgs, 1, room=0, set_={Common.IDX_JNL_AT: -1})
    assert run.end == len(msgs) and run.journal == b"" and run.st[Common.IDX_JNL_AT] == -1
    with pytest.raises(ValueError, match="journal buffer does not match"):
        Run(store, msgs, run.end, room=16, set_={Common.IDX_JNL_AT: 10_000})
    store.close()


def _probed(hashes: list[int], cap: int = 16) -> tuple[bytearray, int]:
    buf = bytearray(HEADER_SIZE + cap * SLOT_SIZE)
    for h in hashes:
        py_put(buf, cap - 1, h, 77)
    return buf, cap - 1


def plain_msgs(n: int, restore: bool) -> list[Any]:
    """Messages the C loop takes, all for one queue (once the reference path has created its file)."""
    if not restore:
        head = [(c.TARGET_TOPIC, b"out"), (c.DELAY_MS, b"40")]
        return [Msg(0, off, (1, T0), b"k", b"v%d" % off, list(head)) for off in range(n)]
    out = []
    for off in range(n):
        rid = b"in:0:%d" % off
        raw = codec.encode(
            codec.head(
                rtype=codec.MESSAGE, due_ms=T0 + 40, enqueue_ms=T0, src_offset=off, src_partition=0,
                target_partition=-1, retry_count=0, level=0,
            ),
            rid, b"out", b"k", b"v", b"\x00\x00",
        )
        out.append(Msg(0, off, (1, T0), rid, raw, None))
    return out


@pytest.mark.parametrize("restore", [False, True], ids=["ingest_run", "restore_run"])
@pytest.mark.parametrize("which", ["old", "old2"])
def test_a_probed_table_stops_the_run_at_its_id(tmp_path: Path, restore: bool, which: str) -> None:
    """Two otherwise identical stores: the run given a table that holds message 5's id stops at 5,
    the other takes it. A table given with a bad mask is refused."""
    msgs = plain_msgs(12, restore)
    stores = [_store(tmp_path / name, "levels") for name in ("with", "without")]
    for store in stores:
        _reference(store, msgs[0], restore)  # the queue's file
    target = py_id_hash(_rid(stores[0], msgs[5], restore))
    kw: dict[str, Any] = {which: _probed([target, target + 16])}
    with_ = Run(stores[0], msgs, 1, restore=restore, **kw)  # (no tags: the table's slots are probed)
    without = Run(stores[1], msgs, 1, restore=restore)
    assert (with_.end, without.end) == (5, len(msgs))
    assert with_.journal == without.journal[: 4 * SLOT_SIZE]
    assert stores[0].ids.find(target) == []
    for bad in (6, -1, 31):  # not a power of two less one, none, larger than the buffer
        with pytest.raises(ValueError, match="probed index buffer"):
            Run(stores[0], msgs, 5, restore=restore, **{which: (_probed([])[0], bad)})
    for store in stores:
        store.close()


@pytest.mark.parametrize("restore", [False, True], ids=["ingest_run", "restore_run"])
@pytest.mark.parametrize("which", ["old", "old2"])
def test_a_probed_table_is_only_probed(tmp_path: Path, restore: bool, which: str) -> None:
    """A table given that holds none of the messages' ids: the run takes every message, and the
    table is left as it was (no slot of it copied into the index, none written)."""
    msgs = plain_msgs(20, restore)
    cap = 16
    hashes = [1000 + 16 * k for k in range(5)]  # none of the messages' ids; slot cap - 1 empty
    store = _store(tmp_path, "levels")
    _reference(store, msgs[0], restore)  # the queue's file
    table = _probed(hashes, cap)
    before = bytes(table[0])
    run = Run(store, msgs, 1, restore=restore, **{which: table})
    assert run.end == len(msgs)
    assert bytes(table[0]) == before
    for h in hashes:
        assert store.ids.find(h) == []  # nothing copied
    store.close()


@pytest.mark.parametrize("restore", [False, True], ids=["ingest_run", "restore_run"])
@pytest.mark.parametrize("which", ["old", "old2"])
def test_the_last_probed_tables_tags_decide_which_slots_are_read(tmp_path: Path, restore: bool, which: str) -> None:
    """The tags given are the last probed table's: with tags that mirror the table, message 5's id
    stops the run as without tags; with tags that say its chain is empty (as no pass leaves
    them: here to show who decides) the table's slots are not read and the run takes it. Tags
    shorter than that table are refused."""
    msgs = plain_msgs(12, restore)
    stores = [_store(tmp_path / name, "levels") for name in ("mirror", "empty")]
    for store in stores:
        _reference(store, msgs[0], restore)  # the queue's file
    target = py_id_hash(_rid(stores[0], msgs[5], restore))
    table, mask = _probed([target, target + 16])
    kw: dict[str, Any] = {which: (table, mask)}
    if which == "old2":  # the table probed last, behind a first probed table that holds nothing
        kw["old"] = _probed([])
    mirror = tags_of(SLOT.unpack_from(table, HEADER_SIZE + k * SLOT_SIZE)[0] for k in range(mask + 1))
    assert mirror.count(0) < mask + 1  # (the tags hold the target's)
    assert Run(stores[0], msgs, 1, restore=restore, tags=mirror, **kw).end == 5
    assert Run(stores[1], msgs, 1, restore=restore, tags=bytes(mask + 1), **kw).end == len(msgs)
    with pytest.raises(ValueError, match="tags do not match"):
        Run(stores[0], msgs, 5, restore=restore, tags=mirror[:-1], **kw)
    for store in stores:
        store.close()
