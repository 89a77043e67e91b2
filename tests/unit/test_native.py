"""The C accelerator (sidecar._native) against its Python twins: the same bytes, the same answers,
the same errors, for any input (hypothesis). The Python functions are the reference; the C ones
are what runs. In CI the extension must be built: a silent fall back to Python would make every
benchmark measure the wrong thing."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c as reference_crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar import contract as c
from sidecar.headers import Rejection, Request, Rules, parse_ingress, py_parse_request
from sidecar.store import codec, native_args
from sidecar.store.idindex import PRECANCEL, IdIndex
from sidecar.store.idprobe import py_id_hash
from tests.infra import needs_native
from tests.unit.helpers.records import HEADERS, parse_rules, records

native = codec.native


def test_built_in_ci() -> None:
    if os.environ.get("CI") == "true" or native is not None:
        assert native is not None, "sidecar._native is not built: scripts/setup.sh builds it"
        assert codec.decode is native.decode and codec.Record is native.Record
    else:
        assert codec.decode is codec.py_decode


def args_of(f: dict[str, Any]) -> tuple[Any, ...]:
    head = codec.head(
        rtype=f["rtype"], due_ms=f["due_ms"], enqueue_ms=f["enqueue_ms"], src_offset=f["src_offset"],
        src_partition=f["src_partition"], target_partition=f["target_partition"], retry_count=f["retry_count"],
        level=f["level"],
    )
    return (head, f["rid"], f["topic"], f["key"], f["value"], codec.py_encode_headers(f["headers"]))


@needs_native
def test_encode_takes_its_integers_by_name_only() -> None:
    """The eight integers of a record travel in a RecordHead (native_args): a positional call of
    the old shape is refused by both twins, and so is any other object in the head's place."""
    assert native is not None
    old = (codec.MESSAGE, 2, 1, 0, 0, -1, 0, 0, b"id", b"t", None, b"v", b"\x00\x00")
    for fn in (native.encode, codec.py_encode):
        with pytest.raises(TypeError):
            fn(*old)
        with pytest.raises(TypeError):
            fn((codec.MESSAGE, 2, 1, 0, 0, -1, 0, 0), b"id", b"t", None, b"v", b"\x00\x00")
    head = native_args.RecordHead()
    head.rtype, head.due_ms = codec.MESSAGE, 5
    with pytest.raises(TypeError):
        native.encode(head, b"id", b"t", None, b"v", b"\x00\x00")  # the C twin takes only its own type
    fields = dict(zip(native_args.fields(native_args.RecordHead), (codec.DEAD, 9, 8, 7, 6, 5, 4, 3), strict=True))
    again = codec.head_of(native.decode(native.encode(codec.head(**fields), b"r", b"t", None, None, b"\x00\x00"), 0))
    assert {name: getattr(again, name) for name in fields} == fields


@needs_native
@given(st.binary(max_size=3000))
def test_crc32c(data: bytes) -> None:
    assert native is not None
    assert native.crc32c(data) == native.crc32c_software(data) == reference_crc32c(data)


@needs_native
@given(st.one_of(st.binary(max_size=300), st.binary(min_size=120, max_size=140), st.binary(min_size=250, max_size=260)))
def test_id_hash(rid: bytes) -> None:
    assert native is not None
    digest = int.from_bytes(hashlib.blake2b(rid, digest_size=8).digest(), "little")
    assert native.id_hash(rid) == py_id_hash(rid) == (digest if digest >= 2 else digest + 2)


@needs_native
@given(HEADERS)
def test_header_blobs(headers: list[tuple[str, bytes | None]]) -> None:
    assert native is not None
    blob = native.encode_headers(headers)
    assert blob == codec.py_encode_headers(headers)
    assert native.decode_headers(blob) == codec.py_decode_headers(blob) == headers


@needs_native
@given(st.binary(max_size=40))
def test_damaged_header_blobs(blob: bytes) -> None:
    assert native is not None
    outcomes = []
    for fn in (native.decode_headers, codec.py_decode_headers):
        try:
            outcomes.append(("ok", fn(blob)))
        except codec.CorruptRecord as e:
            outcomes.append(("corrupt", str(e)))
        except UnicodeDecodeError:
            outcomes.append(("utf8", ""))
    assert outcomes[0] == outcomes[1]


@needs_native
@settings(max_examples=200)
@given(records(), st.integers(0, 16).map(lambda n: n * 8), st.integers(-64, 64))
def test_encode_append_decode(f: dict[str, Any], offset: int, slack: int) -> None:
    assert native is not None
    args = args_of(f)
    data = native.encode(*args)
    assert data == codec.py_encode(*args)
    limit = offset + len(data) + slack
    bufs = [bytearray(b"\xee" * (offset + len(data) + 64)) for _ in range(2)]
    assert native.append(bufs[0], offset, limit, *args) == codec.py_append(bufs[1], offset, limit, *args)
    assert bufs[0] == bufs[1]
    fits = slack >= 0
    assert (bufs[0][offset : offset + len(data)] == data) == fits
    if not fits:
        return
    for verify in (True, False):
        got, want = native.decode(bufs[0], offset, verify=verify), codec.py_decode(memoryview(bufs[1]), offset,
                                                                                   verify=verify)
        for name in ("length", "rtype", "due_ms", "enqueue_ms", "src_offset", "src_partition", "target_partition",
                     "retry_count", "level", "id", "topic", "key", "value", "headers"):
            assert getattr(got, name) == getattr(want, name), name


@needs_native
@settings(max_examples=300)
@given(records(), st.data())
def test_decode_rejects_what_python_rejects(f: dict[str, Any], data: st.DataObject) -> None:
    """Any damage (a flipped byte anywhere, a short limit) gives the same error, word for word."""
    assert native is not None
    buf = bytearray(native.encode(*args_of(f))) + bytes(16)
    at = data.draw(st.integers(0, len(buf) - 1))
    buf[at] ^= data.draw(st.integers(1, 255))
    limit = data.draw(st.one_of(st.none(), st.integers(0, len(buf))))
    outcomes = []
    for fn in (native.decode, codec.py_decode):
        try:
            rec = fn(memoryview(buf), 0, limit)
            outcomes.append(("ok", rec.length, rec.id, rec.value, rec.headers))
        except codec.CorruptRecord as e:
            outcomes.append(("corrupt", str(e)))
    assert outcomes[0] == outcomes[1]


@needs_native
@given(records(), st.binary(min_size=1, max_size=30))
def test_delivery_headers(f: dict[str, Any], source: bytes) -> None:
    assert native is not None
    data = native.encode(*args_of(f))
    got = native.delivery_headers(native.decode(data, 0), source)
    want = codec.py_delivery_headers(codec.py_decode(memoryview(data), 0), source)
    assert got == want


@needs_native
def test_record_type_behaves_like_the_dataclass() -> None:
    assert native is not None
    fields = (80, 1, 5, 6, 7, 8, -1, 0, 2, b"id", b"t", None, b"v", b"\x00\x00")
    a, b = native.Record(*fields), codec.PyRecord(*fields)
    assert [getattr(a, n) for n in codec.PyRecord.__slots__] == [getattr(b, n) for n in codec.PyRecord.__slots__]
    assert a == native.Record(*fields) and a != native.Record(*fields[:-1], b"")
    assert "due_ms=5" in repr(a)
    with pytest.raises(AttributeError):
        a.due_ms = 1  # type: ignore[misc]


# -- id index: the C probes write the same slots as the Python ones --------------------------------
hashes = st.integers(0, 40).map(lambda k: 2 + (k % 5) + (k // 5) * 64)
ops = st.lists(st.tuples(st.sampled_from(["put", "put", "remove", "find", "step", "precancel"]), hashes,
                         st.integers(1, 6)), max_size=300)


def _stages(ix: IdIndex) -> list[bytes]:
    return [bytes(g.stage.buf) for g in (ix.gen, ix.sealed) if g is not None]


@needs_native
@settings(max_examples=150, deadline=None)
@given(ops)
def test_id_index_twins(program: list[tuple[str, int, int]]) -> None:
    """Two indexes fed the same operations, one through C and one through Python, stay byte for
    byte identical: the stages, the journal records, the table after each pass (C
    ``idx_merge_journal`` against its twin) and the counts, expired pre-cancels swept by the
    passes included."""
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        c_ix = IdIndex(Path(d1), initial_capacity=16, native=True)
        p_ix = IdIndex(Path(d2), initial_capacity=16, native=False)
        assert c_ix.native and not p_ix.native
        for ix in (c_ix, p_ix):
            ix.restore(None)
            ix.step(600, 300)  # pre-cancels older than 300 ms at 600 expire
        for op, h, r in program:
            if op == "put":
                c_ix.put(h, r)
                p_ix.put(h, r)
            elif op == "precancel":  # a pre-cancel made at time r * 100
                c_ix.put(h, PRECANCEL | (r * 100))
                p_ix.put(h, PRECANCEL | (r * 100))
            elif op == "remove":
                assert c_ix.remove(h, r) == p_ix.remove(h, r)
            elif op == "step":  # a cut and its pass
                for ix in (c_ix, p_ix):
                    ix.growth.cut(force=True)
                    ix.wait()
            else:
                assert c_ix.find(h) == p_ix.find(h)
            assert (c_ix.cap, c_ix.live, c_ix.tombs, c_ix.swept) == (p_ix.cap, p_ix.live, p_ix.tombs, p_ix.swept)
            assert _stages(c_ix) == _stages(p_ix)
            assert c_ix.gen is not None and p_ix.gen is not None
            assert c_ix.gen.pending == p_ix.gen.pending
        assert bytes(c_ix.f.buf) == bytes(p_ix.f.buf)
        c_ix.close()
        p_ix.close()


# -- the ingress fast path: never a different answer from the full parser ---------------------------
_NAMES = [c.TARGET_TOPIC, c.DELAY_MS, c.DELIVER_AT, c.TARGET_PARTITION, c.ID, c.LEVEL, c.CANCEL, c.RETRY_COUNT,
          c.REPLACE, c.KMS_EPOCH, c.KMS_TARGET_TOPIC, c.SOURCE, "app", "trace-id", "delay.other", "delay.cron",
          "delay.\u00e9", "delay", c.REDRIVE_ID, c.DLQ_REASON]
_VALUES = st.one_of(
    st.none(), st.sampled_from([b"", b"out", b"other", b"unknown", b"in", b"__x", b"0", b"5", b"-5", b"+5", b"1000001",
                                b"1700000000000", b"99999999999999999999", b"1 ", "\u00e9".encode(), b"\xff",
                                b"true", b"false"]),
    st.integers(0, 10**13).map(lambda n: str(n).encode()), st.binary(max_size=8), st.binary(min_size=250, max_size=260),
)
_NUMBER = st.one_of(st.integers(0, 10**13).map(lambda n: str(n).encode()), _VALUES)


@st.composite
def _header_lists(draw: st.DrawFn) -> list[tuple[str, bytes | None]]:
    """Mostly near-valid requests (a target, a delay, an id...), then a few random headers on top
    and a shuffle: both sides of every check the fast path makes."""
    headers: list[tuple[str, bytes | None]] = []
    if draw(st.integers(0, 9)):
        headers.append((c.TARGET_TOPIC, draw(st.sampled_from([b"out", b"out", b"other", b"unknown", b"in", b""]))))
    for name in (c.DELAY_MS, c.DELIVER_AT, c.ID, c.TARGET_PARTITION, "app"):
        if draw(st.integers(0, 2)) == 0:
            headers.append((name, draw(_NUMBER)))
    headers += draw(st.lists(st.tuples(st.sampled_from(_NAMES), _VALUES), max_size=2))
    return draw(st.permutations(headers))


_HEADER_LISTS = _header_lists()


def _fast(headers: Any, ts: int, now: int, size: int, rules: Rules) -> Any:
    assert native is not None
    return native.parse_request(headers, ts, now, size, rules.max_record_bytes, rules.max_delay_ms,
                                rules.checked_targets)


@needs_native
@settings(max_examples=600)
@given(_HEADER_LISTS, st.integers(0, 2 * 10**12), st.integers(0, 2 * 10**12), st.integers(0, 300),
       st.sampled_from([1 << 20, 100, 40]))
def test_parse_request_agrees_with_the_full_parser(
    headers: list[tuple[str, bytes | None]], ts: int, now: int, size: int, max_bytes: int
) -> None:
    rules = parse_rules(max_bytes)
    got = _fast(headers, ts, now, size, rules)
    want = py_parse_request(headers, ts, now, size, rules)
    if want is None:
        assert got is None
    elif got is not None:
        assert got == want


@needs_native
@given(st.sampled_from([c.CRON, c.EVERY, c.STATE_LAST, "delay.deliver_at", "delay.", "delay.\u00e9", "delay.\u4e00",
                        c.REDRIVE_ID, c.DLQ_ERROR]),
       st.integers(0, 3), st.one_of(st.none(), st.binary(max_size=4)))
def test_parse_request_hands_back_every_delay_header_it_does_not_handle(
    name: str, at: int, value: bytes | None
) -> None:
    """A delay.* header with no fast-path code, anywhere in an otherwise plain request: C answers
    None, and the full parser decides (bad-header naming it, or a pass-through). No list of names
    lives in C: only the prefix, from contract.py through ``setup_parser``."""
    ts = 1_700_000_000_000
    headers: list[tuple[str, bytes | None]] = [(c.TARGET_TOPIC, b"out"), (c.DELAY_MS, b"5"), ("app", b"x")]
    headers.insert(at, (name, value))
    rules = parse_rules()
    assert _fast(headers, ts, ts, 10, rules) is None
    assert py_parse_request(headers, ts, ts, 10, rules) is None
    full = parse_ingress(headers, ts, ts, 10, rules, headers_in_size=False)
    if name in c.PASS_THROUGH:
        assert isinstance(full, Request) and (name, value) in full.user_headers
    elif name in c.RECURRING_HEADERS:  # a recurring record: the store arms it (store/firings.py)
        assert (isinstance(full, Request) and full.mode == "recurring") or (
            isinstance(full, Rejection) and full.reason == c.BAD_HEADER and name in full.error)
    else:
        assert isinstance(full, Rejection) and full.reason == c.BAD_HEADER and repr(name) in full.error
    # names that only look alike are user headers, taken by C
    for other in ("delay", "delayed.cron", "Delay.cron", "x-delay.cron"):
        headers[at] = (other, value)
        got = _fast(headers, ts, ts, 10, rules)
        assert got is not None and (other, value) in got[5]


@needs_native
@given(st.sampled_from(["out", "other"]), st.one_of(st.none(), st.sampled_from([c.DELAY_MS, c.DELIVER_AT])),
       st.integers(0, 3_600_000), st.booleans(), st.booleans(),
       st.lists(st.tuples(st.sampled_from(["app", "trace"]), st.one_of(st.none(), st.binary(max_size=10))), max_size=3))
def test_parse_request_takes_the_common_requests(
    target: str, delay: str | None, n: int, with_id: bool, with_partition: bool,
    user: list[tuple[str, bytes | None]],
) -> None:
    ts = now = 1_700_000_000_000
    headers = [(c.TARGET_TOPIC, target.encode()), *user]
    if delay is not None:
        headers.append((delay, str(n if delay == c.DELAY_MS else ts + n).encode()))
    if with_id:
        headers.insert(0, (c.ID, b"order-42"))
    if with_partition:
        headers.append((c.TARGET_PARTITION, b"3"))
    rules = parse_rules()
    got = _fast(headers, ts, now, 100, rules)
    assert got is not None
    assert got == py_parse_request(headers, ts, now, 100, rules)
    assert got[3] == ts + n if delay else ts
    assert got[5] == tuple(user)


@needs_native
@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=12), max_size=60, unique=True), st.data())
def test_remove_delivered_twins(ids: list[bytes], data: st.DataObject) -> None:
    """A settled batch removed in one C call leaves the same stage, counts and journal records as
    the Python path, one record at a time (including refs that are not there, and refs already
    merged into the table)."""
    assert native is not None
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        c_ix = IdIndex(Path(d1), initial_capacity=16, native=True)
        p_ix = IdIndex(Path(d2), initial_capacity=16, native=False)
        merged = data.draw(st.integers(0, len(ids)))
        for ix in (c_ix, p_ix):
            ix.restore(None)
            for ref, rid in enumerate(ids):
                ix.put(py_id_hash(rid), ref)
                if ref + 1 == merged:  # the first ones are in the table, the rest staged
                    ix.growth.cut(force=True)
                    ix.wait()
        chosen = data.draw(st.lists(st.integers(0, len(ids) + 3), max_size=len(ids) + 4))
        pairs = [(ref, native.Record(80, 1, 0, 0, 0, 0, -1, 0, 0, ids[ref] if ref < len(ids) else b"gone", b"t",
                                     None, None, b"")) for ref in chosen]
        assert c_ix.remove_delivered(pairs) == p_ix.remove_delivered(pairs)
        assert (c_ix.live, c_ix.tombs) == (p_ix.live, p_ix.tombs)
        assert _stages(c_ix) == _stages(p_ix)
        assert c_ix.gen is not None and p_ix.gen is not None
        assert c_ix.gen.pending == p_ix.gen.pending
        assert bytes(c_ix.f.buf) == bytes(p_ix.f.buf)
        c_ix.close()
        p_ix.close()
