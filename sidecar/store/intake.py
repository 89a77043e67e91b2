"""Intake: what a store makes of each consumed ingress record.

Intake is synchronous: a consumed record is validated, appended to the commit log and scheduled
before the next one is looked at, so "all consumed records up to offset N are in the store" holds
after every batch, and the checkpoint can name ``N + 1`` as the ingress offset to resume from.
What a record becomes:

- a valid request -> MESSAGE record, scheduled at the scheduler's committed due time
  (``schedule``);
- a cancel command -> CANCEL record (the write-ahead record of the cancel) + the O(1) marker;
  a cancel whose message has not arrived yet is remembered as a *pre-cancel* for the cancel
  horizon (``apply_cancel``);
- bad input -> DEAD record addressed to the DLQ (with the DLQ headers), scheduled due now, so a
  dead letter is as durable and as retried as any delivery (``reject``; the record itself is
  ``Outcomes.append_dead``'s);
- a second pending record with the same ``delay.id`` -> dropped and counted, unless it is a
  replace (``delay.replace: true``, or any kafka-message-scheduler record, whose key is its id)
  from a higher ingress offset: then it is appended and scheduled, and the pending entry is
  cancelled (``schedule``); the same for a version published from the intake and not reported yet
  (``lookup.flight_check``), which its replace marks ``superseded`` instead;
- a kafka-message-scheduler (etf1) delete (a tombstone: null value, the id as key, no ``delay.*``
  header) -> CANCEL record + marker when something is pending under the id, else nothing
  (``_kms_delete``); the tombstone a scheduler writes after a delivery (it carries
  ``scheduler-key``) -> nothing. An etf1 record's id is its key (``_kms_id``).

A pre-cancel stays in the id index until its horizon expires, even after it cancelled its
message: the message is not in the log, so if the process dies before the next checkpoint the
message is consumed again and must be cancelled again.

The common request (a plain ``delay.ms``/``delay.deliver-at`` request, or the common recurring
record: ``delay.every`` with an id and an optional ``delay.start``, stored at its start as
store/firings.py ``arm`` stores it; with no id-index entry under its id's hash, fitting the
current segment and the scheduler's plain append) takes a C fast path: ``ingest_many`` stores a
run of such consumed messages in one ``_native.ingest_run`` call, which checks each record is that
case before writing anything for it and stops at the first that is not; the loop runs that one
through ``ingest_fields`` (the reference for everything) and calls again. Both leave the same
bytes and the same state (docs/storage.md 2.6).

A check that decides whether a consumed record is taken at all (a quota, a per-topic rule) belongs
here, before ``schedule``: on the reference path in ``ingest_fields``, and as a reason for the C
run to stop (``ingest_many``), so that the reference path decides each record it concerns. The
tenant's quota (``store/quota.py``, ``rules.quota``) is checked in ``schedule`` once the id's
look-up says the record adds a pending one (not a replace, duplicate or pre-cancelled one), and
caps the C run at the records the quota has room for.

A cancel whose look-up would read an id-table page that is not resident is not taken: the
partition waits for the page instead of the loop waiting for the disk (``_page_waited``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sidecar import contract as c
from sidecar.headers import Cancel, Rejection, Request, kms_delete, parse_ingress
from sidecar.store import codec
from sidecar.store.codec import NATIVE, encode_headers, native
from sidecar.store.idindex import id_hash
from sidecar.store.idslot import PRECANCEL
from sidecar.store.intake_layout import Common
from sidecar.store.lookup import Flight, flight_check, in_flight, pending_refs, request_check
from sidecar.store.mapped import HEADER_SIZE
from sidecar.store.mirroring import (
    HISTORY_ACCEPTED,
    HISTORY_CANCELLED,
    HISTORY_DEAD_LETTERED,
    HISTORY_REPLACED,
    history_record,
    raw_of,
    report_run,
)
from sidecar.store.outcomes import dlq_headers
from sidecar.store.recent import CANCELLED, DEAD_LETTERED

if TYPE_CHECKING:
    from sidecar.store.partition import PartitionStore

HeaderList = list[tuple[str, bytes | None]]
_fast = native.parse_request if NATIVE else None  # the common request, parsed in C (headers.py)
_NO_HEADERS = encode_headers(())
_run = native.ingest_run if NATIVE else None  # the intake fast path (ingest_many), in C
FAST_INTAKE = _run is not None

# what apply_cancel did
CANCEL_MATCHED, CANCEL_REMEMBERED, CANCEL_LATE = 1, 2, 3
# A CANCEL record's level field: what it did when it was appended, so that the log's replay does
# the same, whatever the scheduler files say about the entries it met (a pending record: cancel
# it, never remember a pre-cancel; none: remember one, and cancel what the replay re-added, a
# record delivered since the checkpoint). 0: written before the field was used (decide by what
# is pending at replay; ``Restore.replay``).
LEVEL_MATCHED, LEVEL_REMEMBERED = 1, 2


class Intake:
    """A store's intake (the module docstring). It holds no state of its own: everything it
    changes is the store's, so the recovery and the checkpoint see one set of fields."""

    __slots__ = ("store",)

    def __init__(self, store: PartitionStore) -> None:
        self.store = store

    def ingest_fields(
        self, topic: str, offset: int, ts: int, key: bytes | None, value: bytes | None,
        headers: HeaderList | None, now_ms: int,
    ) -> None:
        """One consumed record (the loop's per-record call, ``PartitionStore.ingest_fields``). A
        cancel whose look-up would read an evicted id-table page is not taken: ``page_read`` is
        set and nothing else changes (the loop's "Page waits" consume it again once the page is
        read)."""
        store = self.store
        size = (0 if key is None else len(key)) + (0 if value is None else len(value))
        rules = store.rules
        if _fast is not None:
            req = _fast(headers, ts, now_ms, size, rules.max_record_bytes, rules.max_delay_ms, rules.checked_targets)
            if req is not None:
                store.counters.ingested += 1
                store.dirty = True
                if store.next_offset is None or offset >= store.next_offset:
                    store.next_offset = offset + 1
                target, target_partition, rid, due, mode, user = req
                self.schedule(
                    topic, offset, ts, key, value, headers, target, target_partition, rid, due, mode, 0, 0, None,
                    user, now_ms,
                )
                return
        delete = kms_delete(key, value, headers) if value is None else None  # an etf1 delete, or None
        parsed = delete if delete is not None else parse_ingress(headers, ts, now_ms, size, rules,
                                                                 headers_in_size=False)
        if isinstance(parsed, Cancel) and self._page_waited(parsed.id):
            return
        store.counters.ingested += 1
        store.dirty = True
        if store.next_offset is None or offset >= store.next_offset:  # (not back: resume.py's direct ones)
            store.next_offset = offset + 1
        if delete is not None and not isinstance(parsed, Rejection):
            if isinstance(parsed, Cancel):  # (an AfterDelivery tombstone deletes nothing)
                self._kms_delete(offset, parsed.id, now_ms)
            return
        if type(parsed) is Request:
            if parsed.mode == "recurring":
                store.firings.arm(topic, offset, ts, key, value, headers, parsed, now_ms)
                return
            rid = parsed.id
            if parsed.kms:
                rid = self._kms_id(topic, offset, ts, key, value, headers, parsed, now_ms)
                if rid is None:
                    return
                key = parsed.key_override  # etf1 delivers scheduler-target-key, none when absent
            self.schedule(
                topic, offset, ts, key, value, headers, parsed.target_topic, parsed.target_partition, rid,
                parsed.due_ms, parsed.mode, parsed.level, parsed.retry_count, None,
                parsed.user_headers, now_ms, parsed.replace,
            )
        elif isinstance(parsed, Cancel):
            self.cancel(offset, parsed.id, now_ms)
        else:
            assert isinstance(parsed, Rejection)
            self.reject(
                topic, offset, ts, key, value, headers, self.default_id(topic, offset), parsed.reason, parsed.error,
                now_ms,
            )

    def ingest_many(self, msgs: list[Any], start: int, now_ms: int, topic: str | None, direct: Any = None) -> int:
        """Store ``msgs[start:]`` (consumer Messages) while each is the common case, in one C call
        (``_native.ingest_run``): a message of this partition without error (``topic``: the
        messages' ingress topic; None: they mix several, and one of another topic than the store's
        stops the run too, the C intake comparing each message's), a request the fast
        parser accepts, no id-index entry under its id's hash, a plan, room in the current
        segment, the scheduler's plain append, room in the open id-index stage. Returns the index of the first
        message not stored: the caller runs it through the reference path (``ingest_fields``,
        which handles everything) and calls again. Every Python-visible field ends as
        ``ingest_fields`` would leave it, so the fast path changes nothing but the cost
        (docs/storage.md 2.6). Returns ``start`` when the fast path is off (no extension).

        ``direct`` (the store's ``DirectPort``, engine/direct.py; None: off): a request due on
        arrival is published by the C run instead of stored, an id in flight so stops the run
        (the reference path decides), and ``direct.taken`` counts them: the log and the scheduler
        take back only the stored ones."""
        store = self.store
        if _run is None or (topic is not None and topic != store.topic) or type(msgs) is not list:
            return start
        quota = store.rules.quota
        if quota is not None:  # each record the C run takes is one more pending: store/quota.py
            room = quota.headroom(store, now_ms)
            if room <= 0:
                return start
            if len(msgs) - start > room:
                msgs = msgs[:start + room]
        sched = store.sched.intake_begin()
        if sched is None:
            return start
        # the intake state (sidecar/store/intake_layout.py), with the scheduler's part filled in
        st, bufs = sched
        rules = store.rules
        st[Common.HEADER_SIZE] = HEADER_SIZE
        st[Common.NEXT_OFFSET] = -1
        st[Common.MAX_RECORD_BYTES] = rules.max_record_bytes
        st[Common.MAX_DELAY_MS] = rules.max_delay_ms
        seg = store.log.intake_state(st)
        skip = store.page_read_skip
        idx = store.ids.intake_state(st, len(msgs) - start, store.page_waits and not skip)
        first = store.log.head
        old, old2, jnl, tags = store.ids.intake_bufs()
        end: int = _run(msgs, start, native.IngestRun(
            seg_buf=seg, idx_buf=idx, st=st, sched_bufs=bufs, idx_old_buf=old, idx_old2_buf=old2, idx_jnl_buf=jnl,
            idx_tags_buf=tags, now=now_ms, partition=store.partition, id_prefix=store.id_prefix,
            checked_targets=rules.checked_targets, no_headers=_NO_HEADERS,
            topic=store.topic if topic is None else None, direct=direct,
        ))
        count = end - start
        if count:
            if skip:  # taken; none taken: it is left to the record the reference path takes (a cancel's)
                store.page_read_skip = False
            counters = store.counters
            counters.ingested += count
            counters.scheduled += count
            store.dirty = True
            nxt = st[Common.NEXT_OFFSET]
            if store.next_offset is None or nxt > store.next_offset:  # (not back: a checkpoint's direct one again)
                store.next_offset = nxt
            stored = count
            if direct is not None and direct.taken:
                stored -= direct.taken
                counters.published_direct += direct.taken
                direct.taken = 0
            store.ids.intake_restore(st)
            if stored:  # (a run that only published moved nothing of the log's or the scheduler's)
                store.log.intake_restore(st, stored)
                store.sched.intake_end(st, stored)
                if store.mirror is not None or store.history is not None:
                    report_run(store, first, stored, now_ms)
        if st[Common.IDX_WAIT] >= 0:
            store.page_read = store.ids.read_page(st[Common.IDX_WAIT])
        return end

    def _page_waited(self, rid: bytes) -> bool:
        """True, with ``page_read`` set, if the look-up under ``rid`` would read an evicted page of
        the id table (``IdIndex.evicted``): the loop then holds the partition instead of waiting
        for the disk. ``page_read_skip``: the last wait timed out, so this one reads it in place."""
        store = self.store
        if not store.page_waits:
            return False
        if store.page_read_skip:
            store.page_read_skip = False
            return False
        slot = store.ids.evicted(id_hash(rid))
        if slot < 0:
            return False
        store.page_read = store.ids.read_page(slot)
        return True

    def _kms_id(
        self, topic: str, offset: int, ts: int, key: bytes | None, value: bytes | None, headers: HeaderList | None,
        parsed: Request, now_ms: int,
    ) -> bytes | None:
        """The id of a kafka-message-scheduler record: its key (etf1 ``Schedule.ID()``), with
        etf1's delivered headers added to ``parsed.user_headers``; None: it was dead-lettered."""
        error = None
        if not key or len(key) > c.MAX_ID_BYTES:
            error = (f"kafka-message-scheduler mode: the record key is the schedule id and must be "
                     f"1..{c.MAX_ID_BYTES} bytes, not {len(key or b'')}")
        elif parsed.id is not None and parsed.id != key:
            error = f"kafka-message-scheduler mode: header {c.ID} differs from the record key (the schedule id)"
        if error is not None:
            self.reject(topic, offset, ts, key, value, headers, self.default_id(topic, offset), c.BAD_HEADER,
                        error, now_ms)
            return None
        parsed.user_headers = (
            *parsed.user_headers, (c.KMS_TIMESTAMP, b"%d" % (ts // 1000)), (c.KMS_KEY, key),
            (c.KMS_TOPIC, topic.encode()),
        )
        return key

    def _kms_delete(self, offset: int, rid: bytes, now_ms: int) -> None:
        """An etf1 delete: cancel what is pending under ``rid``. Unlike ``delay.cancel`` it leaves
        no pre-cancel (etf1 deletes only what exists, and the key reused later schedules anew); the
        CANCEL record is written only when something is cancelled, so its replay matches too."""
        store = self.store
        found = pending_refs(store, rid)
        if not found[1]:
            store.counters.cancel_unmatched += 1
            return
        pos = self.append_cancel(offset, rid, now_ms, True)
        cancelled = store.sched.record(found[1][0]) if store.history is not None else None
        if self.apply_cancel(rid, now_ms, found) == CANCEL_MATCHED:
            if store.mirror is not None:
                store.mirror.remove(rid)
            if cancelled is not None:
                history_record(store, HISTORY_CANCELLED, cancelled, now_ms)
        store.log.release(pos)

    def default_id(self, topic: str, offset: int) -> bytes:
        """The id of a record that names none: ``<topic>:<partition>:<offset>``."""
        store = self.store
        if topic == store.topic:
            return store.id_prefix + b"%d" % offset
        return b"%s:%d:%d" % (topic.encode(), store.partition, offset)

    def schedule(
        self, topic: str, offset: int, ts: int, key: bytes | None, value: bytes | None, headers: HeaderList | None,
        target: str, target_partition: int, req_id: bytes | None, req_due: int, mode: str, req_level: int,
        retry_count: int, key_override: bytes | None, user_headers: tuple[tuple[str, bytes | None], ...],
        now_ms: int, replace: bool = False, recurring_blob: bytes | None = None,
    ) -> None:
        """Store and schedule a request (the fields of ``headers.Request``). With ``replace``, the
        pending record under the id (an older version: a lower ingress offset) is cancelled once
        the new one is appended; the log's replay does the same (``Restore.replay``). With
        ``recurring_blob`` (its stored headers: store/firings.py) it is a recurring schedule's
        first firing, a RECURRING record."""
        store = self.store
        rid = req_id or self.default_id(topic, offset)
        h = id_hash(rid)
        flight = flight_check(store, rid, h, offset, replace)  # an id published from the intake
        if flight is Flight.DUPLICATE:
            store.counters.duplicates += 1  # as for a handed-out record: nothing changes
            return
        if flight is not None:
            flight.superseded = True  # replaced: its report leaves the changelog to this version
        old = request_check(store, rid, h, offset, replace, now_ms)
        if old is Flight.PRECANCELLED:
            store.counters.cancelled += 1  # kept until the horizon: see the module docstring
            store.recent.note(rid, CANCELLED, now_ms)
            if store.history is not None:
                store.history.event(
                    HISTORY_CANCELLED, rid, enqueued_ms=ts, due_ms=req_due, target=target,
                    target_partition=target_partition, source=f"{topic}:{store.partition}:{offset}",
                    key=key, value=value, at_ms=now_ms,
                )
            return
        if not isinstance(old, list):  # a duplicate: nothing changes
            store.counters.duplicates += 1
            if store.mirror is not None:
                # re-consumed after a crash: its changelog write may have been lost with the
                # process (the ingress offset was not committed), so it is written again
                store.mirror.put(rid, raw_of(old))
            return
        if not old and flight is None and store.rules.quota is not None:  # one more pending record: the quota
            refused = store.rules.quota.refusal(store, now_ms)
            if refused is not None:
                self.reject(topic, offset, ts, key, value, headers, self.default_id(topic, offset), c.QUOTA_EXCEEDED,
                            refused, now_ms)
                return
        planned = store.sched.plan(mode, req_level, req_due, ts)
        if planned is None:
            self.reject(
                topic, offset, ts, key, value, headers, self.default_id(topic, offset), c.DELAY_OUT_OF_RANGE,
                f"requested due time {req_due} is beyond what the {store.sched.name} scheduler holds", now_ms,
            )
            return
        level, due = planned
        if key_override is not None:
            key = key_override
        if recurring_blob is not None:
            rtype, blob = codec.RECURRING, recurring_blob
        else:
            rtype, blob = codec.MESSAGE, encode_headers(user_headers) if user_headers else _NO_HEADERS
        pos = store.log.append(
            codec.head(
                rtype=rtype, due_ms=due, enqueue_ms=ts, src_offset=offset, src_partition=store.partition,
                target_partition=target_partition, retry_count=retry_count, level=level,
            ),
            rid, target.encode(), key, value, blob,
        )
        new = store.sched.add(due, level, pos)
        for ref in old:
            if store.sched.cancel(ref):
                store.ids.remove(h, ref)
            else:  # already handed out (its due time had come): its settle must not tombstone rid
                store.superseded.add(ref)
        if old or flight is not None:
            store.counters.replaced += 1
        store.ids.put(h, new)
        store.counters.scheduled += 1
        if store.mirror is not None:
            store.mirror.put(rid, store.log.raw(pos), due <= now_ms)
        if store.history is not None:
            history_record(store, HISTORY_REPLACED if old else HISTORY_ACCEPTED, store.log.read(pos), now_ms)

    def store_unsent(self, m: Any, now_ms: int) -> None:
        """A record published from the intake whose delivery failed (engine/direct.py): stored now,
        as ``ingest_fields`` would have stored it when it was consumed, due as it was; the stored
        path publishes it again, with the retry ladder and the DLQ behind it."""
        store = self.store
        key, value, headers = m.key(), m.value(), m.headers()
        ts_type, ts = m.timestamp()
        ts = ts if ts_type else now_ms
        size = (0 if key is None else len(key)) + (0 if value is None else len(value))
        parsed = parse_ingress(headers, ts, now_ms, size, store.rules, headers_in_size=False)
        if type(parsed) is not Request:  # it was a plain request when consumed: not expected
            raise RuntimeError(f"a record published from the intake no longer parses as one: {parsed!r}")
        self.schedule(
            m.topic(), m.offset(), ts, key, value, headers, parsed.target_topic, parsed.target_partition,
            parsed.id, parsed.due_ms, parsed.mode, parsed.level, parsed.retry_count, None, parsed.user_headers,
            now_ms,
        )

    def reject(
        self, topic: str, offset: int, ts: int, key: bytes | None, value: bytes | None, headers: HeaderList | None,
        rid: bytes, reason: str, error: str, now_ms: int,
    ) -> None:
        """Bad input: its dead letter under ``rid``, addressed to the DLQ with ``reason``."""
        store = self.store
        h = id_hash(rid)
        for ref in store.ids.find(h):  # a re-consumed bad record after a crash
            rec = store.sched.record(ref)
            if rec is not None and rec.id == rid:
                if store.mirror is not None:
                    store.mirror.put(rid, raw_of(rec))
                return
        out = dlq_headers(list(headers or ()), reason, error, topic, store.partition, offset, 0)
        ref = store.outcomes.append_dead(rid, key, value, out, ts, offset, now_ms)
        store.recent.note(rid, DEAD_LETTERED, now_ms)
        store.ids.put(h, ref)
        store.counters.dlq[reason] = store.counters.dlq.get(reason, 0) + 1
        if store.history is not None:
            store.history.event(
                HISTORY_DEAD_LETTERED, rid, enqueued_ms=ts, due_ms=None, target=None,
                source=f"{topic}:{store.partition}:{offset}", reason=reason, error=error, key=key, value=value,
                at_ms=now_ms,
            )

    def cancel(self, offset: int, cid: bytes, now_ms: int) -> None:
        """A ``delay.cancel`` of ``cid`` consumed at ``offset``: its CANCEL record, then the cancel."""
        store = self.store
        # one look-up for the CANCEL record's outcome, the history event and the cancel itself
        # (appending the CANCEL record changes no index entry): each look-up hashes the id and
        # reads every entry under the hash from the log
        found = pending_refs(store, cid)
        # published from the intake and not reported yet: too late, as for a handed-out record
        flying = not found[1] and in_flight(store, cid) is not None
        pos = self.append_cancel(offset, cid, now_ms, bool(found[1]) or flying)
        cancelled = store.sched.record(found[1][0]) if store.history is not None and found[1] else None
        if flying:
            store.counters.cancel_unmatched += 1
            outcome = CANCEL_LATE
        else:
            outcome = self.apply_cancel(cid, now_ms, found)
        if outcome == CANCEL_MATCHED and cancelled is not None:
            history_record(store, HISTORY_CANCELLED, cancelled, now_ms)
        if store.mirror is not None:
            if outcome == CANCEL_MATCHED:
                store.mirror.remove(cid)
            elif outcome == CANCEL_REMEMBERED:
                store.mirror.put(cid, store.log.raw(pos))
        store.log.release(pos)

    def append_cancel(self, offset: int, cid: bytes, now_ms: int, matches: bool) -> int:
        """The CANCEL record, with what it did in its level field (``Restore.replay`` does the same)."""
        outcome = LEVEL_MATCHED if matches else LEVEL_REMEMBERED
        return self.store.log.append(
            codec.head(
                rtype=codec.CANCEL, due_ms=now_ms, enqueue_ms=now_ms, src_offset=offset,
                src_partition=self.store.partition, target_partition=-1, retry_count=0, level=outcome,
            ),
            cid, b"", None, None, b"",
        )

    def apply_cancel(self, cid: bytes, now_ms: int, found: tuple[int, list[int]] | None = None) -> int:
        """Cancel the pending record ``cid`` (CANCEL_MATCHED), or remember the cancel for the
        horizon (CANCEL_REMEMBERED); CANCEL_LATE: it is already being delivered. ``found``: what
        ``pending_refs`` just returned for ``cid``, when the caller looked it up already."""
        store = self.store
        h, refs = found if found is not None else pending_refs(store, cid)
        if refs:
            matched = False
            for ref in refs:  # a replaced version being delivered and its successor: both are tried
                if store.sched.cancel(ref):
                    store.ids.remove(h, ref)
                    matched = True
            if matched:
                store.counters.cancelled += 1
                store.recent.note(cid, CANCELLED, now_ms)
                return CANCEL_MATCHED
            store.counters.cancel_unmatched += 1  # already being delivered
            for ref in refs:  # a recurring schedule's firing in flight: the schedule ends with it
                rec = store.sched.record(ref)
                if rec is not None and rec.rtype == codec.RECURRING:
                    store.firings.ended.add(ref)
            return CANCEL_LATE
        store.ids.put(h, PRECANCEL | now_ms)
        store.counters.cancel_unmatched += 1
        return CANCEL_REMEMBERED

