"""The sidecar's event loop: consume -> store -> schedule -> publish -> checkpoint -> commit.

One thread does everything, batched (docs/design.md 2); librdkafka does its network I/O on its
own threads and releases the GIL. :class:`Sidecar` owns the partitions' stores and sequences a
turn; the work is done by three parts it composes, each in its own module:

- ``kafka_io.KafkaIO``: the clients (made by an injected factory), topics, rebalance callbacks,
  offset commits, broker health;
- ``publishing.Publishing``: due records to the producer, delivery reports, retries, the backlog;
- ``durability.Durability``: checkpoint jobs and the commits behind them, trim, disk space.

A turn (:meth:`Sidecar.turn`):

1. ``consume(num_messages=batch, timeout=...)`` where the timeout is the time to the next due
   record (capped), so an idle loop wakes exactly when something falls due;
2. each record is validated and appended to its partition's store, and scheduled (synchronous:
   after the batch, every consumed offset is in the store), in slices with a publish in between
   when something fell due meanwhile;
3. every partition's scheduler hands out what is due *now* and it is produced; the due time is
   re-checked against a fresh clock reading right before ``produce`` — never early;
4. ``poll(0)`` runs delivery reports;
5. every ``commit-interval``: data -> index -> checkpoint per partition, then the ingress offsets
   the checkpoint covers are committed to Kafka; every 200 ms the stores are trimmed; every second
   disk space, metrics and readiness.

Time comes from an injected :class:`~sidecar.engine.clock.Clock`, the clients from an injected
:class:`~sidecar.engine.kafka_io.Clients` factory: the unit tests run this loop on virtual time
against an in-memory Kafka twin (``tests/kafka_twin.py``).

Shutdown (SIGTERM/SIGINT): stop consuming, wait for in-flight deliveries up to the deadline,
checkpoint, commit, close. Nothing is lost or duplicated by a graceful stop.

Exactly-once (``delivery: exactly-once``, ``transactions.Transactions``): step 5's offset commit is
replaced by a transaction commit every ``transaction-interval`` (the ingress offsets go into it);
a store is opened marked dirty and wiped at its next open unless a clean close (revoke,
shutdown) followed a committed transaction; an aborted transaction, a lost partition or a dead
producer restores every owned partition from the changelog's committed records (``_reset``).
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from sidecar import logs
from sidecar.config import Settings
from sidecar.engine.changelog import Restorer, StoreMirror, standby_partitions
from sidecar.engine.clock import Clock, SystemClock
from sidecar.engine.durability import Durability
from sidecar.engine.history import HistoryWriter
from sidecar.engine.identity import DataDirLock, instance_id
from sidecar.engine.kafka_io import Clients, ConfluentClients, KafkaIO
from sidecar.engine.publishing import Publishing
from sidecar.engine.transactions import TransactionFailed, Transactions, is_dirty, mark_clean, mark_dirty, wipe
from sidecar.engine.turns import SLOW_TURN_S, TurnWatch
from sidecar.levels.scheduler import LevelsScheduler
from sidecar.runtime.threads import HelperThreads
from sidecar.scheduling import Scheduler
from sidecar.store import space
from sidecar.store.idindex import PageRead
from sidecar.store.log import CommitLog
from sidecar.store.mapped import StoreError, page_worker
from sidecar.store.partition import FAST_INTAKE, TRIM_INTERVAL_S, Counters, PartitionStore, compile_rules
from sidecar.store.recent import iso_ms

log = logs.get("sidecar")

INGEST_SLICE = 250  # consumed records stored between two checks for due records
# A turn that starts this long after the previous one ended (the process was stopped, starved or
# swapped out) may belong to a member the group has expelled meanwhile: publishing waits until
# the group confirms this instance still owns its partitions (``_confirm_owner``).
GAP_S = 2.0
STANDBY_REFRESH_S = 10.0  # how often the group is described to place the standbys
UNPROVEN_HOLD_S = 6.0  # with nothing committed yet to prove it: two heartbeat intervals
FAST_RETRY = 32  # records left to the reference path after the C intake took none (PartitionStore.ingest_many)
# A partition whose C intake stopped for an id-table page not in memory (``ingest``, "Page waits")
# is held until the page thread has read the page, this long at most; the loop looks every
# PAGE_WAIT_POLL_S meanwhile.
PAGE_WAIT_S = 1.0
PAGE_WAIT_POLL_S = 0.002
GC_THRESHOLD = (20_000, 20, 20)
LOOKUP_WAIT_S = 1.0  # how long a look-up from an HTTP thread waits for the stores (then 503)
LOOKUP_YIELD_S = 0.0002  # a busy loop pauses this long before taking the stores back from a waiting look-up


def _text(rid: bytes) -> str:
    return rid.decode("utf-8", "backslashreplace")
# The id indexes' steps (IdIndex.step: notice a finished merge pass, cut the next generation),
# this often: a pass's result waits at most this long to be taken.
INDEX_STEP_S = 0.05


def _in_transaction(_store: PartitionStore, _offset: int | None, _sync: bool) -> None:
    """Exactly-once: a checkpoint commits no offset (the transactions carry them)."""


def quiet_gc() -> None:
    """The loop's collector settings. Nothing long-lived is made of per-record Python objects, and
    the hot path makes no reference cycles: move start-up's objects out of the collector's sight
    and let the youngest generation grow before a collection (fewer pauses on the delivery path)."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def make_scheduler_factory(settings: Settings) -> Callable[[Path, CommitLog], Scheduler]:
    if settings.scheduler == "levels":
        return lambda d, lg: LevelsScheduler(d, lg, settings.levels_ms)
    from sidecar.wheel import make_wheel  # type: ignore[attr-defined,unused-ignore]

    return make_wheel(settings)  # type: ignore[no-any-return,unused-ignore]


class Sidecar:
    def __init__(
        self, settings: Settings, metrics: Any = None, health: Any = None, *, clock: Clock | None = None,
        clients: Clients | None = None,
    ) -> None:
        space.check_budget(settings)  # a disk-max-bytes no partition fits in: refused at start (ConfigError)
        self.s = settings
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.counters = Counters()
        self.metrics = metrics
        self.health = health
        self.rules = compile_rules(
            settings.ingress_topic, settings.dlq_topic, settings.levels_ms, settings.max_delay_ms,
            settings.retry_ladder_ms, settings.max_retries, settings.max_record_bytes, settings.target_allowlist,
        )
        self.stores: dict[int, PartitionStore] = {}
        self.make_scheduler = make_scheduler_factory(settings)
        clients = clients if clients is not None else ConfluentClients()
        self.kafka = KafkaIO(settings, clients, self)
        self.pub = Publishing(settings, self.counters, self.stores, self.clock, clients.produce_errors,
                              self.broker_status)
        # exactly-once: the ingress offsets are committed in the transactions, never by the consumer
        self.txn = (Transactions(self.kafka, settings.transaction_interval_ms, self.clock)
                    if settings.exactly_once else None)
        self._reset_wanted = ""  # exactly-once: why the committed state must be restored (next turn)
        self._txn_synced = (0, 0)  # (committed, aborted) already counted in the metrics
        self.durability = Durability(settings, self.stores, self.counters, self.clock,
                                     self.kafka.commit if self.txn is None else _in_transaction,
                                     self._flush_changelog)
        self.restorer = Restorer(self.kafka, self.clock) if settings.changelog_topic_name else None
        # the stores' mapped pages faulted in ahead of their appends and dropped after, off the loop
        # (mapped.PageWorker)
        self.pages = page_worker(demote=settings.helper_threads != "none")
        self.history = (HistoryWriter(self.kafka, settings.history_topic, settings.history_payload, self.clock)
                        if settings.history_topic else None)
        self._history_synced = (0, 0)  # (written, failed) already counted in the metrics
        self.lock = DataDirLock(settings.data_path)
        self.stop_requested = False
        self.paused = False
        self.pause_reason = ""
        self.disk_stalled = ""  # the space.Decision code while delivering cannot lift a disk pause
        self.assigned = False
        self.turns = TurnWatch()
        self._last = Counters()
        self._tiers_seen: set[str] = set()
        self._helpers: HelperThreads | None = None
        self._last_commit = self._last_space = self._last_trim = self._last_stats = 0.0
        self._last_index_step = 0.0
        self._turn_end = 0.0
        self._callbacks_at_turn_end = 0.0
        self._suspect_since: float | None = None  # a gap was seen: ownership not yet confirmed
        self._skip: dict[int, int] = {}  # partition -> ingress offsets below this are already stored
        # partition (restoring) -> the first ingress offset consumed while it had no store: read
        # again from there once it is restored (see ``ingest``)
        self._refetch: dict[int, int] = {}
        # partition -> (first ingress offset not stored, the page read asked for, since): "Page waits"
        self._page_waits: dict[int, tuple[int, PageRead, float]] = {}
        self.page_waits = 0  # partitions held for an id-table page so far
        self._restored_synced = 0  # restored records already counted in the metrics
        self._group: Any = None  # a pending describe of the group (standby placement)
        self._last_group = -STANDBY_REFRESH_S
        # The stores belong to the loop thread; a look-up (``lookup``, on an HTTP thread) reads
        # them holding this lock, which the loop holds for each turn except while it waits in
        # ``consume`` (see ``lookup``). Reentrant: the rebalance callbacks run inside ``consume``
        # (they take it) and inside ``close`` at shutdown (which holds it already).
        self.store_lock = threading.RLock()
        self._lookup_waiting = False

    # -- Kafka I/O events -----------------------------------------------------------------------
    def partitions_assigned(self, partitions: list[int]) -> dict[int, int | None]:
        """Open (recover) each partition's store; its checkpoint names the offset to resume at."""
        with self.store_lock:
            return self._partitions_assigned(partitions)

    def _partitions_assigned(self, partitions: list[int]) -> dict[int, int | None]:
        resume: dict[int, int | None] = {}
        restore: list[PartitionStore] = []  # restored from the changelog (their offsets asked for at once)
        for partition in partitions:
            warm = self.restorer.end_standby(partition) if self.restorer is not None else None
            if warm is not None:
                # a standby of this partition: its store is current up to the last seconds
                assert self.kafka.changelog_topic is not None
                warm.mirror = StoreMirror(self.kafka, self.kafka.changelog_topic, warm, self.txn is not None)
                warm.history = self.history
                resume[partition] = None
                log.info("standby.promoted", partition=partition, changelog_offset=warm.changelog_offset)
                restore.append(warm)
                continue
            store = self._store(partition)
            t0 = time.monotonic()
            resume[partition] = offset = self._open(store)
            log.info(
                "partition.recovered", partition=partition, resume_offset=offset, pending=store.pending(),
                truncated_bytes=store.truncated_bytes, dangling=len(getattr(store, "dangling", ())),
                seconds=round(time.monotonic() - t0, 3), steps=store.open_steps,
            )
            if self.restorer is None:
                self.stores[partition] = store
                continue
            # With the changelog, the store first catches up with it (another instance may have
            # owned the partition since), and ingress resumes at the group's committed offset:
            # every record before it is in the changelog (the commit waited for that).
            assert self.kafka.changelog_topic is not None
            store.mirror = StoreMirror(self.kafka, self.kafka.changelog_topic, store, self.txn is not None)
            resume[partition] = None
            restore.append(store)
        if self.restorer is not None:
            self.restorer.begin_many(restore)
        self.assigned = bool(self.stores) or bool(self.held())
        log.info("partitions.assigned", partitions=partitions)
        self._readiness()
        # disk-max-bytes against what the partitions now assigned need: refused (paused, not ready,
        # ingress.stalled) before anything is consumed, or a warning if their files can outgrow it
        note = space.budget_note(self.s, len(self._all_stores()))
        if note is not None:
            log.warning("disk.budget_may_stall", **note)
        self._check_space()
        return resume

    def _store(self, partition: int, standby: bool = False) -> PartitionStore:
        store = PartitionStore(
            self.s.data_path, self.s.ingress_topic, partition, rules=self.rules, scheduler_name=self.s.scheduler,
            make_scheduler=self.make_scheduler, segment_bytes=self.s.segment_bytes,
            cancel_horizon_ms=self.s.cancel_horizon_ms, counters=self.counters, durable=self.s.fsync != "none",
            status_memory=self.s.status_memory, pages=self.pages,
        )
        if not standby:
            store.history = self.history  # a standby applies the changelog: no state change of its own
        return store

    def _open(self, store: PartitionStore) -> int | None:
        """Open (recover) ``store``. One not closed cleanly after a committed transaction
        (exactly-once: marked dirty) may hold deliveries Kafka never committed: it is wiped
        first and restored from the changelog's committed records."""
        if is_dirty(store.dir):
            if self.restorer is None:
                raise StoreError(
                    f"{store.dir}: this store was used with --delivery exactly-once and not closed cleanly; only "
                    "the changelog's committed records can restore it: run with --changelog on")
            log.info("store.wiped", partition=store.partition,
                     reason="not closed after a committed transaction (exactly-once)")
            wipe(store.dir)
        if self.txn is not None:
            mark_dirty(store.dir)
        return store.open()

    def held(self) -> set[int]:
        """Assigned partitions whose ingress waits: their stores are still restoring."""
        return set() if self.restorer is None else set(self.restorer.restoring)

    def kept_paused(self) -> set[int]:
        """Assigned partitions that stay paused when ingress resumes: the restoring ones, and those
        waiting for an id-table page."""
        return self.held() | set(self._page_waits)

    def _drop_restoring(self, partitions: list[int]) -> None:
        """A restoring partition that goes away: its store keeps what it restored (uncommitted)."""
        for partition in partitions:
            self._skip.pop(partition, None)
            self._refetch.pop(partition, None)
            self._page_waits.pop(partition, None)
        if self.restorer is None:
            return
        for partition in partitions:
            store = self.restorer.cancel(partition)
            if store is not None:
                self.durability.close_uncommitted(store)

    def partitions_revoked(self, partitions: list[int]) -> None:
        """Finish what is in flight, then checkpoint, commit and close each revoked store: from
        here on this instance publishes nothing of these partitions (the delivery reports of a
        store that left ``stores`` are dropped), before the new owner is assigned them."""
        with self.store_lock:
            self._partitions_revoked(partitions)

    def _partitions_revoked(self, partitions: list[int]) -> None:
        self.pub.drain(deadline=self.clock.monotonic() + self.s.shutdown_timeout_ms / 1000)
        self._drop_restoring(partitions)
        if self.txn is not None:
            self._revoked_in_transactions(partitions)
            return
        for partition in partitions:
            store = self.stores.pop(partition, None)
            if store is not None:
                self.durability.checkpoint_now(store, sync=True)
                store.close()
        self.assigned = bool(self.stores) or bool(self.held())
        log.info("partitions.revoked", partitions=partitions)
        self._readiness()

    def _revoked_in_transactions(self, partitions: list[int]) -> None:
        """Exactly-once revoke: commit the transaction (it holds the revoked partitions' last
        deliveries and offsets), then close their stores clean; if it aborts, they close dirty
        (their next owner restores the committed state) and the rest are restored next turn."""
        why = self._commit() if self.txn is not None and self.txn.open else "no transaction open"
        for partition in partitions:
            store = self.stores.pop(partition, None)
            if store is None:
                continue
            if why:
                self._discard(store)
            else:
                self.durability.checkpoint_now(store, sync=True)
                store.close()
                mark_clean(store.dir)
        if why and self.stores:
            self._reset_wanted = why
        self.assigned = bool(self.stores) or bool(self.held())
        log.info("partitions.revoked", partitions=partitions, committed=not why)
        self._readiness()

    def _discard(self, store: PartitionStore) -> None:
        """Exactly-once: close a store whose state may run ahead of the committed transactions,
        dirty (wiped when opened again); the reports of its purged changelog writes are ignored."""
        if self.txn is not None and isinstance(store.mirror, StoreMirror):
            store.mirror.active = False
        self.durability.close_uncommitted(store)

    def partitions_lost(self, partitions: list[int]) -> None:
        """The group moved on without us: close the stores, commit nothing (not ours any more)."""
        with self.store_lock:
            self._partitions_lost(partitions)

    def _partitions_lost(self, partitions: list[int]) -> None:
        self._drop_restoring(partitions)
        for partition in partitions:
            store = self.stores.pop(partition, None)
            if store is not None:
                self._discard(store)
        if self.txn is not None and self.stores:
            # the open transaction holds records of partitions no longer ours: it cannot commit
            self._reset_wanted = "partitions lost"
        self.assigned = bool(self.stores) or bool(self.held())
        log.warning("partitions.lost", partitions=partitions)
        self._readiness()

    def broker_status(self, up: bool, source: str) -> None:
        st = self.pub.state
        if up == st.broker_up:
            return
        st.broker_up = up
        if up:
            log.info("broker.reachable", source=source)
        else:
            log.warning("broker.unreachable", source=source)
        self._readiness()

    def statistics(self, stats_json: str) -> None:
        if self.metrics is not None:
            self.metrics.update_from_stats(stats_json)

    def _readiness(self) -> None:
        if self.health is not None:
            self.health.set_assigned(self.assigned)
            self.health.set_broker_reachable(self.pub.state.broker_up)

    # -- main loop ------------------------------------------------------------------------------
    def start(self) -> None:
        """Create the topics and the clients and join the group; the collector and the helper
        threads are set for the loop thread."""
        self.s.data_path.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        if not self.s.group_instance_id:
            self.s.group_instance_id = instance_id(self.s.data_path)
        self.kafka.start()
        self.pub.producer = self.kafka.producer
        if self.txn is not None:
            self.txn.start()
            self.pub.topic_exists = self.kafka.topic_exists
        if self.health is not None:
            self.health.set_recovered(True)
        quiet_gc()
        self.turns.install()
        # This thread is the loop: the clients' and the flusher's threads must not preempt it.
        self._helpers = HelperThreads(enabled=self.s.helper_threads == "all")
        self._helpers.demote()
        log.info("sidecar.started", config=self.s.masked(), pid=os.getpid())
        self._last_commit = self._last_space = self._last_trim = self._last_stats = self.clock.monotonic()

    def run(self) -> int:
        self.start()
        try:
            while not self.stop_requested:
                self.turn()
        finally:
            self.shutdown()
        return 0

    def turn(self) -> None:
        """One turn of the loop (see the module docstring): the wait for records outside the
        store lock, the rest inside it."""
        clock = time.perf_counter
        t0 = clock()
        with self.store_lock:
            now = self.clock.wall_ms()
            # a restore in progress must not wait for ingress: its slices run once per turn
            timeout = 0.0 if self.restorer is not None and self.restorer.restoring else self.pub.wait_s(now)
            if self.txn is not None:
                timeout = min(timeout, self.txn.wait_s(self.clock.monotonic()))
            if self._page_waits:
                timeout = min(timeout, PAGE_WAIT_POLL_S)
        tw = clock()
        if not self.paused:
            msgs = self.kafka.consume(self.s.batch_size, timeout)
        else:
            # Paused partitions return nothing, but the call keeps group membership alive
            # and anything it does return (a partition assigned mid-pause) must be ingested.
            msgs = self.kafka.consume(self.s.batch_size, 0)
            if not msgs:
                self.clock.sleep(timeout)
        t = clock()
        self.turns.woke(t - tw, timeout, t)
        if self._lookup_waiting:
            # a busy loop would take the lock back before the woken look-up thread gets to it
            self._lookup_waiting = False
            time.sleep(LOOKUP_YIELD_S)
        with self.store_lock:
            self._work(t0, msgs)

    def _work(self, t0: float, msgs: list[Any]) -> None:
        """The turn after ``consume``: ingest, publish, poll, checkpoint, housekeeping."""
        clock, turns = time.perf_counter, self.turns
        t1 = clock()
        turns.mark()  # also counts the turn
        if self.txn is not None and self._must_reset():
            msgs = []  # consumed again from the committed offsets
        if self._page_waits:
            self._page_waits_step()
        if msgs:
            # In slices, publishing in between whatever fell due meanwhile: a full batch
            # takes tens of ms to store, and due records must not wait behind it.
            for i in range(0, len(msgs), INGEST_SLICE):
                self.ingest(msgs[i : i + INGEST_SLICE])
                if i + INGEST_SLICE < len(msgs) and self.pub.due_now():
                    self.pub.publish()
        if self.kafka.consumer_fatal:
            self._replace_consumer()
        if self.restorer is not None:
            if self.restorer.restoring:
                self._restore_step()
            if self.s.standby_replicas:
                self._standbys()
        t2 = clock()
        if self._confirm_owner():
            self.pub.publish()
        self.pub.poll(0)
        if self.pub.producer_fatal:
            fatal = self.pub.producer_fatal
            self.kafka.replace_producer(fatal)
            self.pub.producer, self.pub.producer_fatal = self.kafka.producer, ""
            if self.txn is not None:
                self.txn.start()
                self._reset(f"producer replaced: {fatal}", aborted=True)
        if self.txn is not None and self.txn.due(self.clock.monotonic()):
            why = self._commit()
            if why:
                self._reset(why, aborted=True)
        t3 = clock()
        dur, parts = self.durability, turns.parts  # the checkpoint phase's steps, for a slow turn
        if dur.jobs:
            dur.reap()
            parts[0] = clock() - t3
        mono = self.clock.monotonic()
        if mono - self._last_commit >= self.s.commit_interval_ms / 1000:
            t = clock()
            dur.checkpoint_all()
            self._last_commit = mono
            parts[1] = clock() - t
        if mono - self._last_index_step >= INDEX_STEP_S:
            # the id indexes' merge passes: noticed when done, started when due (IdIndex.step)
            t = clock()
            now = self.clock.wall_ms()
            for store in self.stores.values():
                store.index_step(now)
            self._last_index_step = mono
            parts[2] = clock() - t
        if mono - self._last_trim >= TRIM_INTERVAL_S:
            t = clock()
            dur.trim(mono)
            if self.restorer is not None:
                for r in (*self.restorer.restoring.values(), *self.restorer.standby.values()):
                    r.store.trim()
            self._last_trim = mono
            parts[3] = clock() - t
        t4 = clock()
        if mono - self._last_space >= 1.0:
            if self._helpers is not None:
                self._helpers.demote()  # librdkafka starts a thread per broker it connects to
            self._check_space()
            if self.metrics is not None:
                self._sync_metrics(self._pending())
            self._last_space = mono
        if mono - self._last_stats >= self.s.stats_interval_ms / 1000:
            self._stats()
            self._last_stats = mono
        if self.health is not None:
            self.health.beat(mono)
        t5 = clock()
        # The wait inside consume (up to the next due time) is not work: a turn is slow
        # when everything after it took longer than SLOW_TURN_S.
        if t5 - t1 > SLOW_TURN_S:
            turns.slow(t0, t1, t2, t3, t4, t5, len(msgs), self.pub.in_flight)
        self._turn_end = self.clock.monotonic()
        self._callbacks_at_turn_end = self.kafka.callback_s

    def _confirm_owner(self) -> bool:
        """One owner per partition: after a gap between turns (see GAP_S) publish nothing until
        the group confirms this member (a synchronous commit of the last committed offsets), or
        rebalances the partitions away (the consume calls meanwhile run the revoke/lost
        callbacks). A zombie — stopped past its session, then resumed — thus never publishes a
        record of a partition its successor owns."""
        mono = self.clock.monotonic()
        if self._suspect_since is None:
            if not self._turn_end or mono - self._turn_end < GAP_S:
                return True
            self._suspect_since = mono
            gap = mono - self._turn_end
            # the time this process spent in its own rebalance callbacks (opening, restoring and
            # handing over stores) is work, not a stop: confirmed all the same, but no warning
            own = self.kafka.callback_s - self._callbacks_at_turn_end
            (log.info if gap - own < GAP_S else log.warning)(
                "loop.gap", seconds=round(gap, 1), in_rebalance_callbacks=round(own, 1),
                action="confirming group membership before publishing")
        proof = self.kafka.prove_membership(list(self.stores))
        if proof or (proof is None and mono - self._suspect_since >= UNPROVEN_HOLD_S) or not self.stores:
            self._suspect_since = None
            return True
        return False

    # -- exactly-once ---------------------------------------------------------------------------
    def _must_reset(self) -> bool:
        """Restore the committed state now if the open transaction cannot commit (a failed
        delivery or changelog write, a lost partition, an abort in a rebalance callback)."""
        why = self._reset_wanted or self.pub.doomed
        if not why:
            failed = sum(s.mirror.failed for s in self.stores.values() if isinstance(s.mirror, StoreMirror))
            why = f"{failed} changelog writes failed" if failed else ""
        if not why:
            return False
        self._reset(why, aborted=False)
        return True

    def _commit(self, begin: bool = True) -> str:
        """Commit the open transaction with the owned partitions' ingress offsets; "" when it
        committed, else why it aborted (a dead producer replaced and registered again)."""
        txn = self.txn
        assert txn is not None
        if self.pub.doomed:
            return self.pub.doomed
        for store in self.stores.values():  # the puts held back (StoreMirror.held), before the offsets
            if isinstance(store.mirror, StoreMirror):
                store.mirror.flush_held()
        offsets = self.kafka.offsets_of(list(self.stores.values()))
        try:
            txn.commit(offsets, self.kafka.group_metadata() if offsets else None, begin)
        except TransactionFailed as e:
            if e.fatal:
                self.kafka.replace_producer(e.reason)
                self.pub.producer = self.kafka.producer
                txn.start()
            return e.reason
        for tp in offsets:
            self.kafka.committed[tp.partition] = tp.offset
        self.pub.poll(0)  # settle what the commit's flush reported
        return ""

    def _reset(self, why: str, aborted: bool) -> None:
        """Exactly-once: the open transaction cannot commit (``aborted``: it was aborted
        already). Abort it, drop every owned and restoring store (dirty: wiped), restore them
        from the changelog's committed records, and consume their ingress again from the
        group's committed offsets. Nothing the aborted transaction held was visible to a
        ``read_committed`` reader; all of it is done again."""
        txn = self.txn
        assert txn is not None
        self._reset_wanted = ""
        partitions = sorted(set(self.stores) | self.held())
        log.error("transaction.aborted", reason=why, partitions=partitions,
                  action="restoring the partitions' committed state from the changelog")
        self._drop_restoring(list(self.held()))
        self._page_waits.clear()  # consumed again from the committed offsets (rewind, below)
        for partition in list(self.stores):
            self._skip.pop(partition, None)
            self._discard(self.stores.pop(partition))
        self.pub.forget()
        if not aborted:  # (a failed commit aborted, or registered a new producer, and began anew)
            try:
                txn.abort()
            except TransactionFailed as e:
                self.kafka.replace_producer(e.reason)
                self.pub.producer = self.kafka.producer
                txn.start()
        self.pub.poll(0)  # the purged records' reports: their stores are gone, only counted down
        if partitions:
            self._partitions_assigned(partitions)
            self.kafka.rewind(partitions)

    def ingest(self, msgs: list[Any]) -> None:
        if self._skip:
            msgs = self._skip_restored(msgs)
        now = self.clock.wall_ms()
        stores = self.stores
        topic = self.s.ingress_topic
        last_partition, store = -1, None
        i, n = 0, len(msgs)
        fast_at = 0 if FAST_INTAKE else n  # where to try the C fast path next
        while i < n:
            if store is not None and i >= fast_at:
                # the common records in one C call; it stops at the first other one (the path below)
                j = store.ingest_many(msgs, i, now, topic)
                # none taken: a run of other records (cancels, late ones...), so the fast path's
                # setup is not paid for each of them
                fast_at = j + (FAST_RETRY if j == i else 0)
                i = j
                if i >= n:
                    break
                if store.page_read is not None:  # stopped for an id-table page: "Page waits"
                    self._page_wait(store, msgs[i].offset())
                    store = None
            m = msgs[i]
            i += 1
            err = m.error()
            if err is not None:
                self.kafka.consume_error(err)
                continue
            partition: int = m.partition()
            if partition != last_partition:
                last_partition = partition
                store = None if partition in self._page_waits else stores.get(partition)
            if store is None:
                # Revoked in between: the new owner consumes it. Or assigned and still restoring
                # (the assign callback does not pause it: kafka_io._assign): paused now, and
                # consumed again from its first such record once restored. Dropped, it would
                # never be stored.
                if self.restorer is not None and partition in self.restorer.restoring \
                        and partition not in self._refetch:
                    self._refetch[partition] = m.offset()
                    self.kafka.hold(partition)
                continue
            ts_type, ts = m.timestamp()
            store.ingest_fields(topic, m.offset(), ts if ts_type else now, m.key(), m.value(), m.headers(), now)
            if store.page_read is not None:  # a cancel's look-up stopped for an id-table page
                self._page_wait(store, m.offset())
                store = None

    def _page_wait(self, store: PartitionStore, offset: int) -> None:
        """Page waits. The C intake (or a cancel's look-up, ``PartitionStore.ingest_fields``)
        stopped before the record at ``offset``: its id's duplicate check (or look-up) has to read
        a slot of the id table whose page the kernel evicted, and the loop would
        wait for the disk (50-135 ms behind the merge passes' writeback in the 100M ``scale``
        bench scenario on six partitions), every other
        partition's deliveries with it. So the page is read on the page thread
        (``IdIndex.read_page``) and the partition is paused from that record on: its records still
        in this batch are skipped and consumed again from ``offset`` once the page is in memory
        (``_page_waits_step``), in order, so nothing is stored twice or out of order. The
        checkpoint covers only what was stored, so a crash meanwhile consumes them again too."""
        read = store.page_read
        assert read is not None
        store.page_read = None
        self._page_waits[store.partition] = (offset, read, self.clock.monotonic())
        self.page_waits += 1
        self.kafka.hold(store.partition)

    def _page_waits_step(self) -> None:
        """Consume again each partition whose page was read, or that waited ``PAGE_WAIT_S``
        (then its next intake reads the slot wherever it is: the loop waits, but moves on)."""
        mono = self.clock.monotonic()
        for partition, (offset, read, since) in list(self._page_waits.items()):
            if not read.done and mono - since < PAGE_WAIT_S:
                continue
            del self._page_waits[partition]
            store = self.stores.get(partition)
            if store is None:
                continue
            if not read.done:
                store.page_read_skip = True
            try:
                self.kafka.seek(partition, offset)
            except KafkaException as e:  # not expected: it is assigned and being fetched
                log.error("ingress.seek_failed", partition=partition, offset=offset, error=str(e))
            self.kafka.release(partition)

    def _restore_step(self) -> None:
        """A slice of changelog restore; a restored store joins the loop and its ingress resumes."""
        assert self.restorer is not None
        for store in self.restorer.step():
            store.dirty = True  # its next checkpoint records the changelog offset it now covers
            self.stores[store.partition] = store
            store.remirror_replayed()
            # at once, not at the next commit interval: in a crash loop faster than that interval
            # every start would otherwise restore the same (and a growing) changelog tail again
            self.durability.checkpoint_soon(store)
            # Ingress resumes at the group's committed offset, which may be older than what this
            # store holds: the records the changelog has, and those this store recovered locally
            # (written to the changelog again just now), are skipped when consumed again.
            held = [o for o in (store.changelog_ingress, store.resume_offset) if o is not None]
            end = self.kafka.ingress_end(store.partition) if held else None
            if held and end is not None and max(held) > end:
                # the store names ingress offsets this topic never had (recreated?): skipping
                # would drop new records, so nothing is skipped (duplicates by id are recognised)
                log.warning("changelog.ingress_ahead", partition=store.partition, held_until=max(held),
                            ingress_end=end, action="consuming from the committed offset without skipping")
            elif held:
                self._skip[store.partition] = max(held)
            again = self._refetch.pop(store.partition, None)
            if again is not None:
                # the usual way now: a restoring partition is held at its first record (kafka_io._assign)
                log.info("ingress.consumed_while_restoring", partition=store.partition, offset=again,
                         action="consuming it again from that offset")
                try:
                    self.kafka.seek(store.partition, again)
                except KafkaException as e:  # not expected: it was being fetched
                    log.error("ingress.seek_failed", partition=store.partition, offset=again, error=str(e))
            self.kafka.release(store.partition)
        self.assigned = bool(self.stores) or bool(self.held())
        self._readiness()

    def _standbys(self) -> None:
        """Keep the standby stores tailing the changelog, and every STANDBY_REFRESH_S place them
        again from a description of the group (changelog.standby_partitions)."""
        restorer = self.restorer
        assert restorer is not None
        if restorer.standby:
            restorer.tail()
        mono = self.clock.monotonic()
        if self._group is None:
            if mono - self._last_group >= STANDBY_REFRESH_S:
                self._last_group = mono
                self._group = self.kafka.describe_group()
            return
        if not self._group.done():
            return
        fut, self._group = self._group, None
        try:
            members = fut.result()
        except Exception as e:  # the admin request failed: placed again at the next refresh
            log.warning("standby.placement_failed", error=str(e))
            return
        me = self.s.group_instance_id or ""
        want = (standby_partitions(members, me, self.s.standby_replicas, set(restorer.standby))
                - set(self.stores) - self.held())
        for partition in set(restorer.standby) - want:
            store = restorer.end_standby(partition)
            if store is not None:
                self.durability.close_uncommitted(store)
                log.info("standby.stopped", partition=partition)
        for partition in sorted(want - set(restorer.standby)):
            store = self._store(partition, standby=True)
            self._open(store)
            restorer.begin_standby(store)

    def _flush_changelog(self, store: PartitionStore) -> bool:
        """Wait (a bounded time) until every changelog write of ``store`` is acknowledged: before
        an offset commit outside the checkpoint jobs (a revoke, a shutdown)."""
        mirror = store.mirror
        if mirror is None:
            return True
        if isinstance(mirror, StoreMirror) and not mirror.active:
            return mirror.acked >= mirror.produced  # its writes were purged: no report is coming
        deadline = self.clock.monotonic() + min(self.s.shutdown_timeout_ms / 1000, 30.0)
        while mirror.acked < mirror.produced and self.clock.monotonic() < deadline:
            self.pub.poll(0.05)
        return mirror.acked >= mirror.produced

    def _drop_standbys(self) -> None:
        if self.restorer is None:
            return
        for partition in list(self.restorer.standby):
            store = self.restorer.end_standby(partition)
            if store is not None:
                self.durability.close_uncommitted(store)

    def _skip_restored(self, msgs: list[Any]) -> list[Any]:
        """Drop the records a restore already brought in (see ``_restore_step``); a partition's
        skip ends at its first record past it."""
        skip, out = self._skip, []
        for m in msgs:
            below = skip.get(m.partition()) if m.error() is None else None
            if below is not None:
                if m.offset() < below:
                    continue
                del skip[m.partition()]
            out.append(m)
        return out

    def _replace_consumer(self) -> None:
        """A fatal consumer error (librdkafka: e.g. a static member fenced after its session
        expired during a broker outage) leaves a consumer that can never fetch or commit again.
        Finish what is in flight, checkpoint and close every partition (nothing is lost: the new
        consumer resumes from the checkpoints), drop the old consumer and join with a new one."""
        log.error("consumer.fatal", error=self.kafka.consumer_fatal, action="rejoining with a new consumer")
        self.kafka.consumer_fatal = ""
        self.pub.drain(deadline=self.clock.monotonic() + min(self.s.shutdown_timeout_ms / 1000, 10.0))
        self._drop_restoring(list(self.held()))
        stores = list(self.stores.values())
        self.stores.clear()
        for store in stores:
            self._discard(store)  # no offset commit: the consumer is fenced
        if self.txn is not None:
            self.pub.forget()
            if self.txn.open:
                try:
                    self.txn.abort()  # it holds deliveries of partitions this member may not own now
                except TransactionFailed as e:
                    self.kafka.replace_producer(e.reason)
                    self.pub.producer = self.kafka.producer
                    self.txn.start()
        self.assigned = False
        self._readiness()
        self.kafka.replace_consumer()

    # -- housekeeping ---------------------------------------------------------------------------
    def _all_stores(self) -> list[PartitionStore]:
        """The open stores and the ones still restoring from the changelog."""
        restoring = [] if self.restorer is None else [r.store for r in self.restorer.restoring.values()]
        return [*self.stores.values(), *restoring]

    def _check_space(self) -> None:
        """Pause or resume ingress for disk space (``durability.space_check``) or for refused
        changelog writes (sent again here, once a second). A pause that deliveries (or retries)
        will lift is backpressure (info); one delivering cannot lift is a stall: an error event
        with the fix, and ``/readyz`` says so until it clears."""
        use, d = self.durability.space_check(self._all_stores())
        mirrors = [m for m in (s.mirror for s in self.stores.values()) if isinstance(m, StoreMirror)]
        for m in mirrors:
            if m.retry:
                m.resend()
        failing = sum(m.failed for m in mirrors)
        if failing and not d.paused:
            d = space.Decision(True, False, "changelog-refused",
                               f"{failing} changelog writes were refused and are being retried")
        if d.paused and not self.paused:
            self.kafka.pause()
            self.paused = True
            log.info("ingress.paused", code=d.code, reason=d.reason)
        elif not d.paused and self.paused:
            self.kafka.resume()
            self.paused = False
            log.info("ingress.resumed")
        self.pause_reason = d.reason
        stalled = d.code if d.stalled else ""
        if stalled != self.disk_stalled:
            if stalled:
                log.error("ingress.stalled", code=d.code, reason=d.reason, fix=d.fix, store_bytes=use.allocated,
                          freeable_bytes=use.freeable, partitions=len(self._all_stores()))
            else:
                log.info("ingress.stall_cleared", code=self.disk_stalled, paused=self.paused)
            self.disk_stalled = stalled
            if self.health is not None:
                self.health.set_disk_stalled(stalled, d.reason, d.fix)
        if self.metrics is not None:
            self.metrics.set_store_bytes(use.allocated, use.apparent)
            self.metrics.set_ingress_paused(self.paused, d.code)

    def _pending(self) -> dict[str, int]:
        pending = dict.fromkeys(self._tiers_seen, 0)
        for store in self.stores.values():
            for tier, n in store.pending().items():
                pending[tier] = pending.get(tier, 0) + n
        self._tiers_seen.update(pending)
        return pending

    def _stats(self) -> None:
        pending = {t: n for t, n in self._pending().items() if n}
        k = self.counters
        turn_count, slow_turns, slowest_turn_ms = self.turns.take()
        late_wakes, latest_wake_ms = self.turns.take_wakes()
        log.info(
            "stats", ingested=k.ingested, scheduled=k.scheduled, delivered=k.delivered, cancelled=k.cancelled,
            duplicates=k.duplicates, replaced=k.replaced, dlq=sum(k.dlq.values()),
            dlq_by_reason={r: n for r, n in k.dlq.items() if n},
            pending=sum(pending.values()), pending_by_tier=pending, in_flight=self.pub.in_flight,
            retry_queue=len(self.pub.retries), early=k.early, paused=self.paused, turns=turn_count,
            slow_turns=slow_turns, slowest_turn_ms=slowest_turn_ms, late_wakes=late_wakes,
            latest_wake_ms=latest_wake_ms, page_waits=self.page_waits,
            **({"transactions_committed": self.txn.committed, "transactions_aborted": self.txn.aborted}
               if self.txn is not None else {}),
            **({"standby_lag": {str(p): n for p, n in self._standby_lag().items()}}
               if self.restorer is not None and self.restorer.standby else {}),
        )

    def _standby_lag(self) -> dict[int, int]:
        """Changelog records each standby store has not applied yet: against the end offset the
        restore consumer last saw, or before its first fetch (no end cached yet: the lag read 0
        while the whole changelog was still to come) the one the standby started with."""
        assert self.restorer is not None
        return {p: max(0, max(self.kafka.changelog_end(p) or 0, r.end) - r.position)
                for p, r in self.restorer.standby.items()}

    def _sync_metrics(self, pending: dict[str, int]) -> None:
        """Push counter deltas since the last sync (the hot path only bumps plain integers)."""
        m, k, last = self.metrics, self.counters, self._last
        m.ingested(k.ingested - last.ingested)
        m.scheduled(k.scheduled - last.scheduled)
        m.delivered(k.delivered - last.delivered)
        m.cancelled(k.cancelled - last.cancelled)
        m.duplicates(k.duplicates - last.duplicates)
        m.replaced(k.replaced - last.replaced)
        m.publish_retries(k.publish_retries - last.publish_retries)
        m.dead_lettered_by_reason({r: n - last.dlq.get(r, 0) for r, n in k.dlq.items()})
        if self.restorer is not None:
            mirrors = {p: s.mirror for p, s in self.stores.items() if isinstance(s.mirror, StoreMirror)}
            m.set_changelog({p: x.produced - x.acked for p, x in mirrors.items()},
                            {p: x.failed for p, x in mirrors.items()}, self.restorer.remaining())
            m.restored(self.restorer.applied - self._restored_synced)
            m.set_standby_lag(self._standby_lag())
            self._restored_synced = self.restorer.applied
        if self.txn is not None:
            t = self.txn
            m.transactions(t.committed - self._txn_synced[0], t.aborted - self._txn_synced[1], t.commit_s)
            t.commit_s = []
            self._txn_synced = (t.committed, t.aborted)
        if self.history is not None:
            hw, hf = self.history.written, self.history.failed
            m.history(hw - self._history_synced[0], hf - self._history_synced[1])
            self._history_synced = (hw, hf)
        st = self.pub.state
        m.observe_lateness_ms(st.lateness_batch)
        m.set_pending_many(pending)
        st.lateness_batch = []
        self._last = Counters(
            ingested=k.ingested, scheduled=k.scheduled, delivered=k.delivered, cancelled=k.cancelled,
            duplicates=k.duplicates, replaced=k.replaced, publish_retries=k.publish_retries, dlq=dict(k.dlq),
        )

    # -- look-up (HTTP threads) -----------------------------------------------------------------
    def lookup(self, rid: bytes, partition: int | None = None) -> tuple[int, dict[str, Any]]:
        """``GET /ids/<id>``: (HTTP status, JSON document) for ``rid`` in this instance's stores
        (``partition``: that one only). Called on an HTTP thread.

        Why a lock and not a query handed to the loop: the loop waits in ``consume`` up to 100 ms
        when idle, and librdkafka's wait cannot be woken, so a queued query would wait up to that.
        Why not a lock-free read: a look-up decodes from the mmapped files, and the loop
        unmaps, rebuilds and closes them (a segment reclaimed, the id index grown, a store
        closed on revoke); a read between two of those steps could see a closed map (and an
        export of a map makes the loop's ``close`` fail). With the lock the loop never changes a
        store during a look-up, and it holds the lock for a turn's work only, never while it
        waits for records, so an idle loop answers at once and a busy one after its turn (a few
        ms; ``LOOKUP_YIELD_S`` keeps it from taking the lock straight back). A look-up costs
        one hash probe and one record decode under the lock: the loop barely notices."""
        t0 = time.perf_counter()
        self._lookup_waiting = True
        if not self.store_lock.acquire(timeout=LOOKUP_WAIT_S):
            return 503, {"error": f"the event loop did not free the stores within {LOOKUP_WAIT_S:g} s (a long "
                                  "turn: a rebalance, a shutdown); try again", "id": _text(rid)}
        self._lookup_waiting = False
        t1 = time.perf_counter()
        try:
            owned = sorted(self.stores)
            restoring = sorted(self.held())
            if partition is not None:
                stores = [self.stores[partition]] if partition in self.stores else []
            else:
                stores = list(self.stores.values())
            found = None
            now = self.clock.wall_ms()
            for store in stores:
                found = store.lookup(rid, now)
                if found is not None:
                    break
        finally:
            self.store_lock.release()
        t2 = time.perf_counter()
        # where the time went: waiting for the loop to let go of the stores, and the look-up itself
        base = {"id": _text(rid), "ingress_topic": self.s.ingress_topic, "instance": self.s.group_instance_id,
                "owned_partitions": owned, "wait_ms": round((t1 - t0) * 1000, 3),
                "lookup_ms": round((t2 - t1) * 1000, 3)}
        if found is None:
            if partition is not None and partition in restoring:
                return 503, {**base, "error": f"partition {partition} is restoring from the changelog; try again"}
            why = ("not pending here, and no outcome remembered" if partition is None or partition in owned
                   else f"partition {partition} is not owned by this instance")
            return 404, {**base, "state": "unknown", "error": why, "restoring_partitions": restoring}
        for field in ("due_ms", "at_ms", "enqueued_ms"):
            if field in found:
                found[field[:-3]] = iso_ms(found[field])
        return 200, {**base, **found}

    # -- shutdown -------------------------------------------------------------------------------
    def shutdown(self) -> None:
        with self.store_lock:
            self._shutdown()

    def _shutdown(self) -> None:
        self.turns.uninstall()
        log.info("sidecar.stopping", in_flight=self.pub.in_flight)
        self.kafka.stop_logs()  # broker disconnects from here on are expected: debug, not errors
        deadline = self.clock.monotonic() + self.s.shutdown_timeout_ms / 1000
        self.pub.drain(deadline)
        if self.kafka.producer is not None:
            self.kafka.producer.flush(max(0.0, deadline - self.clock.monotonic()))
            self.pub.poll(0)
        self._drop_restoring(list(self.held()))
        self._drop_standbys()
        if self.txn is not None:
            # the last transaction, then every store closed clean (or dirty, if it aborted)
            why = self._commit(begin=False) if self.txn.open else "no transaction open"
            for store in self.stores.values():
                if why:
                    self._discard(store)
                else:
                    self.durability.checkpoint_now(store, sync=True)
                    store.close()
                    mark_clean(store.dir)
            self.stores.clear()
        for store in self.stores.values():
            self.durability.checkpoint_now(store, sync=True)
        if self.kafka.consumer is not None:
            self.kafka.close()  # on_revoke closes the stores
        for store in self.stores.values():
            store.close()
        self.stores.clear()
        self.durability.close()
        self.pages.close()
        self.lock.release()
        self._stats()
        log.info("sidecar.stopped", in_flight=self.pub.in_flight)

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            self.stop_requested = True

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
