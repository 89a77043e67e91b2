"""Exactly-once: Write on the transactional id revoked while records flow, then granted again.

The sidecar must not exit: deliveries stop, ``/readyz`` answers 503 ``not-authorized`` naming
the transactional id, and once the ACL is back it resumes with a new transactional producer,
without a restart. Every record sent before, during and after arrives exactly once for a
``read_committed`` reader, none early (engine/txn_refused.py).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from sidecar import acls, client
from sidecar.config import load_settings
from tests.integration.harness import consume_until
from tests.integration.refusals import Run, kafka_flags
from tests.secure.cluster import SecureCluster

pytestmark = pytest.mark.integration


class _Reader:
    """A read_committed reader of the target kept open (assigned: no group join per read)."""

    def __init__(self, conf: dict[str, str], topic: str) -> None:
        self.c = Consumer({**conf, "group.id": f"reader-{topic}", "enable.auto.commit": False})
        self.c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self.seen = 0

    def drain(self, quiet_s: float = 1.0) -> int:
        """Records read so far, once none came for ``quiet_s``."""
        last = time.monotonic()
        while time.monotonic() - last < quiet_s:
            got = sum(1 for m in self.c.consume(1000, 0.2) if m.error() is None)
            if got:
                self.seen += got
                last = time.monotonic()
        return self.seen

    def close(self) -> None:
        self.c.close()


def test_transactional_id_revoked_while_running_heals(tmp_path: Path, secure_kafka: SecureCluster) -> None:
    cluster = secure_kafka
    name = tmp_path.name
    user = cluster.new_user("txnrev")
    principal = SecureCluster.principal(user)
    settings = load_settings({"ingress-topic": f"in-{name}", "dlq-topic": f"dlq-{name}", "group-id": f"g-{name}",
                              "delivery": "exactly-once", "changelog": "on"}, environ={})
    changelog = settings.changelog_topic_name
    assert changelog is not None
    target = f"out-{name}"
    cluster.create_topics([settings.ingress_topic, settings.dlq_topic, target, changelog], compact=[changelog])
    printed = acls.acls_for("run", settings, [acls.Target(target)])
    txn = [a for a in printed if a.resource == acls.TXN]
    assert txn
    bindings = cluster.grant(principal, printed)
    txn_bindings = [b for a, b in zip(printed, bindings, strict=True) if a.resource == acls.TXN]
    run = Run(tmp_path, ["--delivery", "exactly-once", "--changelog", "on", "--transaction-interval", "100ms",
                         *kafka_flags(user)])
    producer = Producer({**cluster.admin_conf, "enable.idempotence": True})
    sent: list[bytes] = []
    stop = threading.Event()

    def send_steadily() -> None:  # records keep flowing while the ACL goes and comes back
        i = 0
        while not stop.is_set():
            v = f"r-{i}".encode()
            client.send_delayed(producer, target, v, key=v, delay="300ms", ingress_topic=settings.ingress_topic,
                                id=v.decode())
            sent.append(v)
            i += 1
            producer.poll(0)
            time.sleep(0.05)

    sender = threading.Thread(target=send_steadily, daemon=True)
    committed = {**cluster.admin_conf, "isolation.level": "read_committed"}
    reader = _Reader(committed, target)
    try:
        run.wait_readyz(60, None)
        sender.start()
        assert consume_until(cluster.bootstrap, [target], 5, 30, conf=committed)  # delivering
        cluster.revoke(principal, txn_bindings)
        doc = run.wait_readyz(60, "not-authorized")["kafka"]
        assert doc["resource"].startswith(f"transactional id g-{name}."), doc
        assert doc["operation"] == "Write" and doc["principal"] == principal, doc
        # refused for a while, records still coming in and falling due: nothing delivered, no exit
        refused_at = reader.drain()
        time.sleep(1)
        assert reader.drain() == refused_at
        assert run.proc.poll() is None, "".join(run.out[-30:])
        assert run.readyz()[0] == 503
        cluster.grant(principal, [a for a in printed if a.resource == acls.TXN])
        run.wait_readyz(60, None)
        time.sleep(1)
        stop.set()
        sender.join(10)
        assert producer.flush(30) == 0
        got = consume_until(cluster.bootstrap, [target], len(sent), 90, settle_s=2, conf=committed)
        values = [r.value or b"" for r in got]
        assert len(values) == len(set(values)), [v for v in set(values) if values.count(v) > 1]
        assert sorted(values) == sorted(sent), (len(values), len(sent))
        assert all(r.lateness_ms >= 0 for r in got), min(r.lateness_ms for r in got)
        assert run.events("kafka.refused")
    finally:
        stop.set()
        reader.close()
        rc = run.stop(60)
    assert rc == 0, "".join(run.out[-30:])
    assert not run.events("kafka.unusable")
    # every record's report was served (by the dead producers too): nothing for the shutdown to wait on
    assert run.events("sidecar.stopping")[0]["in_flight"] == 0
