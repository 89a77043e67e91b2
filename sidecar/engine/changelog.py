"""The changelog: each store's pending state mirrored to a compacted Kafka topic, and restored
from it when a partition is assigned (Kafka Streams' changelog model, docs/design.md 7.4).

**Topic**: one per ingress topic (each tenant's: ``sidecar/tenants.py``),
``<ingress-topic>.changelog`` (``changelog-topic``), ``cleanup.policy=compact``, as many
partitions as the ingress topic; ingress partition p's store writes and restores changelog
partition p of its topic's changelog (the restorer keys its stores by ``stores.StoreKey``). A
changelog topic that exists with other settings is refused at start.

**Format (version 1)**: key = the record's ``delay.id``; value = the record's commit-log bytes
(``store/codec.py``: self-checking, CRC32C, its own format version byte) — everything a new owner
needs to deliver it exactly as the old one would (committed due time, target topic and
partition, key, value, user headers, source, retry count). A CANCEL record is a pre-cancel (a
cancel whose message has not arrived yet). A tombstone (null value) says nothing is pending under
the id any more: delivered, dead-lettered (the dead letter itself is a put under the same id until
the DLQ has it), cancelled. A replace (``delay.replace``) is a put under the same id. Compaction
keeps the newest value per id, so the topic holds about one record per pending id.

**Writes** (:class:`StoreMirror`, one per store, the store's ``mirror``): a put when a record is
stored (intake, a dead letter, a re-consumed duplicate whose earlier write may have been lost), a
tombstone when it is settled or cancelled. They share the delivery producer (idempotent,
``acks=all``, ordered per partition). The durability order: a checkpoint's ingress offset is
committed only once every changelog write made before the checkpoint was acknowledged
(``acked >= needed``, durability.py). A failed write is sent again and ingress pauses until the
changelog acknowledges again: nothing is committed meanwhile, so nothing is lost.

**Held puts**: the put of a record already due when stored is held back (``held``) and dropped
when the record is settled or cancelled before anything needed it: its tombstone alone is
written (an older version of the id may be in the changelog), or nothing at all for a record
that is its id's only version (``fresh``, at-least-once: one the C intake stored, which takes
only an id with no entry in the id index, so no version of it is pending and any earlier one
was tombstoned before; nothing under the id is in the changelog). At-least-once the held puts are
written, in the order the records were stored, when a checkpoint job's syncs are done (before
its checkpoint file and commit, which wait for them: durability.py; the records delivered
between its snapshot and then need none), before an offset commit outside the jobs
(``wait_acked``) and before the put of a record due later. So a commit never covers a record the changelog lacks,
and every record stored before an acknowledged put is in the changelog or settled: a new owner
that resumes ingress after ``changelog_ingress`` skips nothing pending. A crash loses only held
puts of records whose ingress offsets are not committed: consumed again (delivered again if they
were, which at-least-once allows). Exactly-once holds them until its transaction commits.

**The C path** (``sidecar/native/mirror.c``, with the extension): every write's delivery report
is the store's one ``_native.MirrorReport``, which does ``_acked``'s work in C and hands a
failure to ``_on_delivery``; the puts of a run of the C intake (``put_run``: held or produced),
the tombstones of a settled batch (``remove_run``) and the held puts' flush are produced by C
loops calling the producer's ``produce``. A produce the producer refuses (a full queue, a dead
producer) is handed back and written through ``put`` / ``remove`` / ``_send``, the reference
(``in_c=False``: the Python path throughout, tests/unit/test_changelog_native.py compares them).

**Restore** (:class:`Restorer`): a partition assigned to this instance opens its local store and
reads the changelog from the offset its checkpoint covers (``changelog`` in checkpoint.json; from
the beginning when it has no store) up to the end offset seen when the restore started, applying
puts and tombstones idempotently (``PartitionStore.restore_put`` / ``restore_remove``; a put
under a pending id replaces it only if it is a newer version: a higher source offset; runs of
plain puts, an id the store does not know, in one C call: ``restore_many``). The
partition's ingress is consumed, and its records published, only after that: until then the
store is not in the loop's ``stores`` and the partition is paused (records that arrive anyway
are read again once it is restored: the loop's ``ingest``). Ingress then resumes after the last
record the changelog holds (``changelog_ingress``: one past the highest source offset of an
acknowledged or restored put), never before the group's committed offset: a record consumed
again would be stored again after its delivery. What is consumed twice anyway (its put was lost
with a crash) is recognised by its id and written to the changelog again.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from confluent_kafka import KafkaException

from sidecar import logs
from sidecar.engine.stores import StoreKey, store_key, topic_runs
from sidecar.store.codec import NATIVE, Record, native
from sidecar.store.partition import PartitionStore

log = logs.get("sidecar")

_K = TypeVar("_K", int, StoreKey)  # a partition (its key: stores.StoreKey)

_SRC_OFFSET = struct.Struct("<q")  # a record's source (ingress) offset, at byte 32 (store/codec.py)
_SRC_AT = 32


def _src_of(item: tuple[bytes, bytes]) -> int:
    """A held put's source (ingress) offset."""
    return int(_SRC_OFFSET.unpack_from(item[1], _SRC_AT)[0])


_REFUSED = (BufferError, KafkaException)  # what a C write hands back to the reference path
RESTORE_BATCH = 10_000  # changelog records fetched per consume call
RESTORE_SLICE_S = 0.05  # restore work per loop turn, so owned partitions keep being delivered


class StoreMirror:
    """A store's changelog writer (its ``Mirror``)."""

    __slots__ = ("acked", "active", "failed", "fresh", "held", "holds_due", "in_c", "in_transactions", "kafka",
                 "on_settle", "partition", "produced", "put_run", "remove_run", "report", "retry", "store", "topic")

    def __init__(
        self, kafka: Any, topic: str, store: PartitionStore, in_transactions: bool = False, in_c: bool = NATIVE,
    ) -> None:
        self.kafka = kafka  # KafkaIO: its producer may be replaced
        self.topic = topic
        self.store = store
        self.partition = store.partition
        self.produced = 0
        self.acked = 0
        self.failed = 0  # writes that failed and are not yet acknowledged
        self.retry: list[tuple[bytes, bytes | None]] = []  # failed writes waiting to be sent again
        # exactly-once: the writes are part of the producer's transactions; a record's tombstone
        # is written when it is produced (publishing.py), not when it is settled, and a failed
        # write dooms the transaction instead of being sent again (engine/transactions.py)
        self.in_transactions = in_transactions
        self.on_settle = not in_transactions  # PartitionStore.settle writes the tombstones
        # The puts of records already due when stored, held back (``flush_held``). Such a record
        # is usually delivered and settled before anything needs its put (a backlog: every
        # record is due at once), and then needs none: its tombstone alone is written.
        # Exactly-once: until the open transaction commits; its delivery, its tombstone and the
        # ingress offset commit together, so no committed state ever lacks it. At-least-once:
        # until a checkpoint job's syncs are done (its commit waits for them: durability.py), an offset
        # commit outside the jobs (``wait_acked``), or a put of a record due later (``put``: the
        # changelog keeps the ingress order, see the module docstring). Records due later are
        # written at once: holding them too would make every commit wait for a whole interval's
        # puts (measured, exactly-once: p99 3.4 s at half the rate).
        self.held: dict[bytes, bytes] = {}
        # The ids in ``held`` whose put is their store's only version (module docstring, held
        # puts): settled before the flush, such a record needs neither its put nor a tombstone.
        # A backlog's records then cost the changelog nothing. Exactly-once keeps none.
        self.fresh: set[bytes] = set()
        self.holds_due = True
        self.active = True  # False once the store is dropped: the reports of its purged writes are ignored
        # every write's delivery-report callable: with the extension one C object per mirror,
        # whose success is _acked's work in C (native/mirror.c), its failures _on_delivery's
        # (``in_c`` False: the Python reference throughout, as without the extension)
        self.in_c = in_c
        self.report: Callable[[Any, Any], None] = native.MirrorReport(self) if in_c else self._on_delivery
        # the C batch writes (exactly-once writes its tombstones when produced, through remove)
        self.put_run: Callable[[Any, int, int, int, bool], tuple[int, int]] | None = self._put_run if in_c else None
        fast = in_c and not in_transactions
        self.remove_run: Callable[[list[tuple[int, Record]]], None] | None = self._remove_run if fast else None

    def put(self, rid: bytes, raw: bytes, due_now: bool = False, fresh: bool = False) -> None:
        """Write (or hold, ``due_now``) the put of a stored record; ``fresh``: it is its id's only
        version (the C intake's records: ``fresh``)."""
        held = self.held
        if due_now:
            held[rid] = raw
            if fresh and not self.in_transactions:
                self.fresh.add(rid)
            elif self.fresh:
                self.fresh.discard(rid)  # a later version of the id (a replace, a dead letter, a firing)
            return
        if held:
            held.pop(rid, None)  # an older version held back must not be written after this one
            self.fresh.discard(rid)
            if not self.in_transactions:
                self.flush_held()  # at-least-once: every record stored before this one is written first
        self._send(raw, rid)

    def remove(self, rid: bytes) -> None:
        held = self.held
        if held and held.pop(rid, None) is not None:
            # delivered (or cancelled) before its put was needed: none is written
            fresh = self.fresh
            if fresh and rid in fresh:
                fresh.discard(rid)
                return  # nor a tombstone: nothing under the id is in the changelog
        # the tombstone is written even when the put never was: an older version of the id (one
        # replaced) may be in the changelog
        self._send(None, rid)

    def remove_produced(self, batch: list[tuple[int, Record]], start: int, end: int, superseded: set[int]) -> None:
        """Exactly-once: the tombstones of ``batch[start:end]``, just produced by the C publish path
        in the open transaction (as ``Publishing._produce`` writes each one's); a record replaced
        while it was handed out (its ref in ``superseded``) keeps its id's newer version."""
        for k in range(start, end):
            ref, rec = batch[k]
            if ref not in superseded:
                self.remove(rec.id)

    def _put_run(self, buf: Any, off: int, count: int, now_ms: int, fresh: bool) -> tuple[int, int]:
        """The puts of ``count`` records back to back in ``buf`` from ``off`` (a run of the C
        intake, store/mirroring.py), in C: those due at ``now_ms`` held, the others produced. It
        stops before a record whose produce was refused, or one due later while puts are held
        (the caller writes that one with ``put``). Returns (records taken, the next one's
        offset). ``fresh`` as ``put``'s: only then are held ones marked their id's only version."""
        mark = self.fresh if fresh and not self.in_transactions else None
        done, off, _refused = native.mirror_puts(self.report, self.kafka.producer.produce, buf, off, count, _REFUSED,
                                                 self.held, now_ms, mark)
        return done, off

    def _remove_run(self, acked: list[tuple[int, Record]]) -> None:
        """The tombstones of the settled records ``acked`` ((ref, Record) pairs), produced in C,
        each id's held put dropped as ``remove`` drops it (and none written for a ``fresh`` one)."""
        self._in_c(native.mirror_tombstones, acked, lambda item: self.remove(item[1].id), self.held, self.fresh)

    def _in_c(
        self, write: Callable[..., tuple[int, Any]], items: list[Any], one: Callable[[Any], None],
        held: dict[bytes, bytes] | None, fresh: set[bytes] | None = None,
    ) -> None:
        """``items`` written by ``write`` (``_native.mirror_tombstones`` / ``mirror_writes``,
        given ``held`` and ``fresh``); one whose produce was refused by ``one``, the reference path
        (its retries, its failure), and C goes on after it."""
        i, n = 0, len(items)
        while i < n:
            i, _refused = write(self.report, self.kafka.producer.produce, items, i, _REFUSED, held, fresh)
            if i < n:
                one(items[i])
                i += 1

    def flush_held(self) -> int:
        """Write the held puts: exactly-once, of the records not delivered in this transaction
        (called before the commit sends its offsets: a put is in the transaction that commits
        the ingress offset covering it); at-least-once, once a checkpoint job's syncs are done,
        before an offset commit outside the jobs or a put of a record due later. Returns how many."""
        held = self.held
        if not held:
            return 0
        items = list(held.items())
        held.clear()  # in place: a store's DirectPort holds this dict (engine/direct.py)
        self.fresh.clear()  # written now: a tombstone each from here on
        if self.store.flights.port is not None:
            # records published from the intake were held as they were published, a C run's stored
            # ones after the run: written in ingress order, so that no acknowledged put's source
            # offset (changelog_ingress) passes a record whose put is not acknowledged yet
            items.sort(key=_src_of)
        if self.in_c:
            self._in_c(native.mirror_writes, items, lambda item: self._send(item[1], item[0]), None)
            return len(items)
        for rid, raw in items:
            self._send(raw, rid)
        return len(items)

    def _send(self, value: bytes | None, key: bytes, callback: Any = None) -> None:
        """Write (``callback`` None: a new write, counted in ``produced``; else a write sent again)."""
        producer = self.kafka.producer
        while True:
            try:
                # positional, as in publishing.py: topic, value, key, partition, callback
                producer.produce(self.topic, value, key, self.partition, callback or self.report)
                break
            except BufferError:
                producer.poll(0.01)  # the queue is full: serve reports until there is room
            except KafkaException as e:
                # the producer refuses (dead, fenced): a failed write, sent again by ``resend``
                # once the loop has a new producer (at-least-once), or the transaction's abort
                # (exactly-once)
                if callback is None:
                    self.produced += 1
                if self.active and self.kafka.should_warn(f"changelog:{self.topic}:{self.partition}"):
                    log.warning("changelog.write_failed", partition=self.partition, error=str(e),
                                action="retrying; ingress paused until the changelog accepts writes")
                self.failed += 1
                if not self.in_transactions:
                    self.retry.append((key, value))
                return
        if callback is None:
            self.produced += 1

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is None:
            self._acked(msg)
            return
        if not self.active:
            return
        if self.in_transactions:
            # counted: the loop sees ``failed`` and aborts the transaction (its committed state is
            # restored, and this write is made again from there)
            self.failed += 1
            return
        # Not written: send it again (the producer already retried for message.timeout.ms).
        # Ingress pauses while writes fail (the loop reads ``failed``); nothing is committed.
        if self.failed == 0 or self.kafka.should_warn(f"changelog:{self.topic}:{self.partition}"):
            log.warning("changelog.write_failed", partition=self.partition, error=str(err),
                        action="retrying; ingress paused until the changelog accepts writes")
        self.failed += 1
        self._again(msg)

    def _on_retry(self, err: Any, msg: Any) -> None:
        """The report of a write sent again: ``failed`` counts it until it is acknowledged."""
        if err is None:
            self.failed -= 1
            self._acked(msg)
        else:
            self._again(msg)

    def _again(self, msg: Any) -> None:
        """Keep a failed write for ``resend`` (the loop calls it every second: a refusing broker
        is not hammered), in the order the writes were made."""
        self.retry.append((msg.key(), msg.value()))

    def resend(self) -> None:
        retry, self.retry = self.retry, []
        for key, value in retry:
            self._send(value, key, self._on_retry)

    def _acked(self, msg: Any) -> None:
        """A write acknowledged (the reference of ``_native.MirrorReport``'s success)."""
        self.acked += 1
        off = msg.offset()
        store = self.store
        if store.changelog_offset is None or off >= store.changelog_offset:
            store.changelog_offset = off + 1
        value = msg.value()
        if value is not None:
            store.covered(_SRC_OFFSET.unpack_from(value, _SRC_AT)[0])


def wait_acked(store: PartitionStore, poll: Callable[[float], None], clock: Any, timeout_s: float) -> bool:
    """Wait (at most ``timeout_s``, polling the producer) until every changelog write of ``store``
    is acknowledged: before an offset commit outside the checkpoint jobs (a revoke, a shutdown).
    True when they all are (and without a changelog)."""
    mirror = store.mirror
    if mirror is None:
        return True
    if isinstance(mirror, StoreMirror):
        if not mirror.active:
            return mirror.acked >= mirror.produced  # its writes were purged: no report is coming
        if not mirror.in_transactions:
            mirror.flush_held()  # the commit covers the records whose puts are held back
    deadline = clock.monotonic() + timeout_s
    while mirror.acked < mirror.produced and clock.monotonic() < deadline:
        poll(0.05)
    return mirror.acked >= mirror.produced


@dataclass
class _Restoring:
    store: PartitionStore
    end: int  # the changelog end offset when the restore started
    position: int
    t0: float
    records: int = 0
    bytes: int = 0


def standby_partitions(
    members: list[tuple[str, set[_K]]], me: str, replicas: int, kept: set[_K] | frozenset[_K] = frozenset(),
) -> set[_K]:
    """The partitions this instance keeps warm (Kafka Streams' ``num.standby.replicas``): the
    members in order of their ids form a ring, and each keeps standbys of the partitions the next
    ``replicas`` members own (never its own). Pure: every member computes the same placement from
    the same group description. Of the standbys it keeps now (``kept``), those no member owns stay:
    their owner has just left or died and the group has not given them out yet (dropping the warm
    copy then would turn the failover it exists for into a reopen from disk)."""
    ring = sorted(members)
    ids = [m for m, _parts in ring]
    orphans = set(kept) - set().union(*(parts for _m, parts in ring))
    if me not in ids or replicas <= 0:
        return orphans if replicas > 0 else set()
    i = ids.index(me)
    mine = ring[i][1]
    out: set[_K] = set()
    for k in range(1, min(replicas, len(ring) - 1) + 1):
        out |= ring[(i + k) % len(ring)][1]
    return (out | orphans) - mine


@dataclass
class Restorer:
    """Restores assigned partitions from the changelog, a slice per loop turn; and keeps standby
    stores of partitions other members own tailing it (``standby-replicas``)."""

    kafka: Any  # KafkaIO: the restore consumer
    clock: Any
    restoring: dict[StoreKey, _Restoring] = field(default_factory=dict)
    standby: dict[StoreKey, _Restoring] = field(default_factory=dict)  # never done: end is ignored
    applied: int = 0  # changelog records applied, all restores together

    def begin_standby(self, store: PartitionStore) -> None:
        """Tail the changelog into ``store`` from the offset its checkpoint covers, until told to stop."""
        key = store_key(store)
        low, high = self.kafka.restore.watermarks(key)
        start = store.changelog_offset
        if start is not None and start > high:
            start = None
        r = _Restoring(store, high, low if start is None else max(start, low), time.monotonic())
        self.standby[key] = r
        log.info("standby.started", partition=store.partition, topic=store.topic, from_offset=r.position,
                 end_offset=high)
        self.kafka.restore.assign(key, None if start is None else max(start, low))

    def end_standby(self, partition: StoreKey) -> PartitionStore | None:
        r = self.standby.pop(partition, None)
        if r is None:
            return None
        self.kafka.restore.unassign(partition)
        r.store.changelog_offset = max(r.position, r.store.changelog_offset or 0)
        return r.store

    def standby_lag(self) -> dict[StoreKey, int]:
        """Changelog records a standby has not applied yet, by partition (end as last seen)."""
        return {p: max(0, r.end - r.position) for p, r in self.standby.items()}

    def tail(self, budget_s: float = RESTORE_SLICE_S) -> None:
        """Apply what the standbys' changelog partitions have now, without waiting: batches while
        full ones keep coming, for up to ``budget_s`` (a standby far behind, just placed, caught up
        at one batch per loop turn: 10M records took 2-4 min)."""
        deadline = time.monotonic() + budget_s
        while True:
            msgs = self.kafka.restore.consume(RESTORE_BATCH, 0)
            if msgs:
                self._apply(msgs, self.clock.wall_ms())
            if len(msgs) < RESTORE_BATCH or time.monotonic() >= deadline:
                return

    def remaining(self) -> dict[StoreKey, int]:
        """Records left to restore, by partition (an estimate: offsets, compaction leaves gaps)."""
        return {p: max(0, r.end - r.position) for p, r in self.restoring.items()}

    def begin_many(self, stores: list[PartitionStore]) -> None:
        """``begin`` each store, with the changelog's offsets of all of them asked for at once."""
        marks = self.kafka.restore.watermarks_many([store_key(s) for s in stores]) if stores else {}
        for store in stores:
            self.begin(store, marks[store_key(store)])

    def begin(self, store: PartitionStore, marks: tuple[int, int] | None = None) -> None:
        """Start restoring ``store`` from the offset its checkpoint covers (``marks``: the changelog
        partition's low and high offsets, asked for here if not given)."""
        key = store_key(store)
        low, high = marks if marks is not None else self.kafka.restore.watermarks(key)
        start = store.changelog_offset
        if start is not None and start > high:
            # the changelog is younger than this store's checkpoint (recreated topic): start over
            log.warning("changelog.store_ahead", partition=store.partition, topic=store.topic,
                        checkpoint_offset=start, end_offset=high,
                        action="restoring the whole changelog into the existing store")
            start = None
        r = _Restoring(store, high, low if start is None else max(start, low), time.monotonic())
        self.restoring[key] = r
        log.info("partition.restoring", partition=store.partition, topic=store.topic, from_offset=r.position,
                 to_offset=high, records_estimate=max(0, high - r.position))
        if r.position >= high:
            return
        self.kafka.restore.assign(key, None if start is None else max(start, low))

    def cancel(self, partition: StoreKey) -> PartitionStore | None:
        r = self.restoring.pop(partition, None)
        if r is None:
            return None
        if r.position < r.end:
            self.kafka.restore.unassign(partition)
        return r.store

    def _apply(self, msgs: list[Any], now: int) -> list[StoreKey]:
        """Apply changelog records (of several changelog topics: in runs of one topic, as the C
        restore run tells partitions apart, not topics)."""
        if len(self.kafka.changelogs) <= 1:
            return self._apply_run(msgs, now)
        return [p for _topic, run in topic_runs(msgs) for p in self._apply_run(run, now)]

    def _apply_run(self, msgs: list[Any], now: int) -> list[StoreKey]:
        """Apply changelog records to the restoring and standby stores; return the partitions
        whose restore just completed. Runs of plain puts go through the store's C fast path
        (``restore_many``), each other record through ``restore_put`` / ``restore_remove``."""
        done = []
        i, n = 0, len(msgs)
        while i < n:
            m = msgs[i]
            if m.error() is not None:
                self.kafka.consume_error(m.error())
                i += 1
                continue
            p = self.kafka.restore.key(m)
            r = self.restoring.get(p)
            standby = r is None
            if standby:
                r = self.standby.get(p)
            if r is None or (not standby and m.offset() >= r.end):
                i += 1
                continue
            stop, nbytes = r.store.restore_many(msgs, i, -1 if standby else r.end)
            if stop > i:
                taken = stop - i
                r.records += taken
                r.bytes += nbytes
                self.applied += taken
                last = msgs[stop - 1]
                i = stop
            else:
                key, value = m.key(), m.value()
                if value is None:
                    r.store.restore_remove(key)
                else:
                    r.store.restore_put(key, value, now)
                    r.store.covered(_SRC_OFFSET.unpack_from(value, _SRC_AT)[0])
                    r.bytes += len(value)
                r.records += 1
                self.applied += 1
                last = m
                i += 1
            r.position = last.offset() + 1
            if standby:
                r.end = max(r.end, r.position)
                r.store.changelog_offset = r.position
            elif r.position >= r.end:
                self.kafka.restore.unassign(p)
                done.append(p)
        return done

    def _past_markers(self) -> list[StoreKey]:
        """Restores whose consumer has nothing more to return: done if its position reached the
        end. A transactional changelog (exactly-once) ends with a commit marker, an offset no
        record has: the last record's offset + 1 stays below the end."""
        waiting = [p for p, r in self.restoring.items() if r.position < r.end]
        if not waiting:
            return []
        done = []
        for p, pos in self.kafka.restore.positions(waiting).items():
            r = self.restoring[p]
            if pos > r.position:
                r.position = pos
            if r.position >= r.end:
                self.kafka.restore.unassign(p)
                done.append(p)
        return done

    def step(self, budget_s: float = RESTORE_SLICE_S) -> list[PartitionStore]:
        """Restore for up to ``budget_s``; return the stores whose restore is complete."""
        done = [p for p, r in self.restoring.items() if r.position >= r.end]
        if len(done) < len(self.restoring):
            deadline = time.monotonic() + budget_s
            while time.monotonic() < deadline:
                msgs = self.kafka.restore.consume(RESTORE_BATCH, 0.01)
                if not msgs:
                    done += self._past_markers()
                    break
                done += self._apply(msgs, self.clock.wall_ms())
                if all(r.position >= r.end for r in self.restoring.values()):
                    break
        return self._finish(done)

    def caught_up(self) -> list[PartitionStore]:
        """The stores whose changelog has nothing past their checkpoint (a restart on the same
        node, a standby that was current): done at ``begin``, without a slice of the loop. Joining
        them at the assignment keeps their ingress from being held at its first record and then
        resumed: librdkafka starts fetching a resumed partition only when its broker thread next
        wakes, up to a second later (a second added to some restarts of 0.6 s)."""
        return self._finish([p for p, r in self.restoring.items() if r.position >= r.end])

    def _finish(self, done: list[StoreKey]) -> list[PartitionStore]:
        out = []
        for p in dict.fromkeys(done):
            r = self.restoring.pop(p)
            r.store.changelog_offset = max(r.end, r.store.changelog_offset or 0)
            seconds = time.monotonic() - r.t0
            log.info("partition.restored", partition=p.partition, topic=p.topic, records=r.records, bytes=r.bytes,
                     seconds=round(seconds, 3),
                     pending=sum(r.store.pending().values()))
            out.append(r.store)
        return out

