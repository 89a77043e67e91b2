"""The timer wheel's C functions (``sidecar._native.wl_*``: the intake's record writes and the
publish/settle walks) against their Python twins in ``sidecar.wheel.layout``: the same bytes
written, the same result, the same refusals."""

from __future__ import annotations

import struct
from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.store import codec, native_args
from sidecar.store.codec import native
from sidecar.store.native_args import WlAck, WlDone, WlLink, WlSend
from sidecar.wheel import layout
from tests.infra import needs_native, unavailable

HS = 64
PER_FILE = 8
SLOTS = 4
EHS = HS + PER_FILE  # a timer-log file's first entry: after the header and its PER_FILE state bytes
TL_SIZE = EHS + PER_FILE * 32


def _make(cls: type[Any], fn: Any) -> Any:
    """An argument object of ``cls`` for ``fn``: the C type for the C function, else the class."""
    return native_args.make(cls, None if fn.__module__ == layout.__name__ else native)


def _link(fn: Any, t: memoryview, s: memoryview, *args: int) -> Any:
    """``fn`` (wl_link) with its fields given in the struct's order after ``hs``."""
    a = _make(WlLink, fn)
    a.hs, a.f0, a.nent, a.idx, a.due, a.loc, a.flags, a.level, a.slot_off, a.slot_time = EHS, *args
    return fn(t, s, a)


def _outcome(fn: Any, tl: bytearray, sl: bytearray, *args: Any) -> tuple[Any, bytes, bytes]:
    t, s = memoryview(tl), memoryview(sl)
    try:
        r: Any = _link(fn, t, s, *args)
    except (ValueError, struct.error, OverflowError):
        r = "refused"
    return r, bytes(tl), bytes(sl)


@needs_native
@settings(max_examples=400, deadline=None)
@given(
    data=st.data(),
    tl_first=st.integers(0, 1 << 40).map(lambda x: x - x % PER_FILE),
    at=st.integers(0, PER_FILE - 1),
    pos=st.integers(0, SLOTS - 1),
    slot_time=st.integers(-(1 << 50), 1 << 50),
    off=st.integers(-2, 0x10001),
    loc=st.integers(-(1 << 63), (1 << 63) - 1),
    flags=st.integers(0, 255),
    level=st.integers(0, 1 << 20),
    existing=st.booleans(),
)
def test_wl_link_matches_the_python_twin(
    data: st.DataObject, tl_first: int, at: int, pos: int, slot_time: int, off: int, loc: int, flags: int,
    level: int, existing: bool,
) -> None:
    idx = tl_first + at
    tl = bytearray(data.draw(st.binary(min_size=TL_SIZE, max_size=TL_SIZE)))
    sl = bytearray(data.draw(st.binary(min_size=HS + SLOTS * 32, max_size=HS + SLOTS * 32)))
    soff = HS + pos * 32
    if existing:  # a live chain in this slot; its tail in this file, an older one, or odd places
        last = data.draw(st.one_of(st.integers(tl_first, idx), st.integers(-1, tl_first + PER_FILE)))
        count = data.draw(st.integers(1, 0xFFFFFFFE))
        min_off = data.draw(st.integers(0, 0xFFFF))
        layout.SLOT.pack_into(sl, soff, slot_time, data.draw(st.integers(0, 1 << 40)), last, count, min_off, 0)
    args = (tl_first, PER_FILE, idx, slot_time + off, loc, flags, level, soff, slot_time)
    assert native is not None
    c = _outcome(native.wl_link, bytearray(tl), bytearray(sl), *args)
    py = _outcome(layout.wl_link, bytearray(tl), bytearray(sl), *args)
    assert c[0] == py[0]
    if c[0] != "refused":
        assert c == py


def test_wl_link_builds_a_chain() -> None:
    tl, sl = bytearray(TL_SIZE), bytearray(HS + SLOTS * 32)
    for fn in (layout.wl_link, native.wl_link if native is not None else layout.wl_link):
        tl[:], sl[:] = b"\x07" * len(tl), bytes(len(sl))  # states left over from before a restore
        assert _link(fn, memoryview(tl), memoryview(sl), 0, PER_FILE, 0, 1005, 7, 0, 0, HS + 32, 1000) == -1
        assert _link(fn, memoryview(tl), memoryview(sl), 0, PER_FILE, 1, 1003, 8, 0, 0, HS + 32, 1000) == 0
        assert _link(fn, memoryview(tl), memoryview(sl), 0, PER_FILE, 2, 1009, 9, 0, 0, HS + 32, 1000) == 1
        assert layout.SLOT.unpack_from(sl, HS + 32) == (1000, 0, 2, 3, 3, 0)
        assert [layout.ENTRY.unpack_from(tl, EHS + i * 32) for i in range(3)] == [
            (1005, 7, 1, 0, 0, 0, 0), (1003, 8, 2, 0, 0, 0, 1), (1009, 9, -1, 0, 0, 0, 2),
        ]
        assert tl[HS : HS + PER_FILE] == bytes(3) + b"\x07" * 5  # the linked entries are pending
        with pytest.raises(ValueError):  # an index beyond the file
            _link(fn, memoryview(tl), memoryview(sl), 0, PER_FILE, PER_FILE, 1005, 7, 0, 0, HS + 32, 1000)


# -- the per-entry walks (wl_send, wl_done, wl_group, wl_ack) ------------------------------------
# A random timer-log file of PER_FILE entries whose links only go forward (as the log's do),
# some of them out of the file, and random cursor positions, budgets and limits around it.

BASE = 1_000_000
BUCKET = 1 << 62


@st.composite
def _tl_file(draw: st.DrawFn) -> tuple[int, bytearray]:
    f0 = draw(st.integers(0, 1 << 30)) * PER_FILE
    tl = bytearray(TL_SIZE)
    for j in range(PER_FILE):
        x = f0 + j
        due = BASE + draw(st.integers(-1, 3))
        loc = draw(st.one_of(st.integers(0, 999), st.integers(0, 99).map(lambda v: BUCKET | v)))
        nxt = draw(st.one_of(st.just(-1), st.integers(x + 1, f0 + PER_FILE + 2)))
        tag = x & 0xFFFFFFFF if draw(st.integers(0, 9)) else draw(st.integers(0, 0xFFFFFFFF))
        layout.ENTRY.pack_into(tl, EHS + j * 32, due, loc, nxt, 0, draw(st.integers(0, 1)), 0, tag)
        tl[HS + j] = draw(st.integers(0, 3))  # its state
    return f0, tl


def _walk_args(data: st.DataObject, f0: int) -> tuple[Any, dict[str, int]]:
    """A pass's entry list (None: a chain walk) and its position fields."""
    entry = st.integers(f0 - 2, f0 + PER_FILE + 1)
    lst = data.draw(st.one_of(st.none(), st.lists(entry, max_size=10).map(lambda v: array("q", v))))
    fields = {
        "f0": f0, "nent": PER_FILE, "i": data.draw(st.integers(0, 10)), "e": data.draw(st.one_of(st.just(-1), entry)),
        "last": data.draw(entry), "base": BASE, "o": data.draw(st.integers(-1, 3)),
        "nxt": data.draw(st.integers(-1, 3)), "after": data.draw(st.one_of(st.just(-1), entry)),
    }
    return lst, fields


def _twin(fn_c: Any, fn_py: Any, tl: bytearray, *args: Any, extra: Any = ()) -> None:
    tc, tp = bytearray(tl), bytearray(tl)
    xc, xp = [type(x)() for x in extra], [type(x)() for x in extra]
    rc = fn_c(memoryview(tc), EHS, *args, *xc)
    rp = fn_py(memoryview(tp), EHS, *args, *xp)
    _same(rc, rp, tc, tp, xc, xp)


def _twin_struct(name: str, cls: type[Any], tl: bytearray, lead: Any, fields: dict[str, int], extra: Any = ()) -> None:
    """The C and the Python ``name`` (a walk taking ``(buf, *lead, *extra, a)``) on copies of
    ``tl``, their argument objects of ``cls`` set to ``fields``: the same result and moved fields."""
    assert native is not None
    tc, tp = bytearray(tl), bytearray(tl)
    xc, xp = [type(x)() for x in extra], [type(x)() for x in extra]
    out = []
    for fn, t, x in ((getattr(native, name), tc, xc), (getattr(layout, name), tp, xp)):
        a = _make(cls, fn)
        a.hs = EHS
        for k, v in fields.items():
            setattr(a, k, v)
        r = fn(memoryview(t), *lead, *x, a)
        out.append((r, {k: getattr(a, k) for k in native_args.moved(cls)}))
    _same(out[0], out[1], tc, tp, xc, xp)


def _same(rc: Any, rp: Any, tc: bytearray, tp: bytearray, xc: list[Any], xp: list[Any]) -> None:
    assert rc == rp
    assert tc == tp
    assert xc == xp
    assert [list(x.items()) if isinstance(x, dict) else x for x in xc] == [
        list(x.items()) if isinstance(x, dict) else x for x in xp
    ]


@needs_native
@settings(max_examples=400, deadline=None)
@given(data=st.data(), f=_tl_file(), room=st.integers(0, 6), budget=st.integers(0, 12), vl=st.integers(-1, 9))
def test_wl_send_matches_the_python_twin(
    data: st.DataObject, f: tuple[int, bytearray], room: int, budget: int, vl: int
) -> None:
    f0, tl = f
    lst, fields = _walk_args(data, f0)
    _twin_struct("wl_send", WlSend, tl, (lst,), {**fields, "room": room, "budget": budget, "vlim": f0 + vl}, ([],))


@needs_native
@settings(max_examples=400, deadline=None)
@given(data=st.data(), f=_tl_file(), budget=st.integers(0, 12), seg=st.integers(1, 400))
def test_wl_done_matches_the_python_twin(data: st.DataObject, f: tuple[int, bytearray], budget: int, seg: int) -> None:
    f0, tl = f
    lst, fields = _walk_args(data, f0)
    _twin_struct("wl_done", WlDone, tl, (lst,), {**fields, "budget": budget, "seg_bytes": seg}, ({}, []))


@needs_native
@settings(max_examples=400, deadline=None)
@given(data=st.data(), f=_tl_file())
def test_wl_group_matches_the_python_twin(data: st.DataObject, f: tuple[int, bytearray]) -> None:
    f0, tl = f
    entry = st.integers(f0 - 2, f0 + PER_FILE + 1)
    e, last = data.draw(st.one_of(st.just(-1), entry)), data.draw(entry)
    assert native is not None
    _twin(native.wl_group, layout.wl_group, tl, f0, PER_FILE, e, last, BASE)


@needs_native
@settings(max_examples=400, deadline=None)
@given(data=st.data(), f=_tl_file(), P=st.integers(1, 5))
def test_wl_ack_matches_the_python_twin(data: st.DataObject, f: tuple[int, bytearray], P: int) -> None:
    f0, tl = f
    entry = st.integers(f0 - 2, f0 + PER_FILE + 1)
    refs = data.draw(st.lists(st.one_of(entry, entry, st.just(-1), st.integers(0, 9).map(lambda v: BUCKET | v))))
    j = data.draw(st.integers(0, len(refs)))
    head = data.draw(st.integers(f0, f0 + PER_FILE + 2))
    s_k = data.draw(st.integers(BASE // P - 2, BASE // P + 4))
    s_o = data.draw(st.integers(-1, P))
    s_after, l_sent, wa, wb = (data.draw(st.one_of(st.just(-1), entry)) for _ in range(4))
    fields = {
        "f0": f0, "nent": PER_FILE, "j": j, "head": head, "P": P, "s_k": s_k, "s_o": s_o, "s_after": s_after,
        "l_sent": l_sent, "wait_a": wa, "wait_b": wb,
    }
    _twin_struct("wl_ack", WlAck, tl, (refs,), fields)


def test_wl_walks_follow_a_chain_across_files() -> None:
    """A chain of 5 entries over two files (4 per file here), offsets 0 1 0 0 1: each walk stops
    at the file boundary (why 2) and resumes in the next file where it stopped."""
    per = 4
    ehs = HS + per
    files = {0: bytearray(ehs + 4 * 32), 4: bytearray(ehs + 4 * 32)}
    for x, off in zip((1, 2, 3, 4, 6), (0, 1, 0, 0, 1), strict=True):
        nx = {1: 2, 2: 3, 3: 4, 4: 6, 6: -1}[x]
        layout.ENTRY.pack_into(files[x - x % per], ehs + (x % per) * 32, BASE + off, 100 + x, nx, 0, 0, 0, x)
    for mod in (layout, native) if native is not None else (layout,):
        got: dict[int, bytes] = {}
        e = 1
        while e != -1:
            f0 = e - e % per
            g, e = mod.wl_group(memoryview(bytearray(files[f0])), ehs, f0, per, e, 6, BASE)
            for k, v in g.items():
                got[k] = got.get(k, b"") + v
        assert {k: list(array("q", v)) for k, v in got.items()} == {0: [1, 3, 4], 1: [2, 6]}
        pend: list[tuple[int, int]] = []
        a = _make(WlSend, mod.wl_send)
        a.hs, a.nent, a.f0, a.e, a.last, a.base, a.o, a.nxt, a.after = ehs, per, 0, 1, 6, BASE, 0, -1, -1
        a.room, a.budget, a.vlim = 10, 10, 0
        moved = native_args.moved(WlSend)
        assert mod.wl_send(memoryview(files[0]), None, pend, a) == 2 and pend == [(1, 101), (3, 103)]
        assert [getattr(a, k) for k in moved] == [0, 4, 1, 3, 7, 8, -1, -1]  # i e nxt after budget room lo hi
        a.f0 = 4
        assert mod.wl_send(memoryview(files[4]), None, pend, a) == 0
        assert pend == [(1, 101), (3, 103), (4, 104)]
        assert [getattr(a, k) for k in moved] == [0, -1, 1, 6, 5, 7, -1, -1]


def _fields(out: list[tuple[int, Any]]) -> list[tuple[Any, ...]]:
    return [(x, r.due_ms, r.src_offset, bytes(r.id), bytes(r.topic), bytes(r.value)) for x, r in out]


@pytest.mark.parametrize("mod", ["python", "c"])
def test_wl_read_decodes_runs_and_leaves_the_rest_to_the_caller(mod: str, tmp_path: Any) -> None:
    """``wl_read`` decodes the commit log's records of ``pend`` in order, straight from the
    segments (three of them here), and stops at a bucket ref, a segment that is gone and an offset
    that holds no record, returning that position; the C twin gives the same records and stops."""
    if mod == "c" and native is None:
        unavailable("the C extension sidecar._native")
    from sidecar.store.codec import MESSAGE
    from sidecar.store.log import CommitLog

    fn = layout.wl_read if mod == "python" else native.wl_read  # type: ignore[union-attr]
    log = CommitLog(tmp_path, 4096)
    list(log.recover(None, None))
    pos = [
        log.append(
            codec.head(
                rtype=MESSAGE, due_ms=BASE + n, enqueue_ms=BASE, src_offset=n, src_partition=0, target_partition=-1,
                retry_count=0, level=0,
            ),
            b"r%d" % n, b"t", None, bytes([n]) * 700, b"",
        )
        for n in range(12)
    ]
    assert len({p // 4096 for p in pos}) == 3
    ok = [(100 + n, p) for n, p in enumerate(pos)]
    tail = pos[-1] // 4096 * 4096 + 4000  # past the last record of the last segment: zeros
    pend = [*ok[:5], (200, BUCKET | 7), *ok[5:9], (201, 50 * 4096 + 64), *ok[9:11], (202, tail), ok[11]]
    out: list[tuple[int, Any]] = []
    stops = []
    i = 0
    while i < len(pend):
        i = fn(log.segments, 4096, pend, i, out)
        stops.append(i)
        i += 1
    assert stops == [5, 10, 13, 15]
    assert _fields(out) == [(100 + n, BASE + n, n, b"r%d" % n, b"t", bytes([n]) * 700) for n in range(12)]
    assert fn(log.segments, 4096, pend, len(pend), out) == len(pend)
    log.close()
