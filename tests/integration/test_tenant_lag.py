"""Consumer lag of every tenant's ingress topic on /metrics, on the real broker.

One sidecar serves two tenants (one consumer reads both ingress topics); after assignment
``consumer_lag_records`` has a series for every partition of both topics, labelled with the
topic's tenant, and all of them are 0 once the records sent to one tenant are stored.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.harness import TenantSidecar, create_topics, free_port, producer, scrape

pytestmark = pytest.mark.integration

P = "delay_sidecar_"
PARTITIONS = 2


def lag_series(port: int) -> dict[tuple[str, str], float]:
    return {(dict(k[1])["tenant"], dict(k[1])["partition"]): v for k, v in scrape(port).items()
            if k[0] == P + "consumer_lag_records"}


def test_consumer_lag_covers_both_tenants(kafka_bootstrap: str, tmp_path: Path, unique: str) -> None:
    a_in, b_in, target = f"lag-a-{unique}", f"lag-b-{unique}", f"lag-out-{unique}"
    create_topics(kafka_bootstrap, [a_in, b_in, target], PARTITIONS)
    cfg = tmp_path / "tenants.yaml"
    cfg.write_text(
        f"ingress-partitions: {PARTITIONS}\n"
        "tenants:\n"
        f"  a:\n    ingress-topic: {a_in}\n    dlq-topic: {a_in}.dlq\n"
        f"  b:\n    ingress-topic: {b_in}\n    dlq-topic: {b_in}.dlq\n"
    )
    port = free_port()
    sc = TenantSidecar(kafka_bootstrap, tmp_path / "data", a_in, f"{a_in}.dlq",
                       extra=["--http-port", str(port), "--http-host", "127.0.0.1"])
    sc.config = cfg
    want = {(t, str(p)) for t in ("a", "b") for p in range(PARTITIONS)}
    try:
        sc.start()
        p = producer(kafka_bootstrap)
        for i in range(20):  # tenant b's records, due in a minute: stored (and committed) at once
            p.produce(b_in, key=f"b-{i}".encode(), value=b"v", headers=[
                ("delay.target-topic", target.encode()), ("delay.ms", "60000"), ("delay.id", f"b-{i}".encode())])
        assert p.flush(30) == 0
        deadline = time.monotonic() + 30
        seen: dict[tuple[str, str], float] = {}
        while time.monotonic() < deadline:
            seen = lag_series(port)
            if set(seen) == want and not any(seen.values()):
                break
            time.sleep(0.5)
    finally:
        sc.stop_quietly()
    assert set(seen) == want, f"lag series: {seen}"
    assert not any(seen.values()), f"lag once every record is stored: {seen}"
