"""The id index's merge pass and rebuild (``_native.idx_merge_pass``, ``idx_rebuild``) against a
reference model, a set of (hash, ref) pairs, and against their Python twins (``sidecar.store.idmerge``:
the same bytes, the same counts). Tables are small and chunks smaller, homes drawn from
a few slots near the end of the table as well, so chains cross chunks and wrap past the last slot."""

from __future__ import annotations

import os
import random
import tempfile
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.store.codec import native
from sidecar.store.idindex import EMPTY, HEADER_SIZE, PRECANCEL, SLOT, SLOT_SIZE, TOMB
from sidecar.store.idmerge import (
    merge_journal,
    merge_pass,
    py_merge_journal,
    py_merge_pass,
    py_rebuild,
    rebuild,
)
from sidecar.store.idprobe import py_find, py_put, py_remove
from sidecar.store.idslot import REMOVE_MARK, tags_of
from tests.infra import needs, needs_native

pytestmark = needs_native

HS = 40  # a header size the pass must skip and leave alone
HEADER = bytes(range(HS))


def _table(cap: int, entries: list[tuple[int, int]], removed_first: list[tuple[int, int]]) -> bytearray:
    """A table as the store's probes leave it: ``entries`` inserted, then ``removed_first`` removed
    (tombstones and emptied chain ends where they fall), after a header of ``HS`` bytes."""
    work = bytearray(HEADER_SIZE + cap * SLOT_SIZE)  # the Python probes' own header size
    for h, ref in entries:
        py_put(work, cap - 1, h, ref)
    for h, ref in removed_first:
        py_remove(work, cap - 1, h, ref)
    return bytearray(HEADER) + work[HEADER_SIZE:]


def _pass(buf: bytearray, cap: int, removes: list[tuple[int, int]], puts: list[tuple[int, int]],
          cutoff: int, chunk: int, sync: bool = False, twin: bool = False) -> tuple[bytearray, tuple[int, ...]]:
    fd, path = tempfile.mkstemp()
    try:
        os.write(fd, buf)
        ops = [b"".join(SLOT.pack(h, r) for h, r in x) for x in (removes, puts)]
        assert native is not None
        run = py_merge_pass if twin else native.idx_merge_pass
        out = run(fd, HS, cap - 1, ops[0], ops[1], cutoff, chunk, sync)
        os.lseek(fd, 0, os.SEEK_SET)
        after = bytearray(os.read(fd, len(buf) + 1))
    finally:
        os.close(fd)
        os.unlink(path)
    return after, out


def _find(buf: bytearray, cap: int, h: int) -> list[int]:
    return py_find(bytearray(HEADER_SIZE) + buf[HS:], cap - 1, h)


@st.composite
def cases(draw: st.DrawFn) -> tuple[int, int, list[tuple[int, int]], list[tuple[int, int]], list[tuple[int, int]],
                                    list[tuple[int, int]], int]:
    bits = draw(st.integers(2, 7))
    cap = 1 << bits
    chunk = draw(st.sampled_from([1, 2, 3, cap // 2 or 1, cap, cap * 2]))
    # homes: anywhere, or crowded into the last few slots (chains that wrap)
    home = st.one_of(st.integers(0, cap - 1), st.integers(max(0, cap - 3), cap - 1))
    refs = st.one_of(st.integers(0, 50), st.integers(0, 50).map(lambda t: PRECANCEL | t))
    # a hash: its home slot, a few bits above it, a few top bits (the tag's), never 0 or 1 (those
    # mark slots)
    pair = st.tuples(home, st.integers(0, 3), refs, st.integers(0, 2)).map(
        lambda x: ((x[1] << bits | x[0]) + (0 if x[0] > 1 or x[1] else 2 << bits) + (x[3] << 57), x[2])
    )
    room = cap // 2
    base = draw(st.lists(pair, max_size=room, unique=True))
    gone = draw(st.lists(st.sampled_from(base), unique=True)) if base else []
    present = [p for p in base if p not in gone]
    removes = draw(st.lists(st.one_of(st.sampled_from(present), pair) if present else pair, unique=True, max_size=room))
    new = draw(st.lists(pair.filter(lambda p: p not in removes), unique=True, max_size=max(0, room - len(base))))
    puts = new + draw(st.lists(st.sampled_from(present), unique=True)) if present else new
    puts = [p for p in dict.fromkeys(puts) if p not in removes]
    cutoff = draw(st.integers(0, 60))
    return cap, chunk, base, gone, removes, puts, cutoff


def _expired(ref: int, cutoff: int) -> bool:
    return bool(ref & PRECANCEL) and ref & ~PRECANCEL < cutoff


@settings(max_examples=400, deadline=None)
@given(cases())
def test_the_pass_leaves_the_reference_models_entries(case: tuple) -> None:  # type: ignore[type-arg]
    cap, chunk, base, gone, removes, puts, cutoff = case
    buf = _table(cap, base, gone)
    start = {p for p in base if p not in gone}
    after, (live, tombs, inserted, removed, expired, written) = _pass(buf, cap, removes, puts, cutoff, chunk)
    assert _pass(buf, cap, removes, puts, cutoff, chunk, twin=True) == (after, (live, tombs, inserted, removed,
                                                                                  expired, written))

    # removes first; then inserts, but an expired pre-cancel is neither inserted nor kept
    # (an expired pre-cancel also removed counts in either: its slot or its home may come first)
    model = {p for p in start if p not in removes}
    gone_live = sum(1 for p in start if p in removes and not _expired(p[1], cutoff))
    assert gone_live <= removed <= len(start) - len(model)
    assert removed + expired == len(start) - len(model) + sum(1 for p in model if _expired(p[1], cutoff))
    assert inserted == sum(1 for p in puts if p not in model and not _expired(p[1], cutoff))
    model = {p for p in model | set(puts) if not _expired(p[1], cutoff)}

    assert after[:HS] == HEADER and len(after) == len(buf)
    hashes = {h for h, _ in base} | {h for h, _ in removes} | {h for h, _ in puts}
    for h in hashes:
        assert sorted(_find(after, cap, h)) == sorted(r for (mh, r) in model if mh == h), h
    slots = [SLOT.unpack_from(after, HS + k * SLOT_SIZE) for k in range(cap)]
    assert live == len(model) == sum(1 for s, _ in slots if s > TOMB)
    assert tombs == sum(1 for s, _ in slots if s == TOMB)
    assert sum(1 for s, _ in slots if s == EMPTY) > 0
    if after == buf:
        assert written == 0


def test_a_chain_that_wraps_past_the_last_slot() -> None:
    cap = 8
    # four entries homed at slot 6: slots 6, 7, 0, 1; the pass in chunks of 2 removes the one in
    # slot 0 and adds a fifth, which takes the tombstone the remove left (removes come first)
    base = [(6 + 8 * k, 100 + k) for k in range(4)]
    buf = _table(cap, base, [])
    after, (live, _tombs, inserted, removed, expired, written) = _pass(buf, cap, [base[2]], [(6 + 8 * 9, 7)], 0, 2)
    assert (live, inserted, removed, expired) == (4, 1, 1, 0)
    assert _find(after, cap, 6 + 8 * 9) == [7]
    assert _find(after, cap, base[2][0]) == []
    assert [_find(after, cap, h) for h, _ in base[:2] + base[3:]] == [[100], [101], [103]]
    assert SLOT.unpack_from(after, HS + 0 * SLOT_SIZE) == (6 + 8 * 9, 7)
    assert SLOT.unpack_from(after, HS + 2 * SLOT_SIZE)[0] == EMPTY
    assert written == 1  # the wrapped slots only: the last chunk's own did not change


def test_expired_precancels_leave_and_others_stay() -> None:
    cap = 16
    base = [(2, PRECANCEL | 5), (3, PRECANCEL | 50), (4, 9)]
    after, (live, _tombs, _ins, _rem, expired, _w) = _pass(_table(cap, base, []), cap, [], [], 10, 4)
    assert (live, expired) == (2, 1)
    assert _find(after, cap, 2) == [] and _find(after, cap, 3) == [PRECANCEL | 50] and _find(after, cap, 4) == [9]


def test_a_pass_with_nothing_to_do_writes_nothing() -> None:
    cap = 64
    base = [(k * 7 + 2, k) for k in range(20)]
    buf = _table(cap, base, [])
    after, (live, tombs, inserted, removed, expired, written) = _pass(buf, cap, [], base[:5], 0, 8)
    assert after == buf
    assert (live, tombs, inserted, removed, expired, written) == (20, 0, 0, 0, 0, 0)


def _rebuild(buf: bytearray, cap: int, new_cap: int, cutoff: int, chunk: int,
             twin: bool = False) -> tuple[bytearray, tuple[int, ...]]:
    fds, paths = [], []
    try:
        for content in (buf, bytearray(HEADER) + bytes(new_cap * SLOT_SIZE)):
            fd, path = tempfile.mkstemp()
            fds.append(fd)
            paths.append(path)
            os.write(fd, content)
        assert native is not None
        run = py_rebuild if twin else native.idx_rebuild
        out = run(fds[0], fds[1], HS, cap - 1, new_cap - 1, cutoff, chunk, False)
        os.lseek(fds[1], 0, os.SEEK_SET)
        after = bytearray(os.read(fds[1], HS + new_cap * SLOT_SIZE + 1))
    finally:
        for fd, path in zip(fds, paths, strict=True):
            os.close(fd)
            os.unlink(path)
    return after, out


@settings(max_examples=300, deadline=None)
@given(cases(), st.booleans())
def test_a_rebuild_keeps_every_live_entry_but_the_expired(case: tuple, double: bool) -> None:  # type: ignore[type-arg]
    cap, chunk, base, gone, _removes, _puts, cutoff = case
    new_cap = cap * 2 if double else cap
    buf = _table(cap, base, gone)
    after, out = _rebuild(buf, cap, new_cap, cutoff, chunk)
    assert _rebuild(buf, cap, new_cap, cutoff, chunk, twin=True) == (after, out)
    live, tombs, inserted, expired, _written = out
    start = {p for p in base if p not in gone}
    model = {p for p in start if not _expired(p[1], cutoff)}
    assert after[:HS] == HEADER and len(after) == HS + new_cap * SLOT_SIZE
    assert (live, tombs, inserted, expired) == (len(model), 0, len(model), len(start) - len(model))
    for h in {h for h, _ in base}:
        assert sorted(_find(after, new_cap, h)) == sorted(r for (mh, r) in model if mh == h), h
    slots = [SLOT.unpack_from(after, HS + k * SLOT_SIZE)[0] for k in range(new_cap)]
    assert sum(1 for s in slots if s > TOMB) == len(model) and TOMB not in slots


@pytest.mark.parametrize("twin", [False, True])
def test_a_rebuild_refuses_other_sizes(twin: bool) -> None:
    assert native is not None
    with pytest.raises(ValueError, match="twice the old"):
        (py_rebuild if twin else native.idx_rebuild)(0, 0, 0, 7, 31, 0, 4, False)


def test_synced_as_it_goes_the_pass_writes_the_same_bytes() -> None:
    # 64 chunks: the pass starts each chunk's writeback and waits for the one 8 chunks back
    cap = 1 << 12
    rnd = random.Random(5)
    base = [(rnd.getrandbits(62) | 2, k) for k in range(1500)]
    puts = [(rnd.getrandbits(62) | 2, k) for k in range(400)]
    buf = _table(cap, base, base[:300])
    plain, out = _pass(buf, cap, base[300:500], puts, 0, 64)
    synced, out_synced = _pass(buf, cap, base[300:500], puts, 0, 64, sync=True)
    assert synced == plain and out_synced == out
    assert out[:4] == (1400, out[1], 400, 200)


def _reader_case(rnd: random.Random) -> tuple[int, list[tuple[int, int]], list[tuple[int, int]],
                                               list[tuple[int, int]], bytearray]:
    """A 2^16-slot table holding ``kept`` and ``doomed`` (random 64-bit hashes), and ``puts``."""
    cap = 1 << 16
    kept, doomed, puts = ([(rnd.getrandbits(64) | 2, k) for k in range(n)] for n in (12_000, 8_000, 12_000))
    return cap, kept, doomed, puts, _table(cap, kept + doomed, [])


def test_a_reader_probing_during_the_pass_finds_every_entry_it_keeps() -> None:
    """The pass runs with the GIL released while this thread probes the same file through a
    mapping, as the loop will: every entry the pass neither removes nor expires is found by
    every probe, before, during and after the pass's writes to its chunk."""
    import mmap
    import threading

    assert native is not None
    cap, kept, doomed, puts, buf = _reader_case(random.Random(11))
    fd, path = tempfile.mkstemp()
    try:
        os.write(fd, buf)
        mm = mmap.mmap(fd, len(buf), prot=mmap.PROT_READ)
        view = memoryview(mm)
        ops = [b"".join(SLOT.pack(h, r) for h, r in x) for x in (doomed, puts)]
        result: list[tuple[int, ...]] = []
        passes = threading.Thread(
            target=lambda: result.extend(
                native.idx_merge_pass(fd, HS, cap - 1, ops[0], ops[1], 0, 64, False) for _ in range(3)
            )
        )
        probes = misses = 0
        passes.start()
        while passes.is_alive() or probes < len(kept):
            h, ref = kept[probes % len(kept)]
            found = native.idx_find(view, HS, cap - 1, h)
            misses += ref not in found
            probes += 1
        passes.join()
        view.release()
        mm.close()
    finally:
        os.close(fd)
        os.unlink(path)
    assert misses == 0 and probes >= len(kept)
    assert result[0][2:4] == (12_000, 8_000) and result[1][2:4] == (0, 0)  # the second pass: nothing to do


def test_a_reader_probing_through_the_tags_during_the_pass_finds_every_entry_it_keeps() -> None:
    """As the test above, with the loop's probe walking the table's tags, which the pass rewrites
    in place chunk by chunk as it rewrites the slots: no kept entry is ever missed, and the tags
    mirror the slots after each pass. The table's tags are built by a first pass."""
    import mmap
    import threading

    assert native is not None
    rnd = random.Random(12)
    cap, kept, doomed, puts, buf = _reader_case(rnd)
    records = b"".join(REMOVE_MARK + SLOT.pack(h, r) for h, r in doomed) + b"".join(SLOT.pack(h, r) for h, r in puts)
    fd, path = tempfile.mkstemp()
    try:
        os.write(fd, buf)
        tags = mmap.mmap(-1, cap)
        assert native.idx_merge_journal(fd, HS, cap - 1, b"", 0, 64, False, tags)[:4] == (20_000, 0, 0, 0)
        mm = mmap.mmap(fd, len(buf), prot=mmap.PROT_READ)
        view = memoryview(mm)
        result: list[tuple[int, ...]] = []
        passes = threading.Thread(
            target=lambda: result.extend(
                native.idx_merge_journal(fd, HS, cap - 1, records, 0, 64, False, tags) for _ in range(3)
            )
        )
        probes = misses = 0
        passes.start()
        while passes.is_alive() or probes < len(kept):
            h, ref = kept[probes % len(kept)]
            misses += ref not in native.idx_find(view, HS, cap - 1, h, tags)
            probes += 1
        passes.join()
        hashes = [SLOT.unpack_from(view, HS + k * SLOT_SIZE)[0] for k in range(cap)]
        assert tags[:] == tags_of(hashes)
        absent = [rnd.getrandbits(64) | 2 for _ in range(2000)]
        assert [native.idx_find(view, HS, cap - 1, h, tags) for h, _r in puts[:2000] + kept[:2000]] == [
            [r] for _h, r in puts[:2000] + kept[:2000]]
        assert all(native.idx_find(view, HS, cap - 1, h, tags) == [] for h in absent)
        view.release()
        mm.close()
        tags.close()
    finally:
        os.close(fd)
        os.unlink(path)
    assert misses == 0 and probes >= len(kept)
    assert result[0][2:4] == (12_000, 8_000) and result[1][2:4] == (0, 0)


def test_tags_shorter_than_the_table_are_refused() -> None:
    assert native is not None
    cap = 16
    buf = _table(cap, [(2, 1)], [])
    with pytest.raises(ValueError, match="tags hold fewer"):
        native.idx_find(buf, HS, cap - 1, 2, bytes(cap - 1))
    fd, path = tempfile.mkstemp()
    try:
        os.write(fd, buf)
        for run in (merge_journal, py_merge_journal):
            with pytest.raises(ValueError, match="tags hold fewer"):
                run(fd, HS, cap - 1, b"", 0, 4, False, bytearray(cap - 1))
    finally:
        os.close(fd)
        os.unlink(path)


def test_the_entry_points_run_a_pass_and_a_rebuild() -> None:
    cap = 16
    fd, path = tempfile.mkstemp()
    fd2, path2 = tempfile.mkstemp()
    try:
        os.write(fd, _table(cap, [(2, 1), (3, 2)], []))
        os.write(fd2, bytearray(HEADER) + bytes(2 * cap * SLOT_SIZE))
        assert merge_pass(fd, HS, cap - 1, SLOT.pack(2, 1), SLOT.pack(5, 3), 0, 4, True) == (2, 1, 1, 1, 0, 2)
        assert rebuild(fd, fd2, HS, cap - 1, 2 * cap - 1, 0, 4, True) == (2, 0, 2, 0, 2)
    finally:
        for f, p in ((fd, path), (fd2, path2)):
            os.close(f)
            os.unlink(p)


@pytest.mark.parametrize("twin", [False, True])
def test_bad_arguments_are_refused(twin: bool) -> None:
    assert native is not None
    run = py_merge_pass if twin else native.idx_merge_pass
    with pytest.raises(ValueError, match="16-byte"):
        run(0, 0, 7, b"x" * 15, b"", 0, 4, False)
    with pytest.raises(ValueError, match="power-of-two"):
        run(0, 0, 6, b"", b"", 0, 4, False)
    with pytest.raises(OSError):
        run(-1, 0, 7, b"", b"", 0, 4, False)


@settings(max_examples=300, deadline=None)
@given(cases(), st.data())
def test_a_journal_merges_as_its_last_operation_on_each_pair(case: tuple, data: st.DataObject) -> None:  # type: ignore[type-arg]
    """A journal's records in order: inserts and removes of the same pairs, repeated; the table
    ends as if each pair's last operation alone had been applied (an insert then a remove of a
    pair the table never held: absent)."""
    cap, chunk, base, gone, removes, puts, cutoff = case
    buf = _table(cap, base, gone)
    start = {p for p in base if p not in gone}
    pairs = removes + puts
    journal = data.draw(st.lists(st.tuples(st.sampled_from(pairs), st.booleans()), max_size=3 * len(pairs))
                        if pairs else st.just([]))
    records = b"".join((REMOVE_MARK if rm else b"") + SLOT.pack(h, ref) for (h, ref), rm in journal)
    last = {p: rm for p, rm in journal}
    model = {p for p in start if not last.get(p, False)} | {p for p, rm in last.items() if not rm}
    if len(base) + sum(1 for p, rm in last.items() if not rm and p not in start) >= cap:
        return  # a table with no empty slot left: the stage never lets one fill past half
    fd, path = tempfile.mkstemp()
    fd2, path2 = tempfile.mkstemp()
    try:
        for f in (fd, fd2):
            os.write(f, buf)
        # fresh tags (zeros) given to the pass: built whole, chunks it changed or not
        tags, tags2 = bytearray(cap + 3), bytearray(cap)
        out = merge_journal(fd, HS, cap - 1, records, cutoff, chunk, False, tags)
        assert py_merge_journal(fd2, HS, cap - 1, records, cutoff, chunk, False, tags2) == out
        after = bytearray(os.pread(fd, len(buf) + 1, 0))
        assert bytearray(os.pread(fd2, len(buf) + 1, 0)) == after
        hashes = [SLOT.unpack_from(after, HS + k * SLOT_SIZE)[0] for k in range(cap)]
        assert tags == tags_of(hashes) + bytes(3) and tags2 == tags[:cap]
    finally:
        for f, p in ((fd, path), (fd2, path2)):
            os.close(f)
            os.unlink(p)
    model = {p for p in model if not _expired(p[1], cutoff)}
    assert out[0] == len(model)
    assert native is not None
    for h in {h for h, _ in base} | {h for (h, _), _ in journal}:
        assert sorted(_find(after, cap, h)) == sorted(r for (mh, r) in model if mh == h), h
        assert native.idx_find(after, HS, cap - 1, h, tags) == native.idx_find(after, HS, cap - 1, h), h


@pytest.mark.parametrize("twin", [False, True], ids=["c", "python"])
def test_a_malformed_journal_is_refused_before_any_write(twin: bool) -> None:
    """A hash below 2 outside a remove's marker, a marker with a ref or without its pair: ValueError,
    the table untouched."""
    run = py_merge_journal if twin else merge_journal
    cap = 16
    buf = _table(cap, [(18, 1)], [])
    ok = SLOT.pack(34, 2)
    for bad in (SLOT.pack(EMPTY, 1), SLOT.pack(TOMB, 1), REMOVE_MARK, REMOVE_MARK + SLOT.pack(TOMB, 0)):
        fd, path = tempfile.mkstemp()
        try:
            os.write(fd, buf)
            with pytest.raises(ValueError, match="malformed"):
                run(fd, HS, cap - 1, ok + bad, 0, 4, False)
            assert os.pread(fd, len(buf) + 1, 0) == bytes(buf)
        finally:
            os.close(fd)
            os.unlink(path)


def _threads() -> dict[int, tuple[str, int]]:
    """This process's threads: native id -> (name, scheduling policy), from /proc (stat field 41)."""
    out = {}
    for name in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        out[int(name)] = (comm, int(stat[stat.rindex(")") + 2 :].split()[38]))
    return out


@needs(os.path.isdir("/proc/self/task") and hasattr(os, "SCHED_IDLE"), "Linux SCHED_IDLE and /proc/self/task")
def test_a_thread_that_asked_for_it_runs_the_pass_on_an_idle_native_thread() -> None:
    """idx_pass_idle(True): the pass's GIL-free part runs on a native thread named kds-ids-idle at
    SCHED_IDLE while the calling thread waits (it takes the GIL back at its own policy); the table
    ends the same as a pass run on the calling thread. A thread that did not ask runs it itself."""
    assert native is not None
    cap, n = 1 << 21, 600_000  # ~0.2 s of sorting and writing: long enough to be seen from here
    rnd = random.Random(9)
    puts = b"".join(SLOT.pack(rnd.getrandbits(64) | 2, k) for k in range(n))
    results: dict[bool, tuple[bytes, tuple[int, ...]]] = {}
    seen: dict[bool, set[tuple[str, int]]] = {}

    def merge(idle: bool, fd: int) -> None:
        native.idx_pass_idle(idle)
        out = native.idx_merge_pass(fd, HS, cap - 1, b"", puts, 0, 1 << 14, False)
        results[idle] = (os.pread(fd, HS + cap * SLOT_SIZE + 1, 0), out)

    for idle in (True, False):
        fd, path = tempfile.mkstemp()
        try:
            os.write(fd, HEADER)
            os.ftruncate(fd, HS + cap * SLOT_SIZE)
            before = set(_threads())
            t = threading.Thread(target=merge, args=(idle, fd))
            t.start()
            seen[idle] = set()
            while t.is_alive():
                seen[idle].update(v for k, v in _threads().items() if k not in before)
            t.join()
        finally:
            os.close(fd)
            os.unlink(path)
    assert ("kds-ids-idle", os.SCHED_IDLE) in seen[True]
    assert not any(name == "kds-ids-idle" for name, _policy in seen[False])
    assert results[True] == results[False] and results[True][1][2] == n
