"""Exactly-once: the target topics a principal may be produced to, asked before the first produce.

In a transaction a produce to a topic that is missing, or that the producer's principal may not
write, fails and dooms the whole transaction, and again after every abort (the record is
consumed and produced again). So under ``delivery: exactly-once`` a target is produced to only
once the cluster's metadata has it and the principal's authorized operations include Write
(``target_access.TargetAccess``, asked as that principal: the deployment's admin client, or the admin
client of a tenant with ``kafka:`` overrides, engine/txn_lanes.py). Until then a record for it
takes ``Publishing``'s failure path without a produce, with the error the broker would have given:

- missing: ``_UNKNOWN_TOPIC``, a missing target (``delivery-grace``, then the DLQ as
  ``delivery-failed``);
- there but not writable by the principal (or not even describable: the broker answers both
  alike): ``TOPIC_AUTHORIZATION_FAILED``, a permanent error (``delivery-attempts``, then the DLQ
  as ``not-authorized``, the error naming the topic and the principal), as at-least-once's
  refused produce ends.

An unknown topic is asked at most every ``TARGET_ASK_MS`` per principal (the answer is kept
meanwhile); a topic found writable is known from then on, until a delivery to it fails.
:class:`Targets` keeps one :class:`Writable` per principal: the deployment's, and one per tenant
with its own principal, by the tenant's ingress topic.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import KafkaError

from sidecar.store.codec import Record

TARGET_ASK_MS = 1_000  # an unknown target topic's metadata is asked at most this often
WRITABLE, MISSING, REFUSED = "writable", "missing", "refused"  # TargetAccess.state's answers (None: none)

Ask = Callable[[str], str | None]


class Writable:
    """The targets one principal may write: asked of the cluster (``ask``), kept once writable."""

    __slots__ = ("_answers", "ask", "known", "known_b", "principal")

    def __init__(self, ask: Ask | None = None, principal: str = "the sidecar's principal") -> None:
        self.ask = ask
        self.principal = principal
        self.known: set[str] = set()
        self.known_b: set[bytes] = set()  # the same topics, as records name them (the C path's check)
        self._answers: dict[str, tuple[int, str | None]] = {}  # an unknown topic: when asked, the answer

    def all_known(self, batch: list[tuple[int, Record]]) -> bool:
        known = self.known_b
        return all(rec.topic in known for _ref, rec in batch)

    def refusal(self, topic: str, now_ms: int) -> KafkaError | None:
        """None when ``topic`` may be produced to, else the error its record fails with."""
        if topic in self.known:
            return None
        asked = self._answers.get(topic)
        if asked is None or now_ms - asked[0] >= TARGET_ASK_MS:
            answer = self.ask(topic) if self.ask is not None else None
            if answer == WRITABLE:
                self.known.add(topic)
                self.known_b.add(topic.encode())
                self._answers.pop(topic, None)
                return None
            asked = (now_ms, answer)
            self._answers[topic] = asked
        if asked[1] == REFUSED:
            return KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED,
                              f"the authorized operations of {self.principal} on topic {topic!r} lack Write "
                              "(not produced: exactly-once)")
        return KafkaError(KafkaError._UNKNOWN_TOPIC, f"target topic {topic!r} is not in the cluster's metadata "
                          "(not produced: exactly-once)")

    def forget(self, topic: str) -> None:
        """A delivery to ``topic`` failed: asked again before the next produce."""
        self.known.discard(topic)
        self.known_b.discard(topic.encode())


class Targets:
    """The :class:`Writable` of each principal, by the ingress topic whose records it publishes."""

    def __init__(self) -> None:
        self.default = Writable()  # the deployment's principal
        self.by_topic: dict[str, Writable] = {}  # a tenant's own principal

    def of(self, ingress_topic: str) -> Writable:
        return self.by_topic.get(ingress_topic, self.default)
