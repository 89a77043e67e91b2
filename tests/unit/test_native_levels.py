"""The levels scheduler's C walks (``sidecar._native.lv_due``, ``lv_ack``) against their Python
twins in ``sidecar.levels.queue``, on random queue files and commit-log segments: the same
result, the same records handed out, the same bytes written, the same releases counted per
segment, the same errors."""

from __future__ import annotations

import struct
from array import array
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.levels import queue
from sidecar.levels.queue import ENTRY, ENTRY_SIZE, IDX_BITS, NO_POS
from sidecar.store import codec, native_args
from sidecar.store.codec import native
from sidecar.store.native_args import LvDue
from tests.infra import needs_native

HS = 64
PER_FILE = 8
SEG = 1024


class Mapped:
    """What the walks use of a ``MappedFile``: its ``buf``."""

    __slots__ = ("buf",)

    def __init__(self, data: bytes) -> None:
        self.buf = memoryview(bytearray(data))


def _segments(n_records: int) -> tuple[dict[int, bytes], list[int]]:
    """Segments 0 and 2 holding records (1 is missing), and the positions of those records."""
    segs: dict[int, bytes] = {}
    positions: list[int] = []
    for g in (0, 2):
        b = bytearray(SEG)
        off = HS
        for k in range(n_records):
            rec = codec.encode(
                codec.head(
                    rtype=codec.MESSAGE, due_ms=1000 + k, enqueue_ms=7, src_offset=g * 100 + k, src_partition=0,
                    target_partition=-1, retry_count=0, level=k % 3,
                ),
                b"id-%d-%d" % (g, k), b"out", None, b"v" * k, b"\x00\x00",
            )
            b[off : off + len(rec)] = rec
            positions.append(g * SEG + off)
            off += len(rec)
        segs[g] = bytes(b)
    return segs, positions


def _positions(data: st.DataObject, good: list[int]) -> int:
    return data.draw(
        st.one_of(
            st.sampled_from(good),  # a record
            st.just(NO_POS),  # a dropped entry
            st.integers(SEG + HS, 2 * SEG - 8),  # in the missing segment
            st.integers(SEG - 200, SEG - 8).map(lambda x: x - x % 8),  # past the last record: zeros
            st.integers(2 * SEG + HS, 3 * SEG - 8),  # anywhere in a segment: maybe garbage
        )
    )


def _queue_file(data: st.DataObject, good: list[int], now: int) -> bytes:
    b = bytearray(HS + PER_FILE * ENTRY_SIZE)
    for i in range(PER_FILE):
        pos = _positions(data, good)
        due = data.draw(st.integers(now - 50, now + 50))
        state = data.draw(st.sampled_from([0, 0, 0, 1, 2, 3]))
        ENTRY.pack_into(b, HS + i * ENTRY_SIZE, pos, due, state)
    return bytes(b)


def _due_outcome(fn: Any, qfile: bytes, segfiles: dict[int, bytes], args: tuple[int, ...]) -> tuple[Any, ...]:
    qbuf = memoryview(bytearray(qfile))
    segments = {g: Mapped(b) for g, b in segfiles.items()}
    segs: dict[int, int] = {}
    out: list[tuple[int, Any]] = []
    a = native_args.make(LvDue, native if fn is not queue.lv_due else None)
    a.hs, a.seg_bytes = HS, SEG
    a.f0, a.idx, a.stop, a.now, a.restored, a.done, a.room, a.ref_hi = args
    try:
        r: Any = (fn(qbuf, segments, segs, out, a), a.idx, a.done, a.room)
    except (ValueError, struct.error) as e:
        r = type(e).__name__
    return r, out, segs, bytes(qbuf), {g: bytes(m.buf) for g, m in segments.items()}


@needs_native
@settings(max_examples=500, deadline=None)
@given(data=st.data(), n_records=st.integers(1, 6), now=st.integers(-(1 << 40), 1 << 40))
def test_lv_due_matches_the_python_twin(data: st.DataObject, n_records: int, now: int) -> None:
    segfiles, good = _segments(n_records)
    if data.draw(st.booleans()):  # damage a record: the walk leaves it to the caller
        g = data.draw(st.sampled_from([0, 2]))
        b = bytearray(segfiles[g])
        at = data.draw(st.integers(HS, SEG - 1))
        b[at] ^= data.draw(st.integers(1, 255))
        segfiles[g] = bytes(b)
    qfile = _queue_file(data, good, now)
    f0 = data.draw(st.integers(0, 1 << 40).map(lambda x: x - x % PER_FILE))
    idx = f0 + data.draw(st.integers(0, PER_FILE))
    stop = data.draw(st.integers(idx, f0 + PER_FILE))
    restored = data.draw(st.integers(f0 - 1, f0 + PER_FILE + 1))
    done = data.draw(st.one_of(st.just(idx), st.integers(max(0, idx - 20), idx)))
    room = data.draw(st.integers(0, PER_FILE + 2))
    ref_hi = data.draw(st.integers(0, 20)) << IDX_BITS
    args = (f0, idx, stop, now, restored, done, room, ref_hi)
    assert native is not None
    c = _due_outcome(native.lv_due, qfile, segfiles, args)
    py = _due_outcome(queue.lv_due, qfile, segfiles, args)
    assert c == py


def _ack_state(data: st.DataObject, nlv: int, good: list[int]) -> tuple[list[dict[int, bytes]], list[int]]:
    files: list[dict[int, bytes]] = []
    cur: list[int] = []
    for _n in range(nlv):
        done = data.draw(st.integers(0, 3 * PER_FILE))
        send = data.draw(st.integers(done, done + 2 * PER_FILE))
        fs: dict[int, bytes] = {}
        first = done - done % PER_FILE
        while first < send + PER_FILE:
            if data.draw(st.integers(0, 9)):  # now and then a file is missing
                fs[first] = _queue_file(data, good, 0)
            first += PER_FILE
        files.append(fs)
        cur += [done, send, -1, -1]
    return files, cur


def _ack_outcome(fn: Any, files: list[dict[int, bytes]], cur: list[int], refs: list[int]) -> tuple[Any, ...]:
    fs = [{k: Mapped(b) for k, b in d.items()} for d in files]
    c = array("q", cur)
    segs: dict[int, int] = {}
    try:
        r: Any = fn(refs, fs, PER_FILE, HS, c, SEG, segs)
    except (KeyError, IndexError) as e:
        r = type(e).__name__
    return r, list(c), segs, [{k: bytes(m.buf) for k, m in d.items()} for d in fs]


# 250: an example draws up to four levels of queue files (hundreds of entries, each drawn on its
# own), four times the draws of an lv_due example; at 500 it was the suite's slowest unit test
@needs_native
@settings(max_examples=250, deadline=None)
@given(data=st.data(), nlv=st.integers(1, 4))
def test_lv_ack_matches_the_python_twin(data: st.DataObject, nlv: int) -> None:
    _segfiles, good = _segments(4)
    files, cur = _ack_state(data, nlv, good)
    ref = st.tuples(st.integers(0, nlv - 1), st.integers(0, 5 * PER_FILE)).map(lambda t: (t[0] << IDX_BITS) | t[1])
    refs = data.draw(
        st.lists(
            st.one_of(ref, ref, ref, st.integers(-5, (nlv + 2) << IDX_BITS), st.integers(1 << 63, 1 << 64)),
            max_size=30,
        )
    )
    assert native is not None
    c = _ack_outcome(native.lv_ack, files, cur, refs)
    py = _ack_outcome(queue.lv_ack, files, cur, refs)
    assert c == py


def test_lv_ack_advances_over_out_of_order_acks() -> None:
    """An ack of 1, then of 0: done waits, then crosses 0, 1 and the dropped 2 (at NO_POS: it
    releases nothing) and stops at the pending 3; each record is released once in its segment."""
    fns: list[Any] = [queue.lv_ack] if native is None else [queue.lv_ack, native.lv_ack]
    for fn in fns:
        b = bytearray(HS + PER_FILE * ENTRY_SIZE)
        for i, pos in enumerate((HS, SEG + HS, NO_POS, 2 * SEG + 8)):
            ENTRY.pack_into(b, HS + i * ENTRY_SIZE, pos, 5, 3 if pos == NO_POS else 0)
        files = [{0: Mapped(bytes(b))}]
        cur = array("q", [0, 4, -1, -1])
        segs: dict[int, int] = {}
        fn([1], files, PER_FILE, HS, cur, SEG, segs)
        assert list(cur) == [0, 4, 1, 2] and segs == {}
        fn([0], files, PER_FILE, HS, cur, SEG, segs)
        assert list(cur) == [3, 4, 0, 2] and segs == {0: 1, 1: 1}
        fn([3, 3, 0], files, PER_FILE, HS, cur, SEG, segs)
        assert list(cur) == [4, 4, 0, 4] and segs == {0: 1, 1: 1, 2: 1}
        assert [ENTRY.unpack_from(files[0][0].buf, HS + i * ENTRY_SIZE)[2] for i in range(4)] == [1, 1, 3, 1]
