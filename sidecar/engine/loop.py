"""The sidecar's event loop: consume -> store -> schedule -> publish -> checkpoint -> commit.

One thread does everything, batched (DESIGN.md 2); librdkafka does its network I/O on its own
threads and releases the GIL. Each turn:

1. ``consume(num_messages=batch, timeout=...)`` where the timeout is the time to the next due
   record (capped), so an idle loop wakes exactly when something falls due;
2. each record is validated and appended to its partition's store, and scheduled (synchronous:
   after the batch, every consumed offset is in the store);
3. every partition's scheduler hands out what is due *now* (bounded by ``max-in-flight``) and
   the loop produces it with the idempotent producer (``acks=all``); the due time is re-checked
   against a fresh clock reading right before ``produce`` — never early;
4. ``poll(0)`` runs delivery reports: success acks the record in the scheduler; failures go
   through the publish-failure policy (retry with backoff, or dead-letter);
5. every ``commit-interval``: data -> index -> checkpoint per partition, then the ingress offsets
   the checkpoint covers are committed to Kafka.

Shutdown (SIGTERM/SIGINT): stop consuming, wait for in-flight deliveries up to the deadline,
checkpoint, commit, close. Nothing is lost or duplicated by a graceful stop.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import os
import random
import signal
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import psutil
from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from sidecar import contract as c
from sidecar import logs
from sidecar.config import Settings
from sidecar.engine.heap import HeapReleaser
from sidecar.engine.publish_state import PublishState
from sidecar.engine.threads import HelperThreads, demote_self
from sidecar.engine.turns import SLOW_TURN_S, TurnWatch
from sidecar.levels.scheduler import LevelsScheduler
from sidecar.retry import Backoff, ErrorKind, PublishFailurePolicy, Retry, classify, describe
from sidecar.scheduling import Scheduler
from sidecar.store import codec
from sidecar.store.codec import Record, delivery_headers, native
from sidecar.store.log import CommitLog
from sidecar.store.partition import (
    FAST_INTAKE,
    TRIM_INTERVAL_S,
    CheckpointJob,
    Counters,
    PartitionStore,
    compile_rules,
)

log = logs.get("sidecar")

PUBLISH_CHUNK = 1000  # records handed out by a scheduler per call
PUBLISH_BUDGET_PER_TURN = 5000  # records published per loop turn, across partitions
INGEST_SLICE = 250  # consumed records stored between two checks for due records
FAST_RETRY = 32  # records left to the reference path after the C intake took none (PartitionStore.ingest_many)
# The publish fast path in C (docs/storage.md 2.6): ``_produce`` and ``_on_delivery`` stay the
# reference and take every record it hands back.
_publish_due = None if native is None else native.publish_due


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


GC_THRESHOLD = (20_000, 20, 20)


def quiet_gc() -> None:
    """The loop's collector settings. Nothing long-lived is made of per-record Python objects, and
    the hot path makes no reference cycles: move start-up's objects out of the collector's sight
    and let the youngest generation grow before a collection (fewer pauses on the delivery path)."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def ensure_topics(admin: AdminClient, topics: dict[str, int], replication_factor: int, timeout: float = 30) -> None:
    """Create the topics that are missing (ingress, DLQ); an existing topic is left as it is."""
    existing = set(admin.list_topics(timeout=timeout).topics)
    missing = [NewTopic(t, num_partitions=n, replication_factor=replication_factor)
               for t, n in topics.items() if t not in existing]
    if not missing:
        return
    for topic, fut in admin.create_topics(missing, operation_timeout=timeout).items():
        try:
            fut.result()
            log.info("topic.created", topic=topic)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


def make_scheduler_factory(settings: Settings) -> Callable[[Path, CommitLog], Scheduler]:
    if settings.scheduler == "levels":
        return lambda d, lg: LevelsScheduler(d, lg, settings.levels_ms)
    from sidecar.wheel import make_wheel  # type: ignore[attr-defined,unused-ignore]

    return make_wheel(settings)  # type: ignore[no-any-return,unused-ignore]


class _Attempts:
    """Retry state of a record whose publishing failed (none for a record that went through)."""

    __slots__ = ("attempt", "first_failure_ms")

    def __init__(self) -> None:
        self.attempt = 0
        self.first_failure_ms = 0


class Sidecar:
    def __init__(self, settings: Settings, metrics: Any = None, health: Any = None) -> None:
        self.s = settings
        # the state the publish paths share, C and Python (engine/publish_state.py)
        self.ps = PublishState({}, Counters())
        self.metrics = metrics
        self.health = health
        self.rules = compile_rules(
            settings.ingress_topic, settings.dlq_topic, settings.levels_ms, settings.max_delay_ms,
            settings.retry_ladder_ms, settings.max_retries, settings.max_record_bytes, settings.target_allowlist,
        )
        self.make_scheduler = make_scheduler_factory(settings)
        self.topic_cap = max(1, settings.max_in_flight // 4)
        self._rr = 0
        self.backlog: deque[tuple[int, Record, PartitionStore, _Attempts | None]] = deque()
        # (at_ms, seq, ref, store, attempts)
        self.retries: list[tuple[int, int, int, PartitionStore, _Attempts | None]] = []
        self._seq = itertools.count()
        self.policy = PublishFailurePolicy(
            backoff=Backoff(base_ms=100, cap_ms=10_000), grace_ms=settings.delivery_grace_ms,
            max_attempts=settings.delivery_attempts,
        )
        self.rng = random.Random()
        self.stop_requested = False
        self.paused = False
        self.pause_reason = ""
        self.assigned = False
        self._last = Counters()
        self._tiers_seen: set[str] = set()
        self._last_fsync = 0.0
        self.consumer_fatal = ""  # set by a fatal consume error: the loop replaces the consumer
        # SCHED_BATCH: a finished sync must not preempt the loop (engine/threads.py)
        self.flusher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kds-flush",
                                          initializer=demote_self if settings.helper_threads != "none" else None)
        self.jobs: dict[int, tuple[PartitionStore, CheckpointJob, Future[None]]] = {}
        self._warned: dict[str, float] = {}
        self.turns = TurnWatch()
        # A burst leaves its heap high-water mark behind (librdkafka's pre-fetched fetch buffers,
        # freed but pinned in their arena): given back once the burst is over, off the loop thread.
        self.heap = HeapReleaser(executor=self.flusher)
        # The C publish path reads and writes self.ps, where the Python code keeps that state too.
        self._fast: Any = None
        if native is not None:
            self._fast = native.Publisher(self.ps, self._on_delivery, (BufferError, KafkaException))

    # -- clients --------------------------------------------------------------------------------
    def _common(self) -> dict[str, Any]:
        conf: dict[str, Any] = {"bootstrap.servers": self.s.bootstrap_servers, "error_cb": self._on_error}
        conf.update(self.s.kafka)
        return conf

    def _make_consumer(self) -> Consumer:
        conf = self._common()
        conf.update({
            "group.id": self.s.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
            "fetch.wait.max.ms": 10,
            "statistics.interval.ms": 1000,
            "stats_cb": self._on_stats,
        })
        if self.s.group_instance_id:
            conf["group.instance.id"] = self.s.group_instance_id
        for k, v in self.s.kafka.items():
            conf[k] = v
        return Consumer(conf)

    def _make_producer(self) -> Producer:
        conf = self._common()
        conf.update({
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": max(100_000, self.s.max_in_flight * 2),
            "queue.buffering.max.kbytes": 1_048_576,
            "message.timeout.ms": 120_000,
            "topic.metadata.propagation.max.ms": min(self.s.delivery_grace_ms, 30_000),
        })
        for k, v in self.s.kafka.items():
            conf[k] = v
        return Producer(conf)

    def _on_error(self, err: KafkaError) -> None:
        if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            if self.ps.broker_up:
                log.warning("broker.unreachable", error=err.str())
            self.ps.broker_up = False
            self._readiness()
        elif self._should_warn(f"kafka.error:{err.code()}"):
            log.warning("kafka.error", code=err.name(), error=err.str())

    def _should_warn(self, key: str, every_s: float = 30.0) -> bool:
        """Rate-limit repeated warnings (a broker outage raises the same error many times a second)."""
        now = time.monotonic()
        if now - self._warned.get(key, -every_s) < every_s:
            return False
        self._warned[key] = now
        return True

    def _on_stats(self, stats_json: str) -> None:
        """librdkafka statistics (every second): consumer lag for the metrics, and whether any
        real broker connection is UP — the signal that brings readiness back after an outage even
        when nothing is being delivered."""
        if self.metrics is not None:
            self.metrics.update_from_stats(stats_json)
        try:
            brokers = orjson.loads(stats_json).get("brokers", {})
        except orjson.JSONDecodeError:
            return
        up = any(b.get("state") == "UP" for b in brokers.values() if b.get("nodeid", -1) >= 0)
        if up != self.ps.broker_up:
            self.ps.broker_up = up
            if up:
                log.info("broker.reachable")
            else:
                log.warning("broker.unreachable", source="statistics")
            self._readiness()

    def _readiness(self) -> None:
        if self.health is not None:
            self.health.set_assigned(self.assigned)
            self.health.set_broker_reachable(self.ps.broker_up)

    # -- rebalance ------------------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            store = PartitionStore(
                self.s.data_path, tp.topic, tp.partition, rules=self.rules, scheduler_name=self.s.scheduler,
                make_scheduler=self.make_scheduler, segment_bytes=self.s.segment_bytes,
                cancel_horizon_ms=self.s.cancel_horizon_ms, counters=self.ps.counters, durable=self.s.fsync != "none",
            )
            t0 = time.monotonic()
            resume = store.open()
            self.ps.stores[tp.partition] = store
            tp.offset = resume if resume is not None else OFFSET_INVALID
            log.info(
                "partition.recovered", partition=tp.partition, resume_offset=resume, pending=store.pending(),
                truncated_bytes=store.truncated_bytes, dangling=len(getattr(store, "dangling", ())),
                seconds=round(time.monotonic() - t0, 3),
            )
        consumer.incremental_assign(partitions)
        if self.paused:
            consumer.pause(partitions)
        self.assigned = bool(self.ps.stores)
        log.info("partitions.assigned", partitions=[tp.partition for tp in partitions])
        self._readiness()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._drain(deadline=time.monotonic() + self.s.shutdown_timeout_ms / 1000)
        for tp in partitions:
            store = self.ps.stores.pop(tp.partition, None)
            if store is not None:
                self._checkpoint_store(consumer, store, sync=True)
                store.close()
        consumer.incremental_unassign(partitions)
        self.assigned = bool(self.ps.stores)
        log.info("partitions.revoked", partitions=[tp.partition for tp in partitions])
        self._readiness()

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            store = self.ps.stores.pop(tp.partition, None)
            if store is not None:
                self._await_job(None, tp.partition)  # no commit: the partition is no longer ours
                store.checkpoint(fsync=self.s.fsync != "none")
                store.close()
        consumer.incremental_unassign(partitions)
        self.assigned = bool(self.ps.stores)
        log.warning("partitions.lost", partitions=[tp.partition for tp in partitions])
        self._readiness()

    # -- main loop ------------------------------------------------------------------------------
    def run(self) -> int:
        admin = AdminClient(self._common())
        ensure_topics(
            admin, {self.s.ingress_topic: self.s.ingress_partitions, self.s.dlq_topic: 1}, self.s.replication_factor
        )
        self.s.data_path.mkdir(parents=True, exist_ok=True)
        self.producer = self._make_producer()
        consumer = self._make_consumer()
        consumer.subscribe(
            [self.s.ingress_topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        if self.health is not None:
            self.health.set_recovered(True)
        quiet_gc()
        self.turns.install()
        # This thread is the loop: the clients' and the flusher's threads must not preempt it.
        helpers = HelperThreads(enabled=self.s.helper_threads == "all")
        helpers.demote()
        log.info("sidecar.started", config=self.s.masked(), pid=os.getpid())
        last_commit = last_stats = last_space = last_trim = time.monotonic()
        stats_every = self.s.stats_interval_ms / 1000
        commit_every = self.s.commit_interval_ms / 1000
        turns = self.turns
        clock = time.perf_counter
        try:
            while not self.stop_requested:
                t0 = clock()
                now = wall_ms()
                timeout = self._poll_timeout(now)
                if not self.paused:
                    msgs = consumer.consume(num_messages=self.s.batch_size, timeout=timeout)
                else:
                    # Paused partitions return nothing, but the call keeps group membership alive
                    # and anything it does return (a partition assigned mid-pause) must be ingested.
                    msgs = consumer.consume(num_messages=self.s.batch_size, timeout=0)
                    if not msgs:
                        time.sleep(timeout)
                t1 = clock()
                turns.mark()  # also counts the turn
                if msgs:
                    # In slices, publishing in between whatever fell due meanwhile: a full batch
                    # takes tens of ms to store, and due records must not wait behind it.
                    for i in range(0, len(msgs), INGEST_SLICE):
                        self._ingest(msgs[i : i + INGEST_SLICE])
                        if i + INGEST_SLICE < len(msgs) and self._due_now():
                            self._publish()
                if self.consumer_fatal:
                    consumer = self._replace_consumer(consumer)
                t2 = clock()
                self._publish()
                self._poll(0)
                t3 = clock()
                if self.jobs:
                    self._reap_jobs(consumer)
                mono = time.monotonic()
                if mono - last_commit >= commit_every:
                    self._checkpoint_all(consumer)
                    last_commit = mono
                if mono - last_trim >= TRIM_INTERVAL_S:
                    self._trim_all()
                    self.heap.tick(self._work_done(), mono)
                    last_trim = mono
                t4 = clock()
                if mono - last_space >= 1.0:
                    helpers.demote()  # librdkafka starts a thread per broker it connects to
                    self._check_space(consumer)
                    if self.metrics is not None:
                        self._sync_metrics(self._pending())
                    last_space = mono
                if mono - last_stats >= stats_every:
                    self._stats()
                    last_stats = mono
                if self.health is not None:
                    self.health.beat(mono)
                t5 = clock()
                # The wait inside consume (up to the next due time) is not work: a turn is slow
                # when everything after it took longer than SLOW_TURN_S.
                if t5 - t1 > SLOW_TURN_S:
                    turns.slow(t0, t1, t2, t3, t4, t5, len(msgs), self.ps.in_flight)
        finally:
            self.turns.uninstall()
            self._shutdown(consumer)
        return 0

    def _replace_consumer(self, consumer: Consumer) -> Consumer:
        """A fatal consumer error (librdkafka: e.g. a static member fenced after its session
        expired during a broker outage) leaves a consumer that can never fetch or commit again.
        Finish what is in flight, checkpoint and close every partition (nothing is lost: the new
        consumer resumes from the checkpoints), drop the old consumer and join with a new one."""
        log.error("consumer.fatal", error=self.consumer_fatal, action="rejoining with a new consumer")
        self.consumer_fatal = ""
        self._drain(deadline=time.monotonic() + min(self.s.shutdown_timeout_ms / 1000, 10.0))
        stores, self.ps.stores = self.ps.stores, {}
        for partition, store in stores.items():
            self._await_job(None, partition)  # no offset commit: the consumer is fenced
            store.checkpoint(fsync=self.s.fsync != "none")
            store.close()
        self.assigned = False
        self._readiness()
        try:
            consumer.close()
        except (KafkaException, RuntimeError) as e:
            log.warning("consumer.close_failed", error=str(e))
        fresh = self._make_consumer()
        fresh.subscribe(
            [self.s.ingress_topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        return fresh

    def _next_due(self) -> int | None:
        """The earliest due time any partition's scheduler has not handed out yet."""
        nxt: int | None = None
        for store in self.ps.stores.values():
            d = store.sched.next_due_ms()
            if d is not None and (nxt is None or d < nxt):
                nxt = d
        return nxt

    def _due_now(self) -> bool:
        nxt = self._next_due()
        return nxt is not None and nxt <= wall_ms()

    def _poll_timeout(self, now: int) -> float:
        if self.backlog or (self.retries and self.retries[0][0] <= now):
            return 0.0
        nxt = self._next_due()
        if self.retries:
            nxt = self.retries[0][0] if nxt is None else min(nxt, self.retries[0][0])
        if nxt is None:
            return 0.1
        return max(0.0, min(0.1, (nxt - now) / 1000))

    def _ingest(self, msgs: list[Message]) -> None:
        now = wall_ms()
        stores = self.ps.stores
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
            m = msgs[i]
            i += 1
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._FATAL:
                    self.consumer_fatal = err.str()  # the run loop replaces the consumer
                elif err.code() != KafkaError._PARTITION_EOF and self._should_warn(f"consume:{err.code()}"):
                    log.warning("consume.error", code=err.name(), error=err.str())
                continue
            partition: int = m.partition()  # type: ignore[assignment]  # (no typing.cast call per record)
            if partition != last_partition:
                last_partition, store = partition, stores.get(partition)
            if store is None:
                continue  # revoked in between: the new owner consumes it
            ts_type, ts = m.timestamp()
            store.ingest_fields(
                topic, m.offset(), ts if ts_type else now, m.key(), m.value(), m.headers(), now,  # type: ignore[arg-type]
            )

    def _publish(self) -> None:
        now = wall_ms()
        if not self._flush_backlog(now):
            return
        while self.retries and self.retries[0][0] <= now and self.ps.in_flight < self.s.max_in_flight:
            _at, _seq, ref, store, att = heapq.heappop(self.retries)
            again = store.sched.record(ref) if self.ps.stores.get(store.partition) is store else None
            if again is None:
                continue
            self.ps.counters.publish_retries += 1
            if not self._produce(ref, again, store, att, now):
                return
        stores = list(self.ps.stores.values())
        if len(stores) > 1:  # rotate the starting partition so a busy one cannot starve the rest
            self._rr = (self._rr + 1) % len(stores)
            stores = stores[self._rr:] + stores[: self._rr]
        # Bounded work per turn, in chunks with a poll between them: a mass expiry starts
        # publishing at once (not after decoding 20,000 records) and intake keeps its turns.
        budget = PUBLISH_BUDGET_PER_TURN
        for store in stores:
            while budget > 0:
                room = min(self.s.max_in_flight - self.ps.in_flight, PUBLISH_CHUNK, budget)
                if room <= 0:
                    return
                batch = store.sched.due(now, room)
                if not batch:
                    break
                budget -= len(batch)
                if not self._publish_batch(batch, store, now):
                    return
                self._poll(0)
                if len(batch) < room:
                    # Nothing more is due (or the scheduler's scan budget ran out: then it still
                    # reports a due time <= now and the next turn does not wait): asking again
                    # would cost a whole empty ``due`` call per turn.
                    break

    def _publish_batch(self, batch: list[tuple[int, Record]], store: PartitionStore, now: int) -> bool:
        """Produce a due batch; False if the producer queue filled up (the rest waits in the
        backlog). With the extension, ``publish_due`` produces the plain records in C and stops at
        any other one, which goes through ``_produce`` here (or ``_refused``, when the producer
        raised for it) before C takes over again."""
        i, n = 0, len(batch)
        while i < n:
            refused = None
            if self._fast is not None and _publish_due is not None:
                i, refused = _publish_due(self._fast, self.producer.produce, batch, i, store, now)
                if i == n:
                    return True
            ref, rec = batch[i]
            if refused is None:
                ok = self._produce(ref, rec, store, None, now)
            else:
                ok = self._refused(ref, rec, store, None, refused)
            i += 1
            if not ok:
                # The producer queue is full: what was handed out waits in the backlog.
                for ref2, rec2 in batch[i:]:
                    self.backlog.append((ref2, rec2, store, None))
                return False
        return True

    def _poll(self, timeout: float) -> None:
        """Serve delivery reports, then hand the successes to their stores in one batch."""
        self.producer.poll(timeout)
        if self._fast is not None:
            self._fast.sync()  # the topic in-flight counts its reports took down
        for store in self.ps.stores.values():
            if store.acked:
                store.settle()

    def _produce(self, ref: int, rec: Record, store: PartitionStore, att: _Attempts | None, now: int) -> bool:
        if rec.due_ms > now:  # the publish-time check: never early, whatever the scheduler said
            self.ps.counters.early += 1
            log.error("publish.not_due", due_ms=rec.due_ms, now_ms=now)
            heapq.heappush(self.retries, (rec.due_ms, next(self._seq), ref, store, att))
            return True
        topic = rec.topic.decode()
        if self.ps.troubled and topic in self.ps.troubled and self.ps.topic_in_flight.get(topic, 0) >= self.topic_cap:
            # A failing (slow, missing) target must not take the whole in-flight budget from the
            # healthy ones: park its records briefly. Healthy targets are never capped.
            heapq.heappush(self.retries, (now + 200, next(self._seq), ref, store, att))
            return True
        headers: Any = delivery_headers(rec, store.topic_bytes)
        try:
            # Positional: with keywords, confluent-kafka's argument parsing builds a str for every
            # keyword name it looks up, about 2 us per call (measured). The order is the client's:
            # topic, value, key, partition (-1: its partitioner), callback, on_delivery (alias,
            # unused), timestamp (0: now), headers.
            self.producer.produce(
                topic, rec.value, rec.key, rec.target_partition,
                partial(self._on_delivery, ref, rec, store, att, topic), None, 0, headers,
            )
        except (BufferError, KafkaException) as e:
            return self._refused(ref, rec, store, att, e)
        self.ps.in_flight += 1
        tif = self.ps.topic_in_flight
        tif[topic] = tif.get(topic, 0) + 1
        return True

    def _refused(
        self, ref: int, rec: Record, store: PartitionStore, att: _Attempts | None, e: BufferError | KafkaException,
    ) -> bool:
        """``produce`` raised for the record: False when the producer queue is full (the record
        goes first in the backlog); a local error (e.g. an invalid partition) is a failed publish."""
        if isinstance(e, BufferError):
            self.backlog.appendleft((ref, rec, store, att))
            self._poll(0.01)
            return False
        self._failed(ref, rec, store, att, e.args[0])
        return True

    def _on_delivery(
        self, ref: int, rec: Record, store: PartitionStore, att: _Attempts | None, topic: str,
        err: KafkaError | None, msg: Message,
    ) -> None:
        self.ps.in_flight -= 1
        tif = self.ps.topic_in_flight
        left = tif[topic] - 1
        if left:
            tif[topic] = left
        else:
            del tif[topic]
        if self.ps.stores.get(store.partition) is not store:
            return  # the partition was revoked; its new owner delivers from its own checkpoint
        if err is None:
            if self.ps.troubled and topic in self.ps.troubled:
                del self.ps.troubled[topic]
            if not self.ps.broker_up:
                self.ps.broker_up = True
                log.info("broker.reachable")
                self._readiness()
            lateness = msg.timestamp()[1] - rec.due_ms
            if lateness < 0:
                self.ps.counters.early += 1
            self.ps.lateness_batch.append(lateness)
            store.acked.append((ref, rec))  # settled in a batch after the poll (``_poll``)
            return
        self._failed(ref, rec, store, att, err)

    def _failed(self, ref: int, rec: Record, store: PartitionStore, att: _Attempts | None, err: KafkaError) -> None:
        now = wall_ms()
        self.ps.troubled[rec.topic.decode()] = now
        if att is None:
            att = _Attempts()
        att.attempt += 1
        if att.first_failure_ms == 0:
            att.first_failure_ms = now
        kind = classify(err)
        if kind is ErrorKind.RETRIABLE and err.code() in (KafkaError._MSG_TIMED_OUT, KafkaError._TRANSPORT):
            self.ps.broker_up = False
            self._readiness()
        decision = self.policy.decide(kind, att.attempt, att.first_failure_ms, now, self.rng, error=describe(err))
        if isinstance(decision, Retry):
            if att.attempt == 1 or att.attempt % 100 == 0:
                log.warning("publish.retry", topic=rec.topic.decode(), error=err.str(), attempt=att.attempt)
            heapq.heappush(self.retries, (decision.at_ms, next(self._seq), ref, store, att))
            return
        log.warning("publish.dead_letter", topic=rec.topic.decode(), error=err.str(), attempts=att.attempt)
        if rec.rtype == codec.DEAD:
            # The DLQ itself refuses the record: keep retrying it rather than drop it.
            heapq.heappush(self.retries, (now + 10_000, next(self._seq), ref, store, att))
            return
        store.dead_letter(ref, rec, c.DELIVERY_FAILED, decision.error, att.attempt, now)

    # -- durability -----------------------------------------------------------------------------
    def _checkpoint_store(self, consumer: Consumer, store: PartitionStore, sync: bool = False) -> None:
        """A checkpoint of ``store`` done here and now (rebalance, shutdown), then its offset commit."""
        self._await_job(consumer, store.partition)
        store.checkpoint(fsync=self.s.fsync != "none")
        self._commit(consumer, store, store.next_offset, sync)

    def _commit(self, consumer: Consumer, store: PartitionStore, offset: int | None, sync: bool = False) -> None:
        if offset is None:
            return
        try:
            offsets = [TopicPartition(store.topic, store.partition, offset)]
            if sync:
                consumer.commit(offsets=offsets, asynchronous=False)
            else:
                consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as e:
            log.warning("commit.failed", partition=store.partition, error=str(e))

    def _checkpoint_all(self, consumer: Consumer) -> None:
        """batch/none: every commit-interval. interval: only every fsync-interval, because a
        checkpoint (and the offset commit behind it) may only name data that has been synced.

        With fsync on, the syncs and the checkpoint write run on the flusher thread (they release
        the GIL): the loop keeps consuming and publishing while the disk works, and the offset
        commit follows when the job is done (``_reap_jobs``). One job per partition at a time."""
        mono = time.monotonic()
        if self.s.fsync == "interval" and mono - self._last_fsync < self.s.fsync_interval_ms / 1000:
            return
        self._last_fsync = mono
        for store in self.ps.stores.values():
            if store.dirty and store.partition not in self.jobs:
                if self.s.fsync == "none":
                    self._checkpoint_store(consumer, store)  # no disk wait: nothing to hand off
                else:
                    job = store.begin_checkpoint(fsync=True)
                    self.jobs[store.partition] = (store, job, self.flusher.submit(job.run))

    def _trim_all(self) -> None:
        """Every ``TRIM_INTERVAL_S``: idle stores too (recovery, the scanners and the publisher read
        pages as well). On its own clock, not the checkpoints': RSS must not follow the
        commit interval."""
        for store in self.ps.stores.values():
            store.trim()

    def _work_done(self) -> int:
        """Records consumed and delivered so far (any kind): it stops moving when a burst is over."""
        k = self.ps.counters
        return k.ingested + k.delivered + k.publish_retries + sum(k.dlq.values())

    def _reap_jobs(self, consumer: Consumer) -> None:
        """Finish the checkpoint jobs the flusher completed: reclaim, then commit the offsets."""
        for partition in [p for p, (_s, _j, fut) in self.jobs.items() if fut.done()]:
            self._await_job(consumer, partition)

    def _await_job(self, consumer: Consumer | None, partition: int) -> None:
        """Wait for the partition's checkpoint job, if any, and finish it; commit its offset
        unless ``consumer`` is None (the partition is gone, or the consumer is fenced)."""
        entry = self.jobs.pop(partition, None)
        if entry is None:
            return
        store, job, fut = entry
        fut.result()  # a failed sync (EIO, ENOSPC) is fatal, as it is on the loop thread
        gone = store.finish_checkpoint(job)
        if gone:
            self.flusher.submit(gone.run)  # freeing the files' blocks must not stall the loop
        if consumer is not None:
            self._commit(consumer, store, job.ingress_offset)

    def _check_space(self, consumer: Consumer) -> None:
        used = sum(store.disk_bytes() for store in self.ps.stores.values())
        reason = ""
        if self.s.disk_max_bytes and used >= self.s.disk_max_bytes:
            reason = f"data directory holds {used} bytes, limit {self.s.disk_max_bytes}"
        else:
            try:
                free = psutil.disk_usage(str(self.s.data_path)).free
            except OSError:
                free = self.s.disk_min_free_bytes
            if free < self.s.disk_min_free_bytes:
                reason = f"free disk {free} bytes is below {self.s.disk_min_free_bytes}"
        if reason and not self.paused:
            consumer.pause(consumer.assignment())
            self.paused, self.pause_reason = True, reason
            log.warning("ingress.paused", reason=reason)
        elif not reason and self.paused:
            consumer.resume(consumer.assignment())
            self.paused, self.pause_reason = False, ""
            log.info("ingress.resumed")
        if self.metrics is not None:
            self.metrics.set_store_bytes(used)
            self.metrics.set_ingress_paused(self.paused, self.pause_reason)

    def _pending(self) -> dict[str, int]:
        pending = dict.fromkeys(self._tiers_seen, 0)
        for store in self.ps.stores.values():
            for tier, n in store.pending().items():
                pending[tier] = pending.get(tier, 0) + n
        self._tiers_seen.update(pending)
        return pending

    def _stats(self) -> None:
        pending = {t: n for t, n in self._pending().items() if n}
        k = self.ps.counters
        turn_count, slow_turns, slowest_turn_ms = self.turns.take()
        log.info(
            "stats", ingested=k.ingested, scheduled=k.scheduled, delivered=k.delivered, cancelled=k.cancelled,
            duplicates=k.duplicates, dlq=sum(k.dlq.values()), dlq_by_reason={r: n for r, n in k.dlq.items() if n},
            pending=sum(pending.values()), pending_by_tier=pending, in_flight=self.ps.in_flight,
            retry_queue=len(self.retries), early=k.early, paused=self.paused, turns=turn_count, slow_turns=slow_turns,
            slowest_turn_ms=slowest_turn_ms,
        )

    def _sync_metrics(self, pending: dict[str, int]) -> None:
        """Push counter deltas since the last sync (the hot path only bumps plain integers)."""
        m, k, last = self.metrics, self.ps.counters, self._last
        m.ingested(k.ingested - last.ingested)
        m.scheduled(k.scheduled - last.scheduled)
        m.delivered(k.delivered - last.delivered)
        m.cancelled(k.cancelled - last.cancelled)
        m.duplicates(k.duplicates - last.duplicates)
        m.publish_retries(k.publish_retries - last.publish_retries)
        m.dead_lettered_by_reason({r: n - last.dlq.get(r, 0) for r, n in k.dlq.items()})
        m.observe_lateness_ms(self.ps.lateness_batch)
        m.set_pending_many(pending)
        self.ps.lateness_batch = []
        self._last = Counters(
            ingested=k.ingested, scheduled=k.scheduled, delivered=k.delivered, cancelled=k.cancelled,
            duplicates=k.duplicates, publish_retries=k.publish_retries, dlq=dict(k.dlq),
        )

    def _drain(self, deadline: float) -> None:
        """Wait for in-flight deliveries (and the backlog) until none is left or the deadline."""
        while (self.ps.in_flight or self.backlog) and time.monotonic() < deadline:
            self._flush_backlog(wall_ms())
            self._poll(0.05)

    def _flush_backlog(self, now: int) -> bool:
        """Produce what waited for room in the producer queue; False if it is still full."""
        while self.backlog and self.ps.in_flight < self.s.max_in_flight:
            ref, rec, store, att = self.backlog.popleft()
            if not self._produce(ref, rec, store, att, now):
                return False
        return True

    def _shutdown(self, consumer: Consumer) -> None:
        log.info("sidecar.stopping", in_flight=self.ps.in_flight)
        deadline = time.monotonic() + self.s.shutdown_timeout_ms / 1000
        self._drain(deadline)
        self.producer.flush(max(0.0, deadline - time.monotonic()))
        self._poll(0)
        for store in self.ps.stores.values():
            self._checkpoint_store(consumer, store, sync=True)
        consumer.close()  # on_revoke closes the stores
        for store in self.ps.stores.values():
            store.close()
        self.ps.stores.clear()
        self.flusher.shutdown(wait=True)
        self._stats()
        log.info("sidecar.stopped", in_flight=self.ps.in_flight)

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            self.stop_requested = True

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
