"""One ingress partition's store: its state, from open to close (recovery, checkpoints, trims).

The partition is the unit of ownership and of scale (docs/design.md 3 and 7.3): everything below
``<data-dir>/<topic>-<partition>/`` belongs to whichever sidecar owns the partition.
``PartitionStore`` owns the commit log (``log.py``), the scheduler (``levels/`` or ``wheel/``), the
id index (``idindex.py``), the checkpoint (``checkpoint.py``) and the counters. What happens to
the records in them is done by one collaborator per job, each given the store (each module's
docstring says its job):

- ``intake.py`` (``store.intake``): a consumed ingress record -> scheduled, rejected to the DLQ,
  or a cancel; the C batch path (``ingest_many``) and the etf1 ids and deletes;
- ``outcomes.py`` (``store.outcomes``): a handed-out record delivered, dead-lettered or dropped as
  superseded; the settle of a batch;
- ``restore.py`` (``store.restore``): records stored before, applied again (the log's tail at
  ``open``, the changelog at a handover);
- ``mirroring.py``: the changelog and history-topic interfaces (``mirror``, ``history``) and the
  report of a C run to them;
- ``lookup.py``: what is pending under an id (``lookup``, the status answer);
- ``flights.py`` (``store.flights``): the records published from the intake and not reported yet
  (engine/direct.py): the offsets the commit stays below, the checkpoint's ``direct`` list, and
  where ``open`` resumes.

The engine calls the store's methods below, each handed to the collaborator whose job it is. The
per-record ones (``ingest_fields``, ``restore_put``, ``restore_remove``) are the collaborators'
bound methods, set with them (``_wire_collaborators``), so that a record costs no delegating call.

Recovery (``open``) reads the checkpoint, opens the log, the scheduler and the id index at their
checkpointed state, then replays the log records appended after the checkpoint (validating each
CRC, truncating a torn tail) through the same scheduling decisions (``Restore.replay``), arms the
scheduler's check of the entries restored from the checkpoint, and resumes consuming at the first
ingress offset it does not hold (resume.py). Nothing in it is O(pending): the restored entries
point at records made durable before the checkpoint was written, so the scheduler checks each
one against the log when it first reads it (before handing it out), and drops and reports a
dangling one (disk damage) through ``_dangling``: counted, logged as ``recovery.dangling_dropped`` with the hint to
salvage, never published (docs/storage.md, "Recovery").
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar import contract as c
from sidecar import logs
from sidecar.headers import Rules
from sidecar.retry.ladder import RetryLadder
from sidecar.scheduling import Scheduler
from sidecar.store import checkpoint
from sidecar.store.codec import Record
from sidecar.store.firings import Firings
from sidecar.store.flights import Flights
from sidecar.store.idindex import IdIndex
from sidecar.store.idpages import PageRead
from sidecar.store.intake import FAST_INTAKE as FAST_INTAKE  # the loop's: is the C intake there
from sidecar.store.intake import HeaderList, Intake
from sidecar.store.log import CommitLog
from sidecar.store.lookup import status
from sidecar.store.mapped import (
    Disposal,
    PageWorker,
    StoreError,
    SyncBatch,
    deferred_disposal,
    deferred_drops,
    deferred_sync,
)
from sidecar.store.mirroring import History, Mirror
from sidecar.store.outcomes import Outcomes
from sidecar.store.quota import Quota
from sidecar.store.recent import RecentOutcomes
from sidecar.store.restore import Restore
from sidecar.store.resume import Resume

log = logs.get("sidecar.store")
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
    fired: int = 0  # firings of recurring schedules settled: delivered or dead-lettered (store/firings.py)
    missed: int = 0  # nominal firing times a misfire left out (fire-once: stood for by a later firing; skip)
    published_direct: int = 0  # requests due on arrival published by the intake, never stored (engine/direct.py)


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


class PartitionStore:
    """One partition's store: its state and lifecycle (the module docstring). Its collaborators
    get the store and change its fields; no state is split between them, so ``open`` restores and
    a checkpoint names one set of fields."""

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
        # the key the loop's stores map holds this store under (engine/stores.py ``StoreKey`` is
        # a tuple of the same fields: equal, same hash); the C delivery report looks it up
        self.key = (topic, partition)
        # delivered records not yet acked in the scheduler: the loop's delivery callbacks append
        # here and ``settle`` acks them in one batch after each producer poll
        self.acked: list[tuple[int, Record]] = []
        # lateness (ms) of delivered records the metrics have not taken: the delivery reports append
        # here; the loop gives every store of a tenant the tenant's list (engine/tenant_counts.py)
        self.lateness: list[int] = []
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
        self._recovery_fields()  # the log, scheduler and id index, and what recovery found
        # the full trims of a process's stores fall on different calls (each store's own phase):
        # six stores' full trims in one loop turn took 55-78 ms at 100M pending
        self._trims = partition % TRIM_ALL_EVERY
        self._idle = False  # as seen by the previous trim()
        self.settled = 0  # records delivered (settled) since open
        # the changelog (None: changelog off); its writer keeps ``changelog_offset`` current
        self.mirror: Mirror | None = None
        self.history: History | None = None  # the history topic's writer (None: history-topic unset)
        self._pending_at_checkpoint: dict[str, int] | None = None  # sched.pending() the last checkpoint names
        self._settled_at_trim = 0
        # refs replaced while they were being delivered (handed out): their settle leaves the
        # changelog alone, the id's newer version is pending under the same key; one still
        # waiting for a publish retry is dropped instead (``drop_superseded``)
        self.superseded: set[int] = set()
        self._offset_at_trim: int | None = None
        # ids no longer pending and what became of them, for ``lookup`` (status); bounded, in RAM
        self.recent = RecentOutcomes(status_memory)
        self._wire_collaborators()

    def _recovery_fields(self) -> None:
        """The fields recovery fills in (``open``; a changelog restore, restore.py), unset or
        empty until then: the log, scheduler and id index it opens, where the changelog and
        ingress resume, and what it found (``partition.recovered``, the handover)."""
        self.log: CommitLog
        self.sched: Scheduler
        self.ids: IdIndex
        # the next changelog offset whose effect this store does not hold for certain (checkpointed);
        # the changelog's writer (``mirror``) keeps it current
        self.changelog_offset: int | None = None
        # the next ingress offset the changelog holds every record before (1 + the highest source
        # offset of an acknowledged changelog put): where ingress resumes after a restore
        self.changelog_ingress: int | None = None
        self.truncated_bytes = 0
        # seconds of each step of the last open (``partition.recovered``): which one a slow recovery spent
        self.open_steps: dict[str, float] = {}
        # (ref, log position, reason) of dangling entries dropped so far (the first _DANGLING_KEPT)
        self.dangling: list[tuple[int, int, str]] = []
        self.dangling_count = 0
        self.replayed: list[int] = []  # log positions of the records recovery replayed (after the checkpoint)
        # ids of replayed records the restore found in the changelog, the same version as pending
        # (written and acknowledged before the crash): ``remirror_replayed`` need not write them again
        self.in_changelog: set[bytes] = set()
        self.resume_offset: int | None = None  # what open() returned
        self.resume: Resume | None = None  # what open() found the store holds (resume.py)

    def _wire_collaborators(self) -> None:
        """The collaborators, one per job (the module docstring), each given the store, and the
        engine's per-record calls bound to their methods."""
        self.flights = Flights()  # published from the intake, not reported (engine/direct.py)
        self.intake = Intake(self)
        self.outcomes = Outcomes(self)
        self.firings = Firings(self)
        self.restore = Restore(self)
        # the engine's per-record calls, bound to the collaborator's method: no delegating call
        self.ingest_fields = self.intake.ingest_fields
        self.restore_put = self.restore.put
        self.restore_remove = self.restore.remove

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
        below = int(ck["ingress_offset"]) if ck and ck.get("ingress_offset") is not None else None
        stored: set[int] = set()  # the ingress offsets of the records replayed: stored after the checkpoint
        cl = (ck or {}).get("changelog"), (ck or {}).get("changelog_ingress")
        self.changelog_offset, self.changelog_ingress = (None if v is None else int(v) for v in cl)
        self.replayed = []
        for pos, rec in self.log.recover(head, live):
            self.restore.replay(pos, rec)
            self.counters.replayed += 1
            self.replayed.append(pos)
            stored.add(rec.src_offset)
        # resume after what the store holds, and drop what it holds when consumed again (resume.py)
        self.resume = self.flights.reopen((ck or {}).get("direct"), below, stored)
        resume = self.resume.offset()
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
        self.next_offset = self._offset_at_trim = self.resume.held_to()
        self.resume_offset = resume
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

    # -- the engine's calls, each answered by the collaborator whose job it is ------------------
    def ingest(self, m: IngressRecord, now_ms: int) -> None:
        self.ingest_fields(m.topic, m.offset, m.timestamp_ms, m.key, m.value, m.headers, now_ms)

    def ingest_many(self, msgs: list[Any], start: int, now_ms: int, topic: str | None, direct: Any = None) -> int:
        """A run of consumed messages in one C call (``Intake.ingest_many``; ``topic`` None: of
        several ingress topics; ``direct``: the store's DirectPort, engine/direct.py)."""
        return self.intake.ingest_many(msgs, start, now_ms, topic, direct)

    def lookup(self, rid: bytes, now_ms: int | None = None) -> dict[str, Any] | None:
        """What this partition knows of ``rid`` (``delay-sidecar status``), or None (``lookup.status``)."""
        return status(self, rid, now_ms)

    def restore_many(self, msgs: list[Any], start: int, end: int) -> tuple[int, int]:
        """A run of changelog messages in one C call (``Restore.many``)."""
        return self.restore.many(msgs, start, end)

    def remirror_replayed(self) -> int:
        """The replayed records the changelog may have lost, written to it again (``Restore``)."""
        return self.restore.remirror_replayed()

    def covered(self, src_offset: int) -> None:
        """The changelog holds the record of ingress offset ``src_offset`` (and every one before)."""
        if self.changelog_ingress is None or src_offset >= self.changelog_ingress:
            self.changelog_ingress = src_offset + 1

    def settle(self, now_ms: int = -1) -> None:
        """Finish the delivered records in ``acked`` (``Outcomes.settle``)."""
        self.outcomes.settle(now_ms)

    def delivered(self, ref: int, rid_hash: int) -> None:
        self.outcomes.delivered(ref, rid_hash)

    def dead_letter(self, ref: int, rec: Record, reason: str, error: str, attempts: int, now_ms: int) -> None:
        """Publishing failed for good: a DLQ copy, then the original finished (``Outcomes``)."""
        self.outcomes.dead_letter(ref, rec, reason, error, attempts, now_ms)

    def drop_superseded(self, ref: int, rec: Record) -> bool:
        """Finish a superseded handed-out record without publishing it (``Outcomes``)."""
        return self.outcomes.drop_superseded(ref, rec)

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
            # published from the intake, not reported yet: consumed again after a crash (flights.py)
            **self.flights.checkpoint_fields(),
            "log": self.log.state(),
            "sched": self.sched.state(),
            "ids": self.ids.state(),
            "changelog": self.changelog_offset,
            "changelog_ingress": self.changelog_ingress,
        }
        self.dirty = False
        self._pending_at_checkpoint = self.sched.pending()
        dead = self.log.reclaimable()
        return CheckpointJob(self.dir, doc, batch, fsync, dead, [self.log.path_of(i) for i in dead],
                             self.commit_offset())

    def commit_offset(self) -> int | None:
        """The ingress offset a commit may name: ``next_offset``, or below the lowest record
        published from the intake whose delivery is not reported (``Flights.commit_below``)."""
        return self.flights.commit_below(self.next_offset)

    def finish_checkpoint(self, job: CheckpointJob) -> Disposal:
        """Drop what the checkpoint made unnecessary (dead log segments, scheduler files). The
        files are closed and deleted by the returned disposal, which the caller runs on another
        thread (or at once): freeing a 64 MiB segment's blocks took ~55 ms (mapped.Disposal)."""
        self.flights.written(job.doc)  # with ``direct``: engine/direct.py may publish from the intake
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
        self.flights.close()
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
    internal: frozenset[str] = frozenset(), quota: Quota | None = None,
) -> Rules:
    return Rules(
        ingress_topic=ingress_topic, dlq_topic=dlq_topic, levels_ms=levels_ms, max_delay_ms=max_delay_ms,
        retry_ladder=RetryLadder(retry_ladder_ms, max_retries), max_record_bytes=max_record_bytes,
        target_allowlist=tuple(re.compile(p) for p in allowlist), internal_topics=internal, quota=quota,
    )

