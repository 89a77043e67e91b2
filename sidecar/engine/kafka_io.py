"""Kafka I/O, the engine's port to Kafka: its clients, rebalance callbacks, offset commits (the
topics it needs are made or checked by ``topics.py``; every client's base configuration is
``client_conf.py``'s; the changelog's restore consumer is ``changelog_reader.py``'s, made here as
``restore``).

The engine's clients are made here (other engine modules import only confluent-kafka's error and
offset types, and the transactional-id probe its throwaway producer). The clients are made by a
:class:`Clients` factory, injected: production uses :class:`ConfluentClients`; unit tests pass an
in-memory twin (``tests/kafka_twin.py``) with the same methods, so the loop's run, rebalance,
outage and shutdown paths run without a broker.

Consumer: one per process, subscribed to every tenant's ingress topic (``sidecar/tenants.py``;
a partition is named by its topic and number: ``stores.StoreKey``), in the ``group-id`` group
(static membership with ``group-instance-id``), cooperative-sticky assignment, no auto commit
(offsets are committed only for what the store has made durable: ``durability.py``),
``auto.offset.reset=earliest``.
Producer: idempotent, ``acks=all``, a short linger (``LINGER_MS``; ``EOS_LINGER_MS`` when it is
transactional: see ``producer_conf``). Both get the ``kafka:`` properties of the
settings last, so an operator's TLS/SASL/tuning always wins.

Rebalance (librdkafka calls these from inside ``consume``): assigned partitions are opened by the
:class:`Events` handler (the loop), which returns each one's resume offset (its checkpoint's),
and then assigned at that offset (paused if ingress is paused); revoked partitions are handed to
the handler first (it drains, checkpoints, commits and closes them) and unassigned after; lost
partitions (the group moved on without us) are closed without a commit.

Broker health: ``error_cb`` transport errors and the statistics' broker states tell the
handler when the cluster is unreachable and when it is back (``/readyz``). An error that names
why Kafka refuses the sidecar (credentials, TLS, a missing ACL) goes to :class:`Refusals`
(``refusals.py``), which keeps ``/readyz`` and the ``kafka.refused`` warnings.

Logs: every client's ``logger`` is one :class:`~sidecar.kafka_logs.KafkaLog`, so librdkafka's
lines are ``kafka.log`` events, never stderr; the disconnects of a client being closed
(``replace_consumer``) or of the shutdown (``stop_logs``) are expected: debug, in the log and in
``error_cb``. ``close`` closes the producer too: left open, its threads kept reconnecting to a
broker that stopped after the sidecar, and logging it.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Protocol

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from sidecar import kafka_errors, logs
from sidecar.config import Settings
from sidecar.engine.changelog_reader import ChangelogReader, asked_again
from sidecar.engine.client_conf import FETCH_QUEUE_BACKOFF_MS, client_conf
from sidecar.engine.refusals import Refusals
from sidecar.engine.stores import StoreKey, named, tp_key
from sidecar.engine.topics import ensure_changelog, ensure_topics
from sidecar.engine.transactions import transactional_id
from sidecar.kafka_logs import KafkaLog, expected_error
from sidecar.retry.codes import ALL_BROKERS_DOWN, FATAL, PARTITION_EOF, TRANSPORT
from sidecar.status import advertised_client_id, own_address
from sidecar.store.partition import PartitionStore

log = logs.get("sidecar")

LINGER_MS = 2  # at-least-once: a delivery is visible when produced, so it waits little
PURGED_REPORTS_S = 1.0  # a replaced producer's purged records' reports are served this long at most
EOS_LINGER_MS = 10  # exactly-once: see producer_conf

PRODUCE_ERRORS: tuple[type[BaseException], ...] = (BufferError, KafkaException)


class Clients(Protocol):
    """Makes the Kafka clients (``confluent_kafka`` objects, or look-alikes in tests)."""

    produce_errors: tuple[type[BaseException], ...]  # what ``produce`` raises for one record

    def consumer(self, conf: dict[str, Any]) -> Any: ...
    def producer(self, conf: dict[str, Any]) -> Any: ...
    def admin(self, conf: dict[str, Any]) -> Any: ...


class ConfluentClients:
    produce_errors = PRODUCE_ERRORS

    def consumer(self, conf: dict[str, Any]) -> Any:
        return Consumer(conf)

    def producer(self, conf: dict[str, Any]) -> Any:
        return Producer(conf)

    def admin(self, conf: dict[str, Any]) -> Any:
        return AdminClient(conf)


class Events(Protocol):
    """What Kafka I/O tells the loop."""

    def partitions_assigned(self, partitions: list[StoreKey]) -> dict[StoreKey, int | None]: ...
    def partitions_revoked(self, partitions: list[StoreKey]) -> None: ...
    def partitions_lost(self, partitions: list[StoreKey]) -> None: ...
    def kept_paused(self) -> set[StoreKey]: ...  # assigned partitions that stay paused (restoring, page waits)
    def broker_status(self, up: bool, source: str) -> None: ...
    def statistics(self, stats_json: str) -> None: ...


class _Mapped:
    """A future's result passed through a function (``done`` / ``result`` as the future's)."""

    def __init__(self, fut: Any, fn: Any) -> None:
        self.fut, self.fn = fut, fn

    def done(self) -> bool:
        return bool(self.fut.done())

    def result(self) -> Any:
        return self.fn(self.fut)


def retire_producer(old: Any) -> None:
    """Purge a replaced producer: its records' reports come back as failures, retried on the new
    one. The reports of purged records that were in flight to a broker come once its thread fails
    them, possibly after one poll: served until none is left (a second at most), or their
    in-flight count never came down (measured: a shutdown drain waiting its 30 s). Used for the
    deployment's producer and for a tenant's (``tenant_producers.py``)."""
    old.purge()
    deadline = time.monotonic() + PURGED_REPORTS_S
    while True:
        with contextlib.suppress(KafkaException):  # its fatal error, raised again by a poll: logged by the caller
            old.poll(0.05)
        if not len(old) or time.monotonic() > deadline:
            break


class KafkaIO:
    """The engine's port to Kafka's clients (module docstring). One job although it is long: each
    method is one client call (consume, commit, assign, describe, create) with the handling of its
    errors; what the loop decides from them lives in the engine modules that call it."""

    def __init__(self, settings: Settings, clients: Clients, events: Events) -> None:
        self.s = settings
        self.clients = clients
        self.events = events
        self.consumer: Any = None
        self.producer: Any = None
        self.paused = False
        # ingress topics held apart from ``paused``: a tenant lane waiting for its transactional id
        # (txn_lanes.TopicHold); their partitions stay paused through resume, release and rewind
        self.held_topics: set[str] = set()
        self.consumer_fatal = ""  # set by a fatal consume error: the loop replaces the consumer
        self._warned: dict[str, float] = {}
        tenants = settings.tenants
        self.topics = [t.ingress_topic for t in tenants]  # every tenant's ingress topic, one group
        # ingress topic -> its changelog topic (the restore consumer reads them all)
        self.changelogs = {t.ingress_topic: t.changelog_topic for t in tenants if t.changelog_topic is not None}
        self._dlqs = {t.dlq_topic for t in tenants}
        self.committed: dict[StoreKey, int] = {}  # the last offset committed for each partition
        self.advertise = own_address(settings)  # in every commit's metadata: where look-ups reach us
        # seconds spent in the assign and revoke callbacks (opening and restoring stores, handing
        # them over): the loop tells its own work apart from a stopped process (loop.gap)
        self.callback_s = 0.0
        self._admin_client: Any = None
        self.klog = KafkaLog()  # librdkafka's log, through structlog (every client's "logger")
        self.refusals = Refusals(settings, self.should_warn)  # why Kafka refuses the sidecar, for /readyz
        # the changelog's restore consumer (no group), made when first needed
        self.restore = ChangelogReader(settings, self.changelogs, self._common,
                                       lambda conf: self.clients.consumer(conf), self.admin_client, self.should_warn)

    # -- clients --------------------------------------------------------------------------------
    def _common(self) -> dict[str, Any]:
        return client_conf(self.s, {"error_cb": self._on_error, "logger": self.klog})

    def consumer_conf(self) -> dict[str, Any]:
        conf = self._common()
        conf.update({
            "group.id": self.s.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
            "fetch.wait.max.ms": 10,
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,  # a backlog's drain: client_conf.py
            "statistics.interval.ms": 1000,
            "stats_cb": self._on_stats,
        })
        if self.s.group_instance_id:
            conf["group.instance.id"] = self.s.group_instance_id
        conf.update(self.s.kafka)
        # `delay-sidecar status` finds the member owning a partition, and its HTTP address, from a
        # description of the group: the address rides in the client.id (sidecar/status.py)
        conf["client.id"] = advertised_client_id(self.s)
        return conf

    def producer_conf(self) -> dict[str, Any]:
        conf = self._common()
        conf.update({
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": LINGER_MS,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": max(100_000, self.s.max_in_flight * 2),
            "queue.buffering.max.kbytes": 1_048_576,
            "message.timeout.ms": 120_000,
            "topic.metadata.propagation.max.ms": min(self.s.delivery_grace_ms, 30_000),
        })
        if self.s.exactly_once:
            # one transactional id per instance: a restart fences its previous incarnation
            # (engine/transactions.py); set after the operator's properties, which must not
            # give two instances the same id
            assert self.s.group_instance_id, "the instance id is known before the clients are made"
            conf["transaction.timeout.ms"] = self.s.transaction_timeout_ms
            # Nothing is visible before the commit, and commit_transaction flushes what is queued
            # at once, whatever the linger: a longer linger costs a read_committed consumer nothing
            # and packs a transaction's records into fewer, fuller produce requests, which a
            # broker short of CPU turns round sooner (10 ms against 2 ms: a read_committed p99 of
            # 228-290 ms against 538-1,644 ms in the exactly-once `lateness` bench scenario)
            conf["linger.ms"] = EOS_LINGER_MS
            # librdkafka's rule: a record may not wait longer than its transaction may stay open
            conf["message.timeout.ms"] = min(conf["message.timeout.ms"], self.s.transaction_timeout_ms)
        conf.update(self.s.kafka)
        if self.s.exactly_once:
            conf["transactional.id"] = transactional_id(self.s.group_id, self.s.group_instance_id or "")
        return conf

    def start(self) -> None:
        """Create the missing topics (and check the changelog's), the producer and the consumer,
        and join the group."""
        admin = self.clients.admin(self._common())
        ensure_topics(
            admin, {**dict.fromkeys(self.topics, self.s.ingress_partitions), **dict.fromkeys(self._dlqs, 1)},
            self.s.replication_factor,
        )
        for ingress, changelog in self.changelogs.items():
            ensure_changelog(admin, changelog, ingress, self.s.replication_factor)
        if self.s.history_topic is not None:  # keyed by delay.id: as many partitions as ingress
            ensure_topics(admin, {self.s.history_topic: self.s.ingress_partitions}, self.s.replication_factor)
        self.producer = self.clients.producer(self.producer_conf())
        self.consumer = self._subscribe()

    def changelog_of(self, ingress_topic: str) -> str:
        return self.changelogs[ingress_topic]

    def ingress_end(self, partition: StoreKey) -> int | None:
        """The ingress partition's end offset (a request to the broker); None if unknown."""
        try:
            _low, high = self.consumer.get_watermark_offsets(
                TopicPartition(partition.topic, partition.partition), timeout=5, cached=False
            )
        except KafkaException:
            return None
        return int(high) if high >= 0 else None

    def describe_group(self) -> Any:
        """A future of the group's members: ``[(group.instance.id or member id, {partitions})]``."""
        admin = self.admin_client()
        fut = admin.describe_consumer_groups([self.s.group_id], request_timeout=10)[self.s.group_id]
        topics = set(self.topics)

        def members(f: Any) -> list[tuple[str, set[StoreKey]]]:
            return [(m.group_instance_id or m.member_id,
                     {tp_key(tp) for tp in m.assignment.topic_partitions if tp.topic in topics})
                    for m in f.result().members]

        return _Mapped(fut, members)

    def cluster_answers(self, timeout: float) -> bool:
        """Whether a broker answers a metadata request within ``timeout`` (blocks that long at
        most; the admin client's handle, not the consumer's: ``rejoin.py``)."""
        try:
            self.admin_client().list_topics(topic=self.topics[0], timeout=timeout)
        except KafkaException:
            return False
        return True

    def admin_client(self) -> Any:
        """The deployment's admin client, made when first asked (describe, offsets, the targets' checks)."""
        if self._admin_client is None:
            self._admin_client = self.clients.admin(self._common())
        return self._admin_client

    def _subscribe(self) -> Any:
        consumer = self.clients.consumer(self.consumer_conf())
        consumer.subscribe(
            list(self.topics), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        return consumer

    def replace_consumer(self) -> None:
        """Drop a consumer librdkafka declared dead and join the group with a new one."""
        try:
            with self.klog.closing():  # its broker disconnects are expected
                self.consumer.close()
        except (KafkaException, RuntimeError) as e:
            log.warning("consumer.close_failed", error=str(e))
        self.consumer = self._subscribe()

    def replace_producer(self, reason: str, quiet: bool = False) -> None:
        """A fatal producer error (e.g. the idempotent producer's sequence broke) leaves a producer
        that refuses everything: a new one takes over; what was in flight is retried on it (a
        transactional one is registered by the loop, which also restores the committed state).
        ``quiet``: the error was reported already (a refused transactional id, now healed)."""
        if not quiet:
            log.error("producer.fatal", error=reason, action="continuing with a new producer")
        old, self.producer = self.producer, self.clients.producer(self.producer_conf())
        retire_producer(old)

    def stop_logs(self) -> None:
        """The sidecar is shutting down: broker disconnects from here on are expected."""
        self.klog.stop()

    def close(self) -> None:
        self.consumer.close()  # on_revoke closes the stores
        self.restore.close()
        producer = self.producer
        if producer is not None:
            # Records not acknowledged by the shutdown deadline are delivered again after a
            # restart (the checkpoints do not count them): drop them, then close.
            if len(producer):
                producer.purge()
                producer.poll(0)
            close = getattr(producer, "close", None)  # not in older confluent-kafka releases
            if close is not None:
                close()

    # -- consuming ------------------------------------------------------------------------------
    def consume(self, n: int, timeout: float) -> list[Message]:
        msgs: list[Message] = self.consumer.consume(num_messages=n, timeout=timeout)
        if self.refusals.read_refused and msgs:
            self.refusals.consumed(msgs)
        return msgs

    def consume_error(self, err: Any) -> None:
        """A consumed message carried an error instead of a record."""
        if err.code() == FATAL:
            self.consumer_fatal = err.str()  # the loop replaces the consumer
        elif err.code() == PARTITION_EOF:
            pass
        elif not self.refusals.refused(err) and self.should_warn(f"consume:{err.code()}"):
            log.warning("consume.error", code=err.name(), error=err.str())

    def pause(self) -> None:
        self.consumer.pause(self.consumer.assignment())
        self.paused = True

    def resume(self) -> None:
        held, topics = self.events.kept_paused(), self.held_topics
        self.consumer.resume([tp for tp in self.consumer.assignment()
                              if tp_key(tp) not in held and tp.topic not in topics])
        self.paused = False

    def hold(self, partition: StoreKey) -> None:
        """Pause one assigned partition (its store is restoring) that is being fetched."""
        self.consumer.pause([TopicPartition(*partition)])

    def hold_topic(self, topic: str) -> None:
        """Hold ``topic``'s assigned partitions paused until :meth:`release_topic`. A partition
        assigned meanwhile is not paused at once (see ``_assign``): ingress holds it at its
        first record (``Ingress.ingest``)."""
        self.held_topics.add(topic)
        self.consumer.pause([tp for tp in self.consumer.assignment() if tp.topic == topic])

    def release_topic(self, topic: str) -> None:
        """Consume ``topic`` again from the group's committed offsets (its records consumed while
        it was held were dropped, none stored), unless all of ingress is paused."""
        self.held_topics.discard(topic)
        self.rewind([tp_key(tp) for tp in self.consumer.assignment() if tp.topic == topic])
        if not self.paused:
            kept = self.events.kept_paused()
            self.consumer.resume([tp for tp in self.consumer.assignment() if tp.topic == topic
                                  and tp_key(tp) not in kept])

    def seek(self, partition: StoreKey, offset: int) -> None:
        """The next records of ``partition`` are read from ``offset`` (it is being fetched)."""
        self.consumer.seek(TopicPartition(*partition, offset))

    def release(self, partition: StoreKey) -> None:
        """A held (restoring) partition is ready: consume it, unless all of ingress or its topic is paused."""
        if not self.paused and partition.topic not in self.held_topics:
            self.consumer.resume([TopicPartition(*partition)])

    def commit(self, store: PartitionStore, offset: int | None, sync: bool = False) -> None:
        """Commit ``offset`` as the store's partition's resume point (the checkpoint covers it)."""
        if offset is None:
            return
        try:
            # the metadata names where this owner answers look-ups (sidecar/status.py)
            self.consumer.commit(
                offsets=[self._tp(store.topic, store.partition, offset)],
                asynchronous=not sync,
            )
            self.committed[StoreKey(store.topic, store.partition)] = offset
        except KafkaException as e:
            if not (e.args and self.refusals.refused(e.args[0])):  # a missing group ACL: named once a minute
                log.warning("commit.failed", partition=store.partition, topic=store.topic, error=str(e))

    def offsets_of(self, stores: list[PartitionStore]) -> list[TopicPartition]:
        """The ingress offsets to commit for ``stores`` (with this owner's address), in a
        transaction (exactly-once)."""
        return [self._tp(s.topic, s.partition, s.next_offset) for s in stores if s.next_offset is not None]

    def group_metadata(self) -> Any:
        """The consumer's group metadata (member id, generation): a transaction's offsets are
        refused for a member the group has moved on from (KIP-447)."""
        return self.consumer.consumer_group_metadata()

    def rewind(self, partitions: list[StoreKey]) -> None:
        """Consume ``partitions`` again from the group's committed offsets (after an aborted
        transaction: what was consumed since is not committed); the restoring ones stay paused."""
        if not partitions:
            return
        tps = [TopicPartition(*p) for p in partitions]
        committed = asked_again(lambda: self.consumer.committed(tps, timeout=30), "committed", self.should_warn)
        for tp in committed:
            if tp.offset < 0:
                tp.offset = OFFSET_BEGINNING  # nothing committed yet: auto.offset.reset=earliest
            self.consumer.seek(tp)
            if tp.offset >= 0:
                self.committed[tp_key(tp)] = tp.offset
        held, topics = self.events.kept_paused(), self.held_topics
        if self.paused:
            self.consumer.pause(tps)
        elif held or topics:
            self.consumer.pause([tp for tp in tps if tp_key(tp) in held or tp.topic in topics])

    def _tp(self, topic: str, partition: int, offset: int) -> TopicPartition:
        """An offset to commit, with this owner's address as its metadata when it has one."""
        if self.advertise is None:
            return TopicPartition(topic, partition, offset)
        return TopicPartition(topic, partition, offset, metadata=self.advertise)

    def prove_membership(self, partitions: list[StoreKey]) -> bool | None:
        """Is this consumer still the group's owner of ``partitions``? A synchronous commit of
        their last committed offsets answers (the coordinator checks the member id and the
        generation, and refuses a fenced or expired member); None when nothing was committed yet
        (no offset to commit again)."""
        offsets = [self._tp(*p, self.committed[p]) for p in partitions if p in self.committed]
        if not offsets:
            return None
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as e:
            log.warning("group.membership_unproven", error=str(e), partitions=named(partitions),
                        action="not publishing until the group confirms or moves the partitions")
            return False
        return True

    # -- rebalance ------------------------------------------------------------------------------
    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        t0 = time.monotonic()
        try:
            self._assign(consumer, partitions)
        finally:
            self.callback_s += time.monotonic() - t0

    def _assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        resume = self.events.partitions_assigned([tp_key(tp) for tp in partitions])
        for tp in partitions:
            offset = resume.get(tp_key(tp))
            tp.offset = offset if offset is not None else OFFSET_INVALID
        consumer.incremental_assign(partitions)
        # Restoring partitions are not paused here. A pause right after the assignment races the
        # fetch start the assignment queued on librdkafka's own thread (versioned ops:
        # confluentinc/librdkafka#5591, #2190): the pause can be lost, or it can outdate the fetch
        # start, and then the partition is never fetched, resumed or not (CI, 2026-11-28: a
        # partition of each of two runs ingested nothing for 30-120 s after a 1 ms restore). So the
        # loop's ``ingest`` holds a restoring partition at its first record instead (the fetch is
        # running by then: the pause is safe) and reads it again from that record once restored.
        # A pause for disk space (rare at an assignment) still applies at once.
        if self.paused:
            consumer.pause(partitions)

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        t0 = time.monotonic()
        try:
            self._revoke(consumer, partitions)
        finally:
            self.callback_s += time.monotonic() - t0

    def _revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self.events.partitions_revoked([tp_key(tp) for tp in partitions])
        consumer.incremental_unassign(partitions)
        for tp in partitions:
            self.committed.pop(tp_key(tp), None)

    def _on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self.events.partitions_lost([tp_key(tp) for tp in partitions])
        consumer.incremental_unassign(partitions)
        for tp in partitions:
            self.committed.pop(tp_key(tp), None)

    # -- broker health --------------------------------------------------------------------------
    def _on_error(self, err: KafkaError) -> None:
        if expected_error(self.klog, err.name()):  # a disconnect while shutting down or closing a client
            log.debug("kafka.error", code=err.name(), error=err.str(), expected=True)
            return
        refusal = self.refusals.cause(err)
        if refusal is not None and refusal.code in (kafka_errors.AUTH_FAILED, kafka_errors.TLS_FAILED):
            self.events.broker_status(False, refusal.code)
            self.refusals.report(refusal)
        elif err.code() in (ALL_BROKERS_DOWN, TRANSPORT):
            self.events.broker_status(False, err.str())
        elif refusal is not None:
            self.refusals.report(refusal)
        elif self.should_warn(f"kafka.error:{err.code()}"):
            log.warning("kafka.error", code=err.name(), error=err.str())

    def _on_stats(self, stats_json: str) -> None:
        """librdkafka statistics (every second): consumer lag for the metrics, and whether any
        real broker connection is UP — the signal that brings readiness back after an outage even
        when nothing is being delivered."""
        self.events.statistics(stats_json)
        try:
            brokers = orjson.loads(stats_json).get("brokers", {})
        except orjson.JSONDecodeError:
            return
        up = any(b.get("state") == "UP" for b in brokers.values() if b.get("nodeid", -1) >= 0)
        self.events.broker_status(up, "statistics")
        if up:
            self.refusals.broker_up()

    def should_warn(self, key: str, every_s: float = 30.0) -> bool:
        """Rate-limit repeated warnings (a broker outage raises the same error many times a second)."""
        now = time.monotonic()
        if now - self._warned.get(key, -every_s) < every_s:
            return False
        self._warned[key] = now
        return True
