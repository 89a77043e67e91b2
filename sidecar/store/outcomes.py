"""Outcomes: how a stored record stops being pending once it is handed out for publishing.

The publisher (``engine/publishing.py``) takes due records from the scheduler and tells the store
what became of each:

- delivered: the delivery callbacks append ``(ref, record)`` to ``store.acked`` and ``settle``
  finishes the batch after each producer poll: one scheduler call, so the done cursor moves once
  per batch instead of once per delivery report; the id index entries go, the changelog gets the
  tombstones (unless the publisher writes them in its transaction, exactly-once), the history a
  ``delivered`` event, the memory of recent outcomes the batch (``recent.py``);
- publishing failed for good: ``dead_letter`` appends a DLQ copy (``append_dead``: a DEAD record
  due now, as durable and as retried as any delivery; the intake's rejects use it too) and
  finishes the original;
- superseded: a record a replace took the place of while it was handed out finishes without
  being published (``drop_superseded``) or without touching the changelog (``settle``): the id's
  newer version is pending under the same key.

A recurring schedule's firing (a RECURRING record) is finished here like any delivery, and its
next firing armed in its place under the same id, written to the changelog instead of the id's
tombstone (``Firings.settle``, store/firings.py); a firing dead-lettered goes to the DLQ as a
one-shot record under an id of its own (``<id>#fire-<nominal time>``) and the schedule goes on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar import contract as c
from sidecar.store import codec
from sidecar.store.codec import Record, decode_headers, encode_headers
from sidecar.store.firings import record_history
from sidecar.store.idindex import id_hash
from sidecar.store.mirroring import HISTORY_DEAD_LETTERED, history_record
from sidecar.store.recent import DEAD_LETTERED

if TYPE_CHECKING:
    from sidecar.store.partition import PartitionStore

HeaderList = list[tuple[str, bytes | None]]


def dlq_headers(
    original: HeaderList, reason: str, error: str, topic: str, partition: int, offset: int, attempts: int
) -> HeaderList:
    """A dead letter's headers: the record's own, then the DLQ headers (contract.py)."""
    return [
        *original,
        (c.DLQ_REASON, reason.encode()),
        (c.DLQ_ERROR, error.encode("utf-8", "replace")),
        (c.DLQ_SOURCE_TOPIC, topic.encode()),
        (c.DLQ_SOURCE_PARTITION, str(partition).encode()),
        (c.DLQ_SOURCE_OFFSET, str(offset).encode()),
        (c.DLQ_ATTEMPTS, str(attempts).encode()),
    ]


class Outcomes:
    """A store's outcomes (the module docstring). ``acked`` and ``superseded`` are the store's
    (the publisher reads and writes them); of its own it keeps the time of the last settle."""

    __slots__ = ("_settle_ms", "store")

    def __init__(self, store: PartitionStore) -> None:
        self.store = store
        self._settle_ms = 0  # the time of the last settle() given one (a checkpoint's settle has none)

    def append_dead(
        self, rid: bytes, key: bytes | None, value: bytes | None, headers: HeaderList,
        enqueue_ms: int, src_offset: int, now_ms: int,
    ) -> int:
        """Append and schedule a DEAD record under ``rid``, due now, addressed to the DLQ; its ref."""
        store = self.store
        level, due = store.sched.plan("now", 0, now_ms, now_ms) or (0, now_ms)
        pos = store.log.append(
            codec.head(
                rtype=codec.DEAD, due_ms=due, enqueue_ms=enqueue_ms, src_offset=src_offset,
                src_partition=store.partition, target_partition=-1, retry_count=0, level=level,
            ),
            rid, store.rules.dlq_topic.encode(), key, value, encode_headers(headers),
        )
        ref = store.sched.add(due, level, pos)
        if store.mirror is not None:
            # a dead letter of a failed publish replaces the original
            store.mirror.put(rid, store.log.raw(pos), due <= now_ms)
        return ref

    def drop_superseded(self, ref: int, rec: Record) -> bool:
        """Finish, without publishing, a handed-out record that a replace superseded while its
        publishing failed and waited for a retry (True); False: ``ref`` was not superseded. The
        changelog is left alone: the id's newer version is pending under the same key."""
        store = self.store
        if ref not in store.superseded:
            return False
        store.superseded.discard(ref)
        store.firings.forget(ref)
        store.sched.ack(ref)
        store.ids.remove(id_hash(rec.id), ref)
        store.dirty = True
        return True

    def delivered(self, ref: int, rid_hash: int) -> None:
        """Finish one handed-out record at once (not through ``acked``)."""
        store = self.store
        store.sched.ack(ref)
        store.ids.remove(rid_hash, ref)
        store.dirty = True

    def settle(self, now_ms: int = -1) -> None:
        """Finish every record in ``acked`` (delivered) at ``now_ms`` (-1: the time of the
        previous call): one scheduler call for the batch, so the done cursor moves once per batch
        instead of once per delivery report."""
        store = self.store
        acked, store.acked = store.acked, []
        if now_ms >= 0:
            self._settle_ms = now_ms
        store.recent.note_settled(acked, self._settle_ms, codec.DEAD)
        # recurring schedules' firings: the next one armed in the delivered one's place (firings.py)
        rearmed = self._rearm(acked) if store.firings.handed else None
        mirror = store.mirror
        if mirror is not None:
            superseded = store.superseded
            tombstones = mirror.on_settle  # False: written when produced, in its transaction (exactly-once)
            if tombstones and not superseded and not rearmed and mirror.remove_run is not None:
                mirror.remove_run(acked)  # the common batch: a tombstone each, in C
            elif tombstones or superseded:
                for ref, rec in acked:
                    if superseded and ref in superseded:
                        superseded.discard(ref)  # replaced while being delivered: its id's newest version is pending
                        continue
                    if tombstones and not (rearmed and ref in rearmed):
                        mirror.remove(rec.id)
        if store.history is not None:
            record_history(store, acked)  # a DEAD record reaching the DLQ was reported when it died
        store.ids.remove_delivered(acked)
        store.sched.ack_many([ref for ref, _rec in acked])
        store.counters.delivered += len(acked)
        store.settled += len(acked)
        store.dirty = True

    def settle_direct(self, delivered: list[bytes], now_ms: int) -> None:
        """The ids of records published from the intake and delivered since the last call
        (engine/direct.py, its port's list, emptied in place): counted and remembered."""
        ids = delivered[:]
        del delivered[:]
        store = self.store
        store.recent.note_delivered(ids, now_ms)
        store.counters.delivered += len(ids)
        store.settled += len(ids)
        store.dirty = True  # the next checkpoint's commit may pass their offsets

    def _rearm(self, acked: list[tuple[int, Record]]) -> set[int]:
        """Arm the next firing of each recurring schedule in ``acked``; the refs that armed one."""
        return self.store.firings.settle_many(acked, self._settle_ms)

    def dead_letter(self, ref: int, rec: Record, reason: str, error: str, attempts: int, now_ms: int) -> None:
        """Publishing failed for good: append a DLQ copy (durable, retried like any record), then
        finish the original. The copy carries the control headers of an ingress record meaning
        the same schedule (target, partition, id, and the committed due time as
        ``delay.deliver-at`` or the consumer retry's ``delay.retry-count``) plus
        ``delay.enqueued-at``, so ``dlq redrive`` can restore it (sidecar/dlq.py)."""
        store = self.store
        recurring = rec.rtype == codec.RECURRING
        if recurring:  # one firing: dead-lettered as a one-shot record, and the schedule goes on
            base, due_ms = store.firings.dead_letter_headers(ref, rec)
        else:
            base, due_ms = decode_headers(rec.headers), rec.due_ms
        headers: HeaderList = [*base, (c.ID, rec.id), (c.TARGET_TOPIC, rec.topic)]
        if rec.target_partition >= 0:
            headers.append((c.TARGET_PARTITION, b"%d" % rec.target_partition))
        if rec.retry_count:
            headers.append((c.RETRY_COUNT, b"%d" % rec.retry_count))
        else:
            headers.append((c.DELIVER_AT, b"%d" % due_ms))
        headers.append((c.ENQUEUED_AT, b"%d" % rec.enqueue_ms))
        headers = dlq_headers(headers, reason, error, store.topic, rec.src_partition, rec.src_offset, attempts)
        rid = rec.id
        if recurring:
            # under its own id: the schedule's next firing is pending under the schedule's
            dead_id = b"%s#fire-%d" % (rid, due_ms)
            self.append_dead(dead_id, rec.key, rec.value, headers, rec.enqueue_ms, rec.src_offset, now_ms)
        elif ref in store.superseded:
            # replaced while it was being delivered: its dead letter must not take the place of its
            # successor (the id's pending version), so it goes under its source's default id
            store.superseded.discard(ref)
            dead_id = store.intake.default_id(store.topic, rec.src_offset)
            self.append_dead(dead_id, rec.key, rec.value, headers, rec.enqueue_ms, rec.src_offset, now_ms)
        else:
            self.append_dead(rid, rec.key, rec.value, headers, rec.enqueue_ms, rec.src_offset, now_ms)
            store.recent.note(rid, DEAD_LETTERED, now_ms)
        store.counters.dlq[reason] = store.counters.dlq.get(reason, 0) + 1
        if store.history is not None:
            history_record(store, HISTORY_DEAD_LETTERED, rec, now_ms, reason, error)
        self.delivered(ref, id_hash(rid))
        if recurring:
            superseded = ref in store.superseded
            if not store.firings.settle(ref, rec, now_ms) and not superseded and store.mirror is not None:
                store.mirror.remove(rid)  # its last firing: the schedule is over
            store.superseded.discard(ref)
