"""A tenant's own Kafka credentials (``tenants.<name>.kafka``, sidecar/tenants.py) and its own
producer (sidecar/engine/tenant_producers.py): the values' forms and their errors, redaction, and
on the Kafka twin a tenant's records published as the tenant, a refused one dead-lettered as
``not-authorized`` in the tenant's DLQ while the other tenant is delivered."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from sidecar import contract as c
from sidecar.config import ConfigError, load_settings
from sidecar.tenants import TenantSpec
from tests.unit.helpers.world import TARGET, World

SECRET = "s3cr3t-pa55"


def _load(tmp_path: Path, body: str, environ: dict[str, str] | None = None, delivery: str = "at-least-once"):  # type: ignore[no-untyped-def]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"delivery: {delivery}\ntenants:\n  a:\n    ingress-topic: a.in\n" + body)
    return load_settings({}, config_file=cfg, environ=environ or {})


def test_values_come_as_strings_from_files_and_from_the_environment(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text(SECRET + "\n")
    s = _load(tmp_path, f"    kafka:\n      sasl.username: alice\n      sasl.password: {{file: {tmp_path / 'pw'}}}\n"
                        "      ssl.key.password: {env: A_KEY_PW}\n      linger.ms: 5\n", {"A_KEY_PW": "k3y"})
    (a,) = s.tenants
    assert dict(a.kafka) == {"sasl.username": "alice", "sasl.password": SECRET, "ssl.key.password": "k3y",
                             "linger.ms": "5"}
    assert a.principal(s.kafka) == "User:alice"


def test_secrets_are_never_in_the_dump_nor_the_repr(tmp_path: Path) -> None:
    s = _load(tmp_path, "    kafka:\n      sasl.username: alice\n      sasl.password: {env: PW}\n", {"PW": SECRET})
    dumped = orjson.dumps(s.masked(), default=str).decode()
    assert SECRET not in dumped
    assert '"sasl.password":"***"' in dumped and '"sasl.username":"alice"' in dumped
    assert SECRET not in repr(s.tenant_specs) and SECRET not in repr(s.tenants) and SECRET not in repr(s)


@pytest.mark.parametrize(("body", "needle"), [
    ("    kafka: alice\n", "tenants.a.kafka must be a mapping of librdkafka properties, each value a string, "
                          "{file: PATH} or {env: NAME}"),
    ("    kafka:\n      sasl.password: {env: NOPE}\n", "tenants.a.kafka.sasl.password: {env: NOPE}: the environment "
                                                         "variable NOPE is not set"),
    ("    kafka:\n      sasl.password: {file: /nonexistent/pw}\n",
     "tenants.a.kafka.sasl.password: cannot read {file: /nonexistent/pw}: No such file or directory"),
    ("    kafka:\n      sasl.password: {vault: x}\n",
     "tenants.a.kafka.sasl.password: must be a string, {file: PATH} or {env: NAME} (got a mapping with keys vault)"),
    ("    kafka:\n      sasl.password: [a, b]\n",
     "tenants.a.kafka.sasl.password: must be a string, {file: PATH} or {env: NAME}"),
    ("    kafka:\n      sasl.password: {env: ''}\n",
     "tenants.a.kafka.sasl.password: {env: ...} needs a non-empty name"),
    ("    kafka:\n      bootstrap.servers: elsewhere:9092\n",
     "tenants.a.kafka.bootstrap.servers: a property of the deployment, not of a tenant's producer"),
])
def test_bad_values_are_refused_naming_the_tenant_the_key_and_the_forms(tmp_path: Path, body: str,
                                                                        needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, body, {"PW": SECRET})
    assert needle in str(e.value)
    assert SECRET not in str(e.value)


def test_exactly_once_with_tenant_credentials_and_etf1_tombstones_is_refused(tmp_path: Path) -> None:
    """The tombstones are the deployment's writes: they would not commit with the tenant's deliveries."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("delivery: exactly-once\netf1-tombstones: 'on'\ntenants:\n  a:\n    ingress-topic: a.in\n"
                   "    kafka:\n      sasl.username: alice\n")
    with pytest.raises(ConfigError) as e:
        load_settings({}, config_file=cfg, environ={})
    assert "tenants.a.kafka: per-tenant Kafka credentials with delivery: exactly-once and etf1-tombstones: on" in str(
        e.value)
    _load(tmp_path, "    kafka:\n      sasl.username: alice\n", delivery="exactly-once")  # without etf1: fine


A, B = "a.in", "b.in"


def _dead(w: World, topic: str) -> list[dict[str, bytes | None]]:
    return [dict(m.headers() or []) for m in w.cluster.records(f"{topic}.dlq")]


def test_each_tenant_publishes_as_itself_and_a_refused_delivery_is_not_authorized(tmp_path: Path) -> None:
    """alice (tenant a) may not write the target, bob (tenant b) may, the deployment's principal
    may write nothing but the DLQs: a's record for the target lands in a's DLQ as not-authorized,
    naming the topic and User:alice; b's records arrive (so through bob's producer); nothing lost."""
    w = World(tmp_path, tenants=(A, B))
    w.cluster.create_topic(f"{A}.dlq", 1)
    w.cluster.create_topic(f"{B}.dlq", 1)
    w.cluster.denied = {"alice": {TARGET}, "sidecar": {TARGET}}
    specs = (TenantSpec("a", A, dlq_topic=f"{A}.dlq", kafka=(("sasl.username", "alice"), ("sasl.password", "x"))),
             TenantSpec("b", B, dlq_topic=f"{B}.dlq", kafka=(("sasl.username", "bob"),)))
    sc = w.sidecar("a", changelog="off", tenant_specs=specs, kafka={"sasl.username": "sidecar"},
                   delivery_attempts=2)
    assert {p.user for p in w.clients.producers} == {"sidecar", "alice", "bob"}
    w.send(3, lambda i: 200, prefix="steal", topic=A)
    stolen = {b"steal%d" % i for i in range(3)}
    for rid in stolen:
        del w.sent[rid]
    w.send(40, lambda i: 300 + 10 * i, prefix="b", topic=B)
    w.run([sc], lambda: len(w.delivered()) >= 40 and len(_dead(w, A)) >= 3)
    w.check(set(w.sent))  # b's 40, each once, none early
    dead = _dead(w, A)
    assert {h[c.ID] for h in dead} == stolen
    for h in dead:
        assert h[c.DLQ_REASON] == c.NOT_AUTHORIZED.encode()
        error = (h[c.DLQ_ERROR] or b"").decode()
        assert "TOPIC_AUTHORIZATION_FAILED" in error and f"User:alice may not write topic '{TARGET}'" in error
    assert _dead(w, B) == []
    sc.shutdown()
    assert all(len(p) == 0 for p in w.clients.producers)


def test_a_tenants_dead_producer_is_replaced_alone(tmp_path: Path) -> None:
    """A fatal error of tenant a's producer replaces that producer only; its records are still
    delivered, through the new one."""
    from confluent_kafka import KafkaError, KafkaException

    w = World(tmp_path, tenants=(A, B))
    specs = (TenantSpec("a", A, dlq_topic=f"{A}.dlq", kafka=(("sasl.username", "alice"),)),
             TenantSpec("b", B, dlq_topic=f"{B}.dlq"))
    sc = w.sidecar("a", changelog="off", tenant_specs=specs)
    deployment, alice = sc.pub.producer, sc.pub.tenants.own[A]
    real_poll = alice.poll

    def dies(timeout: float = 0) -> int:
        alice.poll = real_poll
        raise KafkaException(KafkaError(KafkaError._FATAL, "Local: Fatal error", fatal=True))

    alice.poll = dies
    w.send(10, lambda i: 100 + 10 * i, prefix="a", topic=A)
    w.send(10, lambda i: 100 + 10 * i, prefix="b", topic=B)
    w.run([sc], lambda: len(w.delivered()) >= 20)
    w.check(set(w.sent))
    assert sc.pub.producer is deployment and sc.pub.tenants.own[A] is not alice
    sc.shutdown()


def test_a_tenant_whose_producer_cannot_get_through_holds_up_no_one(tmp_path: Path) -> None:
    """alice's produces time out (a refused login): b is delivered meanwhile, the deployment stays
    ready, and a's records are retried until alice gets through, then delivered: none lost."""
    w = World(tmp_path, tenants=(A, B))
    specs = (TenantSpec("a", A, dlq_topic=f"{A}.dlq", kafka=(("sasl.username", "alice"),)),
             TenantSpec("b", B, dlq_topic=f"{B}.dlq"))
    sc = w.sidecar("a", changelog="off", tenant_specs=specs)
    w.cluster.unreachable.add("alice")
    w.send(10, lambda i: 100 + 10 * i, prefix="a", topic=A)
    w.send(10, lambda i: 100 + 10 * i, prefix="b", topic=B)
    w.run([sc], lambda: len(w.delivered()) >= 10 and sc.counters.publish_retries >= 10)
    assert {dict(m.headers() or [])[c.ID] for m in w.delivered()} == {b"b%d" % i for i in range(10)}
    assert sc.pub.state.broker_up
    w.cluster.unreachable.clear()
    w.run([sc], lambda: len(w.delivered()) >= 20)
    w.check(set(w.sent))
    assert _dead(w, A) == []
    sc.shutdown()
