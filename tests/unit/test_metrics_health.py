"""Metrics exposition and the /metrics, /healthz, /readyz endpoints (real HTTP on port 0)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from sidecar.contract import REASONS
from sidecar.health import HealthServer
from sidecar.metrics import Metrics, _LatenessHistogram, level_tier
from sidecar.tenants import DEFAULT_TENANT

P = "delay_sidecar_"
T = DEFAULT_TENANT  # the tenant label of the one implicit tenant


def samples(text: str | bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body = text.decode() if isinstance(text, bytes) else text
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str | bytes, name: str, **labels: str) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def get(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(ingress_topic="delay.ingress", scheduler="wheel", tiers=("wheel", "bucket", "retry"))


@pytest.fixture
def server(metrics: Metrics, clock: FakeClock) -> Iterator[HealthServer]:
    hs = HealthServer("127.0.0.1", 0, metrics, clock=clock, stale_after_s=30)
    hs.start()
    try:
        yield hs
    finally:
        hs.stop()


# -- metrics ---------------------------------------------------------------------------------

def test_series_exist_at_zero_before_any_event(metrics: Metrics) -> None:
    text = metrics.render()
    for reason in REASONS:
        assert value(text, P + "dlq_records_total", reason=reason, tenant=T) == 0
    for counter in ("ingested_records", "cancelled_records", "duplicate_records", "publish_retries",
                    "early_deliveries"):
        assert value(text, P + counter + "_total") == 0
    assert value(text, P + "delivered_records_total", tenant=T) == 0
    assert value(text, P + "scheduled_records_total", scheduler="wheel") == 0
    assert value(text, P + "pending_records", tier="bucket", tenant=T) == 0
    assert value(text, P + "delivery_lateness_seconds_count", tenant=T) == 0
    assert value(text, P + "up") == 1
    assert value(text, P + "ready") == 0
    assert value(text, P + "ingress_paused") == 0


def test_counters_and_gauges(metrics: Metrics) -> None:
    metrics.ingested(5000)
    metrics.ingested(0)
    metrics.ingested(7)
    metrics.scheduled(5007)
    metrics.scheduled(3, scheduler="levels")
    metrics.delivered(4000)
    metrics.cancelled(2)
    metrics.duplicates(1)
    metrics.dead_lettered("bad-header", 3)
    metrics.dead_lettered_by_reason({"too-large": 2, "bad-header": 1})
    metrics.publish_retries(9)
    metrics.set_pending(level_tier(3), 12)
    metrics.set_pending_many({"wheel": 100, "bucket": 2_000_000})
    metrics.set_store_bytes(64 * 1024 * 1024)
    text = metrics.render()
    assert value(text, P + "ingested_records_total") == 5007
    assert value(text, P + "scheduled_records_total", scheduler="wheel") == 5007
    assert value(text, P + "scheduled_records_total", scheduler="levels") == 3
    assert value(text, P + "delivered_records_total", tenant=T) == 4000
    assert value(text, P + "cancelled_records_total") == 2
    assert value(text, P + "duplicate_records_total") == 1
    assert value(text, P + "dlq_records_total", reason="bad-header", tenant=T) == 4
    assert value(text, P + "dlq_records_total", reason="too-large", tenant=T) == 2
    assert value(text, P + "dlq_records_total", reason="retries-exhausted", tenant=T) == 0
    assert value(text, P + "publish_retries_total") == 9
    assert value(text, P + "pending_records", tier="level-3", tenant=T) == 12
    assert value(text, P + "pending_records", tier="wheel", tenant=T) == 100
    assert value(text, P + "pending_records", tier="bucket", tenant=T) == 2_000_000
    assert value(text, P + "store_bytes") == 64 * 1024 * 1024


def test_lateness_histogram_in_seconds(metrics: Metrics) -> None:
    metrics.observe_lateness_ms([0, 1, 2, 3, 10, 999, 1000, 60_000, 60_001, 3_600_000])
    metrics.observe_lateness_ms([])
    text = metrics.render()
    name = P + "delivery_lateness_seconds"

    def bucket(le: str) -> float:
        return value(text, name + "_bucket", le=le, tenant=T)

    assert bucket("0.001") == 2  # 0 and 1 ms: buckets are "less than or equal"
    assert bucket("0.002") == 3
    assert bucket("0.005") == 4
    assert bucket("0.01") == 5
    assert bucket("1.0") == 7
    assert bucket("60.0") == 8
    assert bucket("+Inf") == 10
    assert value(text, name + "_count", tenant=T) == 10
    assert value(text, name + "_sum", tenant=T) == pytest.approx(
        (0 + 1 + 2 + 3 + 10 + 999 + 1000 + 60_000 + 60_001 + 3_600_000) / 1000
    )
    les = [s.labels["le"] for f in text_string_to_metric_families(text.decode()) if f.name == name
           for s in f.samples if s.name == name + "_bucket"]
    assert les[0] == "0.001" and les[-2] == "60.0" and len(les) == 16
    assert value(text, P + "early_deliveries_total") == 0


def test_early_deliveries_are_counted_and_observed_as_zero(metrics: Metrics) -> None:
    metrics.observe_lateness_ms([-5, -1, 3])
    text = metrics.render()
    assert value(text, P + "early_deliveries_total") == 2
    assert value(text, P + "delivery_lateness_seconds_bucket", le="0.001", tenant=T) == 2
    assert value(text, P + "delivery_lateness_seconds_sum", tenant=T) == pytest.approx(0.003)


@settings(max_examples=300, deadline=None)
@given(
    bounds=st.lists(st.integers(0, 5_000), min_size=1, max_size=8, unique=True).map(sorted),
    batches=st.lists(st.lists(st.integers(-2_000, 10_000), max_size=40), max_size=4),
)
def test_batch_bucketing_matches_one_value_at_a_time(bounds: list[int], batches: list[list[int]]) -> None:
    """The sorted batch count against the reference model: each value, negatives as 0, in the
    first bucket whose bound is >= it, else +Inf; the sum of the clamped values."""
    h = _LatenessHistogram("x", "x", [b / 1000 for b in bounds]).child("t")
    want = [0] * (len(bounds) + 1)
    want_sum = 0
    for batch in batches:
        assert h.observe_ms(batch) == sum(1 for v in batch if v < 0)
        for v in batch:
            v = max(v, 0)
            want[next((i for i, b in enumerate(bounds) if v <= b), len(bounds))] += 1
            want_sum += v
    assert h.counts == want
    assert h.sum_ms == want_sum


def _stats(partitions: dict[str, Any], topic: str = "delay.ingress") -> str:
    return json.dumps({"name": "rdkafka#consumer-1", "type": "consumer",
                       "topics": {topic: {"topic": topic, "partitions": partitions},
                                  "other": {"partitions": {"0": {"consumer_lag": 999}}}}})


def test_consumer_lag_from_librdkafka_stats(metrics: Metrics) -> None:
    metrics.update_from_stats(_stats({
        "0": {"partition": 0, "consumer_lag": 42, "consumer_lag_stored": 40},
        "1": {"partition": 1, "consumer_lag": 0},
        "2": {"partition": 2, "consumer_lag": -1},  # not assigned / unknown
        "-1": {"partition": -1, "consumer_lag": 7},  # librdkafka's internal UA partition
    }))
    s = samples(metrics.render())
    lag = {dict(k[1])["partition"]: v for k, v in s.items() if k[0] == P + "consumer_lag_records"}
    assert lag == {"0": 42, "1": 0}
    # partition 0 revoked (absent), 1 moves on: 0's series disappears instead of freezing
    metrics.update_from_stats(_stats({"1": {"consumer_lag": 5}}).encode())
    s = samples(metrics.render())
    lag = {dict(k[1])["partition"]: v for k, v in s.items() if k[0] == P + "consumer_lag_records"}
    assert lag == {"1": 5}
    # malformed or foreign documents never raise and leave the gauge alone
    for bad in ("not json", "[]", "{}", json.dumps({"topics": {"delay.ingress": {"partitions": []}}})):
        metrics.update_from_stats(bad)
    assert value(metrics.render(), P + "consumer_lag_records", partition="1", tenant=T) == 5


def test_every_assigned_partition_has_a_lag_series(metrics: Metrics) -> None:
    """librdkafka reports consumer_lag -1 for an assigned partition with no committed offset (the
    sidecar commits only what it stored: a partition that never had a record has none); such a
    partition used to have no series at all."""
    metrics.update_from_stats(_stats({
        "0": {"partition": 0, "desired": True, "consumer_lag": -1, "committed_offset": -1001,
              "hi_offset": 0, "lo_offset": 0},  # assigned, empty, nothing committed
        "1": {"partition": 1, "desired": True, "consumer_lag": -1, "committed_offset": -1001,
              "hi_offset": 7, "lo_offset": 2},  # records, none stored yet
        "2": {"partition": 2, "desired": True, "consumer_lag": 3, "committed_offset": 10, "hi_offset": 13},
        "3": {"partition": 3, "desired": False, "consumer_lag": 4, "committed_offset": 9},  # revoked
        "4": {"partition": 4, "desired": True, "consumer_lag": -1, "hi_offset": -1},  # watermark not known yet
        "5": {"partition": 5, "desired": True, "consumer_lag": -1, "committed_offset": 4, "hi_offset": 6,
              "lo_offset": 0},
    }))
    s = samples(metrics.render())
    lag = {dict(k[1])["partition"]: v for k, v in s.items() if k[0] == P + "consumer_lag_records"}
    assert lag == {"0": 0, "1": 5, "2": 3, "5": 2}


def test_consumer_lag_covers_every_tenants_ingress_topic() -> None:
    """One consumer reads every tenant's ingress topic: each topic's partitions have series,
    labelled with the topic's tenant (partition numbers repeat across topics)."""
    m = Metrics(ingress_topic="payments.delay", tenants=["payments", "search"],
                ingress_topics={"payments.delay": "payments", "search.delay": "search"})
    doc = {"topics": {
        "payments.delay": {"partitions": {"0": {"consumer_lag": 4}, "1": {"consumer_lag": 0}}},
        "search.delay": {"partitions": {"0": {"consumer_lag": 9}, "-1": {"consumer_lag": 3}}},
        "other": {"partitions": {"0": {"consumer_lag": 999}}},  # not an ingress topic
    }}
    m.update_from_stats(json.dumps(doc))

    def lag() -> dict[tuple[str, str], float]:
        return {(dict(k[1])["tenant"], dict(k[1])["partition"]): v for k, v in samples(m.render()).items()
                if k[0] == P + "consumer_lag_records"}

    assert lag() == {("payments", "0"): 4, ("payments", "1"): 0, ("search", "0"): 9}
    # search's partitions revoked (its topic gone from the document): its series disappear only
    del doc["topics"]["search.delay"]
    doc["topics"]["payments.delay"]["partitions"]["0"] = {"consumer_lag": 1}
    m.update_from_stats(json.dumps(doc))
    assert lag() == {("payments", "0"): 1, ("payments", "1"): 0}


def test_store_bytes_allocated_and_preallocated(metrics: Metrics) -> None:
    metrics.set_store_bytes(272 * 1024, 651_000_000)
    text = metrics.render()
    assert value(text, P + "store_bytes") == 272 * 1024
    assert value(text, P + "store_preallocated_bytes") == 651_000_000
    metrics.set_store_bytes(4096)  # preallocated unknown: left as it was
    assert value(metrics.render(), P + "store_preallocated_bytes") == 651_000_000


def test_ingress_paused_and_reason(metrics: Metrics) -> None:
    metrics.set_ingress_paused(True, "disk-full")
    text = metrics.render()
    assert value(text, P + "ingress_paused") == 1
    assert value(text, P + "ingress_paused_reason", reason="disk-full") == 1
    metrics.set_ingress_paused(True, "max-in-flight")
    text = metrics.render()
    assert value(text, P + "ingress_paused_reason", reason="disk-full") == 0
    assert value(text, P + "ingress_paused_reason", reason="max-in-flight") == 1
    metrics.set_ingress_paused(False)
    text = metrics.render()
    assert value(text, P + "ingress_paused") == 0
    assert value(text, P + "ingress_paused_reason", reason="max-in-flight") == 0


def test_registries_are_independent() -> None:
    a, b = Metrics(), Metrics()
    a.delivered(3)
    assert value(a.render(), P + "delivered_records_total", tenant=T) == 3
    assert value(b.render(), P + "delivered_records_total", tenant=T) == 0


# -- HTTP ------------------------------------------------------------------------------------

def test_metrics_endpoint(server: HealthServer, metrics: Metrics) -> None:
    assert server.port > 0
    metrics.ingested(11)
    metrics.dead_lettered("missing-target")
    metrics.observe_lateness_ms([4, 8])
    status, headers, body = get(server.port, "/metrics")
    assert status == 200
    assert headers["content-type"] == CONTENT_TYPE_LATEST
    assert value(body, P + "ingested_records_total") == 11
    assert value(body, P + "dlq_records_total", reason="missing-target", tenant=T) == 1
    assert value(body, P + "delivery_lateness_seconds_count", tenant=T) == 2
    status, _, body = get(server.port, "/metrics", method="HEAD")
    assert status == 200 and body == b""


def test_readiness_flips(server: HealthServer, metrics: Metrics) -> None:
    status, headers, body = get(server.port, "/readyz")
    assert status == 503 and headers["content-type"] == "application/json"
    doc = orjson.loads(body)
    assert doc["ready"] is False
    assert doc["not_ready"] == ["recovered", "assigned", "broker_reachable"]
    server.set_recovered(True)
    server.set_assigned(True)
    status, _, body = get(server.port, "/readyz")
    assert status == 503 and orjson.loads(body)["not_ready"] == ["broker_reachable"]
    assert value(metrics.render(), P + "ready") == 0
    server.set_broker_reachable(True)
    status, _, body = get(server.port, "/readyz")
    assert status == 200
    assert orjson.loads(body) == {"ready": True, "recovered": True, "assigned": True,
                                  "broker_reachable": True, "disk_ok": True, "kafka_ok": True, "not_ready": []}
    assert value(metrics.render(), P + "ready") == 1
    server.set_assigned(False)  # e.g. a rebalance took every partition away
    assert get(server.port, "/readyz")[0] == 503
    assert value(metrics.render(), P + "ready") == 0


def test_a_disk_stall_makes_the_sidecar_unready_and_says_what_to_do(server: HealthServer, metrics: Metrics) -> None:
    for flag in (server.set_recovered, server.set_assigned, server.set_broker_reachable):
        flag(True)
    assert get(server.port, "/readyz")[0] == 200
    server.set_disk_stalled("disk-max-bytes-stalled", "the store holds 9 bytes, limit 8", "raise disk-max-bytes")
    status, _, body = get(server.port, "/readyz")
    doc = orjson.loads(body)
    assert status == 503 and doc["not_ready"] == ["disk_ok"] and doc["disk_ok"] is False
    assert doc["disk"] == {"code": "disk-max-bytes-stalled", "reason": "the store holds 9 bytes, limit 8",
                           "fix": "raise disk-max-bytes"}
    assert value(metrics.render(), P + "ready") == 0
    server.set_disk_stalled()  # deliveries or a new budget let ingress go on again
    status, _, body = get(server.port, "/readyz")
    assert status == 200 and "disk" not in orjson.loads(body)
    assert value(metrics.render(), P + "ready") == 1


def test_a_kafka_cause_makes_the_sidecar_unready_while_it_holds(server: HealthServer, clock: FakeClock) -> None:
    for flag in (server.set_recovered, server.set_assigned, server.set_broker_reachable):
        flag(True)
    cause = {"code": "not-authorized", "setting": "allow Read on topic t",
             "detail": "Broker: Topic authorization failed"}
    server.set_kafka(cause)
    status, _, body = get(server.port, "/readyz")
    doc = orjson.loads(body)
    assert status == 503 and doc["not_ready"] == ["kafka_ok"] and doc["kafka"] == cause
    clock.t += server.kafka_hold_s - 1
    assert get(server.port, "/readyz")[0] == 503  # still reported within the hold
    clock.t += 1
    assert get(server.port, "/readyz")[0] == 200  # no report for a whole hold: lapsed
    server.set_kafka(cause, hold=False)  # at start: until cleared
    clock.t += 1000
    assert get(server.port, "/readyz")[0] == 503
    server.set_kafka(None)
    status, _, body = get(server.port, "/readyz")
    assert status == 200 and "kafka" not in orjson.loads(body)


def test_liveness_follows_the_heartbeat(server: HealthServer, clock: FakeClock) -> None:
    status, _, body = get(server.port, "/healthz")
    assert status == 200 and orjson.loads(body)["status"] == "ok"  # start() counts as a beat
    clock.t += 29.5
    assert get(server.port, "/healthz")[0] == 200
    clock.t += 1
    status, _, body = get(server.port, "/healthz")
    doc = orjson.loads(body)
    assert status == 503
    assert doc["status"] == "stale" and doc["heartbeat_age_s"] == pytest.approx(30.5)
    assert doc["stale_after_s"] == 30
    server.beat(clock.t)
    status, _, body = get(server.port, "/healthz")
    assert status == 200 and orjson.loads(body)["heartbeat_age_s"] == 0


def test_unknown_path_and_query_strings(server: HealthServer) -> None:
    assert get(server.port, "/nope")[0] == 404
    assert get(server.port, "/healthz/")[0] == 200
    assert get(server.port, "/metrics?name[]=x")[0] == 200


def test_quiet_and_restartable(metrics: Metrics, clock: FakeClock, capfd: pytest.CaptureFixture[str]) -> None:
    with HealthServer("127.0.0.1", 0, metrics, clock=clock) as hs:
        port = hs.port
        for path in ("/metrics", "/healthz", "/readyz", "/nope"):
            get(port, path)
    assert hs.port == 0  # stopped: back to the requested port
    hs.stop()  # idempotent
    err = capfd.readouterr().err
    assert "GET /" not in err and "HTTP/1" not in err
    with pytest.raises(OSError):
        get(port, "/healthz")


def test_each_tenant_has_its_series_from_the_start() -> None:
    m = Metrics(tiers=[level_tier(1)], tenants=["payments", "search"])
    m.tenant("payments").delivered(3)
    m.tenant("search").dead_lettered("too-large", 2)
    m.tenant("search").observe_lateness_ms([5, -1])
    text = m.render()
    for t in ("payments", "search"):
        assert value(text, P + "pending_records", tier="level-1", tenant=t) == 0
        for reason in REASONS:
            assert value(text, P + "dlq_records_total", reason=reason, tenant=t) == (
                2 if (t, reason) == ("search", "too-large") else 0)
    assert value(text, P + "delivered_records_total", tenant="payments") == 3
    assert value(text, P + "delivered_records_total", tenant="search") == 0
    assert value(text, P + "delivery_lateness_seconds_count", tenant="search") == 2
    assert value(text, P + "delivery_lateness_seconds_count", tenant="payments") == 0
    assert value(text, P + "early_deliveries_total") == 1
    assert m.tenant("search") is m.tenant("search")  # the children resolved once
    assert (P + "delivered_records_total", (("tenant", T),)) not in samples(text)  # no implicit tenant
