"""Exactly-once: may a principal write a target topic? Asked of the cluster before a target's
first produce (``eos_targets.Writable`` keeps the answer): the topic's metadata, then the
principal's authorized operations on it (``describe_topics`` with
``include_authorized_operations``, KIP-430). The answers are ``eos_targets``' ``writable``,
``missing`` and ``refused`` (there, but not writable, or not even describable: the broker answers
both alike), or None (no answer: asked again later). A refusal is warned once per principal and
topic every five minutes: the operator grants Write or the records go to the DLQ."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AclOperation  # type: ignore[attr-defined]

from sidecar import kafka_errors, logs
from sidecar.config import Settings
from sidecar.engine.eos_targets import MISSING, REFUSED, WRITABLE

log = logs.get("sidecar")


class TargetAccess:
    """``admin``: the deployment's admin client (made when first asked); ``should_warn(key,
    every_s)``: the rate limit of the sidecar's warnings (``KafkaIO.should_warn``)."""

    def __init__(self, settings: Settings, admin: Callable[[], Any],
                 should_warn: Callable[[str, float], bool]) -> None:
        self.s, self.admin, self.should_warn = settings, admin, should_warn

    def state(self, topic: str, admin: Any = None, principal: str = "") -> str | None:
        """``topic``'s answer (module docstring) for the principal of ``admin``: the client of the
        principal that publishes (a tenant's, engine/txn_lanes.py), else the deployment's;
        ``principal`` names it in the log."""
        admin = admin if admin is not None else self.admin()
        try:
            found = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
        except KafkaException:
            return None
        if found is None:
            return MISSING
        err = getattr(found, "error", None)
        if err is not None:
            if err.retriable():
                return None
            if err.code() != KafkaError.TOPIC_AUTHORIZATION_FAILED:
                return MISSING
            return self._not_writable(topic, principal)
        if not found.partitions:
            return MISSING
        return WRITABLE if self._may_write(admin, topic) else self._not_writable(topic, principal)

    @staticmethod
    def _may_write(admin: Any, topic: str) -> bool:
        try:
            fut = admin.describe_topics(TopicCollection([topic]), request_timeout=5,
                                        include_authorized_operations=True)[topic]
            ops = fut.result().authorized_operations
        except KafkaException:
            return True  # no answer about the ACLs: the produce tells
        # None: the broker did not say
        return ops is None or AclOperation.WRITE in ops or AclOperation.ALL in ops

    def _not_writable(self, topic: str, principal: str) -> str:
        who = principal or kafka_errors.principal_of(self.s.kafka) or "the sidecar's principal"
        if self.should_warn(f"not_writable:{who}:{topic}", 300):
            log.warning("target.not_writable", topic=topic, principal=who,
                        action=f"its records go to the DLQ (not-authorized); grant {who} Write on the topic if it "
                               "is a target of the producers this sidecar serves")
        return REFUSED
