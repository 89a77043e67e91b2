"""Commit-log record codec: round trips and corruption detection (issue 3)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.store import codec, native_args
from tests.unit.helpers.records import HEADERS, records


def encode(fields: dict[str, Any], offset: int = 0, fill: int = 0) -> tuple[bytearray, int]:
    f = dict(fields)
    headers_blob = codec.encode_headers(f.pop("headers"))
    size = codec.encoded_size(
        len(f["rid"]), len(f["topic"]), len(f["key"] or b""), len(f["value"] or b""), len(headers_blob)
    )
    buf = bytearray([fill]) * (offset + size + 16)
    head = codec.head(**{name: f.pop(name) for name in native_args.fields(native_args.RecordHead)})
    n = codec.encode_into(buf, offset, head, f["rid"], f["topic"], f["key"], f["value"], headers_blob)
    assert n == size and n % codec.ALIGN == 0
    return buf, n


def assert_same(rec: codec.Record, fields: dict[str, Any]) -> None:
    assert rec.rtype == fields["rtype"]
    for name in ("due_ms", "enqueue_ms", "src_offset", "src_partition", "target_partition", "retry_count", "level"):
        assert getattr(rec, name) == fields[name], name
    assert bytes(rec.id) == fields["rid"]
    assert bytes(rec.topic) == fields["topic"]
    assert (None if rec.key is None else bytes(rec.key)) == fields["key"]
    assert (None if rec.value is None else bytes(rec.value)) == fields["value"]
    assert codec.decode_headers(rec.headers) == [(k, v) for k, v in fields["headers"]]


@given(records(), st.integers(min_value=0, max_value=64).map(lambda n: n * 8), st.sampled_from([0, 0xAB]))
def test_round_trip(fields: dict[str, Any], offset: int, fill: int) -> None:
    buf, n = encode(fields, offset, fill)
    rec = codec.decode(memoryview(buf), offset)
    assert rec.length == n == codec.peek_length(buf, offset)
    assert_same(rec, fields)
    # Bounded by the written area: the record fits exactly, a byte less does not.
    codec.decode(memoryview(buf), offset, limit=offset + n)
    with pytest.raises(codec.CorruptRecord):
        codec.decode(memoryview(buf), offset, limit=offset + n - 1)


def test_empty_and_null_fields_are_distinct() -> None:
    base = {
        "rtype": codec.MESSAGE, "due_ms": 1, "enqueue_ms": 0, "src_offset": 0, "src_partition": 0,
        "target_partition": -1, "retry_count": 0, "level": 0, "rid": b"", "topic": b"t", "headers": [],
    }
    for key, value in ((None, None), (b"", b""), (None, b""), (b"", None)):
        buf, _ = encode({**base, "key": key, "value": value})
        rec = codec.decode(memoryview(buf), 0)
        assert (None if rec.key is None else bytes(rec.key)) == key
        assert (None if rec.value is None else bytes(rec.value)) == value


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(records(), st.integers(min_value=1, max_value=255), st.data())
def test_any_single_byte_corruption_is_detected(fields: dict[str, Any], flip: int, data: st.DataObject) -> None:
    buf, n = encode(fields)
    for i in range(n):  # every byte of the record, header and padding included
        damaged = bytearray(buf)
        damaged[i] ^= flip
        with pytest.raises(codec.CorruptRecord):
            codec.decode(memoryview(damaged), 0)
    # ... and with an arbitrary replacement value at a random position
    i = data.draw(st.integers(min_value=0, max_value=n - 1))
    v = data.draw(st.integers(min_value=0, max_value=255).filter(lambda v: v != buf[i]))
    damaged = bytearray(buf)
    damaged[i] = v
    with pytest.raises(codec.CorruptRecord):
        codec.decode(memoryview(damaged), 0)


def test_zero_length_is_end_of_data_and_truncation_is_detected() -> None:
    fields = {
        "rtype": codec.DEAD, "due_ms": 5, "enqueue_ms": 4, "src_offset": 3, "src_partition": 2,
        "target_partition": 1, "retry_count": 7, "level": 2, "rid": b"id-1", "topic": b"dlq",
        "key": b"k", "value": b"v" * 100, "headers": [("a", b"1"), ("b", None)],
    }
    buf, n = encode(fields)
    with pytest.raises(codec.CorruptRecord, match="end of data"):
        codec.decode(memoryview(bytes(200)), 0)
    for cut in range(n):  # a torn write: the record's bytes from ``cut`` on never reached the file
        if not any(buf[cut:n]):
            continue  # only zero padding is missing: the record is whole
        torn = bytearray(buf[:cut]) + bytearray(len(buf) - cut)
        with pytest.raises(codec.CorruptRecord):
            codec.decode(memoryview(torn), 0)


def test_verify_false_skips_the_crc_only() -> None:
    fields = {
        "rtype": codec.MESSAGE, "due_ms": 5, "enqueue_ms": 4, "src_offset": 3, "src_partition": 2,
        "target_partition": 1, "retry_count": 0, "level": 0, "rid": b"x", "topic": b"t",
        "key": None, "value": b"hello", "headers": [],
    }
    buf, _ = encode(fields)
    buf[codec.HEAD_SIZE + 2 + 3] ^= 1  # inside the value (after the 1-byte id and topic)
    value = codec.decode(memoryview(buf), 0, verify=False).value
    assert value is not None and bytes(value) == b"hel" + bytes([ord("l") ^ 1]) + b"o"
    with pytest.raises(codec.CorruptRecord, match="CRC"):
        codec.decode(memoryview(buf), 0)


@given(HEADERS)
def test_headers_round_trip(headers: list[tuple[str, bytes | None]]) -> None:
    assert codec.decode_headers(codec.encode_headers(headers)) == headers
    assert codec.decode_headers(b"") == []


@given(records())
def test_encode_round_trips(fields: dict[str, Any]) -> None:
    """The intake's positional one-copy ``encode`` decodes to the same fields."""
    f = dict(fields)
    blob = codec.encode_headers(f.pop("headers"))
    data = codec.encode(
        codec.head(
            rtype=f["rtype"], due_ms=f["due_ms"], enqueue_ms=f["enqueue_ms"], src_offset=f["src_offset"],
            src_partition=f["src_partition"], target_partition=f["target_partition"], retry_count=f["retry_count"],
            level=f["level"],
        ),
        f["rid"], f["topic"], f["key"], f["value"], blob,
    )
    assert len(data) % codec.ALIGN == 0
    assert_same(codec.decode(memoryview(bytearray(data)), 0), fields)
