"""The timer wheel's C record writes (``sidecar._native.wl_*``) against their Python twins in
``sidecar.wheel.layout``: the same bytes written, the same result, the same refusals."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.store.codec import native
from sidecar.wheel import layout

needs_native = pytest.mark.skipif(native is None, reason="sidecar._native is not built (or KDS_PURE_PYTHON=1)")

HS = 64
PER_FILE = 8
SLOTS = 4


def _outcome(fn: Any, tl: bytearray, sl: bytearray, *args: Any) -> tuple[Any, bytes, bytes]:
    t, s = memoryview(tl), memoryview(sl)
    try:
        r: Any = fn(t, HS, *args[:6], s, *args[6:])
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
    tl = bytearray(data.draw(st.binary(min_size=HS + PER_FILE * 32, max_size=HS + PER_FILE * 32)))
    sl = bytearray(data.draw(st.binary(min_size=HS + SLOTS * 32, max_size=HS + SLOTS * 32)))
    soff = HS + pos * 32
    if existing:  # a live chain in this slot; its tail in this file, an older one, or odd places
        last = data.draw(st.one_of(st.integers(tl_first, idx), st.integers(-1, tl_first + PER_FILE)))
        count = data.draw(st.integers(1, 0xFFFFFFFE))
        min_off = data.draw(st.integers(0, 0xFFFF))
        layout.SLOT.pack_into(sl, soff, slot_time, data.draw(st.integers(0, 1 << 40)), last, count, min_off, 0)
    args = (tl_first, idx, slot_time + off, loc, flags, level, soff, slot_time)
    assert native is not None
    c = _outcome(native.wl_link, bytearray(tl), bytearray(sl), *args)
    py = _outcome(layout.wl_link, bytearray(tl), bytearray(sl), *args)
    assert c[0] == py[0]
    if c[0] != "refused":
        assert c == py


def test_wl_link_builds_a_chain() -> None:
    tl, sl = bytearray(HS + PER_FILE * 32), bytearray(HS + SLOTS * 32)
    for fn in (layout.wl_link, native.wl_link if native is not None else layout.wl_link):
        tl[:], sl[:] = bytes(len(tl)), bytes(len(sl))
        assert fn(memoryview(tl), HS, 0, 0, 1005, 7, 0, 0, memoryview(sl), HS + 32, 1000) == -1
        assert fn(memoryview(tl), HS, 0, 1, 1003, 8, 0, 0, memoryview(sl), HS + 32, 1000) == 0
        assert fn(memoryview(tl), HS, 0, 2, 1009, 9, 0, 0, memoryview(sl), HS + 32, 1000) == 1
        assert layout.SLOT.unpack_from(sl, HS + 32) == (1000, 0, 2, 3, 3, 0)
        assert [layout.ENTRY.unpack_from(tl, HS + i * 32) for i in range(3)] == [
            (1005, 7, 1, 0, 0, 0, 0), (1003, 8, 2, 0, 0, 0, 1), (1009, 9, -1, 0, 0, 0, 2),
        ]
