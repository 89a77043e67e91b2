"""Publishing: due records -> the producer -> delivery reports -> the stores.

Each loop turn calls :meth:`Publishing.publish`, which hands out what is due, in this order:

1. the **backlog**: records a full producer queue refused (they go first, in order; those of a
   partition no longer owned are dropped: its new owner restores and delivers them);
2. the **retry heap** ``(at_ms, seq, ref, store, attempts)``: records whose publish failed and
   whose backoff ran out, and records parked for a moment (not due yet, or a capped target);
3. every partition's scheduler, ``due(now, room)``, in chunks of ``PUBLISH_CHUNK`` (``SHARED_CHUNK``
   while several tenants have records pending) with a producer poll between them,
   ``PUBLISH_BUDGET_PER_TURN`` records per turn, never more than ``max-in-flight`` unreported
   records. The budget is shared fairly between tenants (the
   partitions of one ingress topic; engine/fairness.py): each tenant with records due gets an
   equal part, what one leaves goes to the others, the lightest goes first, and within a tenant
   the starting partition rotates. While several tenants have records pending, the budget is
   handed out in rounds of at most ``SHARED_TURN_S``, each from a fresh clock reading with the
   lightest tenant first: a record falling due meanwhile waits for the round, not the turn. The
   round's time is checked after each chunk, so the chunk is smaller then: a chunk of 1,000 and
   its poll took 10-30 ms on two busy cores, and the rounds overran by as much.
   A tenant with a ``max-delivery-rate`` gets no more than its token bucket holds
   (``engine/pacing.py``: its lateness is its own).

**Never early**: ``_produce`` compares the record's due time with the clock reading taken for
this publish call; a record that is not due (a scheduler bug) is counted ``early``, logged and
parked until its due time. The C path (``_native.publish_due``) makes the same check.

**Per-target caps**: a target whose last publish failed (``troubled``) may hold at most a quarter
of ``max-in-flight``: a missing or slow topic cannot take the whole budget from healthy ones.

**Delivery reports** (``_on_delivery``, or the C ``Delivery`` for the plain success): a success
is handed to its store (``acked``, settled in one batch after the poll) and its lateness is
recorded; a failure goes through the :class:`~sidecar.retry.PublishFailurePolicy` of the settings
(``delivery-grace``, ``delivery-attempts``): retry with capped, jittered backoff, or dead-letter
with ``delivery-failed``. A report for a partition that was revoked meanwhile is dropped: the new
owner delivers the record from its own checkpoint. A report saying the producer instance itself
is dead (librdkafka fatal error) asks the loop for a new producer (``producer_fatal``); the
record is retried on it.

**Tenant producers** (sidecar/engine/tenant_producers.py): a store's records go through its
tenant's producer when the tenant has ``kafka:`` overrides (``tenants.of``), the deployment's
otherwise; ``poll`` serves every producer's reports. A delivery refused for authorization is
dead-lettered as ``not-authorized``, its error naming the topic and the principal.

The C fast path (docs/storage.md 2.6) produces the plain records and handles plain successes;
everything else comes back to the Python code here, the reference. Both share
:class:`~sidecar.engine.publish_state.PublishState`.

**Records published from the intake** (due on arrival, never stored) are engine/direct.py's:
its ``DirectPort`` counts through ``native_publisher`` (so ``in_flight`` and ``drain`` count
them), and ``poll`` hands what their reports delivered to ``settle_direct``, which it sets.
What both paths share stays here: ``delivered_to`` and ``failure_seen`` (a target's health, the
broker's readiness, a dead producer); a failed one is stored and comes back as a stored record.

**Exactly-once** (``delivery: exactly-once``, engine/transactions.py): a record's changelog
tombstone is written when it is produced, inside the same transaction (``_produce``; after a C
run, ``StoreMirror.remove_produced``). A target topic is produced to only once the cluster's metadata has it and
this principal may write it (``target_access.TargetAccess``; a produce to a missing topic would abort
the whole transaction when it times out, one to a topic it may not write at once, after every
abort again; asked as the principal that publishes the store's records: engine/eos_targets.py):
a batch with a target not known yet takes the reference path, where an unknown target fails
without a produce (missing: ``delivery-grace``, then the DLQ; not writable: ``not-authorized``).
A failed delivery report cannot be retried inside the transaction: it dooms the transaction of
the store's ingress topic (``doomed``), and the loop aborts it and restores the committed state.

**etf1 tombstones** (``etf1-tombstones: on``, sidecar/engine/etf1.py): a record delivered in
kafka-message-scheduler mode gets a tombstone under its key on its ingress partition, as etf1
writes one: from the delivery report (before its store settles it, ``poll``), or under
exactly-once when it is produced, in the same transaction.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from confluent_kafka import KafkaException

from sidecar import contract as c
from sidecar import logs
from sidecar.config import Settings
from sidecar.engine import wake
from sidecar.engine.clock import Clock
from sidecar.engine.eos_targets import Targets
from sidecar.engine.etf1 import Tombstones
from sidecar.engine.fairness import FairTurns, due_sources
from sidecar.engine.pacing import Pacing
from sidecar.engine.publish_state import PublishState
from sidecar.engine.stores import Stores, store_key
from sidecar.engine.tenant_producers import TenantProducers
from sidecar.retry import (
    Backoff,
    ErrorKind,
    KafkaErrorLike,
    PublishFailurePolicy,
    Retry,
    classify,
    describe,
    producer_must_restart,
)
from sidecar.retry.codes import MSG_TIMED_OUT, TRANSPORT
from sidecar.store import codec
from sidecar.store.codec import NATIVE, Record, delivery_headers, native
from sidecar.store.partition import Counters, PartitionStore

log = logs.get("sidecar")

PUBLISH_CHUNK = 1000  # records handed out by a scheduler per call
SHARED_CHUNK = 250  # ... while several tenants have records pending (a round's end is checked after each)
PUBLISH_BUDGET_PER_TURN = 5000  # records published per loop turn, across partitions
SHARED_TURN_S = 0.02  # several tenants with records pending: a round of a turn's publishing ends after this long
PUBLISH_BACKOFF = Backoff(base_ms=100, cap_ms=10_000)  # a failed publish's retry backoff
PARK_MS = 200  # a capped target's record waits this long before it is tried again
DLQ_RETRY_MS = 10_000  # the DLQ itself refused a dead letter: it is tried again after this
# The publish fast path in C: ``_produce`` and ``_on_delivery`` stay the reference and take
# every record it hands back.
_publish_due = native.publish_due if NATIVE else None


def _next_due_ms(store: PartitionStore) -> int | None:
    return store.sched.next_due_ms()


class Attempts:
    """Retry state of a record whose publishing failed (none for a record that went through)."""

    __slots__ = ("attempt", "first_failure_ms")

    def __init__(self) -> None:
        self.attempt = 0
        self.first_failure_ms = 0


BacklogEntry = tuple[int, Record, PartitionStore, Attempts | None]
RetryEntry = tuple[int, int, int, PartitionStore, Attempts | None]  # (at_ms, seq, ref, store, attempts)


class Publishing:
    """Due records to the producers and their reports back to the stores (module docstring).

    One job although it is long: the backlog, the retry heap, the turn order between tenants and
    the in-flight counts are one queue of work seen from its two ends, the hand-out (``publish``)
    and the reports (``poll``); every path that produces or settles a record reads and moves them
    together. What decides without this state lives apart: the turn order's arithmetic
    (fairness.py), pacing (pacing.py), the retry policy (sidecar/retry), the tenants' producers
    (tenant_producers.py), the C fast path (native/publish.c), the records published from the
    intake (direct.py)."""

    def __init__(
        self, settings: Settings, counters: Counters, stores: Stores, clock: Clock,
        produce_errors: tuple[type[BaseException], ...], on_broker: Callable[[bool, str], None],
    ) -> None:
        self.s = settings
        self.clock = clock
        self.counters = counters
        self.stores = stores
        self.state = PublishState(stores, counters)
        self.topic_cap = max(1, settings.max_in_flight // 4)
        self.backlog: deque[BacklogEntry] = deque()
        self.retries: list[RetryEntry] = []
        self._seq = itertools.count()
        # the turn order between tenants, and their shares of the in-flight window
        self.fair: FairTurns[PartitionStore] = FairTurns(settings.max_in_flight)
        self._halted = False  # this turn's publishing stopped: no in-flight room, the queue full, or its time
        self._deadline = 0.0  # several tenants with records: when a round of this turn's publishing ends
        self._timed_out = False  # ... and it did: another round follows, from a fresh clock reading
        self.pacing = Pacing(settings.tenants, clock.wall_ms())  # max-delivery-rate per tenant
        self.policy = PublishFailurePolicy.from_settings(settings, PUBLISH_BACKOFF)
        self.rng = random.Random()
        self.on_broker = on_broker  # (up, source): the loop's readiness
        self.producer: Any = None  # set by the loop once the clients exist
        self.tenants = TenantProducers(settings)  # the tenants' own producers, started by the loop
        self.producer_fatal = ""  # set by a report that the producer instance is dead
        self.produce_errors = produce_errors  # what ``produce`` raises for one record
        self.exactly_once = settings.exactly_once
        # the C fast path's reports count through it, and those of engine/direct.py's ports (None: no C)
        self.native_publisher: Any = native.Publisher(self.state, self._on_delivery, produce_errors) if NATIVE else None
        self.settle_direct: Callable[[], None] | None = None  # after each poll: engine/direct.py's
        # exactly-once: the targets each principal may write (eos_targets.py), and why an open
        # transaction must abort, by the ingress topic of the failed record ("": the deployment's)
        self.targets = Targets()
        self.doomed: dict[str, str] = {}
        # ingress topics whose stores are not published: their lane waits for its transactional id
        # (the loop hands in ``KafkaIO.held_topics``, the same set)
        self.held: set[str] = set()
        self.etf1 = Tombstones(settings.ingress_topic, self._etf1_rejected, produce_errors) if (
            settings.etf1_tombstones == "on") else None

    def _etf1_rejected(self, error: str) -> None:
        if self.exactly_once:
            self.doomed.setdefault("", error)  # it was in the open transaction, which cannot commit now

    @property
    def in_flight(self) -> int:
        return self.state.in_flight

    # -- a turn ---------------------------------------------------------------------------------
    def publish(self) -> None:
        now = self.clock.wall_ms()
        if not self.flush_backlog(now):
            return
        st, max_in_flight = self.state, self.s.max_in_flight
        while self.retries and self.retries[0][0] <= now and st.in_flight < max_in_flight:
            _at, _seq, ref, store, att = heapq.heappop(self.retries)
            again = store.sched.record(ref) if self.stores.get(store_key(store)) is store else None
            if again is None:
                continue
            if store.superseded and store.drop_superseded(ref, again):
                continue  # replaced while it waited for this retry: the new version is pending
            self.counters.publish_retries += 1
            if not self._produce(ref, again, store, att, now):
                return
        # Bounded work per turn, in chunks with a poll between them: a mass expiry starts
        # publishing at once (not after decoding 20,000 records) and intake keeps its turns.
        # The budget is shared between tenants (engine/fairness.py): one tenant's mass expiry
        # cannot take another's turn.
        groups: dict[str, list[PartitionStore]] = {}
        held = self.held
        for store in self.stores.values():
            if held and store.topic in held:
                continue  # its lane waits for its transactional id (txn_refusal.py)
            group = groups.get(store.topic)
            if group is None:
                groups[store.topic] = [store]
            else:
                group.append(store)
        budget = PUBLISH_BUDGET_PER_TURN
        while True:
            if len(groups) > 1:
                tenants, present = due_sources(groups, now, _next_due_ms)
                if not tenants:
                    return
            else:
                tenants, present = groups, set(groups)
            # Several tenants with records: a round of the budget's sharing ends after SHARED_TURN_S
            # and the next starts from a fresh clock reading, the lightest tenant first, so that a
            # record falling due meanwhile waits 20 ms, not for a neighbour's 5,000.
            self._halted = self._timed_out = False
            self._deadline = self.clock.monotonic() + SHARED_TURN_S if len(present) > 1 else 0.0
            given = self.fair.turn(budget, tenants, partial(self._take, now=now), self._is_halted, present,
                                   self._total_in_flight)
            budget -= sum(given.values())
            if not self._timed_out or budget <= 0:
                return
            now = self.clock.wall_ms()

    def _total_in_flight(self) -> int:
        return int(self.state.in_flight)

    def _is_halted(self) -> bool:
        return self._halted

    def _take(self, store: PartitionStore, want: int, now: int) -> int:
        """Hand out up to ``want`` of ``store``'s due records, in chunks with a producer poll
        between them; fewer when nothing more is due or the producer cannot take more (then
        ``_halted``: ``max-in-flight`` reached, or the queue full)."""
        st, max_in_flight = self.state, self.s.max_in_flight
        chunk = SHARED_CHUNK if self._deadline else PUBLISH_CHUNK  # a round's end is checked per chunk
        given = 0
        while given < want:
            room = min(max_in_flight - st.in_flight, chunk, want - given)
            if room <= 0:
                self._halted = True
                break
            room = self.pacing.room(store.topic, room, now)  # its tenant's max-delivery-rate
            batch = store.sched.due(now, room) if room > 0 else None
            if not batch:
                break
            self.pacing.took(store.topic, batch, now)
            given += len(batch)
            if not self._publish_batch(batch, store, now):
                self._halted = True
                break
            self.poll(0)
            if self._deadline and self.clock.monotonic() >= self._deadline:
                self._halted = self._timed_out = True
                break
            if len(batch) < room:
                # Nothing more is due (or the scheduler's scan budget ran out: then it still
                # reports a due time <= now and the next turn does not wait): asking again
                # would cost a whole empty ``due`` call per turn.
                break
        return given

    def _publish_batch(self, batch: list[tuple[int, Record]], store: PartitionStore, now: int) -> bool:
        """Produce a due batch; False if the producer queue filled up (the rest waits in the
        backlog). With the extension, ``publish_due`` produces the plain records in C and stops at
        any other one, which goes through ``_produce`` here (or ``_refused``, when the producer
        raised for it) before C takes over again."""
        i, n = 0, len(batch)
        # exactly-once: C produces only to targets known to exist (an unknown one would abort the
        # transaction: ``_produce`` asks for it), and the tombstones of what it produced are
        # written right after, in the same transaction (``StoreMirror.remove_produced``)
        publish_due = _publish_due if self.native_publisher is not None and (
            not self.exactly_once or self.targets.of(store.topic).all_known(batch)) else None
        producer = self.tenants.of(store.topic, self.producer)
        while i < n:
            refused = None
            if publish_due is not None:
                start = i
                i, refused = publish_due(self.native_publisher, producer.produce, batch, i, store, now)
                if self.exactly_once and i > start:
                    if store.mirror is not None:
                        store.mirror.remove_produced(batch, start, i, store.superseded)
                    if self.etf1 is not None:
                        self.etf1.write(self.producer, batch[start:i], store)
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

    def poll(self, timeout: float) -> None:
        """Serve delivery reports, then hand the successes to their stores in one batch."""
        try:
            self.producer.poll(timeout)
        except KafkaException as e:
            # confluent-kafka raises a fatal error (a fenced transactional producer, a broken
            # idempotent sequence) from poll, whatever the error callback: a new producer is needed
            err = e.args[0] if e.args else None
            if err is None or not hasattr(err, "fatal") or not err.fatal():
                raise
            if not self.producer_fatal:
                self.producer_fatal = describe(err)
        if self.tenants.own:
            self.tenants.poll()
        if self.native_publisher is not None:
            self.native_publisher.sync()  # the in-flight counts its reports took down
        now = -1
        for store in self.stores.values():
            if store.acked:
                if now < 0:
                    now = self.clock.wall_ms()
                if self.etf1 is not None and not self.exactly_once:
                    self.etf1.write(self.producer, store.acked, store)
                self.fair.settled(store.topic, len(store.acked))
                store.settle(now)
        if self.settle_direct is not None:
            self.settle_direct()

    def flush_backlog(self, now: int) -> bool:
        """Produce what waited for room in the producer queue; False if it is still full."""
        while self.backlog and self.state.in_flight < self.s.max_in_flight:
            ref, rec, store, att = self.backlog.popleft()
            if self.stores.get(store_key(store)) is not store:
                # The partition went away (lost, or a revoke whose drain ran out of time) while its
                # record waited for room: its new owner restores it from the changelog and delivers
                # it. Produced here, it would arrive a second time after the handover.
                continue
            if store.superseded and store.drop_superseded(ref, rec):
                continue  # replaced while it waited for room: the new version is pending
            if not self._produce(ref, rec, store, att, now):
                return False
        return True

    def drain(self, deadline: float) -> None:
        """Wait for in-flight deliveries (and the backlog) until none is left or the deadline
        (on the clock's monotonic seconds)."""
        while (self.state.in_flight or self.backlog) and self.clock.monotonic() < deadline:
            self.flush_backlog(self.clock.wall_ms())
            self.poll(0.05)

    # -- when to wake (engine/wake.py) ------------------------------------------------------------
    def next_due(self) -> int | None:
        return wake.next_due(self.stores.values(), self.held, self.pacing,
                             self.clock.wall_ms() if self.pacing.buckets else 0)

    def due_now(self) -> bool:
        nxt = self.next_due()
        return nxt is not None and nxt <= self.clock.wall_ms()

    def wait_s(self, now: int) -> float:
        """How long the loop may wait for records (engine/wake.py)."""
        return wake.wait_s(now, self.next_due, self.backlog, self.retries)

    # -- one record -----------------------------------------------------------------------------
    def _park(self, at_ms: int, ref: int, store: PartitionStore, att: Attempts | None) -> None:
        heapq.heappush(self.retries, (at_ms, next(self._seq), ref, store, att))

    def _produce(self, ref: int, rec: Record, store: PartitionStore, att: Attempts | None, now: int) -> bool:
        if rec.due_ms > now:  # the publish-time check: never early, whatever the scheduler said
            self.counters.early += 1
            log.error("publish.not_due", due_ms=rec.due_ms, now_ms=now)
            self._park(rec.due_ms, ref, store, att)
            return True
        if rec.rtype == codec.RECURRING:  # a schedule's firing: what fires now (store/firings.py)
            headers: Any = store.firings.fire(ref, rec, now)
            if headers is None:
                return True  # nothing fires now (misfire: skip); the next firing is armed
        else:
            headers = None
        topic = rec.topic.decode()
        st = self.state
        if self.exactly_once and (unwritable := self.targets.of(store.topic).refusal(topic, now)) is not None:
            self._failed(ref, rec, store, att, unwritable)  # missing, or its principal may not write it
            return True
        if st.troubled and topic in st.troubled and st.topic_in_flight.get(topic, 0) >= self.topic_cap:
            # A failing (slow, missing) target must not take the whole in-flight budget from the
            # healthy ones: park its records briefly. Healthy targets are never capped.
            self._park(now + PARK_MS, ref, store, att)
            return True
        if headers is None:
            headers = delivery_headers(rec, store.topic_bytes)
        try:
            # Positional: with keywords, confluent-kafka's argument parsing builds a str for every
            # keyword name it looks up, about 2 us per call (measured). The order is the client's:
            # topic, value, key, partition (-1: its partitioner), callback, on_delivery (alias,
            # unused), timestamp (0: now), headers.
            self.tenants.of(store.topic, self.producer).produce(
                topic, rec.value, rec.key, rec.target_partition,
                partial(self._on_delivery, ref, rec, store, att, topic), None, 0, headers,
            )
        except self.produce_errors as e:  # BufferError (queue full) or the client's local error
            return self._refused(ref, rec, store, att, e)
        st.in_flight += 1
        tif = st.topic_in_flight
        tif[topic] = tif.get(topic, 0) + 1
        if (self.exactly_once and store.mirror is not None and ref not in store.superseded
                and not (rec.rtype == codec.RECURRING and store.firings.continues(ref))):
            store.mirror.remove(rec.id)  # in the delivery's transaction: both commit or neither
        if self.exactly_once and self.etf1 is not None:
            self.etf1.write(self.producer, ((ref, rec),), store)
        return True

    def forget(self, covers: Callable[[str], bool] | None = None) -> None:
        """Drop the backlog, the retries and the doom of the ingress topics ``covers`` accepts
        (all without it): their stores are gone, an aborted transaction."""
        if covers is None:
            self.backlog.clear()
            self.retries.clear()
            self.doomed.clear()
            return
        kept = [e for e in self.backlog if not covers(e[2].topic)]
        self.backlog.clear()
        self.backlog.extend(kept)
        self.retries[:] = [e for e in self.retries if not covers(e[3].topic)]
        heapq.heapify(self.retries)
        for topic in [t for t in self.doomed if covers(t)]:
            del self.doomed[topic]

    def _refused(
        self, ref: int, rec: Record, store: PartitionStore, att: Attempts | None, e: BaseException,
    ) -> bool:
        """``produce`` raised for the record: False when the producer queue is full (the record
        goes first in the backlog); a local error (e.g. an invalid partition) is a failed publish."""
        if isinstance(e, BufferError):
            self.backlog.appendleft((ref, rec, store, att))
            self.poll(0.01)
            return False
        self._failed(ref, rec, store, att, e.args[0])
        return True

    def _on_delivery(
        self, ref: int, rec: Record, store: PartitionStore, att: Attempts | None, topic: str,
        err: KafkaErrorLike | None, msg: Any,
    ) -> None:
        st = self.state
        st.in_flight -= 1
        tif = st.topic_in_flight
        left = tif[topic] - 1
        if left:
            tif[topic] = left
        else:
            del tif[topic]
        if self.stores.get(store_key(store)) is not store:
            return  # the partition was revoked; its new owner delivers from its own checkpoint
        if err is not None and self.exactly_once:
            # the transaction cannot commit with a failed record in it: the loop aborts it and
            # restores the committed state (retried from there; a topic is asked for again)
            self.targets.of(store.topic).forget(topic)
            self.doomed.setdefault(store.topic, f"delivery to {topic} failed: {describe(err)}")
            return
        if err is None:
            self.delivered_to(topic)
            lateness = msg.timestamp()[1] - rec.due_ms
            if lateness < 0:
                self.counters.early += 1
            store.lateness.append(lateness)
            store.acked.append((ref, rec))  # settled in a batch after the poll (``poll``)
            return
        self._failed(ref, rec, store, att, err)

    def delivered_to(self, topic: str) -> None:
        """A delivery to ``topic`` succeeded: it is not troubled, the broker is up."""
        st = self.state
        if st.troubled and topic in st.troubled:
            del st.troubled[topic]
        if not st.broker_up:
            self.on_broker(True, "delivery")

    def failure_seen(self, err: Any, topic: str, ingress_topic: str) -> ErrorKind:
        """A delivery to ``topic`` (of a record of ``ingress_topic``) failed with ``err``: the
        target is troubled, the broker may be down, the producer may be dead. Returns its kind."""
        self.state.troubled[topic] = self.clock.wall_ms()
        kind = classify(err)
        if (kind is ErrorKind.RETRIABLE and err.code() in (MSG_TIMED_OUT, TRANSPORT) and self.state.broker_up
                and ingress_topic not in self.tenants.own):  # a tenant's own connection is not the deployment's
            self.on_broker(False, "delivery")
        if (producer_must_restart(err) and not self.tenants.died(ingress_topic, describe(err))
                and not self.producer_fatal):
            self.producer_fatal = describe(err)  # the loop replaces the producer at the end of the turn
        return kind

    def _failed(self, ref: int, rec: Record, store: PartitionStore, att: Attempts | None, err: Any) -> None:
        now = self.clock.wall_ms()
        kind = self.failure_seen(err, rec.topic.decode(), store.topic)
        if att is None:
            att = Attempts()
        att.attempt += 1
        if att.first_failure_ms == 0:
            att.first_failure_ms = now
        refusal = self.tenants.refusal(err, rec.topic.decode(), store.topic)  # names topic and principal
        decision = self.policy.decide(kind, att.attempt, att.first_failure_ms, now, self.rng,
                                      error=refusal or describe(err))
        if isinstance(decision, Retry):
            if att.attempt == 1 or att.attempt % 100 == 0:
                log.warning("publish.retry", topic=rec.topic.decode(), error=err.str(), attempt=att.attempt)
            self._park(decision.at_ms, ref, store, att)
            return
        log.warning("publish.dead_letter", topic=rec.topic.decode(), error=err.str(), attempts=att.attempt)
        if rec.rtype == codec.DEAD:
            # The DLQ itself refuses the record: keep retrying it rather than drop it.
            self._park(now + DLQ_RETRY_MS, ref, store, att)
            return
        store.dead_letter(ref, rec, c.NOT_AUTHORIZED if refusal else c.DELIVERY_FAILED, decision.error, att.attempt,
                          now)
