"""Exactly-once per principal: one transactional producer, and its transactions, per lane.

With ``delivery: exactly-once`` every write that must commit with a delivery goes through the
transactional producer that made the delivery. A tenant with ``kafka:`` overrides (its own
principal, engine/tenant_producers.py) publishes as itself, so its partitions get a lane of their
own: the tenant's transactional producer (id ``<group-id>.<tenant>:<instance-id>``) writes their
deliveries, dead letters and changelog writes, and commits their ingress offsets into the group
(``send_offsets_to_transaction`` with the group consumer's metadata: KIP-447 fencing holds as for
the deployment's). Every other partition is in the deployment's lane (``<group-id>.<instance-id>``,
the deployment's principal). History records stay on the deployment's producer (an audit trail, at
most once per change: docs/operations.md).

Lanes are independent: each commits on its own ``transaction-interval`` and a failure (a refused
delivery, a failed changelog write, a fatal producer error) aborts and restores only its own
partitions (``ExactlyOnce.reset``); the other lanes' transactions go on. A tenant's transactional
id refused (its Write ACL revoked, or missing at start) holds only its lane (:class:`TopicHold`)
until the ACL is back; the deployment's refused holds everything (its producer also writes what
belongs to no lane). What concerns the whole member (partitions lost, the consumer fenced)
concerns every lane.

The broker decides what a tenant may write: its lane's target checks are asked as the tenant
(engine/eos_targets.py), and its transactional id, changelog and group offsets need the tenant's
own ACLs (``delay-sidecar acls --for tenant``).
"""

from __future__ import annotations

from typing import Any

from sidecar.engine.kafka_io import KafkaIO
from sidecar.engine.tenant_producers import TenantProducers
from sidecar.engine.transactions import Transactions
from sidecar.engine.txn_refusal import TxnRefusal


class TenantPort:
    """What a tenant lane's transactions and changelog writers use of Kafka: the tenant's producer
    (``producer``, replaced on a fatal error) and the deployment's warning rate limit."""

    __slots__ = ("kafka", "tenants", "topic")

    def __init__(self, tenants: TenantProducers, topic: str, kafka: KafkaIO) -> None:
        self.tenants = tenants
        self.topic = topic
        self.kafka = kafka

    @property
    def producer(self) -> Any:
        return self.tenants.own[self.topic]

    def should_warn(self, key: str, every_s: float = 30.0) -> bool:
        return self.kafka.should_warn(key, every_s)


class TopicHold:
    """A tenant lane's ingress while its transactional id is refused (txn_refusal.py): its topic
    held (``KafkaIO.held_topics``: its partitions paused, its records consumed meanwhile dropped,
    its stores not published); released, its partitions are consumed again from the committed
    offsets. The other lanes' topics go on."""

    __slots__ = ("kafka", "topic")

    def __init__(self, kafka: KafkaIO, topic: str) -> None:
        self.kafka = kafka
        self.topic = topic

    @property
    def held(self) -> bool:
        return self.topic in self.kafka.held_topics

    def hold(self) -> None:
        self.kafka.hold_topic(self.topic)

    def release(self) -> None:
        self.kafka.release_topic(self.topic)


class Lane:
    """One transactional producer's transactions and the ingress topics whose partitions they cover."""

    __slots__ = ("name", "port", "refusal", "reset_wanted", "rest", "topics", "txn")

    def __init__(self, name: str, port: Any, txn: Transactions, refusal: TxnRefusal, topics: frozenset[str],
                 rest: bool = False) -> None:
        self.name = name  # the tenant's; "" for the deployment's lane
        self.port = port  # KafkaIO or a TenantPort: ``producer``
        self.txn = txn
        self.refusal = refusal  # the transactional id refused: waited out (txn_refusal.py)
        # its ingress topics; ``rest`` (the deployment's lane): every topic but these (the tenant lanes')
        self.topics = topics
        self.rest = rest
        self.reset_wanted = ""  # why this lane's committed state must be restored (at the next turn)

    def covers(self, topic: str) -> bool:
        """Are the records of ingress topic ``topic`` in this lane's transactions? ("": the
        deployment's own writes, e.g. etf1 tombstones.)"""
        return (topic in self.topics) != self.rest

    def log_fields(self) -> dict[str, str]:
        return {"tenant": self.name} if self.name else {}
