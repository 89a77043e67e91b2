"""Guarantees under failure (issue 5), each with full accounting on the real broker:
sent = delivered + dead-lettered + cancelled, zero early, duplicates counted.

(SIGKILL at random points lives in test_crash.py.)
"""

from __future__ import annotations

import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devkafka.local import LocalKafka
from sidecar import client
from sidecar.config import DEFAULT_LEVELS
from sidecar.durations import parse_duration_list
from sidecar.levels.table import plan as level_plan
from tests.integration.harness import SidecarProcess, consume_until, create_topics, free_port, producer

pytestmark = pytest.mark.integration


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return -1


def _wait_status(port: int, path: str, want: int, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if _status(port, path) == want:
            return time.monotonic() - t0
        time.sleep(0.25)
    raise AssertionError(f"{path} did not answer {want} within {timeout_s}s (last {_status(port, path)})")


@pytest.fixture
def http_port() -> int:
    return free_port()


@pytest.fixture
def make_sidecar(kafka_bootstrap: str, tmp_path: Path, unique: str) -> Iterator[object]:
    made: list[SidecarProcess] = []

    def make(*extra: str, bootstrap: str | None = None) -> SidecarProcess:
        sc = SidecarProcess(bootstrap or kafka_bootstrap, tmp_path / f"data{len(made)}", f"ingress-{unique}",
                            f"dlq-{unique}", extra=["--scheduler", "levels", "--ingress-partitions", "2", *extra])
        made.append(sc)
        return sc

    yield make
    for sc in made:
        sc.stop_quietly()


def _send(bootstrap: str, ingress: str, target: str, ids: range, max_delay_ms: int, pause_every: int = 0) -> None:
    p = producer(bootstrap)
    rng = random.Random(7)
    for i in ids:
        headers = [("delay.target-topic", target.encode()), ("delay.ms", str(rng.randint(0, max_delay_ms)).encode()),
                   ("delay.id", f"r{i}".encode())]
        p.produce(ingress, key=str(i).encode(), value=b"v", headers=headers)
        if pause_every and i % pause_every == 0:
            p.poll(0)
            time.sleep(0.05)
    assert p.flush(120) == 0


# The outage's length: 12 s by default (well past /readyz going 503, and the records sent during it
# wait in the producer's buffer: both are inside every client timeout, 120 s for a delivery, as at
# 30 s); the 30 s the issue names under ``pytest -m soak``.
# (and the 12 s outage with each producer: the native one's error_cb and failed reports must tell
# the loop the broker is down and back as confluent-kafka's do)
@pytest.mark.kafka_outage
@pytest.mark.parametrize(("outage_s", "producer_kind"),
                         [(12, "auto"), (12, "confluent"), pytest.param(30, "auto", marks=pytest.mark.soak)],
                         ids=["12s", "12s-confluent", "30s"])
def test_broker_outage_under_load(
    make_sidecar: object, local_kafka: LocalKafka | None, kafka_bootstrap: str, unique: str, http_port: int,
    outage_s: int, producer_kind: str,
) -> None:
    if local_kafka is None:
        pytest.skip("needs the session's own broker to stop and start it")
    target = f"t-{unique}"
    create_topics(kafka_bootstrap, [target])
    sc = make_sidecar("--http-port", str(http_port), "--producer", producer_kind)  # type: ignore[operator]
    sc.start()
    _wait_status(http_port, "/readyz", 200, 30)
    n1, n2 = 800, 400
    _send(kafka_bootstrap, sc.ingress, target, range(n1), 3000, pause_every=50)
    local_kafka.stop()
    outage_start = time.monotonic()
    took = _wait_status(http_port, "/readyz", 503, 30)
    print(f"\n/readyz went 503 {took:.1f}s into the outage")
    assert _status(http_port, "/healthz") == 200, "the loop stays alive during the outage"
    sender = threading.Thread(target=_send, args=(kafka_bootstrap, sc.ingress, target, range(n1, n1 + n2), 1000))
    sender.start()  # the producer buffers while the broker is down
    time.sleep(max(0.0, outage_s - (time.monotonic() - outage_start)))
    assert sc.proc is not None and sc.proc.poll() is None, f"the sidecar survives a {outage_s} s outage"
    local_kafka.start()
    took = _wait_status(http_port, "/readyz", 200, 90)
    print(f"/readyz back to 200 {took:.1f}s after the broker restarted")
    sender.join(120)
    got = consume_until(kafka_bootstrap, [target], want=n1 + n2, timeout_s=120, settle_s=3)
    ids = Counter(r.headers["delay.id"] for r in got)
    dups = sum(v - 1 for v in ids.values())
    print(f"outage: sent={n1 + n2} delivered={len(ids)} duplicates={dups}")
    assert len(ids) == n1 + n2, "nothing lost"
    assert min(r.lateness_ms for r in got) >= 0, "never early"
    assert '"event":"broker.unreachable"' in sc.log_text()


def test_target_that_appears_late_is_delivered(make_sidecar: object, kafka_bootstrap: str, unique: str) -> None:
    sc = make_sidecar("--delivery-grace", "40s")  # type: ignore[operator]
    sc.start()
    late = f"late-{unique}"
    p = producer(kafka_bootstrap)
    p.produce(sc.ingress, key=b"k", value=b"waits-for-topic", headers=[("delay.target-topic", late.encode())])
    assert p.flush(30) == 0
    # the topic is created once the record is due and handed to the producer, which waits for the
    # topic to appear (its stats show it in flight; not after a fixed wait)
    deadline = time.monotonic() + 30
    while '"in_flight":1,' not in sc.log_text():
        assert time.monotonic() < deadline, "the record was never handed to the producer"
        time.sleep(0.1)
    create_topics(kafka_bootstrap, [late])
    got = consume_until(kafka_bootstrap, [late], want=1, timeout_s=60)
    assert [r.value for r in got] == [b"waits-for-topic"]
    assert consume_until(kafka_bootstrap, [sc.dlq], want=1, timeout_s=3) == []


def test_consumer_that_always_fails_climbs_the_ladder_then_dead_letters(
    make_sidecar: object, kafka_bootstrap: str, unique: str
) -> None:
    target = f"t-{unique}"
    create_topics(kafka_bootstrap, [target])
    ladder = [300, 700, 1500]
    sc = make_sidecar("--retry-ladder", " ".join(f"{x}ms" for x in ladder), "--max-retries", "3")  # type: ignore[operator]
    sc.start()
    p = producer(kafka_bootstrap)
    client.send_delayed(p, target, b"job", key=b"job-1", id="job-1", ingress_topic=sc.ingress,
                        headers=[("trace", b"t1")])
    p.flush(30)
    from confluent_kafka import Consumer

    cons = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"worker-{unique}",
                     "auto.offset.reset": "earliest"})
    cons.subscribe([target])
    seen: list[tuple[int, int, int]] = []  # (retry count, deliver-at - enqueued-at, lateness)
    deadline = time.monotonic() + 60
    while len(seen) < 4 and time.monotonic() < deadline:
        m = cons.poll(0.2)
        if m is None or m.error():
            continue
        h = dict(m.headers() or [])
        assert h["trace"] == b"t1" and m.key() == b"job-1" and m.value() == b"job"
        count = int(h.get("delay.retry-count", b"0"))
        due, enq = int(h["delay.deliver-at"]), int(h["delay.enqueued-at"])
        seen.append((count, due - enq, m.timestamp()[1] - due))
        client.retry_later(p, m, ingress_topic=sc.ingress)  # processing "failed" again
        p.flush(10)
    cons.close()
    assert [s[0] for s in seen] == [0, 1, 2, 3]
    # the retried record's delay is the ladder step (from the retry record's own timestamp), which
    # the levels scheduler rounds up to the next level: 300 ms and 700 ms -> 1 s, 1.5 s -> 5 s
    levels = tuple(parse_duration_list(DEFAULT_LEVELS))
    assert [s[1] for s in seen[1:]] == [level_plan(levels, "retry", 0, step, 0)[1] for step in ladder]  # type: ignore[index]
    assert all(s[2] >= 0 for s in seen)
    dlq = consume_until(kafka_bootstrap, [sc.dlq], want=1, timeout_s=30)
    assert len(dlq) == 1
    assert dlq[0].headers["delay.dlq.reason"] == b"retries-exhausted"
    assert dlq[0].headers["delay.retry-count"] == b"4"


def test_sigterm_under_load_loses_and_duplicates_nothing(
    make_sidecar: object, kafka_bootstrap: str, unique: str, http_port: int
) -> None:
    target = f"t-{unique}"
    create_topics(kafka_bootstrap, [target])
    sc = make_sidecar("--http-port", str(http_port), "--commit-interval", "100ms")  # type: ignore[operator]
    sc.start()
    n = 3000
    sender = threading.Thread(target=_send, args=(kafka_bootstrap, sc.ingress, target, range(n), 1500, 100))
    sender.start()
    time.sleep(1.5)
    assert sc.terminate() == 0
    sc.start()
    sender.join(120)
    got = consume_until(kafka_bootstrap, [target], want=n, timeout_s=90, settle_s=3)
    ids = Counter(r.headers["delay.id"] for r in got)
    assert len(ids) == n
    assert max(ids.values()) == 1, "a graceful stop duplicates nothing"
    assert min(r.lateness_ms for r in got) >= 0
    # the metrics of the second run are plausible
    time.sleep(1.5)
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    names = {k[0] for k in samples}
    for series in ("delay_sidecar_ingested_records_total", "delay_sidecar_delivered_records_total",
                   "delay_sidecar_dlq_records_total", "delay_sidecar_delivery_lateness_seconds_bucket",
                   "delay_sidecar_pending_records", "delay_sidecar_store_bytes",
                   "delay_sidecar_early_deliveries_total"):
        assert series in names, series
    delivered = samples[("delay_sidecar_delivered_records_total", (("tenant", "default"),))]
    assert 0 < delivered <= n
    assert samples[("delay_sidecar_early_deliveries_total", ())] == 0
    assert samples[("delay_sidecar_dlq_records_total", (("reason", "bad-header"), ("tenant", "default")))] == 0
    assert samples[("delay_sidecar_store_bytes", ())] > 0
