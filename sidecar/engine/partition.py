"""One ingress partition's state: commit log + id index + scheduler + checkpoint.

The partition is the unit of ownership and of scale (DESIGN.md 3 and 7): everything below
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
- a second pending record with the same ``delay.id`` -> dropped and counted.

Recovery (``open``) reads the checkpoint, opens the log, the scheduler and the id index at their
checkpointed state, then replays the log records appended after the checkpoint (validating each
CRC, truncating a torn tail) through the same scheduling code, validates the scheduler entries
restored from the checkpoint against the log (dropping and reporting dangling ones), and resumes
consuming after the last replayed ingress offset.

A pre-cancel stays in the id index until its horizon expires, even after it cancelled its
message: the message is not in the log, so if the process dies before the next checkpoint the
message is consumed again and must be cancelled again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sidecar import contract as c
from sidecar import logs
from sidecar.headers import Cancel, Rejection, Request, Rules, parse_ingress
from sidecar.scheduling import Scheduler
from sidecar.store import checkpoint, codec
from sidecar.store.codec import Record, decode_headers, encode_headers
from sidecar.store.idindex import PRECANCEL, IdIndex, id_hash
from sidecar.store.log import CommitLog
from sidecar.store.mapped import StoreError

HeaderList = list[tuple[str, bytes | None]]
log = logs.get("sidecar.store")
TRIM_ALL_EVERY = 16  # trim(): all of the store is dropped at least every 16th call (~3 s)


@dataclass(slots=True)
class Counters:
    """Plain integers on the hot path; the metrics layer reads them."""

    ingested: int = 0
    scheduled: int = 0
    delivered: int = 0
    cancelled: int = 0
    cancel_unmatched: int = 0
    duplicates: int = 0
    dlq: dict[str, int] = field(default_factory=lambda: dict.fromkeys(c.REASONS, 0))
    publish_retries: int = 0
    early: int = 0
    replayed: int = 0
    dangling: int = 0  # scheduler entries dropped by recovery's validation (disk damage)


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
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.dir = root / f"{topic}-{partition}"
        self.rules = rules
        self.scheduler_name = scheduler_name
        self.make_scheduler = make_scheduler
        self.segment_bytes = segment_bytes
        self.cancel_horizon_ms = cancel_horizon_ms
        self.counters = counters
        self.durable = durable
        self.next_offset: int | None = None  # next ingress offset to consume
        self.dirty = False
        self.log: CommitLog
        self.sched: Scheduler
        self.ids: IdIndex
        self.truncated_bytes = 0
        self.dangling: list[tuple[int, int, str]] = []  # (ref, log position, reason) dropped by recovery
        self.checkpoints = 0  # written since open: trim() tells a busy store from an idle one by it
        self._trims = 0
        self._trimmed_at = 0  # ``checkpoints`` at the previous trim()
        self._idle = False  # as seen by the previous trim()

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
        self.log = CommitLog(self.dir, self.segment_bytes)
        self.sched = self.make_scheduler(self.dir, self.log)
        self.sched.restore(ck.get("sched") if ck else None)
        self.ids = IdIndex(self.dir)
        self.ids.restore(ck.get("ids") if ck else None)
        log_state = ck.get("log") if ck else None
        head = int(log_state["head"]) if log_state else None
        live = {int(k): int(v) for k, v in log_state["live"].items()} if log_state else None
        resume = int(ck["ingress_offset"]) if ck and ck.get("ingress_offset") is not None else None
        for pos, rec in self.log.recover(head, live):
            self._replay(pos, rec)
            self.counters.replayed += 1
            # Records after the checkpoint were consumed before the crash: resume after them.
            resume = max(resume or 0, rec.src_offset + 1)
        self.truncated_bytes = sum(t.dropped_bytes for t in self.log.truncations)
        validate: Callable[[int], list[tuple[int, int, str]]] | None = getattr(self.sched, "validate", None)
        if validate is not None and head is not None:
            self.dangling = validate(head)
            if self.dangling:
                self.counters.dangling += len(self.dangling)
                log.error(
                    "recovery.dangling_dropped", partition=self.partition, count=len(self.dangling),
                    first=[{"ref": r, "position": p, "reason": why} for r, p, why in self.dangling[:10]],
                    hint="disk damage: run `delay-sidecar salvage` on a copy of the data directory",
                )
        self.next_offset = resume
        return resume

    def _replay(self, pos: int, rec: Record) -> None:
        if rec.rtype == codec.CANCEL:
            self._apply_cancel(bytes(rec.id), rec.enqueue_ms)
            self.log.release(pos)
            return
        ref = self.sched.add(rec.due_ms, rec.level, pos)
        self.ids.put(id_hash(rec.id), ref)

    # -- intake ---------------------------------------------------------------------------------
    def ingest(self, m: IngressRecord, now_ms: int) -> None:
        self.counters.ingested += 1
        self.dirty = True
        self.next_offset = m.offset + 1
        size = len(m.key or b"") + len(m.value or b"")
        for name, v in m.headers or ():
            size += len(name) + len(v or b"")
        parsed = parse_ingress(m.headers, m.timestamp_ms, now_ms, size, self.rules)
        if isinstance(parsed, Cancel):
            self.log.release(self._append_cancel(m, parsed.id, now_ms))
            self._apply_cancel(parsed.id, now_ms)
            return
        default_id = f"{m.topic}:{m.partition}:{m.offset}".encode()
        if isinstance(parsed, Rejection):
            self._reject(m, default_id, parsed.reason, parsed.error, now_ms)
            return
        self._schedule(m, parsed, default_id, now_ms)

    def _schedule(self, m: IngressRecord, req: Request, default_id: bytes, now_ms: int) -> None:
        rid = req.id or default_id
        h = id_hash(rid)
        for ref in self.ids.find(h):
            if ref & PRECANCEL:
                if now_ms - (ref & ~PRECANCEL) <= self.cancel_horizon_ms:
                    self.counters.cancelled += 1  # kept until the horizon: see the module docstring
                    return
                self.ids.remove(h, ref)
                continue
            rec = self.sched.record(ref)
            if rec is None:
                self.ids.remove(h, ref)  # stale: already done
            elif rec.id == rid:
                self.counters.duplicates += 1
                return
        planned = self.sched.plan(req.mode, req.level, req.due_ms, m.timestamp_ms)
        if planned is None:
            self._reject(
                m, default_id, c.DELAY_OUT_OF_RANGE,
                f"requested due time {req.due_ms} is beyond what the {self.sched.name} scheduler holds", now_ms,
            )
            return
        level, due = planned
        key = req.key_override if req.key_override is not None else m.key
        pos = self.log.append(
            rtype=codec.MESSAGE, due_ms=due, enqueue_ms=m.timestamp_ms, src_offset=m.offset,
            src_partition=m.partition, target_partition=req.target_partition, retry_count=req.retry_count,
            level=level, rid=rid, topic=req.target_topic.encode(), key=key, value=m.value,
            headers_blob=encode_headers(req.user_headers),
        )
        self.ids.put(h, self.sched.add(due, level, pos))
        self.counters.scheduled += 1

    def _reject(self, m: IngressRecord, rid: bytes, reason: str, error: str, now_ms: int) -> None:
        h = id_hash(rid)
        for ref in self.ids.find(h):  # a re-consumed bad record after a crash
            rec = self.sched.record(ref)
            if rec is not None and rec.id == rid:
                return
        headers = dlq_headers(list(m.headers or ()), reason, error, m.topic, m.partition, m.offset, 0)
        ref = self._append_dead(
            rid, m.key, m.value, headers, m.timestamp_ms, m.offset, now_ms,
        )
        self.ids.put(h, ref)
        self.counters.dlq[reason] = self.counters.dlq.get(reason, 0) + 1

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
        return self.sched.add(due, level, pos)

    def _append_cancel(self, m: IngressRecord, cid: bytes, now_ms: int) -> int:
        return self.log.append(
            rtype=codec.CANCEL, due_ms=now_ms, enqueue_ms=now_ms, src_offset=m.offset,
            src_partition=m.partition, target_partition=-1, retry_count=0, level=0, rid=cid,
            topic=b"", key=None, value=None, headers_blob=b"",
        )

    def _apply_cancel(self, cid: bytes, now_ms: int) -> None:
        h = id_hash(cid)
        for ref in self.ids.find(h):
            if ref & PRECANCEL:
                continue
            rec = self.sched.record(ref)
            if rec is None:
                self.ids.remove(h, ref)
                continue
            if rec.id == cid:
                if self.sched.cancel(ref):
                    self.ids.remove(h, ref)
                    self.counters.cancelled += 1
                else:
                    self.counters.cancel_unmatched += 1  # already being delivered
                return
        self.ids.put(h, PRECANCEL | now_ms)
        self.counters.cancel_unmatched += 1

    # -- delivery -------------------------------------------------------------------------------
    def delivered(self, ref: int, rid_hash: int) -> None:
        self.sched.ack(ref)
        self.ids.remove(rid_hash, ref)
        self.dirty = True

    def dead_letter(self, ref: int, rec: Record, reason: str, error: str, attempts: int, now_ms: int) -> None:
        """Publishing failed for good: append a DLQ copy (durable, retried like any record), then
        finish the original."""
        headers: HeaderList = [
            *decode_headers(rec.headers),
            (c.ID, bytes(rec.id)),
            (c.TARGET_TOPIC, bytes(rec.topic)),
        ]
        headers = dlq_headers(headers, reason, error, self.topic, rec.src_partition, rec.src_offset, attempts)
        rid = bytes(rec.id)
        self._append_dead(
            rid, None if rec.key is None else bytes(rec.key), None if rec.value is None else bytes(rec.value),
            headers, rec.enqueue_ms, rec.src_offset, now_ms,
        )
        self.counters.dlq[reason] = self.counters.dlq.get(reason, 0) + 1
        self.delivered(ref, id_hash(rid))

    # -- durability -----------------------------------------------------------------------------
    def checkpoint(self, fsync: bool = True) -> None:
        """data -> index -> checkpoint; then reclaim what the checkpoint made unnecessary."""
        if fsync:
            self.log.flush()
            self.sched.flush()
            self.ids.flush()
        checkpoint.write(
            self.dir,
            {
                "topic": self.topic,
                "partition": self.partition,
                "scheduler": self.scheduler_name,
                "ingress_offset": self.next_offset,
                "log": self.log.state(),
                "sched": self.sched.state(),
                "ids": self.ids.state(),
            },
            durable=fsync,
        )
        self.log.reclaim()
        reclaim = getattr(self.sched, "reclaim", None)
        if reclaim is not None:
            reclaim()
        self.dirty = False
        self.checkpoints += 1

    def trim(self) -> None:
        """Unmap the resident pages of the store's mmapped files from this process, so RSS holds
        little more than what was touched lately (docs/storage.md 9). Safe at any time, nothing is
        lost; the loop calls it once per checkpoint interval, idle or not.

        Every call drops what was appended to the commit log since the previous call. All the rest
        (sealed segments, id index, scheduler files) goes when the store goes idle (no checkpoint
        since the previous call, after one; or the first call after open: recovery read it all)
        and at every ``TRIM_ALL_EVERY``-th call. Not at every call: the id index, the wheel's slots
        and its chain links are written at random, so under a stream of writes their pages come
        back at once (with ``fsync=none``, which has no msync to write-protect them anyway, that
        measured +0.33 page faults per ingested record), and an idle store would pay a madvise per
        file per interval for the few pages its scanners touch."""
        self._trims += 1
        idle = self._trimmed_at == self.checkpoints
        if (idle and not self._idle) or self._trims % TRIM_ALL_EVERY == 0:
            self.log.trim()
            self.sched.trim()
            self.ids.trim()
        else:
            self.log.trim(sealed=False)
        self._idle = idle
        self._trimmed_at = self.checkpoints

    def pending(self) -> dict[str, int]:
        return self.sched.pending()

    def disk_bytes(self) -> int:
        return self.log.disk_bytes() + self.sched.disk_bytes() + self.ids.disk_bytes()

    def close(self) -> None:
        self.sched.close()
        self.ids.close()
        self.log.close()


def compile_rules(
    ingress_topic: str, dlq_topic: str, levels_ms: tuple[int, ...], max_delay_ms: int,
    retry_ladder_ms: tuple[int, ...], max_retries: int, max_record_bytes: int, allowlist: tuple[str, ...],
) -> Rules:
    return Rules(
        ingress_topic=ingress_topic, dlq_topic=dlq_topic, levels_ms=levels_ms, max_delay_ms=max_delay_ms,
        retry_ladder_ms=retry_ladder_ms, max_retries=max_retries, max_record_bytes=max_record_bytes,
        target_allowlist=tuple(re.compile(p) for p in allowlist),
    )

