"""Mirroring: how a store reports its changes to the world beyond its own disk.

A store has two optional sinks, set by the engine after ``open`` (``None``: off):

- ``store.mirror``, the changelog (``Mirror``; ``engine/changelog.py``): a put of the commit-log
  bytes of the record now pending under an id (or of the pre-cancel now remembered), a removal
  once nothing is pending under it. Another sidecar restores a store from it (``restore.py``).
- ``store.history``, the history topic (``History``; ``engine/history.py``): one event per state
  change of a schedule (accepted, replaced, cancelled, delivered, dead-lettered).

The intake, the outcomes and the restore call the sinks at the point where each change happens,
so that the order of a store's changes is the order of its reports. This module declares the two
interfaces and the event names, and reports what the C intake stored: ``_native.ingest_run``
calls no Python, so after a run ``report_run`` walks the records it appended (back to back in one
segment) and reports each one as the reference path would have (``Intake.schedule``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from sidecar.store import codec
from sidecar.store.codec import Record
from sidecar.store.mapped import HEADER_SIZE

if TYPE_CHECKING:
    from sidecar.store.partition import PartitionStore

_LEN = struct.Struct("<I")  # a record's length (codec layout)
_ID_LEN = struct.Struct("<H")  # its id length, at _ID_LEN_AT
_DUE = struct.Struct("<q")  # its due time (epoch ms), at _DUE_AT
_ID_LEN_AT = 52
_DUE_AT = 16


class Mirror(Protocol):
    """Where a store's changes go besides its own disk: the changelog (``engine/changelog.py``).
    ``put``: the record now pending (or the pre-cancel now remembered) under ``rid``, as its
    commit-log bytes; ``remove``: nothing is pending under ``rid`` any more. ``produced`` and
    ``acked`` count the writes made and acknowledged (durability waits for the latter)."""

    produced: int
    acked: int

    on_settle: bool  # settle() writes the tombstones (False: the publisher does, exactly-once)
    holds_due: bool  # put() uses ``due_now`` (held back: engine/changelog.py); False: the intake need not work it out
    # batch writes (None: one put / remove per record): put_run(buf, off, count, now_ms, fresh)
    # takes the puts of a run of records back to back in buf from off as put would (``fresh`` as
    # put's), stopping before one it leaves to put, and returns (taken, the next one's offset);
    # remove_run(acked) writes the tombstones of a settled batch of (ref, Record) pairs
    put_run: Callable[[Any, int, int, int, bool], tuple[int, int]] | None
    remove_run: Callable[[list[tuple[int, Record]]], None] | None

    def put(self, rid: bytes, raw: bytes, due_now: bool = False, fresh: bool = False) -> None: ...
    def remove(self, rid: bytes) -> None: ...
    def remove_produced(self, batch: list[tuple[int, Record]], start: int, end: int, superseded: set[int]) -> None:
        """Exactly-once: the tombstones of ``batch[start:end]`` (just produced), but of ``superseded`` refs."""


class History(Protocol):
    """Where a store reports each state change of a schedule: the history topic
    (``engine/history.py``; event names there). One call per change, never raising."""

    def event(
        self, event: str, rid: bytes, *, enqueued_ms: int | None, due_ms: int | None, target: bytes | str | None,
        target_partition: int = -1, level: int = 0, source: str | None = None, reason: str | None = None,
        error: str | None = None, key: bytes | None = None, value: bytes | None = None, at_ms: int | None = None,
    ) -> None: ...


# history event names (engine/history.py documents the format)
HISTORY_ACCEPTED, HISTORY_REPLACED, HISTORY_CANCELLED, HISTORY_DELIVERED, HISTORY_DEAD_LETTERED = (
    "accepted", "replaced", "cancelled", "delivered", "dead-lettered")


def raw_of(rec: Record) -> bytes:
    """A decoded record's commit-log bytes again (the codec is deterministic): what a changelog put
    of a record the store already holds carries."""
    return codec.encode(codec.head_of(rec), rec.id, rec.topic, rec.key, rec.value, rec.headers)


def history_record(
    store: PartitionStore, event: str, rec: Record, at_ms: int | None = None, reason: str | None = None,
    error: str | None = None,
) -> None:
    """One history event about a stored record (the history topic, engine/history.py)."""
    assert store.history is not None
    store.history.event(
        event, bytes(rec.id), enqueued_ms=rec.enqueue_ms, due_ms=rec.due_ms, target=bytes(rec.topic),
        target_partition=rec.target_partition, level=rec.level,
        source=f"{store.topic}:{rec.src_partition}:{rec.src_offset}", reason=reason, error=error,
        key=None if rec.key is None else bytes(rec.key), value=None if rec.value is None else bytes(rec.value),
        at_ms=at_ms,
    )


def report_run(store: PartitionStore, pos: int, count: int, now_ms: int, fresh: bool = True) -> None:
    """Report the ``count`` records the C intake appended from log position ``pos`` on to the
    sinks that are set: a changelog put of each, an ``accepted`` event of each. ``fresh``: each is
    its id's only version (the intake's: it takes only ids with nothing pending); a re-armed
    firing is not (its earlier firings' puts may be in the changelog, and need its tombstone)."""
    if store.mirror is not None:
        _mirror_run(store, pos, count, now_ms, fresh)
    if store.history is not None:
        _history_run(store, pos, count, now_ms)


def _run_start(store: PartitionStore, pos: int) -> tuple[memoryview, int]:
    """The segment buffer and offset of a run's first record (a run that starts a segment starts
    after its header)."""
    sb = store.log.segment_bytes
    if pos % sb < HEADER_SIZE:
        pos = pos - pos % sb + HEADER_SIZE
    return store.log.segments[pos // sb].buf, pos % sb


def _mirror_run(store: PartitionStore, pos: int, count: int, now_ms: int, fresh: bool) -> None:
    """Mirror the run (one segment, back to back: the C intake stops at a segment's end);
    ``due_now`` for those already due at ``now_ms`` (the mirror may hold their puts back:
    ``StoreMirror.held``)."""
    buf, off = _run_start(store, pos)
    mirror = store.mirror
    assert mirror is not None
    put, holds, put_run = mirror.put, mirror.holds_due, mirror.put_run
    while count:
        if put_run is not None:
            done, off = put_run(buf, off, count, now_ms, fresh)  # all of them, or up to one it leaves to put
            count -= done
            if not count:
                return
        length, id_len = _LEN.unpack_from(buf, off)[0], _ID_LEN.unpack_from(buf, off + _ID_LEN_AT)[0]
        rid, raw = bytes(buf[off + codec.HEAD_SIZE : off + codec.HEAD_SIZE + id_len]), bytes(buf[off : off + length])
        if holds and _DUE.unpack_from(buf, off + _DUE_AT)[0] <= now_ms:
            put(rid, raw, True, fresh=fresh)
        else:
            put(rid, raw)
        off += length
        count -= 1


def _history_run(store: PartitionStore, pos: int, count: int, now_ms: int) -> None:
    """``accepted`` for each record of the run (walked as ``_mirror_run`` walks it)."""
    buf, off = _run_start(store, pos)
    for _ in range(count):
        rec = codec.decode(buf, off, verify=False)
        history_record(store, HISTORY_ACCEPTED, rec, now_ms)
        off += _LEN.unpack_from(buf, off)[0]
