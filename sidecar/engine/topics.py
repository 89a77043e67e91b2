"""The topics the sidecar needs, made or checked when it starts (``KafkaIO.start``): a missing
ingress, DLQ or history topic is created with the deployment's partitions and replication factor
(an existing one is left as it is); a changelog topic is created compacted with one partition per
ingress partition, and one that exists with another partition count or cleanup policy is refused
with the command that fixes it (its records would land in partitions no store reads, or be
deleted rather than compacted)."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType  # type: ignore[attr-defined]

from sidecar import logs
from sidecar.config import ConfigError
from sidecar.retry.codes import TOPIC_ALREADY_EXISTS

log = logs.get("sidecar")


def ensure_topics(
    admin: Any, topics: dict[str, int], replication_factor: int, timeout: float = 30,
    configs: dict[str, dict[str, str]] | None = None,
) -> None:
    """Create the topics that are missing (ingress, DLQ); an existing topic is left as it is."""
    existing = set(admin.list_topics(timeout=timeout).topics)
    missing = [NewTopic(t, num_partitions=n, replication_factor=replication_factor, config=(configs or {}).get(t, {}))
               for t, n in topics.items() if t not in existing]
    if not missing:
        return
    for topic, fut in admin.create_topics(missing, operation_timeout=timeout).items():
        try:
            fut.result()
            log.info("topic.created", topic=topic)
        except KafkaException as e:
            if e.args[0].code() != TOPIC_ALREADY_EXISTS:
                raise


def described(admin: Any, topic: str, timeout: float) -> Any:
    """The topic's metadata, waiting for a topic created a moment ago to show up in it."""
    deadline = time.monotonic() + timeout
    while True:
        found = admin.list_topics(topic=topic, timeout=timeout).topics.get(topic)
        if found is not None and found.error is None and found.partitions:
            return found
        if time.monotonic() >= deadline:
            raise ConfigError(f"topic {topic!r} did not appear in the cluster's metadata within {timeout:.0f} s")
        time.sleep(0.1)


def ensure_changelog(admin: Any, topic: str, ingress: str, replication_factor: int, timeout: float = 30) -> None:
    """Create the changelog topic of the ``ingress`` topic (compacted, one partition per ingress
    partition), or refuse one that exists with other settings: its records would be deleted
    (not compacted) or land in partitions no store reads."""
    n = len(described(admin, ingress, timeout).partitions)
    ensure_topics(admin, {topic: n}, replication_factor, timeout, {topic: {"cleanup.policy": "compact"}})
    have = len(described(admin, topic, timeout).partitions)
    fix = (f"use a new changelog topic (--changelog-topic) or recreate {topic!r} as "
           f"'kafka-topics --create --topic {topic} --partitions {n} --config cleanup.policy=compact' "
           "while no sidecar runs")
    if have != n:
        raise ConfigError(
            f"changelog topic {topic!r} has {have} partitions, the ingress topic {ingress!r} has {n}: "
            f"a partition's store would restore from the wrong partition; {fix}"
        )
    res = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([res])[res].result(timeout)
    policy = entries["cleanup.policy"].value if "cleanup.policy" in entries else "delete"
    if policy != "compact":
        raise ConfigError(
            f"changelog topic {topic!r} has cleanup.policy={policy}, it must be 'compact' (with 'delete', "
            f"pending records older than retention.ms would be lost on a handover); {fix}, or "
            f"'kafka-configs --alter --entity-type topics --entity-name {topic} "
            "--add-config cleanup.policy=compact'"
        )
