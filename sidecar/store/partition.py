"""One ingress partition's state: commit log + id index + scheduler + checkpoint.

The partition is the unit of ownership and of scale (docs/design.md 3 and 7.3): everything below
``<data-dir>/<topic>-<partition>/`` belongs to whichever sidecar owns the partition.

Intake (``ingest``) is synchronous: a consumed record is validated, appended to the commit log
and scheduled before the next one is looked at, so "all consumed records up to offset N are in
the store" holds after every batch, and the checkpoint can name ``N + 1`` as the ingress offset to
resume from. Outcomes:

- a valid request -> MESSAGE record, scheduled at the scheduler's committed due time;
- a cancel command -> CANCEL record (the write-ahead record of the cancel) + the O(1) marker;
  a cancel whose message has not arrived yet is remembered as a *pre-cancel* for the cancel
  horizon;
- bad input -> DEAD record addressed to the DLQ (with the DLQ headers), scheduled due now, so a
  dead letter is as durable and as retried as any delivery;
- a second pending record with the same ``delay.id`` -> dropped and counted, unless it is a
  replace (``delay.replace: true``, or any kafka-message-scheduler record, whose key is its id)
  from a higher ingress offset: then it is appended and scheduled, and the pending entry is
  cancelled (``_schedule``);
- a kafka-message-scheduler delete (a tombstone: null value, the id as key, no ``delay.*``
  header) -> CANCEL record + marker when something is pending under the id, else nothing; the
  tombstone a scheduler writes after a delivery (it carries ``scheduler-key``) -> nothing.

The common request (a plain ``delay.ms``/``delay.deliver-at`` request with no id-index entry
under its id's hash, fitting the current segment and the scheduler's plain append) takes a C fast
path: ``ingest_many`` stores a run of such consumed messages in one ``_native.ingest_run`` call,
which checks each record is that case before writing anything for it and stops at the first that
is not; the loop runs that one through ``ingest_fields`` (the reference for everything) and calls
again. Both leave the same bytes and the same state (docs/storage.md 2.6).

Recovery (``open``) reads the checkpoint, opens the log, the scheduler and the id index at their
checkpointed state, then replays the log records appended after the checkpoint (validating each
CRC, truncating a torn tail) through the same scheduling code, arms the scheduler's check of the
entries restored from the checkpoint, and resumes consuming after the last replayed ingress
offset. A MESSAGE or DEAD record replayed under an id that is pending takes the pending entry's
place (``_replay``): the log never holds a duplicate, so it is a replace, or the dead letter of a
record whose publishing failed for good. Nothing in it is O(pending): the restored entries point
at records made durable before the checkpoint was written, so the scheduler checks each one
against the log when it first reads it (before handing it out), and drops and reports a dangling
one (disk damage) through ``_dangling``: counted, logged as ``recovery.dangling_dropped`` with
the hint to salvage, never published (docs/storage.md, "Recovery").

A pre-cancel stays in the id index until its horizon expires, even after it cancelled its
message: the message is not in the log, so if the process dies before the next checkpoint the
message is consumed again and must be cancelled again.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sidecar import contract as c
from sidecar import logs
from sidecar.headers import Cancel, Rejection, Request, Rules, kms_delete, parse_ingress
from sidecar.retry.ladder import RetryLadder
from sidecar.scheduling import Scheduler
from sidecar.store import checkpoint, codec
from sidecar.store.codec import NATIVE, Record, decode_headers, encode_headers, native
from sidecar.store.idindex import IdIndex, PageRead, id_hash
from sidecar.store.idslot import PRECANCEL
from sidecar.store.intake_layout import Common
from sidecar.store.log import CommitLog
from sidecar.store.mapped import (
    HEADER_SIZE,
    Disposal,
    PageWorker,
    StoreError,
    SyncBatch,
    deferred_disposal,
    deferred_drops,
    deferred_sync,
)
from sidecar.store.recent import CANCELLED, DEAD_LETTERED, RecentOutcomes

HeaderList = list[tuple[str, bytes | None]]
_fast = native.parse_request if NATIVE else None  # the common request, parsed in C (headers.py)
_NO_HEADERS = encode_headers(())
_run = native.ingest_run if NATIVE else None  # the intake fast path (ingest_many), in C
_restore_run = native.restore_run if NATIVE else None  # the restore's (restore_many), in C
FAST_INTAKE = _run is not None
log = logs.get("sidecar.store")
_LEN = struct.Struct("<I")  # a record's length (codec layout)
_ID_LEN = struct.Struct("<H")  # its id length, at _ID_LEN_AT
_DUE = struct.Struct("<q")  # its due time (epoch ms), at _DUE_AT
_ID_LEN_AT = 52
_DUE_AT = 16
_DANGLING_KEPT = 1000  # dangling entries remembered (for the recovered event, inspect and tests)
_DANGLING_LOGGED = 10  # logged one by one; after that at every power of two
TRIM_INTERVAL_S = 0.2  # how often the loop calls trim(), whatever the commit interval
TRIM_ALL_EVERY = 16  # trim(): all of the store is dropped at least every 16th call (~3 s)
TRIM_DRAIN_RECORDS = 4096  # trim(): at least this many delivered since the previous call, and 4x
# more than ingested, is a backlog being drained: its commit log and scheduler pages go every call


@dataclass(slots=True)
class Counters:
    """Plain integers on the hot path; the metrics layer reads them."""

    ingested: int = 0
    scheduled: int = 0
    delivered: int = 0
    cancelled: int = 0
    cancel_unmatched: int = 0
    duplicates: int = 0
    replaced: int = 0  # pending records replaced by a newer version (delay.replace, etf1 mode)
    dlq: dict[str, int] = field(default_factory=lambda: dict.fromkeys(c.REASONS, 0))
    publish_retries: int = 0
    early: int = 0
    replayed: int = 0
    dangling: int = 0  # restored scheduler entries dropped because their record fails the check (disk damage)


@dataclass(slots=True)
class IngressRecord:
    """What ``ingest`` needs of a consumed Kafka message (decoupled from confluent_kafka so the
    core is testable with plain values)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: HeaderList | None


def dlq_headers(
    original: HeaderList, reason: str, error: str, topic: str, partition: int, offset: int, attempts: int
) -> HeaderList:
    return [
        *original,
        (c.DLQ_REASON, reason.encode()),
        (c.DLQ_ERROR, error.encode("utf-8", "replace")),
        (c.DLQ_SOURCE_TOPIC, topic.encode()),
        (c.DLQ_SOURCE_PARTITION, str(partition).encode()),
        (c.DLQ_SOURCE_OFFSET, str(offset).encode()),
        (c.DLQ_ATTEMPTS, str(attempts).encode()),
    ]


class Mirror(Protocol):
    """Where a store's changes go besides its own disk: the changelog (``engine/changelog.py``).
    ``put``: the record now pending (or the pre-cancel now remembered) under ``rid``, as its
    commit-log bytes; ``remove``: nothing is pending under ``rid`` any more. ``produced`` and
    ``acked`` count the writes made and acknowledged (durability waits for the latter)."""

    produced: int
    acked: int

    on_settle: bool  # settle() writes the tombstones (False: the publisher does, exactly-once)
    holds_due: bool  # put() uses ``due_now`` (exactly-once); False: the intake need not work it out

    def put(self, rid: bytes, raw: bytes, due_now: bool = False) -> None: ...
    def remove(self, rid: bytes) -> None: ...


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


def _version(rec: Record) -> tuple[int, int]:
    """Which of two records under one id is newer: the higher ingress offset (a replace comes
    after what it replaces in the partition); at the same offset the dead letter of a record."""
    return rec.src_offset, rec.rtype == codec.DEAD


def raw_of(rec: Record) -> bytes:
    """A decoded record's commit-log bytes again (the codec is deterministic)."""
    return codec.encode(
        rec.rtype, rec.due_ms, rec.enqueue_ms, rec.src_offset, rec.src_partition, rec.target_partition,
        rec.retry_count, rec.level, rec.id, rec.topic, rec.key, rec.value, rec.headers,
    )


# what _apply_cancel did
CANCEL_MATCHED, CANCEL_REMEMBERED, CANCEL_LATE = 1, 2, 3
# A CANCEL record's level field: what it did when it was appended, so that the log's replay does
# the same, whatever the scheduler files say about the entries it met (a pending record: cancel
# it, never remember a pre-cancel; none: remember one, and cancel what the replay re-added, a
# record delivered since the checkpoint). 0: written before the field was used (decide by what
# is pending at replay).
_CANCEL_MATCHED, _CANCEL_REMEMBERED = 1, 2


class PartitionStore:
    def __init__(
        self,
        root: Path,
        topic: str,
        partition: int,
        *,
        rules: Rules,
        scheduler_name: str,
        make_scheduler: Callable[[Path, CommitLog], Scheduler],
        segment_bytes: int,
        cancel_horizon_ms: int,
        counters: Counters,
        durable: bool = True,
        status_memory: int = 100_000,
        pages: PageWorker | None = None,
    ) -> None:
        self.topic = topic
        self.topic_bytes = topic.encode()
        self.id_prefix = b"%s:%d:" % (self.topic_bytes, partition)  # default delay.id: <topic>:<partition>:<offset>
        self.partition = partition
        # delivered records not yet acked in the scheduler: the loop's delivery callbacks append
        # here and ``settle`` acks them in one batch after each producer poll
        self.acked: list[tuple[int, Record]] = []
        self.dir = root / f"{topic}-{partition}"
        self.rules = rules
        self.scheduler_name = scheduler_name
        self.make_scheduler = make_scheduler
        self.segment_bytes = segment_bytes
        self.cancel_horizon_ms = cancel_horizon_ms
        self.counters = counters
        self.durable = durable
        # the commit log's pages faulted in ahead of its appends, the files' pages dropped by trim,
        # both off the loop (mapped.PageWorker)
        self.pages = pages
        self.next_offset: int | None = None  # next ingress offset to consume
        self.dirty = False
        # the C intake stopped for an id-table page, being read (the loop's "Page waits");
        # page_read_skip: the next intake does not stop so (the read took too long)
        self.page_read: PageRead | None = None
        self.page_read_skip = False
        self.page_waits = True  # the caller holds the partition for such a page (False: the intake reads it)
        self.log: CommitLog
        self.sched: Scheduler
        self.ids: IdIndex
        self.truncated_bytes = 0
        # seconds of each step of the last open (``partition.recovered``): which one a slow recovery spent
        self.open_steps: dict[str, float] = {}
        # (ref, log position, reason) of dangling entries dropped so far (the first _DANGLING_KEPT)
        self.dangling: list[tuple[int, int, str]] = []
        self.dangling_count = 0
        # the full trims of a process's stores fall on different calls (each store's own phase):
        # six stores' full trims in one loop turn took 55-78 ms at 100M pending
        self._trims = partition % TRIM_ALL_EVERY
        self._idle = False  # as seen by the previous trim()
        self.settled = 0  # records delivered (settled) since open
        # the changelog (None: changelog off); its writer keeps changelog_offset current: the next
        # changelog offset whose effect this store does not hold for certain (checkpointed)
        self.mirror: Mirror | None = None
        self.history: History | None = None  # the history topic's writer (None: history-topic unset)
        self.changelog_offset: int | None = None
        # the next ingress offset the changelog holds every record before (1 + the highest source
        # offset of an acknowledged changelog put): where ingress resumes after a restore
        self.changelog_ingress: int | None = None
        self.replayed: list[int] = []  # log positions of the records recovery replayed (after the checkpoint)
        # ids of replayed records the restore found in the changelog, the same version as pending
        # (written and acknowledged before the crash): ``remirror_replayed`` need not write them again
        self.in_changelog: set[bytes] = set()
        self.resume_offset: int | None = None  # what open() returned
        self._pending_at_checkpoint: dict[str, int] | None = None  # sched.pending() the last checkpoint names
        self._settled_at_trim = 0
        # refs replaced while they were being delivered (handed out): their settle leaves the
        # changelog alone, the id's newer version is pending under the same key; one still
        # waiting for a publish retry is dropped instead (``drop_superseded``)
        self.superseded: set[int] = set()
        self._offset_at_trim: int | None = None
        # ids no longer pending and what became of them, for ``lookup`` (status); bounded, in RAM
        self.recent = RecentOutcomes(status_memory)
        self._settle_ms = 0  # the time of the last settle() given one (a checkpoint's settle has none)

    # -- recovery -------------------------------------------------------------------------------
    def open(self) -> int | None:
        """Recover; return the ingress offset to resume from (``None``: no local state)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        ck = checkpoint.read(self.dir)
        if ck is not None:
            if (ck.get("topic"), ck.get("partition")) != (self.topic, self.partition):
                raise StoreError(f"{self.dir}: checkpoint belongs to {ck.get('topic')}-{ck.get('partition')}")
            if ck.get("scheduler") != self.scheduler_name:
                raise StoreError(
                    f"{self.dir}: the store was written by the {ck.get('scheduler')!r} scheduler, "
                    f"not {self.scheduler_name!r}; run with --scheduler {ck.get('scheduler')} until it drains"
                )
        clock = time.perf_counter
        t0 = clock()
        self.log = CommitLog(self.dir, self.segment_bytes, self.pages)
        t1 = clock()
        self.sched = self.make_scheduler(self.dir, self.log)
        self.sched.restore(ck.get("sched") if ck else None)
        t2 = clock()
        self.ids = IdIndex(self.dir, pages=self.pages)
        self.ids.restore(ck.get("ids") if ck else None)
        t3 = clock()
        log_state = ck.get("log") if ck else None
        head = int(log_state["head"]) if log_state else None
        live = {int(k): int(v) for k, v in log_state["live"].items()} if log_state else None
        resume = int(ck["ingress_offset"]) if ck and ck.get("ingress_offset") is not None else None
        cl = (ck or {}).get("changelog"), (ck or {}).get("changelog_ingress")
        self.changelog_offset, self.changelog_ingress = (None if v is None else int(v) for v in cl)
        self.replayed = []
        for pos, rec in self.log.recover(head, live):
            self._replay(pos, rec)
            self.counters.replayed += 1
            self.replayed.append(pos)
            # Records after the checkpoint were consumed before the crash: resume after them.
            resume = max(resume or 0, rec.src_offset + 1)
        self.truncated_bytes = sum(t.dropped_bytes for t in self.log.truncations)
        t4 = clock()
        if head is not None:
            self.sched.arm(head, self._dangling)
        t5 = clock()
        # the log's files opened; the scheduler's files opened and its state restored; the id
        # index's table mapped and its journals loaded; the log replayed from the head; the
        # restored entries checked
        self.open_steps = {k: round(b - a, 3) for k, a, b in (
            ("log", t0, t1), ("scheduler", t1, t2), ("ids", t2, t3), ("replay", t3, t4), ("arm", t4, t5))}
        self.next_offset = self._offset_at_trim = self.resume_offset = resume
        return resume

    def _dangling(self, ref: int, pos: int, reason: str) -> None:
        """The scheduler dropped an entry restored from the checkpoint whose record fails the
        check (disk damage): it is never published. Counted; the first ones and then every power
        of two are logged, so a damaged segment cannot flood the log."""
        self.dangling_count += 1
        self.counters.dangling += 1
        if len(self.dangling) < _DANGLING_KEPT:
            self.dangling.append((ref, pos, reason))
        n = self.dangling_count
        if n <= _DANGLING_LOGGED or n & (n - 1) == 0:
            log.error(
                "recovery.dangling_dropped", partition=self.partition, ref=ref, position=pos, reason=reason, count=n,
                hint="disk damage: run `delay-sidecar salvage` on a copy of the data directory",
            )

    def _replay(self, pos: int, rec: Record) -> None:
        if rec.rtype == codec.CANCEL:
            if rec.level == _CANCEL_MATCHED:  # it cancelled what was pending: never a pre-cancel
                h, refs = self._pending_refs(rec.id)
                for ref in refs:
                    if self.sched.cancel(ref):
                        self.ids.remove(h, ref)
            elif rec.level == _CANCEL_REMEMBERED:  # nothing was pending: what replay re-added was done
                h, refs = self._pending_refs(rec.id)
                for ref in refs:
                    if self.sched.cancel(ref):
                        self.ids.remove(h, ref)
                if PRECANCEL | rec.enqueue_ms not in self.ids.find(h):
                    self.ids.put(h, PRECANCEL | rec.enqueue_ms)
            else:
                self._apply_cancel(rec.id, rec.enqueue_ms)
            self.log.release(pos)
            return
        # A record for an id that is pending can only be a replace (a duplicate is never appended)
        # or the dead letter of a record whose publishing failed for good: either way it takes
        # the pending one's place, as it did when it was appended.
        h, old = self._pending_refs(rec.id)
        for ref in old:
            if self.sched.cancel(ref):
                self.ids.remove(h, ref)
        self.ids.put(h, self.sched.add(rec.due_ms, rec.level, pos))

    # -- intake ---------------------------------------------------------------------------------
    def ingest(self, m: IngressRecord, now_ms: int) -> None:
        self.ingest_fields(m.topic, m.offset, m.timestamp_ms, m.key, m.value, m.headers, now_ms)

    def ingest_fields(
        self, topic: str, offset: int, ts: int, key: bytes | None, value: bytes | None,
        headers: HeaderList | None, now_ms: int,
    ) -> None:
        """``ingest`` without the ``IngressRecord``: the loop's per-record call. A cancel whose
        look-up would read an evicted id-table page is not taken: ``page_read`` is set and nothing
        else changes (the loop's "Page waits" consume it again once the page is read)."""
        size = (0 if key is None else len(key)) + (0 if value is None else len(value))
        rules = self.rules
        if _fast is not None:
            req = _fast(headers, ts, now_ms, size, rules.max_record_bytes, rules.max_delay_ms, rules.checked_targets)
            if req is not None:
                self.counters.ingested += 1
                self.dirty = True
                self.next_offset = offset + 1
                target, target_partition, rid, due, mode, user = req
                self._schedule(
                    topic, offset, ts, key, value, headers, target, target_partition, rid, due, mode, 0, 0, None,
                    user, now_ms,
                )
                return
        delete = kms_delete(key, value, headers) if value is None else None  # an etf1 delete, or None
        parsed = delete if delete is not None else parse_ingress(headers, ts, now_ms, size, rules,
                                                                 headers_in_size=False)
        if isinstance(parsed, Cancel) and self._page_waited(parsed.id):
            return
        self.counters.ingested += 1
        self.dirty = True
        self.next_offset = offset + 1
        if delete is not None and not isinstance(parsed, Rejection):
            if isinstance(parsed, Cancel):  # (an AfterDelivery tombstone deletes nothing)
                self._kms_delete(offset, parsed.id, now_ms)
            return
        if type(parsed) is Request:
            rid = parsed.id
            if parsed.kms:
                rid = self._kms_id(topic, offset, ts, key, value, headers, parsed, now_ms)
                if rid is None:
                    return
                key = parsed.key_override  # etf1 delivers scheduler-target-key, none when absent
            self._schedule(
                topic, offset, ts, key, value, headers, parsed.target_topic, parsed.target_partition, rid,
                parsed.due_ms, parsed.mode, parsed.level, parsed.retry_count, None,
                parsed.user_headers, now_ms, parsed.replace,
            )
        elif isinstance(parsed, Cancel):
            pos = self._append_cancel(offset, parsed.id, now_ms, bool(self._pending_refs(parsed.id)[1]))
            cancelled = self._pending_record(parsed.id) if self.history is not None else None
            outcome = self._apply_cancel(parsed.id, now_ms)
            if outcome == CANCEL_MATCHED and cancelled is not None:
                self._history_record(HISTORY_CANCELLED, cancelled, now_ms)
            if self.mirror is not None:
                if outcome == CANCEL_MATCHED:
                    self.mirror.remove(parsed.id)
                elif outcome == CANCEL_REMEMBERED:
                    self.mirror.put(parsed.id, self.log.raw(pos))
            self.log.release(pos)
        else:
            assert isinstance(parsed, Rejection)
            self._reject(
                topic, offset, ts, key, value, headers, self._default_id(topic, offset), parsed.reason, parsed.error,
                now_ms,
            )

    def _page_waited(self, rid: bytes) -> bool:
        """True, with ``page_read`` set, if the look-up under ``rid`` would read an evicted page of
        the id table (``IdIndex.evicted``): the loop then holds the partition instead of waiting
        for the disk. ``page_read_skip``: the last wait timed out, so this one reads it in place."""
        if not self.page_waits:
            return False
        if self.page_read_skip:
            self.page_read_skip = False
            return False
        slot = self.ids.evicted(id_hash(rid))
        if slot < 0:
            return False
        self.page_read = self.ids.read_page(slot)
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
            self._reject(topic, offset, ts, key, value, headers, self._default_id(topic, offset), c.BAD_HEADER,
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
        if not self._pending_refs(rid)[1]:
            self.counters.cancel_unmatched += 1
            return
        pos = self._append_cancel(offset, rid, now_ms, True)
        cancelled = self._pending_record(rid) if self.history is not None else None
        if self._apply_cancel(rid, now_ms) == CANCEL_MATCHED:
            if self.mirror is not None:
                self.mirror.remove(rid)
            if cancelled is not None:
                self._history_record(HISTORY_CANCELLED, cancelled, now_ms)
        self.log.release(pos)

    def ingest_many(self, msgs: list[Any], start: int, now_ms: int, topic: str) -> int:
        """Store ``msgs[start:]`` (consumer Messages) while each is the common case, in one C call
        (``_native.ingest_run``): a message of this partition without error, a request the fast
        parser accepts, no id-index entry under its id's hash, a plan, room in the current
        segment, the scheduler's plain append, room in the open id-index stage. Returns the index of the first
        message not stored: the caller runs it through the reference path (``ingest_fields``,
        which handles everything) and calls again. Every Python-visible field ends as
        ``ingest_fields`` would leave it, so the fast path changes nothing but the cost
        (docs/storage.md 2.6). Returns ``start`` when the fast path is off (no extension)."""
        if _run is None or topic != self.topic or type(msgs) is not list:
            return start
        sched = self.sched.intake_begin()
        if sched is None:
            return start
        # the intake state (sidecar/store/intake_layout.py), with the scheduler's part filled in
        st, bufs = sched
        rules = self.rules
        st[Common.HEADER_SIZE] = HEADER_SIZE
        st[Common.NEXT_OFFSET] = -1
        st[Common.MAX_RECORD_BYTES] = rules.max_record_bytes
        st[Common.MAX_DELAY_MS] = rules.max_delay_ms
        seg = self.log.intake_state(st)
        skip = self.page_read_skip
        idx = self.ids.intake_state(st, len(msgs) - start, self.page_waits and not skip)
        first = self.log.head
        end: int = _run(
            msgs, start, now_ms, self.partition, self.id_prefix, rules.checked_targets, _NO_HEADERS, seg, idx, st,
            bufs, *self.ids.intake_bufs(),
        )
        count = end - start
        if count:
            if skip:  # taken; none taken: it is left to the record the reference path takes (a cancel's)
                self.page_read_skip = False
            counters = self.counters
            counters.ingested += count
            counters.scheduled += count
            self.dirty = True
            self.next_offset = st[Common.NEXT_OFFSET]
            self.log.intake_restore(st, count)
            self.ids.intake_restore(st)
            self.sched.intake_end(st, count)
            if self.mirror is not None:
                self._mirror_run(first, count, now_ms)
            if self.history is not None:
                self._history_run(first, count, now_ms)
        if st[Common.IDX_WAIT] >= 0:
            self.page_read = self.ids.read_page(st[Common.IDX_WAIT])
        return end

    def _mirror_run(self, pos: int, count: int, now_ms: int) -> None:
        """Mirror the ``count`` records the C intake appended from ``pos`` on (one segment,
        back to back: it stops at a segment's end); ``due_now`` for those already due at
        ``now_ms`` (the mirror may hold their puts back: ``StoreMirror.held``)."""
        sb = self.log.segment_bytes
        if pos % sb < HEADER_SIZE:
            pos = pos - pos % sb + HEADER_SIZE
        buf = self.log.segments[pos // sb].buf
        off = pos % sb
        mirror = self.mirror
        assert mirror is not None
        put, holds = mirror.put, mirror.holds_due
        for _ in range(count):
            length, id_len = _LEN.unpack_from(buf, off)[0], _ID_LEN.unpack_from(buf, off + _ID_LEN_AT)[0]
            due_now = holds and _DUE.unpack_from(buf, off + _DUE_AT)[0] <= now_ms
            put(bytes(buf[off + codec.HEAD_SIZE : off + codec.HEAD_SIZE + id_len]), bytes(buf[off : off + length]),
                due_now)
            off += length

    def _history_run(self, pos: int, count: int, now_ms: int) -> None:
        """``accepted`` for the ``count`` records the C intake appended from ``pos`` on (as
        ``_mirror_run`` walks them)."""
        sb = self.log.segment_bytes
        if pos % sb < HEADER_SIZE:
            pos = pos - pos % sb + HEADER_SIZE
        buf = self.log.segments[pos // sb].buf
        off = pos % sb
        for _ in range(count):
            rec = codec.decode(buf, off, verify=False)
            self._history_record(HISTORY_ACCEPTED, rec, now_ms)
            off += _LEN.unpack_from(buf, off)[0]

    def _history_record(
        self, event: str, rec: Record, at_ms: int | None = None, reason: str | None = None, error: str | None = None,
    ) -> None:
        """One history event about a stored record (the history topic, engine/history.py)."""
        assert self.history is not None
        self.history.event(
            event, bytes(rec.id), enqueued_ms=rec.enqueue_ms, due_ms=rec.due_ms, target=bytes(rec.topic),
            target_partition=rec.target_partition, level=rec.level,
            source=f"{self.topic}:{rec.src_partition}:{rec.src_offset}", reason=reason, error=error,
            key=None if rec.key is None else bytes(rec.key), value=None if rec.value is None else bytes(rec.value),
            at_ms=at_ms,
        )

    def _pending_record(self, rid: bytes) -> Record | None:
        """The pending record under ``rid`` (for its history event before it changes)."""
        _h, ref = self._pending_ref(rid)
        return None if ref is None else self.sched.record(ref)

    def _default_id(self, topic: str, offset: int) -> bytes:
        if topic == self.topic:
            return self.id_prefix + b"%d" % offset
        return b"%s:%d:%d" % (topic.encode(), self.partition, offset)

    def _schedule(
        self, topic: str, offset: int, ts: int, key: bytes | None, value: bytes | None, headers: HeaderList | None,
        target: str, target_partition: int, req_id: bytes | None, req_due: int, mode: str, req_level: int,
        retry_count: int, key_override: bytes | None, user_headers: tuple[tuple[str, bytes | None], ...],
        now_ms: int, replace: bool = False,
    ) -> None:
        """Store and schedule a request (the fields of ``headers.Request``). With ``replace``, the
        pending record under the id (an older version: a lower ingress offset) is cancelled once
        the new one is appended; the log's replay does the same (``_replay``)."""
        rid = req_id or self._default_id(topic, offset)
        h = id_hash(rid)
        old: list[int] = []
        for ref in self.ids.find(h):
            if ref & PRECANCEL:
                if now_ms - (ref & ~PRECANCEL) <= self.cancel_horizon_ms:
                    self.counters.cancelled += 1  # kept until the horizon: see the module docstring
                    self.recent.note(rid, CANCELLED, now_ms)
                    if self.history is not None:
                        self.history.event(
                            HISTORY_CANCELLED, rid, enqueued_ms=ts, due_ms=req_due, target=target,
                            target_partition=target_partition, source=f"{topic}:{self.partition}:{offset}",
                            key=key, value=value, at_ms=now_ms,
                        )
                    return
                self.ids.remove(h, ref)
                continue
            rec = self.sched.record(ref)
            if rec is None:
                self.ids.remove(h, ref)  # stale: already done
            elif rec.id == rid and replace and offset > rec.src_offset:
                old.append(ref)
            elif rec.id == rid:
                # without replace, or this very record (or an older one) consumed again after a
                # crash or a handover while its newer version is pending: nothing changes
                self.counters.duplicates += 1
                if self.mirror is not None:
                    # re-consumed after a crash: its changelog write may have been lost with the
                    # process (the ingress offset was not committed), so it is written again
                    self.mirror.put(rid, raw_of(rec))
                return
        planned = self.sched.plan(mode, req_level, req_due, ts)
        if planned is None:
            self._reject(
                topic, offset, ts, key, value, headers, self._default_id(topic, offset), c.DELAY_OUT_OF_RANGE,
                f"requested due time {req_due} is beyond what the {self.sched.name} scheduler holds", now_ms,
            )
            return
        level, due = planned
        if key_override is not None:
            key = key_override
        blob = encode_headers(user_headers) if user_headers else _NO_HEADERS
        pos = self.log.append_record(
            codec.MESSAGE, due, ts, offset, self.partition, target_partition, retry_count, level, rid,
            target.encode(), key, value, blob,
        )
        new = self.sched.add(due, level, pos)
        for ref in old:
            if self.sched.cancel(ref):
                self.ids.remove(h, ref)
            else:  # already handed out (its due time had come): its settle must not tombstone rid
                self.superseded.add(ref)
        if old:
            self.counters.replaced += 1
        self.ids.put(h, new)
        self.counters.scheduled += 1
        if self.mirror is not None:
            self.mirror.put(rid, self.log.raw(pos), due <= now_ms)
        if self.history is not None:
            self._history_record(HISTORY_REPLACED if old else HISTORY_ACCEPTED, self.log.read(pos), now_ms)

    def _reject(
        self, topic: str, offset: int, ts: int, key: bytes | None, value: bytes | None, headers: HeaderList | None,
        rid: bytes, reason: str, error: str, now_ms: int,
    ) -> None:
        h = id_hash(rid)
        for ref in self.ids.find(h):  # a re-consumed bad record after a crash
            rec = self.sched.record(ref)
            if rec is not None and rec.id == rid:
                if self.mirror is not None:
                    self.mirror.put(rid, raw_of(rec))
                return
        out = dlq_headers(list(headers or ()), reason, error, topic, self.partition, offset, 0)
        ref = self._append_dead(rid, key, value, out, ts, offset, now_ms)
        self.recent.note(rid, DEAD_LETTERED, now_ms)
        self.ids.put(h, ref)
        self.counters.dlq[reason] = self.counters.dlq.get(reason, 0) + 1
        if self.history is not None:
            self.history.event(
                HISTORY_DEAD_LETTERED, rid, enqueued_ms=ts, due_ms=None, target=None,
                source=f"{topic}:{self.partition}:{offset}", reason=reason, error=error, key=key, value=value,
                at_ms=now_ms,
            )

    def _append_dead(
        self, rid: bytes, key: bytes | None, value: bytes | None, headers: HeaderList,
        enqueue_ms: int, src_offset: int, now_ms: int,
    ) -> int:
        level, due = self.sched.plan("now", 0, now_ms, now_ms) or (0, now_ms)
        pos = self.log.append(
            rtype=codec.DEAD, due_ms=due, enqueue_ms=enqueue_ms, src_offset=src_offset,
            src_partition=self.partition, target_partition=-1, retry_count=0, level=level, rid=rid,
            topic=self.rules.dlq_topic.encode(), key=key, value=value, headers_blob=encode_headers(headers),
        )
        ref = self.sched.add(due, level, pos)
        if self.mirror is not None:
            # a dead letter of a failed publish replaces the original
            self.mirror.put(rid, self.log.raw(pos), due <= now_ms)
        return ref

    def _append_cancel(self, offset: int, cid: bytes, now_ms: int, matches: bool) -> int:
        """The CANCEL record, with what it did in its level field (``_replay`` does the same)."""
        outcome = _CANCEL_MATCHED if matches else _CANCEL_REMEMBERED
        return self.log.append_record(
            codec.CANCEL, now_ms, now_ms, offset, self.partition, -1, 0, outcome, cid, b"", None, None, b"",
        )

    def _apply_cancel(self, cid: bytes, now_ms: int) -> int:
        """Cancel the pending record ``cid`` (CANCEL_MATCHED), or remember the cancel for the
        horizon (CANCEL_REMEMBERED); CANCEL_LATE: it is already being delivered."""
        h, refs = self._pending_refs(cid)
        if refs:
            matched = False
            for ref in refs:  # a replaced version being delivered and its successor: both are tried
                if self.sched.cancel(ref):
                    self.ids.remove(h, ref)
                    matched = True
            if matched:
                self.counters.cancelled += 1
                self.recent.note(cid, CANCELLED, now_ms)
                return CANCEL_MATCHED
            self.counters.cancel_unmatched += 1  # already being delivered
            return CANCEL_LATE
        self.ids.put(h, PRECANCEL | now_ms)
        self.counters.cancel_unmatched += 1
        return CANCEL_REMEMBERED

    # -- restore from the changelog ------------------------------------------------------------
    def _pending_ref(self, rid: bytes) -> tuple[int, int | None]:
        """(id hash, the pending entry under ``rid`` or None); drops stale index entries."""
        h, refs = self._pending_refs(rid)
        return h, refs[0] if refs else None

    def _pending_refs(self, rid: bytes) -> tuple[int, list[int]]:
        """(id hash, every entry under ``rid`` not done yet); drops stale index entries. More than
        one only while a replaced version is being delivered (handed out, not acked yet)."""
        h = id_hash(rid)
        refs: list[int] = []
        for ref in self.ids.find(h):
            if ref & PRECANCEL:
                continue
            rec = self.sched.record(ref)
            if rec is None:
                self.ids.remove(h, ref)
            elif rec.id == rid:
                refs.append(ref)
        return h, refs

    def lookup(self, rid: bytes, now_ms: int | None = None) -> dict[str, Any] | None:
        """What this partition knows of ``rid`` (``delay-sidecar status``), or None.

        A pending record is found through the id index (one hash probe) and verified against the
        stored record's id: a 64-bit hash collision is never an answer. Unlike ``_pending_ref`` it
        changes nothing (a stale index entry is skipped, not removed), so the answer costs no
        write. Then a pre-cancel (a cancel that came before its message; matched on the hash, as
        the intake matches it; with ``now_ms``, only one within the cancel horizon, as the intake
        honours it), then the memory of recent outcomes (``recent.py``)."""
        h = id_hash(rid)
        precancel: int | None = None
        found: Record | None = None
        for ref in self.ids.find(h):
            if ref & PRECANCEL:
                at = ref & ~PRECANCEL
                if now_ms is None or now_ms - at <= self.cancel_horizon_ms:
                    precancel = at
                continue
            rec = self.sched.record(ref)
            # two versions only while a replaced one is being delivered: the newer (later offset) answers
            if rec is not None and rec.id == rid and (found is None or rec.src_offset > found.src_offset):
                found = rec
        if found is not None:
            rec = found
            out: dict[str, Any] = {
                "partition": self.partition, "state": "pending", "due_ms": rec.due_ms,
                "enqueued_ms": rec.enqueue_ms, "ingress_offset": rec.src_offset,
                "target_topic": rec.topic.decode("utf-8", "replace"),
                "target_partition": None if rec.target_partition < 0 else rec.target_partition,
            }
            if rec.rtype == codec.DEAD:  # a dead letter on its way to the DLQ
                out["state"] = "dead-lettered"
                out["dlq_delivered"] = False
                for name, value in decode_headers(rec.headers):
                    if name == c.DLQ_REASON and value is not None:
                        out["reason"] = value.decode("utf-8", "replace")
                    elif name == c.TARGET_TOPIC and value is not None:
                        out["target_topic"] = value.decode("utf-8", "replace")
                out["dlq_topic"] = rec.topic.decode("utf-8", "replace")
            return out
        if precancel is not None:
            return {"partition": self.partition, "state": "cancelled", "at_ms": precancel, "before_message": True}
        known = self.recent.get(rid)
        if known is None:
            return None
        return {"partition": self.partition, "state": known[0], "at_ms": known[1]}

    def remirror_replayed(self) -> int:
        """Write the records recovery replayed to the changelog again, those still pending: their
        first writes were made after the checkpoint and may have died with the process (a
        checkpoint names only records whose writes were acknowledged, durability.py). Not those
        the restore just read from the changelog (``in_changelog``): their writes did not die.
        Writing them again would grow the changelog's tail by what every restart replays, and a
        crash loop faster than the checkpoints would restore a longer tail at each start."""
        replayed, self.replayed = self.replayed, []
        seen, self.in_changelog = self.in_changelog, set()
        if self.mirror is None:
            return 0
        n = 0
        for pos in replayed:
            rec = self.log.read(pos)
            if rec.id in seen:
                continue
            if rec.rtype != codec.CANCEL:  # still the pending version of its id (not replaced since)
                refs = self._pending_refs(rec.id)[1]
                held = [self.sched.record(ref) for ref in refs]
                pending = any(r is not None and _version(r) == _version(rec) for r in held)
            else:
                pending = PRECANCEL | rec.enqueue_ms in self.ids.find(id_hash(rec.id))
            if pending:
                self.mirror.put(rec.id, raw_of(rec))
                n += 1
        return n

    def covered(self, src_offset: int) -> None:
        """The changelog holds the record of ingress offset ``src_offset`` (and every one before)."""
        if self.changelog_ingress is None or src_offset >= self.changelog_ingress:
            self.changelog_ingress = src_offset + 1

    def restore_put(self, rid: bytes, raw: bytes, now_ms: int) -> None:
        """A changelog record: ``raw`` (commit-log bytes) is pending under ``rid``. Idempotent: a
        record already pending under that id is kept unless ``raw`` is a newer version of it (a
        replace: a higher ingress offset; or the dead letter of it, same offset), which takes its
        place as it did on the old owner; an equal or older one is the same record replayed (from
        before the store's checkpoint). A pending pre-cancel wins, as at intake. A CANCEL is a
        pre-cancel, remembered until its horizon."""
        rec = codec.decode(memoryview(raw), 0, verify=True)
        if rec.id != rid:
            raise StoreError(f"changelog record under key {rid!r} holds id {rec.id!r}")
        self.dirty = True
        if rec.rtype == codec.CANCEL:
            if now_ms - rec.enqueue_ms <= self.cancel_horizon_ms:
                h, ref = self._pending_ref(rid)
                if ref is not None and self.sched.cancel(ref):
                    self.ids.remove(h, ref)
                elif ref is None and PRECANCEL | rec.enqueue_ms not in self.ids.find(h):
                    self.ids.put(h, PRECANCEL | rec.enqueue_ms)
                elif ref is None and self.replayed:
                    self.in_changelog.add(rid)
            return
        h, refs = self._pending_refs(rid)
        for pre in self.ids.find(h):  # a record arriving after its cancel: it never fires
            if pre & PRECANCEL and now_ms - (pre & ~PRECANCEL) <= self.cancel_horizon_ms:
                return
        rank = _version(rec)
        for ref in refs:
            held = self.sched.record(ref)
            if held is not None and _version(held) >= rank:
                if self.replayed and _version(held) == rank:
                    self.in_changelog.add(rid)
                return  # the same record, or a newer version of it, is held
        pos = self.log.append_record(
            rec.rtype, rec.due_ms, rec.enqueue_ms, rec.src_offset, rec.src_partition, rec.target_partition,
            rec.retry_count, rec.level, rec.id, rec.topic, rec.key, rec.value, rec.headers,
        )
        new = self.sched.add(rec.due_ms, rec.level, pos)
        for ref in refs:
            if self.sched.cancel(ref):
                self.ids.remove(h, ref)
            else:
                self.superseded.add(ref)
        self.ids.put(h, new)

    def restore_many(self, msgs: list[Any], start: int, end: int) -> tuple[int, int]:
        """Store ``msgs[start:]`` (changelog consumer Messages) in one C call (``_native.restore_run``)
        while each is a put ``restore_put`` would append as it is: a message of this partition
        without error, below changelog offset ``end`` (-1: none, a standby), whose value is a
        MESSAGE or DEAD record of its key's id in the codec's canonical form, CRC-checked, with no
        id-index entry under the id's hash (nothing pending, no pre-cancel; in no stage and not in
        the table), room in the current segment, the scheduler's plain append, room in the open
        stage (each insert journaled as ``put`` journals it). Returns (the index of the first
        message not stored, the value bytes stored); the caller runs that message through the
        reference path (``restore_put`` / ``restore_remove``, which handle everything: tombstones,
        CANCELs, ids already known, a new segment) and calls again. Both leave the same bytes and
        the same state (docs/storage.md 10); ``covered`` is told the highest source offset stored."""
        if _restore_run is None or type(msgs) is not list:
            return start, 0
        sched = self.sched.intake_begin()
        if sched is None:
            return start, 0
        st, bufs = sched
        st[Common.HEADER_SIZE] = HEADER_SIZE
        st[Common.NEXT_OFFSET] = -1
        st[Common.MAX_SRC_OFFSET] = -1
        seg = self.log.intake_state(st)
        idx = self.ids.intake_state(st, len(msgs) - start)
        stop: int = _restore_run(msgs, start, self.partition, end, seg, idx, st, bufs, *self.ids.intake_bufs())
        count = stop - start
        if count:
            self.dirty = True
            self.log.intake_restore(st, count)
            self.ids.intake_restore(st)
            self.sched.intake_end(st, count)
            self.covered(st[Common.MAX_SRC_OFFSET])
            return stop, st[Common.RESTORED_BYTES]
        return stop, 0

    def restore_remove(self, rid: bytes) -> None:
        """A changelog tombstone: nothing is pending under ``rid`` (delivered, dead-lettered,
        cancelled); a record this store still holds under it is dropped without being delivered."""
        h, refs = self._pending_refs(rid)
        for ref in refs:
            if self.sched.cancel(ref):
                self.ids.remove(h, ref)
                self.dirty = True

    # -- delivery -------------------------------------------------------------------------------
    def drop_superseded(self, ref: int, rec: Record) -> bool:
        """Finish, without publishing, a handed-out record that a replace superseded while its
        publishing failed and waited for a retry (True); False: ``ref`` was not superseded. The
        changelog is left alone: the id's newer version is pending under the same key."""
        if ref not in self.superseded:
            return False
        self.superseded.discard(ref)
        self.sched.ack(ref)
        self.ids.remove(id_hash(rec.id), ref)
        self.dirty = True
        return True

    def delivered(self, ref: int, rid_hash: int) -> None:
        self.sched.ack(ref)
        self.ids.remove(rid_hash, ref)
        self.dirty = True

    def settle(self, now_ms: int = -1) -> None:
        """Finish every record in ``acked`` (delivered) at ``now_ms`` (-1: the time of the
        previous call): one scheduler call for the batch, so the done cursor moves once per batch
        instead of once per delivery report."""
        acked, self.acked = self.acked, []
        if now_ms >= 0:
            self._settle_ms = now_ms
        self.recent.note_settled(acked, self._settle_ms, codec.DEAD)
        mirror = self.mirror
        if mirror is not None:
            superseded = self.superseded
            tombstones = mirror.on_settle  # False: written when produced, in its transaction (exactly-once)
            for ref, rec in acked:
                if superseded and ref in superseded:
                    superseded.discard(ref)  # replaced while being delivered: its id's newest version is pending
                    continue
                if tombstones:
                    mirror.remove(rec.id)
        if self.history is not None:
            for _ref, rec in acked:
                if rec.rtype == codec.MESSAGE:  # a DEAD record reaching the DLQ was reported when it died
                    self._history_record(HISTORY_DELIVERED, rec)
        self.ids.remove_delivered(acked)
        self.sched.ack_many([ref for ref, _rec in acked])
        self.counters.delivered += len(acked)
        self.settled += len(acked)
        self.dirty = True

    def dead_letter(self, ref: int, rec: Record, reason: str, error: str, attempts: int, now_ms: int) -> None:
        """Publishing failed for good: append a DLQ copy (durable, retried like any record), then
        finish the original. The copy carries the control headers of an ingress record meaning
        the same schedule (target, partition, id, and the committed due time as
        ``delay.deliver-at`` or the consumer retry's ``delay.retry-count``) plus
        ``delay.enqueued-at``, so ``dlq redrive`` can restore it (sidecar/dlq.py)."""
        headers: HeaderList = [
            *decode_headers(rec.headers),
            (c.ID, rec.id),
            (c.TARGET_TOPIC, rec.topic),
        ]
        if rec.target_partition >= 0:
            headers.append((c.TARGET_PARTITION, b"%d" % rec.target_partition))
        if rec.retry_count:
            headers.append((c.RETRY_COUNT, b"%d" % rec.retry_count))
        else:
            headers.append((c.DELIVER_AT, b"%d" % rec.due_ms))
        headers.append((c.ENQUEUED_AT, b"%d" % rec.enqueue_ms))
        headers = dlq_headers(headers, reason, error, self.topic, rec.src_partition, rec.src_offset, attempts)
        rid = rec.id
        if ref in self.superseded:
            # replaced while it was being delivered: its dead letter must not take the place of its
            # successor (the id's pending version), so it goes under its source's default id
            self.superseded.discard(ref)
            dead_id = self._default_id(self.topic, rec.src_offset)
            self._append_dead(dead_id, rec.key, rec.value, headers, rec.enqueue_ms, rec.src_offset, now_ms)
        else:
            self._append_dead(rid, rec.key, rec.value, headers, rec.enqueue_ms, rec.src_offset, now_ms)
            self.recent.note(rid, DEAD_LETTERED, now_ms)
        self.counters.dlq[reason] = self.counters.dlq.get(reason, 0) + 1
        if self.history is not None:
            self._history_record(HISTORY_DEAD_LETTERED, rec, now_ms, reason, error)
        self.delivered(ref, id_hash(rid))

    # -- durability -----------------------------------------------------------------------------
    def checkpoint(self, fsync: bool = True) -> None:
        """data -> index -> checkpoint; then reclaim what the checkpoint made unnecessary."""
        job = self.begin_checkpoint(fsync)
        job.run()
        self.finish_checkpoint(job).run()

    def begin_checkpoint(self, fsync: bool = True) -> CheckpointJob:
        """Snapshot the state a checkpoint names and note what must reach the disk before it
        (the data and index pages, new files' directories) — without waiting for the disk. The
        job's ``run`` (any thread) syncs them and then writes the checkpoint; ``finish_checkpoint``
        (this thread, after ``run``) reclaims what the snapshot no longer needs. Between the two,
        the store keeps working: what it writes is not named by the snapshot."""
        if self.acked:
            self.settle()
        with deferred_sync() as batch:
            if fsync:
                self.log.flush()
                self.sched.flush()
            self.ids.flush(sync=fsync)  # its journals; without fsync still: a grown table takes its name
        doc = {
            "topic": self.topic,
            "partition": self.partition,
            "scheduler": self.scheduler_name,
            "ingress_offset": self.next_offset,
            "log": self.log.state(),
            "sched": self.sched.state(),
            "ids": self.ids.state(),
            "changelog": self.changelog_offset,
            "changelog_ingress": self.changelog_ingress,
        }
        self.dirty = False
        self._pending_at_checkpoint = self.sched.pending()
        dead = self.log.reclaimable()
        return CheckpointJob(self.dir, doc, batch, fsync, dead, [self.log.path_of(i) for i in dead], self.next_offset)

    def finish_checkpoint(self, job: CheckpointJob) -> Disposal:
        """Drop what the checkpoint made unnecessary (dead log segments, scheduler files). The
        files are closed and deleted by the returned disposal, which the caller runs on another
        thread (or at once): freeing a 64 MiB segment's blocks took ~55 ms (mapped.Disposal)."""
        with deferred_disposal() as gone:
            self.log.reclaim(job.dead_segments, unlink=False)  # the job deleted the files
            self.sched.reclaim()
            self.ids.reclaim()  # merged journals the checkpoint no longer names; a grown table's old one
        return gone

    def index_step(self, now_ms: int) -> int:
        """A loop turn's share of the id index's maintenance (``IdIndex.step``): notice a finished
        merge pass, start the next one when due. Returns the operations it sealed (0: none)."""
        return self.ids.step(now_ms, self.cancel_horizon_ms)

    def trim(self) -> None:
        """Unmap the resident pages of the store's mmapped files from this process, so RSS holds
        little more than what was touched lately (docs/storage.md 9). Safe at any time, nothing is
        lost; the loop calls it every ``TRIM_INTERVAL_S``, idle or not, on its own clock: not at
        each checkpoint, so a longer ``commit-interval`` (or ``fsync=interval``) does not let RSS
        grow between checkpoints.

        Every call drops what was appended to the commit log since the previous call. All the rest
        (sealed segments, id index, scheduler files) goes when the store goes idle (nothing
        ingested or delivered since the previous call, after a call with some; or the first call
        after open: recovery read it all) and at every ``TRIM_ALL_EVERY``-th call. Not at every
        call: the id index, the wheel's slots and its chain links are written at random, so under
        a stream of writes their pages come back at once (with ``fsync=none``, which has no msync
        to write-protect them anyway, that measured +0.33 page faults per ingested record), and an
        idle store would pay a madvise per file per interval for the few pages its scanners touch.

        A store draining a backlog (a mass expiry: at least ``TRIM_DRAIN_RECORDS`` delivered since
        the previous call and four times more than ingested) also drops its whole commit log and
        the scheduler's files at every call: the publisher reads them front to back at up to
        ~100k records/s, ~30 MB/s of pages it will not read again, which would otherwise stay
        mapped until the next full drop (measured: +107 MiB RSS during a one-million-record
        drain). The few writes of the intake beside it do not make the re-faults matter.

        Where the process has a page thread (``pages``, with the C extension), the unmapping is
        done there (``deferred_drops``): the loop only collects the ranges. Each store has its own
        phase in ``TRIM_ALL_EVERY`` (its partition), so a process's full trims are spread over the
        calls: at 100M pending on six partitions, the six in one turn took 55-78 ms."""
        self._trims += 1
        offset, before = self.next_offset, self._offset_at_trim
        delivered = self.settled - self._settled_at_trim
        ingested = 0 if offset is None or before is None else offset - before
        idle = delivered == 0 and offset == before
        draining = delivered >= TRIM_DRAIN_RECORDS and delivered >= 4 * ingested
        self._settled_at_trim, self._offset_at_trim = self.settled, offset
        with deferred_drops(self.pages):  # the unmapping itself on the page thread (mapped.PageWorker)
            if (idle and not self._idle) or self._trims % TRIM_ALL_EVERY == 0:
                self.log.trim()
                self.sched.trim()
                self.ids.trim()
            elif draining:
                self.log.trim()
                self.sched.trim()
            else:
                self.log.trim(sealed=False)
        self._idle = idle

    def pending(self) -> dict[str, int]:
        return self.sched.pending()

    def needs_checkpoint(self) -> bool:
        """True if a checkpoint taken now would say something the last one does not: records
        stored or finished (``dirty``), or the scheduler's cursors moved past finished entries
        (a cancelled record's entry, passed when its due time comes, changes the pending counts
        with nothing stored or delivered; ``inspect`` reads them from the checkpoint)."""
        return self.dirty or self.sched.pending() != self._pending_at_checkpoint

    def disk_bytes(self) -> int:
        return self.log.disk_bytes() + self.sched.disk_bytes() + self.ids.disk_bytes()

    def close(self) -> None:
        self.sched.close()
        self.ids.close()
        self.log.close()


@dataclass(slots=True)
class CheckpointJob:
    """One checkpoint between ``begin_checkpoint`` and ``finish_checkpoint`` (see there)."""

    dir: Path
    doc: dict[str, Any]
    syncs: SyncBatch
    durable: bool
    dead_segments: list[int]  # commit-log segments empty at the snapshot: deleted once it is durable
    dead_paths: list[Path]  # their files
    ingress_offset: int | None  # what the offset commit may name once the checkpoint is written

    def run(self) -> None:
        """data and index to disk, then the checkpoint (atomic, durable), then delete the segments
        it no longer needs: safe on any thread. Deleting a 64 MiB segment took 7-98 ms (its page
        cache dropped, its blocks freed and discarded): on the loop thread that was a stall of every
        delivery. A sealed segment never gets a record again, so deleting it here, before the loop
        unmaps it, is safe; a crash before the unlink leaves a file recovery deletes."""
        self.syncs.run()
        self.publish()

    def publish(self) -> None:
        """The second half of ``run``: the checkpoint, then the segments it no longer needs. With
        the changelog it waits for the changelog writes the snapshot covers (durability.py)."""
        checkpoint.write(self.dir, self.doc, durable=self.durable)
        for path in self.dead_paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def compile_rules(
    ingress_topic: str, dlq_topic: str, levels_ms: tuple[int, ...], max_delay_ms: int,
    retry_ladder_ms: tuple[int, ...], max_retries: int, max_record_bytes: int, allowlist: tuple[str, ...],
) -> Rules:
    return Rules(
        ingress_topic=ingress_topic, dlq_topic=dlq_topic, levels_ms=levels_ms, max_delay_ms=max_delay_ms,
        retry_ladder=RetryLadder(retry_ladder_ms, max_retries), max_record_bytes=max_record_bytes,
        target_allowlist=tuple(re.compile(p) for p in allowlist),
    )

