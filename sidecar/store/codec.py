"""Commit-log record codec: one self-checking, 8-byte aligned binary record per ingress record.

Layout (little-endian; offsets in bytes from the start of the record)::

    0   u32  length     total record length including this header and padding (multiple of 8)
    4   u32  crc        CRC32C (Castagnoli) of bytes [8, 8 + body_len): everything after this field
    8   u8   type       1 MESSAGE (deliver to target), 2 CANCEL (a cancel command), 3 DEAD (to DLQ),
                        4 RECURRING (a recurring schedule's next firing: store/firings.py)
    9   u8   version    record format version (1)
    10  u16  flags      bit 0: key is null; bit 1: value is null
    12  u32  body_len   bytes covered by the CRC, from offset 8 (the tail beyond it is zero padding)
    16  i64  due_ms     committed due time, epoch ms (already rounded up by the scheduler)
    24  i64  enqueue_ms ingress record timestamp, epoch ms
    32  i64  src_offset ingress offset
    40  i32  src_partition
    44  i32  target_partition (-1: producer's partitioner)
    48  u16  retry_count
    50  u16  level      1-based delay level (0: none)
    52  u16  id_len
    54  u16  topic_len  target topic (the DLQ topic for DEAD records)
    56  u32  key_len
    60  u32  value_len
    64  u32  headers_len
    68  u32  reserved (0)
    72  id | topic | key | value | headers
    headers: u16 count, then per header: u16 name_len, name, i32 value_len (-1: null), value

``length`` comes first so a reader can skip a record without decoding it; the CRC covers the type
and every field, and the padding must be zero, so any single corrupted byte inside a record is
detected (a corrupted length is
caught by the CRC too, because it moves ``body_len`` or the bytes the CRC is checked against, and
by the alignment and bounds checks). A zero ``length`` marks the unused, preallocated tail of a
segment.

Decoding copies the byte fields out of the mapped file (``bytes``): a record outlives its mapping
safely, and the delivery path hands them to the producer as they are.

Every function here is the reference for its C twin in ``sidecar._native`` (the same bytes, the
same answers and errors, property-tested in tests/unit/test_native.py). Where the extension is
built (scripts/setup.sh builds it; ``KDS_PURE_PYTHON=1`` turns it off) the module's public names
are rebound to the C functions at import, at the end of this file; ``py_*`` keep the Python ones.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from crc32c import crc32c as _crc

from sidecar import contract as c
from sidecar.store import native_args as _args
from sidecar.store import native_layouts as _layouts
from sidecar.store.native_args import RecordHead

MESSAGE = _layouts.REC_MESSAGE
CANCEL = _layouts.REC_CANCEL
DEAD = _layouts.REC_DEAD
RECURRING = _layouts.REC_RECURRING  # a MESSAGE that fires again: sidecar/store/firings.py
TYPES = (MESSAGE, CANCEL, DEAD, RECURRING)
# the head's format and sizes are shared with the C codec: declared in native_layouts.py
FLAG_KEY_NULL = _layouts.FLAG_KEY_NULL
FLAG_VALUE_NULL = _layouts.FLAG_VALUE_NULL
ALIGN = _layouts.RECORD_ALIGN
HEAD = _layouts.RECORD_HEAD
VERSION = _layouts.RECORD_VERSION
HEAD_SIZE = HEAD.size  # 72
assert HEAD_SIZE == 72
_HEAD_BODY = struct.Struct("<" + HEAD.format.removeprefix("<II"))  # HEAD without length and crc
assert _HEAD_BODY.size == HEAD_SIZE - 8
_LEN_CRC = struct.Struct("<II")
_U16 = struct.Struct("<H")
_HDR_VALUE_LEN = struct.Struct("<i")
_ZERO_PAD = bytes(ALIGN)
MAX_RECORD = 1 << 31


class CorruptRecord(ValueError):
    """The bytes at a position are not a whole, valid record."""


def crc32c(data: bytes | bytearray | memoryview) -> int:
    return int(_crc(data))


def encode_headers(headers: Sequence[tuple[str, bytes | None]], /) -> bytes:
    parts = [_U16.pack(len(headers))]
    for name, value in headers:
        nb = name.encode()
        parts.append(_U16.pack(len(nb)))
        parts.append(nb)
        if value is None:
            parts.append(_HDR_VALUE_LEN.pack(-1))
        else:
            parts.append(_HDR_VALUE_LEN.pack(len(value)))
            parts.append(value)
    return b"".join(parts)


def decode_headers(blob: memoryview | bytes, /) -> list[tuple[str, bytes | None]]:
    b = bytes(blob)  # one copy, then cheap bytes slices (memoryview slices of the map cost more)
    if not b:
        return []
    if len(b) < 2:
        raise CorruptRecord("header blob is truncated")
    count = b[0] | b[1] << 8
    pos = 2
    out: list[tuple[str, bytes | None]] = []
    n = len(b)
    for _ in range(count):
        if pos + 2 > n:
            raise CorruptRecord("header blob is truncated")
        nlen = b[pos] | b[pos + 1] << 8
        pos += 2
        if pos + nlen + 4 > n:
            raise CorruptRecord("header blob is truncated")
        name = b[pos : pos + nlen].decode()
        pos += nlen
        (vlen,) = _HDR_VALUE_LEN.unpack_from(b, pos)
        pos += 4
        if vlen < 0:
            out.append((name, None))
        else:
            if pos + vlen > n:
                raise CorruptRecord("header blob is truncated")
            out.append((name, b[pos : pos + vlen]))
            pos += vlen
    return out


def delivery_headers(rec: Record, source_topic: bytes, /) -> list[tuple[str, bytes | None]]:
    """The headers a delivered record carries (docs/design.md 1, outgoing): the stored ones, then for
    a MESSAGE ``delay.id``, ``delay.deliver-at``, ``delay.enqueued-at``, ``delay.source``
    (``<topic>:<partition>:<offset>``) and ``delay.retry-count`` when above zero."""
    headers = decode_headers(rec.headers)
    if rec.rtype == MESSAGE:
        headers += (
            (c.ID, bytes(rec.id)),
            (c.DELIVER_AT, b"%d" % rec.due_ms),
            (c.ENQUEUED_AT, b"%d" % rec.enqueue_ms),
            (c.SOURCE, b"%s:%d:%d" % (source_topic, rec.src_partition, rec.src_offset)),
        )
        if rec.retry_count:
            headers.append((c.RETRY_COUNT, b"%d" % rec.retry_count))
    return headers


def encoded_size(id_len: int, topic_len: int, key_len: int, value_len: int, headers_len: int) -> int:
    body_end = HEAD_SIZE + id_len + topic_len + key_len + value_len + headers_len
    return (body_end + ALIGN - 1) & ~(ALIGN - 1)


def head(
    *, rtype: int, due_ms: int, enqueue_ms: int, src_offset: int, src_partition: int, target_partition: int,
    retry_count: int, level: int,
) -> RecordHead:
    """A record's integer fields, named (``encode`` and ``append`` take them in one object, so two
    of them cannot be swapped): the extension's ``RecordHead`` where it is built, else the class.
    Rebound to the type itself at the end of this module (one C call, no Python frame)."""
    return _args.RecordHead(
        rtype=rtype, due_ms=due_ms, enqueue_ms=enqueue_ms, src_offset=src_offset, src_partition=src_partition,
        target_partition=target_partition, retry_count=retry_count, level=level,
    )


def head_of(rec: Record) -> RecordHead:
    """A decoded record's head again: what re-encoding it (the codec is deterministic) takes."""
    return head(
        rtype=rec.rtype, due_ms=rec.due_ms, enqueue_ms=rec.enqueue_ms, src_offset=rec.src_offset,
        src_partition=rec.src_partition, target_partition=rec.target_partition, retry_count=rec.retry_count,
        level=rec.level,
    )


def encode_into(
    buf: memoryview | bytearray, offset: int, h: RecordHead, rid: bytes, topic: bytes, key: bytes | None,
    value: bytes | None, headers_blob: bytes,
) -> int:
    """Write one record at ``buf[offset:]``; return its length. The caller has checked the room
    with ``encoded_size``."""
    data = encode(h, rid, topic, key, value, headers_blob)
    buf[offset : offset + len(data)] = data
    return len(data)


def encode(
    h: RecordHead, rid: bytes, topic: bytes, key: bytes | None, value: bytes | None, headers_blob: bytes, /
) -> bytes:
    """One record as ``bytes`` (one join and one CRC pass): the intake writes it into the segment
    with a single copy; ``encode_into`` writes it at an offset."""
    if not isinstance(h, _HEADS):
        raise TypeError("the record's head must be a RecordHead (sidecar.store.codec.head)")
    flags = (FLAG_KEY_NULL if key is None else 0) | (FLAG_VALUE_NULL if value is None else 0)
    k = b"" if key is None else key
    v = b"" if value is None else value
    body_len = HEAD_SIZE - 8 + len(rid) + len(topic) + len(k) + len(v) + len(headers_blob)
    length = (8 + body_len + ALIGN - 1) & ~(ALIGN - 1)
    head_body = _HEAD_BODY.pack(
        h.rtype, VERSION, flags, body_len, h.due_ms, h.enqueue_ms, h.src_offset, h.src_partition,
        h.target_partition, h.retry_count, h.level, len(rid), len(topic), len(k), len(v), len(headers_blob), 0,
    )
    body = b"".join((head_body, rid, topic, k, v, headers_blob, _ZERO_PAD[: length - 8 - body_len]))
    crc = _crc(memoryview(body)[:body_len])
    return _LEN_CRC.pack(length, crc) + body


@dataclass(slots=True)
class Record:
    """A decoded record (its byte fields are copies: ``bytes``). The C twin is
    ``sidecar._native.Record``: the same fields, read-only."""

    length: int
    rtype: int
    due_ms: int
    enqueue_ms: int
    src_offset: int
    src_partition: int
    target_partition: int
    retry_count: int
    level: int
    id: bytes
    topic: bytes
    key: bytes | None
    value: bytes | None
    headers: bytes


def peek_length(buf: memoryview | bytes, offset: int) -> int:
    (length,) = struct.unpack_from("<I", buf, offset)
    return int(length)


_CHECK = struct.Struct("<IIBBHIq")  # length, crc, type, version, flags, body_len, due_ms
_LEVEL_AT = 50


def check(buf: memoryview, offset: int) -> tuple[int, int, int]:
    """Verify the record at ``offset`` (bounds, type, CRC, zero padding) without decoding its
    fields; return ``(rtype, due_ms, level)``. Recovery's validation of pending scheduler entries
    uses it: the same guarantees as ``decode(verify=True)`` at a fraction of the cost."""
    end = len(buf)
    if offset + HEAD_SIZE > end:
        raise CorruptRecord(f"no room for a record header at {offset}")
    length, crc, rtype, version, _flags, body_len, due_ms = _CHECK.unpack_from(buf, offset)
    if (
        length == 0
        or length % ALIGN
        or length < HEAD_SIZE
        or offset + length > end
        or body_len + 8 > length
        or body_len + 8 + ALIGN <= length
        or version != VERSION
        or rtype not in TYPES
    ):
        raise CorruptRecord(f"not a record at {offset}")
    if int(_crc(buf[offset + 8 : offset + 8 + body_len])) != crc:
        raise CorruptRecord(f"CRC mismatch at {offset}")
    pad = buf[offset + 8 + body_len : offset + length]
    if len(pad) and pad != _ZERO_PAD[: len(pad)]:
        raise CorruptRecord(f"non-zero padding at {offset}")
    (level,) = _U16.unpack_from(buf, offset + _LEVEL_AT)
    return rtype, due_ms, level


def decode(buf: memoryview, offset: int, limit: int | None = None, verify: bool = True) -> Record:
    """Decode the record at ``offset``; ``limit`` bounds it (end of the written area). Raises
    ``CorruptRecord`` for a torn, zero or damaged record."""
    end_of_buf = len(buf) if limit is None else limit
    if offset + HEAD_SIZE > end_of_buf:
        raise CorruptRecord(f"no room for a record header at {offset}")
    (
        length, crc, rtype, version, flags, body_len, due_ms, enqueue_ms, src_offset, src_partition,
        target_partition, retry_count, level, id_len, topic_len, key_len, value_len, headers_len, _r,
    ) = HEAD.unpack_from(buf, offset)
    if length == 0:
        raise CorruptRecord(f"end of data at {offset}")
    if (
        length % ALIGN
        or length < HEAD_SIZE
        or offset + length > end_of_buf
        or body_len + 8 > length
        or body_len + 8 + ALIGN <= length
    ):
        raise CorruptRecord(f"bad record length {length} at {offset}")
    if version != VERSION or rtype not in TYPES:
        raise CorruptRecord(f"bad record type/version {rtype}/{version} at {offset}")
    if HEAD_SIZE - 8 + id_len + topic_len + key_len + value_len + headers_len != body_len:
        raise CorruptRecord(f"record fields do not add up at {offset}")
    if verify:
        if int(_crc(buf[offset + 8 : offset + 8 + body_len])) != crc:
            raise CorruptRecord(f"CRC mismatch at {offset}")
        pad = buf[offset + 8 + body_len : offset + length]
        if len(pad) and pad != _ZERO_PAD[: len(pad)]:
            raise CorruptRecord(f"non-zero padding at {offset}")
    pos = offset + HEAD_SIZE
    rid = bytes(buf[pos : pos + id_len])
    pos += id_len
    topic = bytes(buf[pos : pos + topic_len])
    pos += topic_len
    key = None if flags & FLAG_KEY_NULL else bytes(buf[pos : pos + key_len])
    pos += key_len
    value = None if flags & FLAG_VALUE_NULL else bytes(buf[pos : pos + value_len])
    pos += value_len
    headers = bytes(buf[pos : pos + headers_len])
    return Record(
        length, rtype, due_ms, enqueue_ms, src_offset, src_partition, target_partition, retry_count,
        level, rid, topic, key, value, headers,
    )


def append(
    buf: memoryview | bytearray, offset: int, limit: int, h: RecordHead, rid: bytes, topic: bytes,
    key: bytes | None, value: bytes | None, headers_blob: bytes, /,
) -> int:
    """Write one record at ``buf[offset:]`` if it ends at or before ``limit`` and return its
    length; else write nothing and return minus its length (the caller rolls to a new segment)."""
    data = encode(h, rid, topic, key, value, headers_blob)
    if offset + len(data) > limit:
        return -len(data)
    buf[offset : offset + len(data)] = data
    return len(data)


# -- the C twins (see the module docstring) ----------------------------------------------------
py_encode, py_decode, py_append = encode, decode, append
py_encode_headers, py_decode_headers, py_delivery_headers = encode_headers, decode_headers, delivery_headers
PyRecord = Record


# ``native`` is the extension, typed by its stub (sidecar/_native.pyi) so that mypy checks every
# call against it; ``NATIVE`` says whether it is loaded. Callers test ``NATIVE``, not ``native is
# None``: mypy cannot write "the module or None" (a union of a module with None loses the module's
# names), and with the module's type a None test would mark the Python branch unreachable and
# leave it unchecked.
try:
    if os.environ.get("KDS_PURE_PYTHON"):
        raise ImportError("KDS_PURE_PYTHON is set")
    from sidecar import _native

    native = _native
except ImportError:
    native = None  # type: ignore[assignment]  # see above: only read behind NATIVE
NATIVE = native is not None
if NATIVE:
    native.setup(CorruptRecord, c.ID, c.DELIVER_AT, c.ENQUEUED_AT, c.SOURCE, c.RETRY_COUNT)
# the head object encode and append take: the C type where the extension runs (its C twins accept
# only that), else the class; the Python twins accept either
_HEADS: tuple[type, ...] = (_args.RecordHead,) if native is None else (_args.RecordHead, native.RecordHead)
if NATIVE:
    Record = native.Record  # type: ignore[misc]
    head = native.RecordHead  # the same keywords (mypy checks them against the function above)
    encode, decode, append = native.encode, native.decode, native.append
    encode_headers, decode_headers, delivery_headers = (
        native.encode_headers, native.decode_headers, native.delivery_headers,
    )
