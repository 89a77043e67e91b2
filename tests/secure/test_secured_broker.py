"""The secured dev broker enforces what it claims: SCRAM over TLS, and ACLs with no default allow.

A SCRAM client with Write and Read on a topic (and Read on its group) produces and consumes; a
principal without those ACLs is refused both; a wrong password does not get in. These are the
canaries of tests/secure/: every other test there relies on the broker refusing what no ACL allows.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from sidecar.acls import GROUP, TOPIC, Acl
from tests.secure.cluster import SecureCluster

pytestmark = pytest.mark.integration


def _produce(conf: dict[str, str], topic: str, n: int) -> list[KafkaError | None]:
    p = Producer({**conf, "message.timeout.ms": 5000})
    results: list[KafkaError | None] = []
    for i in range(n):
        p.produce(topic, value=b"v%d" % i, on_delivery=lambda err, msg: results.append(err))
    p.flush(15)
    return results


def _consume(
    conf: dict[str, str], topic: str, group: str, want: int, timeout_s: float
) -> tuple[list[bytes], list[int]]:
    c = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    values: list[bytes] = []
    errors: list[int] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) < want and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error() is not None:
                errors.append(m.error().code())
                if not m.error().retriable() and m.error().code() != KafkaError._PARTITION_EOF:
                    break
                continue
            values.append(m.value() or b"")
    finally:
        c.close()
    return values, errors


def test_scram_client_under_acls(secure_kafka: SecureCluster) -> None:
    topic, group = f"sec-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    secure_kafka.create_topics([topic])
    alice = secure_kafka.new_user("alice")
    bob = secure_kafka.new_user("bob")
    secure_kafka.grant(SecureCluster.principal(alice), [
        Acl(TOPIC, topic, "literal", "Write"), Acl(TOPIC, topic, "literal", "Read"),
        Acl(GROUP, group, "literal", "Read"),
    ])

    assert _produce(alice, topic, 3) == [None, None, None]
    values, errors = _consume(alice, topic, group, 3, 30)
    assert sorted(values) == [b"v0", b"v1", b"v2"], errors

    refused = _produce(bob, topic, 1)
    assert len(refused) == 1 and refused[0] is not None
    assert refused[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    values, errors = _consume(bob, topic, group, 1, 10)
    assert values == []
    assert KafkaError.GROUP_AUTHORIZATION_FAILED in errors or KafkaError.TOPIC_AUTHORIZATION_FAILED in errors, errors


def test_wrong_password_is_refused(secure_kafka: SecureCluster) -> None:
    alice = secure_kafka.new_user("alice")
    errors: list[KafkaError] = []
    p = Producer({**alice, "sasl.password": "not-" + alice["sasl.password"], "error_cb": errors.append})
    with pytest.raises(KafkaException):
        p.list_topics(timeout=5)
    p.poll(0)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
