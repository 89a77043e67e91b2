"""A sidecar deployment on the secured broker, as the docs recommend it (tests/secure/).

:class:`Deployment` makes a test's topics as the admin (the sidecar creates none: it has no
Create), a SCRAM principal for the sidecar holding exactly the ACLs ``sidecar.acls`` prints for
its settings, a producer principal with Write on the ingress topic only, and runs the sidecar as a
real process (tests/integration/harness.py) logged in as its principal.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from sidecar import acls
from sidecar import contract as c
from sidecar.config import Settings, load_settings
from tests.integration.harness import Received, SidecarProcess, _received
from tests.secure.cluster import SecureCluster


def kafka_flags(conf: dict[str, str]) -> list[str]:
    """``--kafka PROP=VALUE`` flags of a principal's client properties (no bootstrap)."""
    out: list[str] = []
    for k, v in conf.items():
        if k != "bootstrap.servers":
            out += ["--kafka", f"{k}={v}"]
    return out


@dataclass
class Deployment:
    cluster: SecureCluster
    tmp: Path
    delivery: str = "at-least-once"
    changelog: str = "off"
    history: bool = False
    partitions: int = 1
    extra: list[str] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    sidecars: list[SidecarProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        u = uuid.uuid4().hex[:8]
        self.ingress, self.dlq = f"in-{u}", f"dlq-{u}"
        self.target = f"orders-{u}"
        self.history_topic = f"hist-{u}" if self.history else None
        self.targets = [self.target, *self.targets]
        self.sidecar_user = self.cluster.new_user("sidecar")
        self.producer_user = self.cluster.new_user("producer")

    @property
    def settings(self) -> Settings:
        """What ``delay-sidecar run`` reads from the flags the harness and :meth:`start` pass."""
        flags: dict[str, Any] = {"ingress-topic": self.ingress, "dlq-topic": self.dlq,
                                 "group-id": f"sc-{self.ingress}", "delivery": self.delivery,
                                 "changelog": self.changelog, "history-topic": self.history_topic}
        return load_settings(flags, environ={})

    def acls(self, command: str = "run", **kw: Any) -> list[acls.Acl]:
        return acls.acls_for(command, self.settings, [acls.Target(t) for t in self.targets], **kw)

    def create_topics(self) -> None:
        s = self.settings
        topics = [self.ingress, self.dlq, *self.targets, *([self.history_topic] if self.history_topic else [])]
        changelog = [s.changelog_topic_name] if s.changelog_topic_name else []
        self.cluster.create_topics(topics + changelog, self.partitions, compact=changelog)

    def grant(self, skip: acls.Acl | None = None) -> list[Any]:
        """The sidecar's printed ACLs (but ``skip``) and the producer's; returns the sidecar's."""
        self.cluster.grant(SecureCluster.principal(self.producer_user), self.acls("producer"))
        return self.cluster.grant(SecureCluster.principal(self.sidecar_user), [a for a in self.acls() if a != skip])

    def sidecar(self, instance: str = "0", extra: tuple[str, ...] = ()) -> SidecarProcess:
        s = self.settings
        flags = ["--delivery", s.delivery, "--changelog", s.changelog, "--ingress-partitions", str(self.partitions),
                 "--delivery-grace", "1s", "--transaction-interval", "100ms", *self.extra, *extra,
                 *(["--history-topic", self.history_topic] if self.history_topic else []),
                 *kafka_flags(self.sidecar_user)]
        sc = SidecarProcess(self.cluster.bootstrap, self.tmp / f"data-{instance}", self.ingress, self.dlq,
                            extra=flags, instance=instance)
        self.sidecars.append(sc)
        return sc

    def send(self, n: int, delay_ms: int = 1000, target: str | None = None, prefix: str = "r",
             conf: dict[str, str] | None = None) -> list[bytes]:
        """``n`` delayed records to ``target`` (default: the first target), as the producer."""
        p = Producer({**(conf or self.producer_user), "enable.idempotence": True, "linger.ms": 5})
        values = [f"{prefix}-{i}".encode() for i in range(n)]
        errors: list[Any] = []
        for v in values:
            p.produce(self.ingress, key=v, value=v, on_delivery=lambda err, msg: errors.append(err),
                      headers=[(c.TARGET_TOPIC, (target or self.target).encode()),
                               (c.DELAY_MS, str(delay_ms).encode()), (c.ID, v)])
        assert p.flush(30) == 0
        assert [e for e in errors if e is not None] == []
        return values

    def read_all(self, topic: str) -> list[Received]:
        """Every committed record of ``topic`` now (as the admin)."""
        return read_all(self.cluster, topic)

    def stop(self) -> None:
        for sc in self.sidecars:
            sc.stop_quietly()


def read_all(cluster: SecureCluster, topic: str) -> list[Received]:
    """Every committed record of ``topic`` now (as the admin)."""
    cons = Consumer({**cluster.admin_conf, "group.id": f"t-{uuid.uuid4().hex[:8]}",
                     "enable.partition.eof": True, "isolation.level": "read_committed"})
    parts = len(cons.list_topics(topic, timeout=10).topics[topic].partitions)
    cons.assign([TopicPartition(topic, p, 0) for p in range(parts)])
    out: list[Received] = []
    eof: set[int] = set()
    try:
        for _ in range(200):
            for m in cons.consume(num_messages=1000, timeout=0.2):
                if m.error() is not None:
                    eof.add(m.partition() or 0)
                else:
                    out.append(_received(m))
            if len(eof) == parts:
                return out
    finally:
        cons.close()
    raise AssertionError(f"no end of {topic} within 40 s")


@dataclass
class TwoTenants:
    """Tenants a and b with principals of their own (alice, bob) and ``delivery: exactly-once``: the
    topics made as the admin (ingress and changelog with ``partitions``, DLQs and targets), the
    sidecar's principal, the tenants' config file (passwords from the environment: ``env``) and its
    settings, before any ACL is granted."""

    settings: Settings
    config: Path
    env: dict[str, str]
    topics: dict[str, str]  # a_in, b_in, a_dlq, b_dlq, a_out, b_out
    sidecar: dict[str, str]
    alice: dict[str, str]
    bob: dict[str, str]

    @classmethod
    def make(cls, cl: SecureCluster, tmp: Path, prefix: str, partitions: int) -> TwoTenants:
        u = uuid.uuid4().hex[:8]
        names = ("a_in", "b_in", "a_dlq", "b_dlq", "a_out", "b_out")
        topics = {n: f"{prefix}{n.replace('_in', '').replace('_', '-')}-{u}" for n in names}
        a_in, b_in = topics["a_in"], topics["b_in"]
        cl.create_topics([a_in, b_in, f"{a_in}.changelog", f"{b_in}.changelog"], partitions,
                         compact=[f"{a_in}.changelog", f"{b_in}.changelog"])
        cl.create_topics([topics[n] for n in names[2:]])
        sidecar, alice, bob = cl.new_user("sidecar"), cl.new_user("alice"), cl.new_user("bob")
        cfg = tmp / "tenants.yaml"
        cfg.write_text(
            "delivery: exactly-once\nchangelog: \"on\"\n"
            "tenants:\n"
            f"  a:\n    ingress-topic: {a_in}\n    dlq-topic: {topics['a_dlq']}\n"
            f"    kafka:\n      sasl.username: {alice['sasl.username']}\n      sasl.password: {{env: ALICE_PASSWORD}}\n"
            f"  b:\n    ingress-topic: {b_in}\n    dlq-topic: {topics['b_dlq']}\n"
            f"    kafka:\n      sasl.username: {bob['sasl.username']}\n      sasl.password: {{env: BOB_PASSWORD}}\n"
        )
        env = {"ALICE_PASSWORD": alice["sasl.password"], "BOB_PASSWORD": bob["sasl.password"]}
        settings = load_settings({"group-id": f"sc-{a_in}"}, config_file=cfg, environ=env)
        return cls(settings, cfg, env, topics, sidecar, alice, bob)
