"""The sidecar's event loop: one thread sequences a turn over the parts that do the work.

One thread does everything, batched (docs/design.md 2); librdkafka does its network I/O on its
own threads and releases the GIL. :class:`Sidecar` makes the parts, hands each what it needs (the
stores map, the Kafka I/O port, the clock) and calls them in order; it holds no state of theirs:

- ``kafka_io.KafkaIO``: the clients (made by an injected factory), topics, rebalance callbacks,
  offset commits, broker health;
- ``ingress.Ingress``: consumed records into their partitions' stores;
- ``publishing.Publishing``: due records to the producer, delivery reports, retries, the backlog;
  ``direct.DirectPublish``: records due on arrival published by the intake, never stored;
- ``durability.Durability``: checkpoint jobs and the offset commits behind them, trim;
- ``handover.Handover``: stores in and out of the stores map (assign, revoke, lost, restore),
  ``standbys.Standbys``: warm copies of other members' partitions, ``opening.StoreOpener``: a
  store made and recovered;
- ``page_waits.PageWaits``: a partition held while an id-table page is read off the loop;
- ``ownership.Ownership``: nothing published after a gap until the group confirms this member;
- ``rejoin.RejoinWatch``: a consumer that lost its partitions and never rejoins is replaced;
- ``exactly_once.ExactlyOnce``: the transactions that replace the offset commits (nothing is
  published while the broker refuses the transactional id: ``txn_refusal.TxnRefusal``);
- ``backpressure.Backpressure``: ingress paused for disk space or a refusing changelog;
- ``reporting.Reporting``: metrics, ``stats`` and readiness; ``lookup.Lookup``: ``GET /ids/<id>``;
  ``listing.Listing``: ``GET /pending``
  on an HTTP thread, under the store lock the loop holds for each turn's work.

A turn (:meth:`Sidecar.turn`):

1. ``consume(num_messages=batch, timeout=...)`` where the timeout is the time to the next due
   record (capped), so an idle loop wakes exactly when something falls due; the store lock is
   free during this wait (look-ups, ``lookup.py``);
2. the records are ingested (synchronous: after the batch, every consumed offset is in its
   store), in slices with a publish in between when something fell due meanwhile; then the
   restores and the standbys take their slice;
3. every partition's scheduler hands out what is due *now* and it is produced; the due time is
   re-checked against a fresh clock reading right before ``produce`` — never early;
4. ``poll(0)`` runs delivery reports; exactly-once: the transaction commits when due;
5. every ``commit-interval``: data -> index -> checkpoint per partition, then the ingress offsets
   the checkpoint covers are committed to Kafka; every 200 ms the stores are trimmed; every second
   disk space, metrics and readiness.

Time comes from an injected :class:`~sidecar.engine.clock.Clock`, the clients from an injected
:class:`~sidecar.engine.kafka_io.Clients` factory: the unit tests run this loop on virtual time
against an in-memory Kafka twin (``tests/kafka_twin.py``).

Shutdown (SIGTERM/SIGINT): stop consuming, wait for in-flight deliveries up to the deadline,
checkpoint, commit, close. Nothing is lost or duplicated by a graceful stop.

Several ingress topics in one group (each tenant's: ``sidecar/tenants.py``): the stores map's
key (``stores.StoreKey``) is the ingress topic and partition, which ``ingress.py`` and
``handover.py`` take from a record and from the callbacks; each store has its tenant's rules.

Where the next features land: a schedule that re-arms (the recurring issue) is a store outcome
(the firing's settle stores its next firing), which the loop publishes like any due record.
"""

from __future__ import annotations

import gc
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar import logs
from sidecar.config import Settings
from sidecar.engine import quota_metrics
from sidecar.engine.backpressure import Backpressure
from sidecar.engine.changelog import Restorer, wait_acked
from sidecar.engine.clock import Clock, SystemClock
from sidecar.engine.direct import DirectPublish
from sidecar.engine.durability import Durability
from sidecar.engine.exactly_once import ExactlyOnce, lanes_of
from sidecar.engine.handover import Handover
from sidecar.engine.history import HistoryWriter
from sidecar.engine.identity import DataDirLock, instance_id
from sidecar.engine.ingress import Ingress
from sidecar.engine.kafka_io import Clients, KafkaIO
from sidecar.engine.listing import Listing
from sidecar.engine.lookup import Lookup
from sidecar.engine.native_client import clients_for
from sidecar.engine.opening import StoreOpener
from sidecar.engine.ownership import Ownership
from sidecar.engine.page_waits import PAGE_WAIT_POLL_S, PageWaits
from sidecar.engine.publishing import Publishing
from sidecar.engine.rejoin import ASK_TIMEOUT_S, RejoinWatch, rejoin_limit_s
from sidecar.engine.reporting import Reporting
from sidecar.engine.standbys import Standbys
from sidecar.engine.stores import StoreKey, Stores
from sidecar.engine.tenant_counts import TenantCounts
from sidecar.engine.transactions import Transactions
from sidecar.engine.turns import SLOW_TURN_S, TurnWatch
from sidecar.levels.scheduler import LevelsScheduler
from sidecar.runtime.threads import HelperThreads
from sidecar.scheduling import Scheduler
from sidecar.store import space
from sidecar.store.log import CommitLog
from sidecar.store.mapped import page_worker
from sidecar.store.partition import TRIM_INTERVAL_S, Counters, PartitionStore, compile_rules
from sidecar.store.quota import tenant_quota

log = logs.get("sidecar")

INGEST_SLICE = 250  # consumed records stored between two checks for due records
GC_THRESHOLD = (20_000, 20, 20)
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
        self.counts = TenantCounts(settings.tenants)  # per tenant, and the totals (engine/tenant_counts.py)
        self.metrics = metrics
        self.health = health
        # each tenant's rules, by its ingress topic: a store takes its topic's (sidecar/tenants.py);
        # no tenant's record may target any tenant's ingress, DLQ or changelog topic
        tenants = settings.tenants
        internal = frozenset(x for t in tenants for x in (t.ingress_topic, t.dlq_topic, t.changelog_topic) if x)
        self.stores: Stores = {}  # the owned stores, shared by every part below
        self.tenant_rules = {t.ingress_topic: compile_rules(
            t.ingress_topic, t.dlq_topic, settings.levels_ms, t.max_delay_ms,
            settings.retry_ladder_ms, settings.max_retries, settings.max_record_bytes, t.target_allowlist, internal,
            tenant_quota(t, self.stores),
        ) for t in tenants}
        self.rules = next(iter(self.tenant_rules.values()))  # the first tenant's (the only one without tenants)
        self.make_scheduler = make_scheduler_factory(settings)
        clients = clients if clients is not None else clients_for(settings.producer, settings.exactly_once)
        self.kafka = KafkaIO(settings, clients, self)
        self.kafka.refusals.health = health  # /readyz names why Kafka refuses the sidecar (refusals.py)
        self.pub = Publishing(settings, self.counts.loop, self.stores, self.clock, clients.produce_errors,
                              self.broker_status)
        self.pub.held = self.kafka.held_topics  # a tenant lane waiting for its transactional id (txn_lanes.py)
        quota_metrics.register(getattr(metrics, "registry", None), (r.quota for r in self.tenant_rules.values()),
                               self.pub.pacing)
        # exactly-once: the ingress offsets are committed in the transactions, never by the consumer
        self.txn = (Transactions(self.kafka, settings.transaction_interval_ms, self.clock)
                    if settings.exactly_once else None)
        flush_s = min(settings.shutdown_timeout_ms / 1000, 30.0)
        self.durability = Durability(settings, self.stores, self.counts.totals, self.clock,
                                     self.kafka.commit if self.txn is None else _in_transaction,
                                     lambda store: wait_acked(store, self.pub.poll, self.clock, flush_s))
        self.restorer = Restorer(self.kafka, self.clock) if self.kafka.changelogs else None
        # the stores' mapped pages faulted in ahead of their appends and dropped after, off the loop
        # (mapped.PageWorker)
        self.pages = page_worker(demote=settings.helper_threads != "none")
        self.history = (HistoryWriter(self.kafka, settings.history_topic, settings.history_payload, self.clock)
                        if settings.history_topic else None)
        self.lock = DataDirLock(settings.data_path)
        self.stop_requested = False
        self.turns = TurnWatch()
        self._helpers: HelperThreads | None = None

        opener = StoreOpener(settings, self.tenant_rules, self.make_scheduler, self.counts, self.pages, self.history,
                             changelog=self.restorer is not None, exactly_once=self.txn is not None)
        self.page_waits = PageWaits(self.stores, self.kafka, self.clock)
        self.standbys = (Standbys(settings, self.stores, self.kafka, self.restorer, self.durability, opener,
                                  self.clock) if self.restorer is not None else None)
        self.backpressure = Backpressure(settings, self.stores, self.kafka, self.durability, metrics, health)
        self.reporting = Reporting(
            self.stores, self.counts, self.pub, self.turns, self.backpressure, self.page_waits,
            restorer=self.restorer, standbys=self.standbys, txn=self.txn, history=self.history, metrics=metrics,
            health=health)
        self.reporting.several_topics = len(self.kafka.topics) > 1
        self.handover = Handover(
            settings, self.stores, self.kafka, self.pub, self.durability, self.restorer, opener, self.page_waits,
            self.clock, history=self.history, exactly_once=self.txn is not None,
            readiness=self.reporting.set_assigned, space_check=self.backpressure.assigned)
        self.ingress = Ingress(settings, self.stores, self.kafka, self.handover, self.page_waits, self.clock)
        self.direct = DirectPublish(settings, self.stores, self.pub, self.durability, self.clock)
        if self.direct.on:
            self.ingress.direct = self.direct
            self.handover.direct = True
        self.ownership = Ownership(self.stores, self.kafka, self.clock)
        self.rejoin = RejoinWatch(rejoin_limit_s(settings.kafka))  # a consumer stuck outside its group
        self.eos = self._exactly_once()
        self.lookups = Lookup(settings, self.stores, self.clock, self.handover.held)
        self.lookup = self.lookups.lookup  # GET /ids/<id> (cli.py hands it to the health server)
        self.listing = Listing(settings, self.stores, self.clock, self.lookups).answer  # GET /pending (as lookup)
        # the loop holds it for each turn's work, the look-ups and the rebalance callbacks take it
        self.store_lock = self.lookups.lock
        self._last_commit = self._last_space = self._last_trim = self._last_stats = 0.0
        self._last_index_step = 0.0

    def _exactly_once(self) -> ExactlyOnce | None:
        """Exactly-once's transactions (None at-least-once): one lane per principal, the
        deployment's and each tenant's own (txn_lanes.py); the handover publishes through them."""
        if self.txn is None:
            return None
        lanes = lanes_of(self.s, self.txn, self.kafka, self.pub, self.clock, lambda: self.backpressure.paused)
        eos = ExactlyOnce(lanes, self.stores, self.kafka, self.pub, self.handover, self.page_waits)
        self.handover.port_of = eos.port_of
        return eos

    # -- Kafka I/O events (kafka_io.Events; the rebalance callbacks run inside consume) ---------
    @property
    def counters(self) -> Counters:
        """Every count of the loop, all tenants' (engine/tenant_counts.py)."""
        return self.counts.totals()

    def partitions_assigned(self, partitions: list[StoreKey]) -> dict[StoreKey, int | None]:
        """Open (recover) each partition's store; its checkpoint names the offset to resume at."""
        self.rejoin.assigned()
        with self.store_lock:
            return self.handover.assigned(partitions)

    def partitions_revoked(self, partitions: list[StoreKey]) -> None:
        """Finish what is in flight, then checkpoint, commit and close each revoked store."""
        with self.store_lock:
            if self.eos is not None:
                self.eos.revoked(partitions)
            else:
                self.handover.revoked(partitions)

    def partitions_lost(self, partitions: list[StoreKey]) -> None:
        """The group moved on without us: close the stores, commit nothing (not ours any more)."""
        self.rejoin.lost(self.clock.monotonic())  # librdkafka rejoins by itself, or should (rejoin.py)
        with self.store_lock:
            self.handover.lost(partitions)
            if self.eos is not None:
                self.eos.lost()

    def kept_paused(self) -> set[StoreKey]:
        """Assigned partitions that stay paused when ingress resumes: the restoring ones, and those
        waiting for an id-table page."""
        return self.handover.held() | set(self.page_waits.held)

    def broker_status(self, up: bool, source: str) -> None:
        self.reporting.broker_status(up, source)

    def statistics(self, stats_json: str) -> None:
        self.reporting.statistics(stats_json)

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
        self.pub.tenants.start(self.kafka.clients.producer, self.kafka.producer_conf, self.kafka.should_warn)
        if self.eos is not None:
            self.eos.start()
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
            restoring = self.restorer is not None and bool(self.restorer.restoring)
            timeout = 0.0 if restoring else self.pub.wait_s(now)
            if self.eos is not None:
                timeout = self.eos.wait_s(self.clock.monotonic(), timeout, restoring)
            if self.page_waits.held:
                timeout = min(timeout, PAGE_WAIT_POLL_S)
        tw = clock()
        if not self.backpressure.paused:
            msgs = self.kafka.consume(self.s.batch_size, timeout)
        else:
            # Paused partitions return nothing, but the call keeps group membership alive
            # and anything it does return (a partition assigned mid-pause) must be ingested.
            msgs = self.kafka.consume(self.s.batch_size, 0)
            if not msgs:
                self.clock.sleep(timeout)
        t = clock()
        self.turns.woke(t - tw, timeout, t)
        self.lookups.let_in()
        with self.store_lock:
            self._work(t0, msgs)

    def _work(self, t0: float, msgs: list[Any]) -> None:
        """The turn after ``consume``: ingest, publish, poll, checkpoint, housekeeping."""
        clock, turns = time.perf_counter, self.turns
        t1 = clock()
        turns.mark()  # also counts the turn
        eos = self.eos
        if eos is not None and eos.must_reset():
            msgs = eos.kept(msgs)  # the reset partitions' are consumed again from the committed offsets
        if eos is not None and eos.waiting:
            eos.refused_step()  # the transactional id refused: waiting for its ACL (txn_refusal.py)
        producing = eos is None or eos.producing
        # asked once a turn, before the intake: it publishes records due on arrival (engine/direct.py)
        confirmed = self.direct.confirmed = producing and self.ownership.confirmed()
        if self.page_waits.held:
            self.page_waits.step()
        if msgs:
            # In slices, publishing in between whatever fell due meanwhile: a full batch
            # takes tens of ms to store, and due records must not wait behind it.
            ingest = self.ingress.ingest
            for i in range(0, len(msgs), INGEST_SLICE):
                ingest(msgs[i : i + INGEST_SLICE])
                if i + INGEST_SLICE < len(msgs) and producing and self.pub.due_now():
                    self.pub.publish()
        if self.kafka.consumer_fatal:
            self._replace_consumer()
        if self.restorer is not None and self.restorer.restoring:
            self.handover.restore_step()
        if self.standbys is not None and self.s.standby_replicas:
            self.standbys.step()
        t2 = clock()
        if confirmed:
            self.pub.publish()
        self.pub.poll(0)
        if self.pub.producer_fatal:
            self._replace_producer()
        if self.eos is not None:
            self.eos.commit_due(self.clock.monotonic())
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
            self.handover.trim_restoring()
            self._last_trim = mono
            parts[3] = clock() - t
        t4 = clock()
        if mono - self._last_space >= 1.0:
            self._each_second(mono)
            self._last_space = mono
        if mono - self._last_stats >= self.s.stats_interval_ms / 1000:
            self.reporting.stats()
            self._last_stats = mono
        if self.health is not None:
            self.health.beat(mono)
        t5 = clock()
        # The wait inside consume (up to the next due time) is not work: a turn is slow
        # when everything after it took longer than SLOW_TURN_S.
        if t5 - t1 > SLOW_TURN_S:
            turns.slow(t0, t1, t2, t3, t4, t5, len(msgs), self.pub.in_flight)
        self.ownership.turn_ended()

    def _each_second(self, mono: float) -> None:
        """The turn's once-a-second checks: helper threads, disk space, a consumer stuck outside
        its group, the metrics."""
        if self._helpers is not None:
            self._helpers.demote()  # librdkafka starts a thread per broker it connects to
        self.backpressure.check(self.handover.all_stores())
        stuck = self.rejoin.step(mono, lambda: self.kafka.cluster_answers(ASK_TIMEOUT_S))
        if stuck:
            self.kafka.consumer_fatal = stuck  # replaced at the next turn, as after a fatal error
        self.reporting.sync_metrics()

    def _replace_producer(self) -> None:
        """A delivery report said the producer instance is dead (``Publishing.producer_fatal``):
        a new one; exactly-once: registered, and the committed state restored."""
        fatal = self.pub.producer_fatal
        if self.eos is not None:
            self.eos.producer_died(fatal)
            return
        self.kafka.replace_producer(fatal)
        self.pub.producer, self.pub.producer_fatal = self.kafka.producer, ""

    def _replace_consumer(self) -> None:
        """A fatal consumer error (librdkafka: e.g. a static member fenced after its session
        expired during a broker outage) leaves a consumer that can never fetch or commit again; so
        does one that never rejoins its group after losing its partitions (``rejoin.py``).
        Every partition is handed back without a commit (nothing is lost: the new consumer
        resumes from the checkpoints), the old consumer dropped and the group joined anew."""
        log.error("consumer.fatal", error=self.kafka.consumer_fatal, action="rejoining with a new consumer")
        self.kafka.consumer_fatal = ""
        self.handover.fenced()
        if self.eos is not None:
            self.eos.fenced()
        self.kafka.replace_consumer()
        self.rejoin.lost(self.clock.monotonic())  # the new consumer must be assigned in its turn

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
        # a producer refused its transactional id is dead: nothing to flush (its flush raises)
        if self.kafka.producer is not None and (self.eos is None or self.eos.producing):
            self.kafka.producer.flush(max(0.0, deadline - self.clock.monotonic()))
            self.pub.tenants.flush(max(0.0, deadline - self.clock.monotonic()))
            self.pub.poll(0)
        self.handover.drop_restoring(list(self.handover.held()))
        if self.standbys is not None:
            self.standbys.drop_all()
        if self.eos is not None:
            self.eos.close_all()  # the last transaction, then every store closed clean (or dirty)
        for store in self.stores.values():
            self.durability.checkpoint_now(store, sync=True)
        if self.kafka.consumer is not None:
            self.kafka.close()  # on_revoke closes the stores
        self.pub.tenants.close()
        for store in self.stores.values():
            store.close()
        self.stores.clear()
        self.durability.close()
        self.pages.close()
        self.lock.release()
        self.reporting.stats()
        log.info("sidecar.stopped", in_flight=self.pub.in_flight)

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            self.stop_requested = True

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
