"""An in-memory Kafka twin and a virtual clock, for unit tests of the event loop.

The model is dramatiq's ``StubBroker``: the engine talks to these objects through the same
methods it calls on confluent-kafka's clients (``engine/kafka_io.py``'s ``Clients`` factory), so
``Sidecar.turn`` runs its real code — intake, the C paths, publishing, checkpoints, rebalance and
shutdown — with no broker, deterministically, in milliseconds.

- :class:`VirtualClock`: epoch ms and monotonic seconds that move only when the code waits (a
  ``consume`` with nothing to return, ``sleep``) or the test says so (``advance``): trio's
  ``MockClock`` with autojump. Scheduled actions (``at``) run when the clock passes their time.
- :class:`TwinCluster`: topics of partitions (lists of :class:`TwinMessage`), committed offsets per
  group, and one consumer group with cooperative rebalancing: members join and leave, the
  partitions are spread round-robin, a moved partition is revoked from its old owner (at that
  owner's next ``consume``) before the new owner is assigned it. ``down`` makes every produce
  fail with a transport error, as an outage would; ``refused`` topics refuse every write, and
  ``denied`` those of one principal (a producer's ``sasl.username``), with
  ``TOPIC_AUTHORIZATION_FAILED``, as an ACL missing on the broker would; the produces of an
  ``unreachable`` principal time out, as a refused login's would.
- :class:`TwinClients`: the factory the loop gets (``consumer``, ``producer``, ``admin``).

Transactions (a producer made with ``transactional.id``), as librdkafka and the broker run them:

- States, as librdkafka names them: ``Init`` -> ``init_transactions`` -> ``Ready`` ->
  ``begin_transaction`` -> ``InTransaction`` -> ``commit_transaction``/``abort_transaction`` ->
  ``Ready``; ``AbortableError`` (only ``abort_transaction`` leaves it) and ``FatalError`` (nothing
  does). Timeouts are positional numbers, as confluent-kafka parses them (a keyword or None is a
  ``TypeError``). A call in the wrong state raises ``_STATE``; in ``AbortableError`` every call but
  abort raises the transaction's error with ``txn_requires_abort()``, in ``FatalError`` the fatal one.
  ``produce`` is allowed only ``InTransaction`` (else ``_STATE``; after a fatal error ``_FATAL``,
  whose ``fatal()`` is False: confluent-kafka's ``produce`` raises the bare code).
- A transaction's records are appended at the next ``poll`` like any record (offsets, successful
  delivery reports), tagged with their transaction. ``commit_transaction`` flushes (delivery
  reports; a failed one makes the transaction abortable), then ends the transaction: a control
  record (the marker) is appended to every partition it wrote, taking an offset that no consumer
  returns, and the offsets given to ``send_offsets_to_transaction`` become the group's committed
  offsets at that moment. ``abort_transaction`` purges the unacknowledged records (their reports,
  ``_PURGE_QUEUE``, are served inside the call, as librdkafka's purge + flush does), writes abort
  markers and drops the offsets; aborted records stay in the log.
- Consumers read ``isolation.level`` (default ``read_committed``, as librdkafka). A read_committed
  consumer skips aborted records and never reads at or past a partition's last stable offset (LSO:
  the first offset of its earliest open transaction); ``get_watermark_offsets`` and the admin's
  ``list_offsets(isolation_level=READ_COMMITTED)`` answer the LSO as the high offset. Control
  records are skipped at every level and the position moves past them when they are read over. A
  partition never written transactionally is read as a plain slice of its log.
- ``send_offsets_to_transaction`` checks the consumer's ``consumer_group_metadata()`` (member id and
  the generation it last synced at a ``consume``) against the group: a member that is gone
  (``expel``, ``leave``) is refused with ``UNKNOWN_MEMBER_ID``, metadata from before a rebalance the
  member has since taken part in with ``ILLEGAL_GENERATION``; both are abortable. Offsets accepted
  before an expel still commit with the transaction (the broker checks that request only); what
  keeps the new owner from reading twice is KIP-447's stable-offset fetch: a read_committed
  consumer's committed-offset lookup (``committed``, an assignment from the committed offset) waits,
  in virtual time, while a transaction holds offsets of that partition.
- ``init_transactions`` with a transactional.id that another producer holds fences that one: its
  open transaction is aborted, and it learns at its next transactional call (which raises ``_FENCED``
  with ``fatal()``) or at its next ``poll``/``flush`` with records queued (the queue is purged with
  ``_PURGE_QUEUE`` reports and the call raises the fatal error, as confluent-kafka's error callback
  does for a fatal error; a transactional call that found it also leaves that raise to the next
  ``poll``). A transaction left open ``transaction.timeout.ms`` (default 60000) after it first
  wrote a record or offsets is aborted by the coordinator, which fences its producer the same way.
- Outages and faults: with ``down``, ``init_transactions``, ``commit_transaction`` (nothing queued)
  and ``abort_transaction`` wait their timeout and raise a retriable ``_TIMED_OUT`` (calling the
  same method again resumes it), ``send_offsets_to_transaction`` raises an abortable one, and
  records queued at a commit fail their delivery, so the commit raises an abortable error.
  A transactional id in ``txn_refused`` (its Write ACL revoked) makes ``init_transactions``,
  ``send_offsets_to_transaction`` and ``commit_transaction`` raise the broker's fatal
  ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``; an open transaction is left to the coordinator's timeout.
  ``TwinCluster.fail_next_commit`` makes the next commits fail with an abortable error.

Errors are real ``confluent_kafka.KafkaError`` objects (tests may import the client), so the
loop's classification sees what it sees in production.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AclOperation, OffsetSpec  # type: ignore[attr-defined]

EPOCH_MS = 1_800_000_000_000

# a transactional producer's states, named as librdkafka names them (rd_kafka_txn_state2str)
INIT, READY, IN_TXN = "Init", "Ready", "InTransaction"
COMMITTING, ABORTING = "CommittingTransaction", "AbortingTransaction"
ABORTABLE, FATAL = "AbortableError", "FatalError"


class VirtualClock:
    def __init__(self, start_ms: int = EPOCH_MS) -> None:
        self.now_ms = start_ms
        self._start = start_ms
        self._actions: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def wall_ms(self) -> int:
        return self.now_ms

    def monotonic(self) -> float:
        return (self.now_ms - self._start) / 1000 + 1000.0

    def sleep(self, seconds: float) -> None:
        self.advance(max(1, round(seconds * 1000)))

    def at(self, when_ms: int, action: Callable[[], None]) -> None:
        """Run ``action`` when the clock reaches ``when_ms``."""
        heapq.heappush(self._actions, (when_ms, next(self._seq), action))

    def advance(self, ms: int) -> None:
        target = self.now_ms + ms
        while self._actions and self._actions[0][0] <= target:
            when, _seq, action = heapq.heappop(self._actions)
            self.now_ms = max(self.now_ms, when)
            action()
        self.now_ms = target


@dataclass
class TwinMessage:
    """What confluent-kafka's ``Message`` answers (the methods the engine calls)."""

    _topic: str
    _partition: int
    _offset: int
    _key: bytes | None
    _value: bytes | None
    _headers: list[tuple[str, bytes | None]] | None
    _ts: int
    _error: KafkaError | None = None
    _txn: _Txn | None = None  # the transaction that wrote it
    _control: bool = False  # a transaction's commit or abort marker: takes an offset, never returned

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)  # TIMESTAMP_CREATE_TIME

    def error(self) -> KafkaError | None:
        return self._error


@dataclass(eq=False)
class _Txn:
    """One transaction on the coordinator."""

    producer: TwinProducer
    state: str = "open"  # open, committed, aborted
    first: dict[tuple[str, int], int] = field(default_factory=dict)  # (topic, partition) -> its first offset there
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)  # (group, topic, partition) -> offset
    started_ms: int | None = None  # its first record or offsets: the coordinator's timeout runs from here


@dataclass(frozen=True)
class TwinGroupMetadata:
    """What ``Consumer.consumer_group_metadata()`` returns (opaque in confluent-kafka): the member
    and the generation it last synced, which the group checks a transaction's offsets against."""

    group_id: str
    member_id: str
    generation: int
    group_instance_id: str | None


@dataclass
class _Member:
    consumer: TwinConsumer
    owned: set[tuple[str, int]] = field(default_factory=set)  # (topic, partition)
    to_revoke: set[tuple[str, int]] = field(default_factory=set)
    to_assign: set[tuple[str, int]] = field(default_factory=set)
    member_id: str = ""


class TwinCluster:
    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.topics: dict[str, list[list[TwinMessage]]] = {}
        self.configs: dict[str, dict[str, str]] = {}
        self.committed: dict[tuple[str, str, int], int] = {}  # (group, topic, partition) -> offset
        self.members: list[_Member] = []
        self.group_topics: list[str] = []  # the topics the group's members subscribe to
        self.generation = 0  # the group's, moved on by every rebalance
        self._member_ids = itertools.count(1)
        self.down = False  # a broker outage: produce reports fail with a transport error
        self.refused: set[str] = set()  # topics whose writes fail (e.g. no ACL to write them)
        # principal (a producer's sasl.username, None without one) -> topics it may not write
        self.denied: dict[str | None, set[str]] = {}
        self.unreachable: set[str | None] = set()  # principals whose produces time out (refused logins)
        self.leaderless = 0  # the next N offset queries (consumer or admin) fail: NOT_LEADER_FOR_PARTITION
        # transactions
        self.txn_owners: dict[str, TwinProducer] = {}  # transactional.id -> its current producer
        self.open_txns: list[_Txn] = []
        self.txn_parts: set[tuple[str, int]] = set()  # partitions holding transactional records
        self.commit_failures: list[KafkaError] = []  # what the next commit_transaction calls fail with
        self.offsets_hangs: list[threading.Event] = []  # what the next send_offsets_to_transaction waits for
        self.txn_refused: set[str] = set()  # transactional ids the principal may not Write (ACL revoked)

    # -- topics ---------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int, config: dict[str, str] | None = None) -> None:
        if name not in self.topics:
            self.topics[name] = [[] for _ in range(partitions)]
            self.configs[name] = {"cleanup.policy": "delete", **(config or {})}

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               headers: list[tuple[str, bytes | None]] | None, ts: int | None = None,
               txn: _Txn | None = None) -> TwinMessage:
        log = self.topics[topic][partition]
        m = TwinMessage(topic, partition, len(log), key, value, headers, self.clock.now_ms if ts is None else ts,
                        _txn=txn)
        log.append(m)
        if txn is not None:
            txn.first.setdefault((topic, partition), m._offset)
            self.txn_parts.add((topic, partition))
            self.touch(txn)
        return m

    def records(self, topic: str, committed_only: bool = False) -> list[TwinMessage]:
        """The topic's records (no transaction markers); ``committed_only``: what a read_committed
        consumer would read (no aborted records, nothing at or past a partition's LSO)."""
        out: list[TwinMessage] = []
        for p, log in enumerate(self.topics.get(topic, [])):
            if (topic, p) not in self.txn_parts:
                out.extend(log)
                continue
            end = self.lso(topic, p) if committed_only else len(log)
            out.extend(m for m in log[:end] if _readable(m, committed_only))
        return out

    def lso(self, topic: str, partition: int) -> int:
        """The last stable offset: the first offset of the partition's earliest open transaction,
        else its end."""
        end = len(self.topics[topic][partition])
        key = (topic, partition)
        if key not in self.txn_parts:
            return end
        return min((t.first[key] for t in self.open_txns if key in t.first), default=end)

    def end_offset(self, topic: str, partition: int, read_committed: bool) -> int:
        return self.lso(topic, partition) if read_committed else len(self.topics[topic][partition])

    # -- transactions (the coordinators' side) ---------------------------------------------------
    def fail_next_commit(self, code: int = KafkaError.TRANSACTION_ABORTABLE,
                         reason: str = "Broker: The server encountered an error with the transaction",
                         times: int = 1) -> None:
        """The next ``times`` ``commit_transaction`` calls (of any producer) fail with an abortable
        error: the transaction's records and offsets stay pending until it is aborted."""
        self.commit_failures.extend(KafkaError(code, reason, txn_requires_abort=True) for _ in range(times))

    def hang_next_offsets(self) -> threading.Event:
        """The next ``send_offsets_to_transaction`` call (of any producer) does not return until
        the event is set, whatever its timeout: librdkafka's behaviour once the group coordinator
        it cached is gone from the metadata (its issues 5456 and 5511; a broker restart here)."""
        ev = threading.Event()
        self.offsets_hangs.append(ev)
        return ev

    def claim(self, transactional_id: str, producer: TwinProducer) -> None:
        """``init_transactions``: the id's previous producer is fenced and its open transaction aborted."""
        old = self.txn_owners.get(transactional_id)
        self.txn_owners[transactional_id] = producer
        for t in list(self.open_txns):
            if t.producer is not producer and t.producer.transactional_id == transactional_id:
                self.end_txn(t, commit=False)
        if old is not None and old is not producer:
            old.fence("a newer producer with the same transactional.id was initialized")

    def begin_txn(self, producer: TwinProducer) -> _Txn:
        t = _Txn(producer)
        self.open_txns.append(t)
        return t

    def touch(self, txn: _Txn) -> None:
        """The transaction's first record or offsets: the coordinator aborts it (and fences its
        producer) if it is still open ``transaction.timeout.ms`` later."""
        if txn.started_ms is None:
            txn.started_ms = self.clock.now_ms
            self.clock.at(txn.started_ms + txn.producer.txn_timeout_ms, lambda: self._expire(txn))

    def _expire(self, txn: _Txn) -> None:
        if txn.state == "open":
            self.end_txn(txn, commit=False)
            txn.producer.fence("the coordinator aborted its transaction after transaction.timeout.ms")

    def end_txn(self, txn: _Txn, commit: bool) -> None:
        for topic, p in txn.first:  # the marker, in every partition the transaction wrote
            log = self.topics[topic][p]
            log.append(TwinMessage(topic, p, len(log), None, None, None, self.clock.now_ms, _control=True))
        txn.state = "committed" if commit else "aborted"
        self.open_txns.remove(txn)
        if commit:
            self.committed.update(txn.offsets)

    def pending_offsets(self, keys: list[tuple[str, str, int]]) -> list[_Txn]:
        """The open transactions holding offsets for any of ``keys`` ((group, topic, partition))."""
        return [t for t in self.open_txns if any(k in t.offsets for k in keys)]

    def check_group_metadata(self, md: TwinGroupMetadata) -> KafkaError | None:
        """The group coordinator's check of a TxnOffsetCommit (classic protocol)."""
        if not md.member_id and md.generation < 0:
            return None  # a consumer outside the group protocol (assigned by hand)
        m = next((m for m in self.members if m.member_id == md.member_id), None)
        if m is None:
            return KafkaError(KafkaError.UNKNOWN_MEMBER_ID, "Broker: Unknown member", txn_requires_abort=True)
        if md.generation != m.consumer.generation:
            return KafkaError(KafkaError.ILLEGAL_GENERATION, "Broker: Specified group generation id is not valid",
                              txn_requires_abort=True)
        return None

    # -- the group ------------------------------------------------------------------------------
    def join(self, consumer: TwinConsumer, topics: list[str]) -> None:
        self.group_topics = list(topics)
        self.members.append(_Member(consumer, member_id=f"{consumer.group}-member-{next(self._member_ids)}"))
        self._rebalance()

    def leave(self, consumer: TwinConsumer) -> None:
        self.members = [m for m in self.members if m.consumer is not consumer]
        self._rebalance()

    def expel(self, consumer: TwinConsumer) -> None:
        """The member's session expired (the process was stopped): the group moves its partitions
        on; the consumer learns it at its next ``consume`` (the lost callback), as librdkafka's does
        after its next heartbeat is refused."""
        m = self.member(consumer)
        assert m is not None
        consumer.expelled = set(m.owned)
        consumer.unaware = 1  # consume calls before it hears of it (the heartbeat's round trip)
        self.leave(consumer)

    def _rebalance(self) -> None:
        """Round-robin over the members in join order, the topics' partitions one topic after the
        other; moves are revoke-then-assign."""
        self.generation += 1
        want: dict[int, set[tuple[str, int]]] = {i: set() for i in range(len(self.members))}
        every = [(topic, p) for topic in self.group_topics for p in range(len(self.topics.get(topic, [])))]
        for i, key in enumerate(every):
            if self.members:
                want[i % len(self.members)].add(key)
        for i, m in enumerate(self.members):
            m.to_revoke |= m.owned - want[i]
            m.to_assign = want[i] - m.owned

    def member(self, consumer: TwinConsumer) -> _Member | None:
        return next((m for m in self.members if m.consumer is consumer), None)

    def owner(self, partition: int, topic: str | None = None) -> TwinConsumer | None:
        """The member owning ``partition`` of ``topic`` (None: the group's first topic)."""
        key = (topic or self.group_topics[0], partition)
        return next((m.consumer for m in self.members if key in m.owned), None)


def _readable(m: TwinMessage, read_committed: bool) -> bool:
    """Whether a consumer returns the record (below the LSO, for read_committed)."""
    if m._control:
        return False
    return not (read_committed and m._txn is not None and m._txn.state == "aborted")


def _read_committed(conf: dict[str, Any]) -> bool:
    level = conf.get("isolation.level", "read_committed")
    if level not in ("read_committed", "read_uncommitted"):
        raise KafkaException(KafkaError(
            KafkaError._INVALID_ARG, f'Invalid value "{level}" for configuration property "isolation.level" '
            "(read_committed or read_uncommitted)"))
    return bool(level == "read_committed")


class TwinConsumer:
    def __init__(self, cluster: TwinCluster, conf: dict[str, Any]) -> None:
        self.cluster = cluster
        self.group = conf["group.id"]
        self.instance_id = conf.get("group.instance.id")
        self.read_committed = _read_committed(conf)
        self.callbacks: dict[str, Any] = {}
        self.positions: dict[tuple[str, int], int] = {}
        # assigned partitions whose committed offset a transaction still holds (read_committed
        # asks for stable offsets): no position until it ends
        self.awaiting: set[tuple[str, int]] = set()
        self.paused: set[tuple[str, int]] = set()
        self.closed = False
        self.expelled: set[tuple[str, int]] = set()
        self.unaware = 0
        self.member_id = ""  # the group's answers as this client last heard them
        self.generation = -1

    def subscribe(self, topics: list[str], on_assign: Any, on_revoke: Any, on_lost: Any) -> None:
        self.callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}
        self.cluster.join(self, topics)

    def _tps(self, parts: set[tuple[str, int]]) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in sorted(parts)]

    def _rebalance(self) -> None:
        if self.unaware:
            self.unaware -= 1
        elif self.expelled:
            lost, self.expelled = self.expelled, set()
            self.callbacks["lost"](self, self._tps(lost))
        m = self.cluster.member(self)
        if m is None:
            return
        # the member has (re)joined: it knows the group's generation (before the callbacks, as the
        # cooperative protocol revokes after the join that took the partitions)
        self.member_id, self.generation = m.member_id, self.cluster.generation
        if m.to_revoke:
            parts, m.to_revoke = m.to_revoke & m.owned, set()
            if parts:
                self.callbacks["revoke"](self, self._tps(parts))
        # a partition is assigned only once no other member still owns it
        free = {p for p in m.to_assign if all(p not in o.owned for o in self.cluster.members if o is not m)}
        if free:
            m.to_assign -= free
            self.callbacks["assign"](self, self._tps(free))

    def consumer_group_metadata(self) -> TwinGroupMetadata:
        return TwinGroupMetadata(self.group, self.member_id, self.generation, self.instance_id)

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        m = self.cluster.member(self)  # None: assigned by hand (no group), e.g. a restore consumer
        for tp in tps:
            if m is not None:
                m.owned.add((tp.topic, tp.partition))
            key = (tp.topic, tp.partition)
            if tp.offset == OFFSET_BEGINNING:
                start = 0
            elif tp.offset == OFFSET_INVALID or tp.offset < 0:
                if self.read_committed and self.cluster.pending_offsets([(self.group, *key)]):
                    self.awaiting.add(key)
                    self.positions.pop(key, None)
                    continue
                start = self.cluster.committed.get((self.group, tp.topic, tp.partition), 0)
            else:
                start = tp.offset
            self.awaiting.discard(key)
            self.positions[key] = start

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        m = self.cluster.member(self)
        for tp in tps:
            if m is not None:
                m.owned.discard((tp.topic, tp.partition))
            self.positions.pop((tp.topic, tp.partition), None)
            self.awaiting.discard((tp.topic, tp.partition))

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float = 0, cached: bool = False) -> tuple[int, int]:
        """(low, high); the high offset is the LSO for a read_committed consumer, as librdkafka's."""
        if self.cluster.leaderless > 0 and not cached:
            self.cluster.leaderless -= 1
            raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
        return 0, self.cluster.end_offset(tp.topic, tp.partition, self.read_committed)

    def committed(self, partitions: list[TopicPartition], timeout: float | None = None) -> list[TopicPartition]:
        """The group's committed offsets (OFFSET_INVALID where none). A read_committed consumer asks
        for stable offsets: while a transaction holds offsets of one of the partitions the call
        waits (virtual time) for it to end, up to ``timeout``, then raises ``_TIMED_OUT``."""
        if self.closed:
            raise RuntimeError("Consumer closed")
        keys = [(self.group, tp.topic, tp.partition) for tp in partitions]
        if self.read_committed:
            self._await_stable(keys, timeout)
        return [TopicPartition(tp.topic, tp.partition, self.cluster.committed.get(k, OFFSET_INVALID))
                for tp, k in zip(partitions, keys, strict=True)]

    def _await_stable(self, keys: list[tuple[str, str, int]], timeout: float | None) -> None:
        clock = self.cluster.clock
        deadline = None if timeout is None or timeout < 0 else clock.now_ms + round(timeout * 1000)
        while txns := self.cluster.pending_offsets(keys):
            if deadline is not None and clock.now_ms >= deadline:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get committed offsets: "
                                                "a transaction holds them (UNSTABLE_OFFSET_COMMIT)"))
            # the coordinator ends them by their timeout at the latest
            ends = max((t.started_ms or clock.now_ms) + t.producer.txn_timeout_ms for t in txns)
            clock.advance(max(1, min(ends, deadline if deadline is not None else ends) - clock.now_ms))

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.positions.get((tp.topic, tp.partition), -1001))
                for tp in tps]

    def seek(self, tp: TopicPartition) -> None:
        """The next ``consume`` reads from ``tp.offset`` (OFFSET_BEGINNING, OFFSET_END and the
        committed offset for the other logical ones); nothing is pre-fetched here, so nothing read
        before the seek is returned after it."""
        key = (tp.topic, tp.partition)
        assert key in self.positions or key in self.awaiting, "seek on an unassigned partition"
        if tp.offset == OFFSET_BEGINNING:
            off = 0
        elif tp.offset == OFFSET_END:
            off = self.cluster.end_offset(tp.topic, tp.partition, self.read_committed)
        elif tp.offset < 0:
            off = self.cluster.committed.get((self.group, tp.topic, tp.partition), 0)
        else:
            off = tp.offset
        self.awaiting.discard(key)
        self.positions[key] = off

    def assignment(self) -> list[TopicPartition]:
        m = self.cluster.member(self)
        return [] if m is None else self._tps(m.owned)

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in tps}

    def consume(self, num_messages: int, timeout: float) -> list[TwinMessage]:
        assert not self.closed, "consume on a closed consumer"
        self._rebalance()
        out = self._take(num_messages)
        if not out and timeout > 0:
            self.cluster.clock.sleep(timeout)  # autojump: nothing arrives while we wait, unless scheduled
            self._rebalance()
            out = self._take(num_messages)
        return out

    def _take(self, n: int) -> list[TwinMessage]:
        if self.awaiting:
            self._settle()
        out: list[TwinMessage] = []
        txn_parts = self.cluster.txn_parts
        for (topic, p) in sorted(self.positions):
            if (topic, p) in self.paused:
                continue
            pos = self.positions[(topic, p)]
            log = self.cluster.topics[topic][p]
            if (topic, p) in txn_parts:
                pos = self._take_txn(log, topic, p, pos, n - len(out), out)
            else:
                chunk = log[pos : pos + n - len(out)]
                out.extend(chunk)
                pos += len(chunk)
            self.positions[(topic, p)] = pos
            if len(out) >= n:
                break
        return out

    def _take_txn(self, log: list[TwinMessage], topic: str, p: int, pos: int, want: int,
                  out: list[TwinMessage]) -> int:
        """A partition with transactional records: markers (and, read_committed, aborted records)
        are passed over, and read_committed stops at the LSO. Returns the new position."""
        end = self.cluster.end_offset(topic, p, self.read_committed)
        while pos < end and want > 0:
            m = log[pos]
            pos += 1
            if _readable(m, self.read_committed):
                out.append(m)
                want -= 1
        return pos

    def _settle(self) -> None:
        """Positions for the awaited partitions whose committed offsets are stable now."""
        for key in sorted(self.awaiting):
            if not self.cluster.pending_offsets([(self.group, *key)]):
                self.awaiting.discard(key)
                self.positions[key] = self.cluster.committed.get((self.group, *key), 0)

    def commit(self, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        m = self.cluster.member(self)
        for tp in offsets:
            if m is None or (tp.topic, tp.partition) not in m.owned:
                self.unaware = 0  # a refused commit tells the client at once
                raise KafkaException(KafkaError(KafkaError.ILLEGAL_GENERATION, "not the partition's owner"))
            self.cluster.committed[(self.group, tp.topic, tp.partition)] = tp.offset

    def close(self) -> None:
        m = self.cluster.member(self)
        if m is not None and m.owned:
            self.callbacks["revoke"](self, self._tps(set(m.owned)))
        if m is not None:
            self.cluster.leave(self)
        self.closed = True


def _seconds(timeout: Any) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"must be real number, not {type(timeout).__name__}")


@dataclass
class _Pending:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: Any
    callback: Any
    txn: _Txn | None = None


class TwinProducer:
    """Produces into the cluster at the next ``poll`` (the broker's ack), with the virtual time
    as the record timestamp; a full queue raises ``BufferError`` like librdkafka's. With a
    ``transactional.id`` in its conf it is a transactional producer (the module docstring)."""

    def __init__(self, cluster: TwinCluster, queue_max: int = 100_000, conf: dict[str, Any] | None = None) -> None:
        conf = conf or {}
        self.cluster = cluster
        self.queue: list[_Pending] = []
        self.queue_max = queue_max
        self.produced = 0
        self.transactional_id: str | None = conf.get("transactional.id")
        self.user: str | None = conf.get("sasl.username")  # its principal (``TwinCluster.denied``)
        self.txn_timeout_ms = int(conf.get("transaction.timeout.ms", 60_000))
        self.state = INIT
        self.txn: _Txn | None = None
        self.txn_error: KafkaError | None = None  # the abortable or fatal error of its state
        self.fenced_because = ""  # set by the cluster; the producer learns it at its next request
        self._fatal_unraised = False  # the next poll raises the fatal error (confluent's error callback)

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = -1,
                callback: Any = None, on_delivery: Any = None, timestamp: int = 0, headers: Any = None) -> None:
        if self.transactional_id is not None and self.state != IN_TXN:
            code = KafkaError._FATAL if self.state == FATAL else KafkaError._STATE
            raise KafkaException(KafkaError(code, f"Unable to produce message: {KafkaError(code).str()}"))
        if len(self.queue) >= self.queue_max:
            raise BufferError("Local: Queue full")
        self.queue.append(_Pending(topic, partition, key, value, headers, callback or on_delivery, self.txn))

    def poll(self, timeout: float = 0) -> int:
        if self.fenced_because and self.state != FATAL and self.queue:
            self._fatal()  # the produce request is refused: the producer learns it was fenced
        n = self._deliver()
        if self._fatal_unraised:
            self._fatal_unraised = False
            assert self.txn_error is not None
            raise KafkaException(self.txn_error)
        return n

    def _deliver(self) -> int:
        done, self.queue = self.queue, []
        for p in done:
            if self.state == FATAL:  # librdkafka purges the queue on a fatal error
                self._report(p, KafkaError(KafkaError._PURGE_QUEUE, "Local: Purged in queue"))
                continue
            if self.cluster.down or self.user in self.cluster.unreachable:
                self._failed(p, KafkaError(KafkaError._MSG_TIMED_OUT, "Local: Message timed out"))
                continue
            if p.topic in self.cluster.refused or p.topic in self.cluster.denied.get(self.user, ()):
                self._failed(p, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed"))
                continue
            if p.topic not in self.cluster.topics:
                self.cluster.create_topic(p.topic, 1)  # auto.create.topics.enable
            part = p.partition if p.partition >= 0 else hash(p.key) % len(self.cluster.topics[p.topic])
            m = self.cluster.append(p.topic, part, p.key, p.value, list(p.headers or []), txn=p.txn)
            self.produced += 1
            if p.callback is not None:
                p.callback(None, m)
        return len(done)

    def _failed(self, p: _Pending, err: KafkaError) -> None:
        """A failed delivery; a transaction's makes it abortable (librdkafka's txn error)."""
        if p.txn is not None and self.state in (IN_TXN, COMMITTING):
            self._abortable(KafkaError(err.code(), f"Failed to produce a transaction's record: {err.str()}"))
        self._report(p, err)

    def _report(self, p: _Pending, err: KafkaError) -> None:
        if p.callback is not None:
            p.callback(err, self._unsent(p))

    def _unsent(self, p: _Pending) -> TwinMessage:
        """A failed report's message, as librdkafka gives it: the record, no offset."""
        return TwinMessage(p.topic, max(p.partition, 0), -1, p.key, p.value, p.headers, self.cluster.clock.now_ms)

    def flush(self, timeout: float = 0) -> int:
        self.poll(0)
        return 0

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        done, self.queue = self.queue, []
        for p in done:
            p.callback(KafkaError(KafkaError._PURGE_QUEUE, "Local: Purged in queue"), self._unsent(p))

    def __len__(self) -> int:
        return len(self.queue)

    # -- transactions ----------------------------------------------------------------------------
    def fence(self, because: str) -> None:
        """The cluster's side: a newer producer (or the coordinator's timeout) fenced this one."""
        if not self.fenced_because:
            self.fenced_because = because

    def _fatal(self) -> None:
        self.state = FATAL
        self.txn = None
        self.txn_error = KafkaError(
            KafkaError._FENCED, f"Producer fenced by newer instance: {self.fenced_because}", fatal=True)
        self._fatal_unraised = True

    def _abortable(self, err: KafkaError) -> KafkaError:
        self.state = ABORTABLE
        self.txn_error = KafkaError(err.code(), err.str(), txn_requires_abort=True)
        return self.txn_error

    def _require(self, *states: str) -> None:
        """librdkafka's state check of a transactional call."""
        if self.transactional_id is None:
            raise KafkaException(KafkaError(
                KafkaError._NOT_CONFIGURED, "The Transactional API requires transactional.id to be configured"))
        if self.fenced_because and self.state != FATAL:
            self._fatal()  # the call's request is refused: the producer learns it was fenced
        if self.state in states:
            return
        if self.state in (FATAL, ABORTABLE):
            assert self.txn_error is not None
            raise KafkaException(self.txn_error)
        raise KafkaException(KafkaError(KafkaError._STATE, f"Operation not valid in state {self.state}"))

    def _check_id(self, what: str) -> None:
        """The broker refuses a transactional id without Write: a fatal error (as librdkafka)."""
        if self.transactional_id in self.cluster.txn_refused:
            self.state = FATAL
            self.txn = None
            self.txn_error = KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                        f"Failed to {what}: Broker: Transactional Id authorization failed", fatal=True)
            self._fatal_unraised = True  # raised again by the next poll or flush (measured on a broker)
            raise KafkaException(self.txn_error)

    def _timed_out(self, timeout: float, what: str, abortable: bool = False) -> KafkaException:
        """An outage: the call waits its timeout (virtual time) for the coordinator, then fails; an
        infinite one (negative) ends with the transaction's timeout here."""
        ms = self.txn_timeout_ms if timeout < 0 else round(timeout * 1000)
        self.cluster.clock.advance(max(1, ms))
        err = KafkaError(KafkaError._TIMED_OUT, f"Failed to {what}: Local: Timed out",
                         retriable=not abortable, txn_requires_abort=abortable)
        if abortable:
            self._abortable(err)
        return KafkaException(err)

    # confluent-kafka parses these calls' arguments positionally ("|d"): a keyword or a None
    # timeout is a TypeError there, so it is here
    def init_transactions(self, timeout: float = -1, /) -> None:
        _seconds(timeout)
        self._require(INIT)
        if self.cluster.down:
            raise self._timed_out(timeout, "initialize the producer id")
        self._check_id("find transaction coordinator")
        assert self.transactional_id is not None
        self.cluster.claim(self.transactional_id, self)
        self.state = READY

    def begin_transaction(self) -> None:
        self._require(READY)
        self.txn = self.cluster.begin_txn(self)
        self.txn_error = None
        self.state = IN_TXN

    def send_offsets_to_transaction(self, positions: list[TopicPartition], group_metadata: Any,
                                    timeout: float = -1, /) -> None:
        _seconds(timeout)
        self._require(IN_TXN)
        if not isinstance(group_metadata, TwinGroupMetadata):
            raise TypeError("group_metadata must be what Consumer.consumer_group_metadata() returned")
        self._check_id("add offsets to transaction")
        valid = [tp for tp in positions if tp.offset >= 0]  # logical and invalid offsets are ignored
        if not valid:
            return
        if self.cluster.offsets_hangs:
            self.cluster.offsets_hangs.pop(0).wait()
            self._require(IN_TXN)  # fenced meanwhile: raised on the caller's thread, if any still waits
        if self.cluster.down:
            raise self._timed_out(timeout, "commit the transaction's offsets", abortable=True)
        err = self.cluster.check_group_metadata(group_metadata)
        if err is not None:
            raise KafkaException(self._abortable(err))
        assert self.txn is not None
        for tp in valid:
            self.txn.offsets[(group_metadata.group_id, tp.topic, tp.partition)] = tp.offset
        self.cluster.touch(self.txn)

    def commit_transaction(self, timeout: float = -1, /) -> None:
        _seconds(timeout)
        self._require(IN_TXN, COMMITTING)
        self._check_id("end transaction")
        self._deliver()  # the flush: a failed record makes the transaction abortable
        if self.state == ABORTABLE:
            assert self.txn_error is not None
            raise KafkaException(self.txn_error)
        if self.cluster.down:
            self.state = COMMITTING  # calling commit_transaction again resumes it
            raise self._timed_out(timeout, "commit the transaction")
        if self.cluster.commit_failures:
            raise KafkaException(self._abortable(self.cluster.commit_failures.pop(0)))
        assert self.txn is not None
        self.cluster.end_txn(self.txn, commit=True)
        self.txn = None
        self.state = READY

    def abort_transaction(self, timeout: float = -1, /) -> None:
        _seconds(timeout)
        self._require(IN_TXN, ABORTABLE, ABORTING)
        self.state = ABORTING
        done, self.queue = self.queue, []  # librdkafka's purge of the queue, then a flush: reports now
        for p in done:
            self._report(p, KafkaError(KafkaError._PURGE_QUEUE, "Local: Purged in queue"))
        if self.cluster.down:
            raise self._timed_out(timeout, "abort the transaction")
        if self.txn is not None and self.txn.state == "open":
            self.cluster.end_txn(self.txn, commit=False)
        self.txn = None
        self.txn_error = None
        self.state = READY


class _TopicMeta:
    def __init__(self, partitions: int) -> None:
        self.partitions = dict.fromkeys(range(partitions))
        self.error = None


class _TopicsMeta:
    def __init__(self, topics: dict[str, list[Any]]) -> None:
        self.topics = {name: _TopicMeta(len(parts)) for name, parts in topics.items()}


class _Done:
    def __init__(self, value: Any = None, error: KafkaError | None = None) -> None:
        self.value = value
        self.error = error

    def result(self, timeout: float | None = None) -> Any:
        if self.error is not None:
            raise KafkaException(self.error)
        return self.value

    def done(self) -> bool:
        return True


class _Entry:
    def __init__(self, value: str) -> None:
        self.value = value


class TwinAdmin:
    def __init__(self, cluster: TwinCluster, user: str | None = None) -> None:
        self.cluster = cluster
        self.user = user  # its principal: the topics ``TwinCluster.denied`` it are not writable

    def list_topics(self, topic: str | None = None, timeout: float = 0) -> _TopicsMeta:
        if self.cluster.down:  # no broker answers in an outage
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Local: Broker transport failure"))
        return _TopicsMeta(dict(self.cluster.topics))

    def describe_topics(self, topics: Any, **_kw: Any) -> dict[str, _Done]:
        """The broker does not say which operations are authorized (None), except for a topic its
        principal is denied (``TwinCluster.denied``): Describe and Read, no Write."""
        denied = self.cluster.denied.get(self.user, ()) if self.user is not None else ()
        return {t: _Done(SimpleNamespace(authorized_operations=[AclOperation.DESCRIBE, AclOperation.READ]
                                         if t in denied else None)) for t in topics.topic_names}

    def create_topics(self, new_topics: list[Any], operation_timeout: float = 0) -> dict[str, _Done]:
        for t in new_topics:
            self.cluster.create_topic(t.topic, t.num_partitions, dict(t.config or {}))
        return {t.topic: _Done() for t in new_topics}

    def describe_consumer_groups(self, group_ids: list[str], request_timeout: float = 0) -> dict[str, _Done]:
        out = {}
        for gid in group_ids:
            members = [SimpleNamespace(
                member_id=f"m{i}", group_instance_id=m.consumer.instance_id,
                assignment=SimpleNamespace(topic_partitions=m.consumer.assignment()),
            ) for i, m in enumerate(self.cluster.members) if m.consumer.group == gid]
            out[gid] = _Done(SimpleNamespace(members=members))
        return out

    def list_offsets(self, specs: dict[TopicPartition, Any], isolation_level: IsolationLevel | None = None,
                     **_kw: Any) -> dict[TopicPartition, _Done]:
        """Earliest (0: nothing is ever deleted here) or latest offsets: the LSO with
        ``isolation_level=READ_COMMITTED``, the high watermark otherwise (the admin client's default)."""
        out = {}
        leaderless = self.cluster.leaderless > 0
        if leaderless:
            self.cluster.leaderless -= 1
        committed_only = isolation_level == IsolationLevel.READ_COMMITTED
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        for tp, spec in specs.items():
            end = self.cluster.end_offset(tp.topic, tp.partition, committed_only)
            out[tp] = _Done(SimpleNamespace(offset=end if spec == latest else 0),
                            KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION) if leaderless else None)
        return out

    def describe_configs(self, resources: list[Any]) -> dict[Any, _Done]:
        return {r: _Done({k: _Entry(v) for k, v in self.cluster.configs.get(r.name, {}).items()})
                for r in resources}


class TwinClients:
    """The ``Clients`` factory of ``engine/kafka_io.py`` over one :class:`TwinCluster`."""

    produce_errors: tuple[type[BaseException], ...] = (BufferError, KafkaException)

    def __init__(self, cluster: TwinCluster) -> None:
        self.cluster = cluster
        self.consumers: list[TwinConsumer] = []
        self.producers: list[TwinProducer] = []

    def consumer(self, conf: dict[str, Any]) -> TwinConsumer:
        c = TwinConsumer(self.cluster, conf)
        self.consumers.append(c)
        return c

    def producer(self, conf: dict[str, Any]) -> TwinProducer:
        p = TwinProducer(self.cluster, conf=conf)
        self.producers.append(p)
        return p

    def admin(self, conf: dict[str, Any]) -> TwinAdmin:
        return TwinAdmin(self.cluster, conf.get("sasl.username"))
