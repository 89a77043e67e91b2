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
  fail with a transport error, as an outage would.
- :class:`TwinClients`: the factory the loop gets (``consumer``, ``producer``, ``admin``).

Errors are real ``confluent_kafka.KafkaError`` objects (tests may import the client), so the
loop's classification sees what it sees in production.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

EPOCH_MS = 1_800_000_000_000


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


@dataclass
class _Member:
    consumer: TwinConsumer
    owned: set[int] = field(default_factory=set)
    to_revoke: set[int] = field(default_factory=set)
    to_assign: set[int] = field(default_factory=set)


class TwinCluster:
    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.topics: dict[str, list[list[TwinMessage]]] = {}
        self.configs: dict[str, dict[str, str]] = {}
        self.committed: dict[tuple[str, str, int], int] = {}  # (group, topic, partition) -> offset
        self.members: list[_Member] = []
        self.group_topic = ""
        self.down = False  # a broker outage: produce reports fail with a transport error
        self.refused: set[str] = set()  # topics whose writes fail (e.g. no ACL to write them)
        self.leaderless = 0  # the next N offset queries (consumer or admin) fail: NOT_LEADER_FOR_PARTITION

    # -- topics ---------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int, config: dict[str, str] | None = None) -> None:
        if name not in self.topics:
            self.topics[name] = [[] for _ in range(partitions)]
            self.configs[name] = {"cleanup.policy": "delete", **(config or {})}

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               headers: list[tuple[str, bytes | None]] | None, ts: int | None = None) -> TwinMessage:
        log = self.topics[topic][partition]
        m = TwinMessage(topic, partition, len(log), key, value, headers, self.clock.now_ms if ts is None else ts)
        log.append(m)
        return m

    def records(self, topic: str) -> list[TwinMessage]:
        return [m for part in self.topics.get(topic, []) for m in part]

    # -- the group ------------------------------------------------------------------------------
    def join(self, consumer: TwinConsumer, topic: str) -> None:
        self.group_topic = topic
        self.members.append(_Member(consumer))
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
        """Round-robin over the members in join order; moves are revoke-then-assign."""
        n = len(self.topics.get(self.group_topic, []))
        want: dict[int, set[int]] = {i: set() for i in range(len(self.members))}
        for p in range(n):
            if self.members:
                want[p % len(self.members)].add(p)
        for i, m in enumerate(self.members):
            m.to_revoke |= m.owned - want[i]
            m.to_assign = want[i] - m.owned

    def member(self, consumer: TwinConsumer) -> _Member | None:
        return next((m for m in self.members if m.consumer is consumer), None)

    def owner(self, partition: int) -> TwinConsumer | None:
        return next((m.consumer for m in self.members if partition in m.owned), None)


class TwinConsumer:
    def __init__(self, cluster: TwinCluster, conf: dict[str, Any]) -> None:
        self.cluster = cluster
        self.group = conf["group.id"]
        self.instance_id = conf.get("group.instance.id")
        self.callbacks: dict[str, Any] = {}
        self.positions: dict[tuple[str, int], int] = {}
        self.paused: set[int] = set()
        self.closed = False
        self.topic = ""
        self.expelled: set[int] = set()
        self.unaware = 0

    def subscribe(self, topics: list[str], on_assign: Any, on_revoke: Any, on_lost: Any) -> None:
        self.topic = topics[0]
        self.callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}
        self.cluster.join(self, self.topic)

    def _tps(self, parts: set[int]) -> list[TopicPartition]:
        return [TopicPartition(self.topic, p) for p in sorted(parts)]

    def _rebalance(self) -> None:
        if self.unaware:
            self.unaware -= 1
        elif self.expelled:
            lost, self.expelled = self.expelled, set()
            self.callbacks["lost"](self, self._tps(lost))
        m = self.cluster.member(self)
        if m is None:
            return
        if m.to_revoke:
            parts, m.to_revoke = m.to_revoke & m.owned, set()
            if parts:
                self.callbacks["revoke"](self, self._tps(parts))
        # a partition is assigned only once no other member still owns it
        free = {p for p in m.to_assign if all(p not in o.owned for o in self.cluster.members if o is not m)}
        if free:
            m.to_assign -= free
            self.callbacks["assign"](self, self._tps(free))

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        m = self.cluster.member(self)  # None: assigned by hand (no group), e.g. a restore consumer
        for tp in tps:
            if m is not None:
                m.owned.add(tp.partition)
            if tp.offset == OFFSET_BEGINNING:
                start = 0
            elif tp.offset == OFFSET_INVALID or tp.offset < 0:
                start = self.cluster.committed.get((self.group, tp.topic, tp.partition), 0)
            else:
                start = tp.offset
            self.positions[(tp.topic, tp.partition)] = start

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        m = self.cluster.member(self)
        for tp in tps:
            if m is not None:
                m.owned.discard(tp.partition)
            self.positions.pop((tp.topic, tp.partition), None)

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float = 0, cached: bool = False) -> tuple[int, int]:
        if self.cluster.leaderless > 0 and not cached:
            self.cluster.leaderless -= 1
            raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
        return 0, len(self.cluster.topics[tp.topic][tp.partition])

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.positions.get((tp.topic, tp.partition), -1001))
                for tp in tps]

    def seek(self, tp: TopicPartition) -> None:
        assert (tp.topic, tp.partition) in self.positions, "seek on an unassigned partition"
        self.positions[(tp.topic, tp.partition)] = tp.offset

    def assignment(self) -> list[TopicPartition]:
        m = self.cluster.member(self)
        return [] if m is None else self._tps(m.owned)

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused |= {tp.partition for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused -= {tp.partition for tp in tps}

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
        out: list[TwinMessage] = []
        for (topic, p) in sorted(self.positions):
            if p in self.paused and topic == self.topic:
                continue
            pos = self.positions[(topic, p)]
            chunk = self.cluster.topics[topic][p][pos : pos + n - len(out)]
            out.extend(chunk)
            self.positions[(topic, p)] = pos + len(chunk)
            if len(out) >= n:
                break
        return out

    def commit(self, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        m = self.cluster.member(self)
        for tp in offsets:
            if m is None or tp.partition not in m.owned:
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


@dataclass
class _Pending:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: Any
    callback: Any


class TwinProducer:
    """Produces into the cluster at the next ``poll`` (the broker's ack), with the virtual time
    as the record timestamp; a full queue raises ``BufferError`` like librdkafka's."""

    def __init__(self, cluster: TwinCluster, queue_max: int = 100_000) -> None:
        self.cluster = cluster
        self.queue: list[_Pending] = []
        self.queue_max = queue_max
        self.produced = 0

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = -1,
                callback: Any = None, on_delivery: Any = None, timestamp: int = 0, headers: Any = None) -> None:
        if len(self.queue) >= self.queue_max:
            raise BufferError("Local: Queue full")
        self.queue.append(_Pending(topic, partition, key, value, headers, callback or on_delivery))

    def poll(self, timeout: float = 0) -> int:
        done, self.queue = self.queue, []
        for p in done:
            if self.cluster.down:
                err = KafkaError(KafkaError._MSG_TIMED_OUT, "Local: Message timed out")
                p.callback(err, self._unsent(p))
                continue
            if p.topic in self.cluster.refused:
                err = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed")
                p.callback(err, self._unsent(p))
                continue
            if p.topic not in self.cluster.topics:
                self.cluster.create_topic(p.topic, 1)  # auto.create.topics.enable
            part = p.partition if p.partition >= 0 else hash(p.key) % len(self.cluster.topics[p.topic])
            m = self.cluster.append(p.topic, part, p.key, p.value, list(p.headers or []))
            self.produced += 1
            if p.callback is not None:
                p.callback(None, m)
        return len(done)

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
    def __init__(self, cluster: TwinCluster) -> None:
        self.cluster = cluster

    def list_topics(self, topic: str | None = None, timeout: float = 0) -> _TopicsMeta:
        return _TopicsMeta(dict(self.cluster.topics))

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

    def list_offsets(self, specs: dict[TopicPartition, Any], **_kw: Any) -> dict[TopicPartition, _Done]:
        """Earliest (0: nothing is ever deleted here) or latest offsets."""
        out = {}
        leaderless = self.cluster.leaderless > 0
        if leaderless:
            self.cluster.leaderless -= 1
        for tp, spec in specs.items():
            end = len(self.cluster.topics[tp.topic][tp.partition])
            out[tp] = _Done(SimpleNamespace(offset=end if spec == OffsetSpec.latest() else 0),
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
        p = TwinProducer(self.cluster)
        self.producers.append(p)
        return p

    def admin(self, conf: dict[str, Any]) -> TwinAdmin:
        return TwinAdmin(self.cluster)
