"""``inspect`` against a live sidecar's ``/metrics``: the same pending counts after sends, cancels
and deliveries, every assigned partition listed, every assigned partition with a lag series.

The partitions are set up so that the old defects show: partition 1's last event is its
cancelled records falling due (the scheduler passes them; nothing is stored or delivered, so the
old loop wrote no checkpoint and inspect kept counting them), partition 2 never gets a record
(no checkpoint, no committed offset: inspect left it out and the lag gauge had no series for it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.inspect import inspect_data_dir
from tests.integration.harness import SidecarProcess, consume_until, create_topics, free_port, producer, scrape

pytestmark = pytest.mark.integration

P = "delay_sidecar_"


def live_pending(m: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, int]:
    return {dict(k[1])["tier"]: int(v) for k, v in m.items() if k[0] == P + "pending_records" and v}


def inspected_pending(data_dir: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in inspect_data_dir(data_dir)["partitions"]:
        for tier, n in p["pending"].items():
            out[tier] = out.get(tier, 0) + n
    return out


@pytest.fixture
def sidecar(kafka_bootstrap: str, tmp_path: Path, unique: str) -> Iterator[tuple[SidecarProcess, int]]:
    port = free_port()
    sc = SidecarProcess(
        kafka_bootstrap, tmp_path / "data", f"ingress-insp-{unique}", f"dlq-insp-{unique}",
        extra=["--ingress-partitions", "3", "--commit-interval", "100ms", "--http-port", str(port),
               "--http-host", "127.0.0.1"],
    )
    yield sc, port
    sc.stop_quietly()


def send(bootstrap: str, ingress: str, target: str, partition: int, ids: list[str], delay_ms: int) -> None:
    p = producer(bootstrap)
    for rid in ids:
        p.produce(ingress, key=rid.encode(), value=b"v" * 100, partition=partition, headers=[
            ("delay.target-topic", target.encode()), ("delay.ms", str(delay_ms).encode()), ("delay.id", rid.encode())])
    assert p.flush(30) == 0


def cancel(bootstrap: str, ingress: str, partition: int, ids: list[str]) -> None:
    p = producer(bootstrap)
    for rid in ids:
        p.produce(ingress, key=rid.encode(), value=None, partition=partition, headers=[("delay.cancel", rid.encode())])
    assert p.flush(30) == 0


def test_inspect_counts_equal_the_live_metrics(
    sidecar: tuple[SidecarProcess, int], kafka_bootstrap: str, unique: str
) -> None:
    sc, port = sidecar
    target = f"insp-target-{unique}"
    create_topics(kafka_bootstrap, [target])
    sc.start()
    # partition 0: 10 delivered soon, 10 pending, 4 of those cancelled (their entries count until due)
    send(kafka_bootstrap, sc.ingress, target, 0, [f"a{i}" for i in range(10)], 500)
    send(kafka_bootstrap, sc.ingress, target, 0, [f"b{i}" for i in range(10)], 600_000)
    cancel(kafka_bootstrap, sc.ingress, 0, [f"b{i}" for i in range(4)])
    # partition 1: 5 delivered soon, 6 due at 4 s all cancelled, 3 pending long: at 4 s the only
    # thing that happens on it is the scheduler passing the cancelled entries
    t0 = time.monotonic()
    send(kafka_bootstrap, sc.ingress, target, 1, [f"c{i}" for i in range(5)], 500)
    send(kafka_bootstrap, sc.ingress, target, 1, [f"d{i}" for i in range(6)], 4000)
    cancel(kafka_bootstrap, sc.ingress, 1, [f"d{i}" for i in range(6)])
    send(kafka_bootstrap, sc.ingress, target, 1, [f"e{i}" for i in range(3)], 600_000)
    got = consume_until(kafka_bootstrap, [target], want=10 + 5, timeout_s=60, settle_s=1)
    assert sorted(r.headers["delay.id"] for r in got) == sorted(  # type: ignore[type-var]
        [f"a{i}".encode() for i in range(10)] + [f"c{i}".encode() for i in range(5)])
    time.sleep(max(0.0, t0 + 4.5 - time.monotonic()))  # past the cancelled records' due time
    expected = {"wheel": 10 + 3}
    deadline = time.monotonic() + 15
    live: dict[str, int] = {}
    seen: dict[str, int] = {}
    while time.monotonic() < deadline:
        live, seen = live_pending(scrape(port)), inspected_pending(sc.data_dir)
        if live == seen == expected:
            break
        time.sleep(0.3)
    assert live == expected, f"/metrics says {live}"
    assert seen == live, f"inspect says {seen}, /metrics {live}"
    time.sleep(1.5)  # more commit intervals: it stays so
    assert inspected_pending(sc.data_dir) == live_pending(scrape(port)) == expected

    report = inspect_data_dir(sc.data_dir)
    names = [Path(p["directory"]).name for p in report["partitions"]]
    assert names == [f"{sc.ingress}-{n}" for n in range(3)], "partition 2 (no record ever) is listed too"
    assert [p["pending_total"] for p in report["partitions"]] == [10, 3, 0]

    lag = {dict(k[1])["partition"]: v for k, v in scrape(port).items() if k[0] == P + "consumer_lag_records"}
    assert sorted(lag) == ["0", "1", "2"], f"lag series: {lag}"
    assert lag["2"] == 0
    m = scrape(port)
    assert 0 < m[(P + "store_bytes", ())] < m[(P + "store_preallocated_bytes", ())]
    assert sc.terminate() == 0
