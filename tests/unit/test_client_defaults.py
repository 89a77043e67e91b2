"""The sidecar's librdkafka defaults (``client_conf.CLIENT_DEFAULTS``) reach every client of a start,
the start's probe included, and an operator's ``kafka:`` entry overrides them."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar import connectivity
from sidecar.config import Settings
from sidecar.engine.client_conf import CLIENT_DEFAULTS
from sidecar.engine.kafka_io import KafkaIO


def _io(**kw: Any) -> KafkaIO:
    s = Settings(bootstrap_servers="127.0.0.1:1", group_instance_id="i-1", http_port=0, **kw)
    return KafkaIO(s, clients=None, events=None)  # type: ignore[arg-type]


def _probe_conf(monkeypatch: pytest.MonkeyPatch, **kw: Any) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(connectivity, "probe", lambda conf, *_a, **_k: seen.append(conf))
    s = Settings(bootstrap_servers="127.0.0.1:1", group_instance_id="i-1", http_port=0, **kw)
    connectivity.run_probe(s)()
    return seen[0]


def test_the_reconnect_backoff_is_short_for_every_client_of_a_start(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CLIENT_DEFAULTS["reconnect.backoff.ms"] < 100  # librdkafka's default waits 50 ms per new client
    io = _io()
    for conf in (io.consumer_conf(), io.producer_conf(), io._common(), _probe_conf(monkeypatch)):
        assert conf["reconnect.backoff.ms"] == CLIENT_DEFAULTS["reconnect.backoff.ms"]


def test_an_operators_kafka_entry_wins_over_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    io = _io(kafka={"reconnect.backoff.ms": "250"})
    for conf in (io.consumer_conf(), io.producer_conf(), io._common(),
                 _probe_conf(monkeypatch, kafka={"reconnect.backoff.ms": "250"})):
        assert conf["reconnect.backoff.ms"] == "250"
    assert _io().consumer_conf()["reconnect.backoff.ms"] == CLIENT_DEFAULTS["reconnect.backoff.ms"]


def test_a_tenants_admin_client_has_the_defaults_under_its_properties() -> None:
    from sidecar.engine.tenant_producers import TenantProducers
    from sidecar.tenants import TenantSpec

    spec = TenantSpec("a", "in.a", dlq_topic="in.a.dlq", kafka=(("sasl.username", "alice"),))
    s = Settings(bootstrap_servers="127.0.0.1:1", group_instance_id="i-1", http_port=0, tenant_specs=(spec,))
    conf = TenantProducers(s).admin("in.a", lambda c: c)
    assert conf["reconnect.backoff.ms"] == CLIENT_DEFAULTS["reconnect.backoff.ms"]
    assert conf["sasl.username"] == "alice"
    over = TenantSpec("a", "in.a", dlq_topic="in.a.dlq", kafka=(("reconnect.backoff.ms", "250"),))
    s = Settings(bootstrap_servers="127.0.0.1:1", group_instance_id="i-1", http_port=0, tenant_specs=(over,))
    assert TenantProducers(s).admin("in.a", lambda c: c)["reconnect.backoff.ms"] == "250"


def _restore_conf(**kw: Any) -> dict[str, Any]:
    from sidecar.engine.changelog_reader import ChangelogReader

    io = _io(**kw)
    made: list[dict[str, Any]] = []
    reader = ChangelogReader(io.s, {}, io._common, lambda conf: made.append(conf), lambda: None, lambda _w: False)
    reader._restorer()
    return made[0]


def _redrive_conf(monkeypatch: pytest.MonkeyPatch, **kw: Any) -> dict[str, Any]:
    import confluent_kafka

    from sidecar import dlq

    made: list[dict[str, Any]] = []
    monkeypatch.setattr(confluent_kafka, "Consumer", lambda conf: made.append(conf))
    dlq._consumer(dlq.Job("127.0.0.1:1", "in.dlq", "in", (), None, None, **kw))
    return made[0]


def test_every_consumer_looks_at_its_full_fetch_queue_again_within_ms(monkeypatch: pytest.MonkeyPatch) -> None:
    # librdkafka's default waits a second before fetching again for a partition whose local queue
    # was full: a backlog's drain (ingress, restore, redrive) then stalls once a queue's worth
    from bench.workload import INGRESS_CONSUMER
    from sidecar.engine.client_conf import FETCH_QUEUE_BACKOFF_MS

    assert 0 < FETCH_QUEUE_BACKOFF_MS <= 10  # 0 re-checks in a busy loop
    io = _io()
    for conf in (io.consumer_conf(), _restore_conf(), _redrive_conf(monkeypatch), INGRESS_CONSUMER):
        assert conf["fetch.queue.backoff.ms"] == FETCH_QUEUE_BACKOFF_MS
    # a consumer property: a producer would log it as ignored
    assert "fetch.queue.backoff.ms" not in io.producer_conf()
    over = {"fetch.queue.backoff.ms": "100"}
    for conf in (_io(kafka=over).consumer_conf(), _restore_conf(kafka=over), _redrive_conf(monkeypatch, kafka=over)):
        assert conf["fetch.queue.backoff.ms"] == "100"
