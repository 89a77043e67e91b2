"""A running sidecar that delivers to one target, under exactly the documented ACLs: what the
tests of a refusal while running (an ACL revoked, credentials changed, a certificate expired)
start from, and the admin's producer and consumer around it."""

from __future__ import annotations

from pathlib import Path

from sidecar.acls import Target, acls_for
from sidecar.config import load_settings
from tests.integration.refusals import Run, kafka_flags
from tests.secure.cluster import SecureCluster


class Deliveries:
    """A running sidecar under exactly the documented ACLs for its topics and one target (made by
    the admin beforehand), and the admin's producer and consumer around it."""

    def __init__(self, tmp_path: Path, secure_kafka: SecureCluster, user: dict[str, str]) -> None:
        name = tmp_path.name
        self.cluster, self.name = secure_kafka, name
        self.ingress, self.target = f"in-{name}", f"out-{name}"
        secure_kafka.create_topics([self.ingress, f"dlq-{name}", self.target])
        settings = load_settings({"ingress-topic": self.ingress, "dlq-topic": f"dlq-{name}", "changelog": "off",
                                  "group-id": f"g-{name}"}, environ={})
        self.principal = secure_kafka.principal(user)
        self.acls = acls_for("run", settings, [Target(self.target)])
        self.bindings = secure_kafka.grant(self.principal, self.acls)
        self.run = Run(tmp_path, kafka_flags(user))

    def send(self, value: bytes) -> None:
        from confluent_kafka import Producer

        from sidecar import client

        p = Producer(self.cluster.admin_conf)
        client.send_delayed(p, self.target, value, key=b"k", delay="1s", ingress_topic=self.ingress)
        assert p.flush(30) == 0

    def first_delivered(self) -> bytes | None:
        from confluent_kafka import Consumer

        c = Consumer({**self.cluster.admin_conf, "group.id": f"check-{self.name}", "auto.offset.reset": "earliest"})
        c.subscribe([self.target])
        try:
            for _ in range(100):
                m = c.poll(0.3)
                if m is not None and m.error() is None:
                    return m.value()
            return None
        finally:
            c.close()
