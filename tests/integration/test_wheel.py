"""The timer wheel on the real broker (issue 4): arbitrary delays to the millisecond, never early,
a one-year delay that survives a restart in a time bucket, and a mass expiry with flat memory."""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.integration.harness import SidecarProcess, consume_until, create_topics, producer

pytestmark = pytest.mark.integration

YEAR_MS = 365 * 86_400_000


@pytest.fixture
def wheel(kafka_bootstrap: str, tmp_path: Path, unique: str) -> Iterator[SidecarProcess]:
    sc = SidecarProcess(kafka_bootstrap, tmp_path / "data", f"ingress-{unique}", f"dlq-{unique}",
                        extra=["--scheduler", "wheel", "--ingress-partitions", "2"])
    yield sc
    sc.stop_quietly()


# 20k records over 15k ms: three ms in four are a due time, ~13 records per 10 ms slot;
# the ring's paths are those of longer delays (its window is 1 h, so no bucket is involved either way)
MAX_DELAY_MS = 15_000


def test_20000_random_delays_up_to_15s_all_arrive_never_early(
    wheel: SidecarProcess, kafka_bootstrap: str, unique: str
) -> None:
    target = f"t-{unique}"
    create_topics(kafka_bootstrap, [target], partitions=2)
    wheel.start()
    n = 20_000
    rng = random.Random(11)
    asked: dict[str, int] = {}
    p = producer(kafka_bootstrap)
    for i in range(n):
        asked[f"w{i}"] = rng.randint(0, MAX_DELAY_MS)
        headers = [("delay.target-topic", target.encode()), ("delay.ms", str(asked[f"w{i}"]).encode()),
                   ("delay.id", f"w{i}".encode())]
        p.produce(wheel.ingress, key=str(i).encode(), value=b"x" * 100, headers=headers)
        if i % 2000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    got = consume_until(kafka_bootstrap, [target], want=n, timeout_s=MAX_DELAY_MS / 1000 + 90, settle_s=2)
    ids = Counter(r.headers["delay.id"] for r in got)
    assert len(ids) == n, f"{n - len(ids)} records missing"
    assert max(ids.values()) == 1
    lateness = [r.lateness_ms for r in got]
    for r in got:  # the wheel commits to the requested time, to the millisecond
        committed = int(r.headers["delay.deliver-at"] or b"0") - int(r.headers["delay.enqueued-at"] or b"0")
        assert committed == asked[(r.headers["delay.id"] or b"").decode()], r.headers
    q = statistics.quantiles(lateness, n=1000)
    print(f"\nwheel lateness ms over {n}: min={min(lateness)} p50={q[499]:.0f} p90={q[899]:.0f} "
          f"p99={q[989]:.0f} p99.9={q[998]:.0f} max={max(lateness)}")
    assert min(lateness) >= 0, "never early"


def test_one_year_delay_survives_restart_in_a_bucket(
    wheel: SidecarProcess, kafka_bootstrap: str, unique: str
) -> None:
    target = f"t-{unique}"
    create_topics(kafka_bootstrap, [target])
    wheel.start()
    p = producer(kafka_bootstrap)
    p.produce(wheel.ingress, key=b"y", value=b"next-year",
              headers=[("delay.target-topic", target.encode()), ("delay.ms", str(YEAR_MS).encode()),
                       ("delay.id", b"yearly")])
    p.produce(wheel.ingress, key=b"n", value=b"now", headers=[("delay.target-topic", target.encode())])
    assert p.flush(30) == 0
    assert [r.value for r in consume_until(kafka_bootstrap, [target], want=1, timeout_s=30)] == [b"now"]
    assert wheel.terminate() == 0

    def inspect() -> dict:  # type: ignore[type-arg]
        out = subprocess.run([sys.executable, "-m", "sidecar", "inspect", str(wheel.data_dir), "--json"],
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out)  # type: ignore[no-any-return]

    report = inspect()
    assert report["pending_total"] == 1
    assert sum(p["pending"].get("bucket", 0) for p in report["partitions"]) == 1
    assert sum(len(p["buckets"]) for p in report["partitions"]) == 1
    wheel.start()
    time.sleep(3)
    assert wheel.terminate() == 0
    assert inspect()["pending_total"] == 1, "still pending after a restart"
    extra = consume_until(kafka_bootstrap, [target], want=2, timeout_s=3)
    assert [r.value for r in extra] == [b"now"], "and not delivered early"


# (records, ms from the first send to their one tick): the whole batch must be stored before the
# tick (else the last records take the late path and the test measures something else; checked
# below), and the test waits for it. Sending and storing 200k took 24.8 s on 2 cores at a load
# average of 20 (five test sessions): 50k by default, 10 s ahead; 200k, 30 s ahead, under
# ``pytest -m soak``.
MASS = [(50_000, 10_000), pytest.param((200_000, 30_000), marks=pytest.mark.soak)]


def _ingested_by(sc: SidecarProcess, n: int, due_ms: int) -> int:
    """Wait until the sidecar's stats count ``n`` records ingested; fail if that is not before
    ``due_ms``. Returns the wall ms it was seen."""
    while True:
        stats = [json.loads(line) for line in sc.log_text().splitlines() if '"event":"stats"' in line]
        now = int(time.time() * 1000)
        if stats and int(stats[-1].get("ingested", 0)) >= n:
            return now
        assert now < due_ms, f"{stats[-1] if stats else 'no stats'}: not all {n} stored before their tick"
        time.sleep(0.2)


@pytest.mark.parametrize("mass", MASS, ids=["50k", "200k"])
def test_mass_due_in_the_same_tick_with_bounded_rss(
    kafka_bootstrap: str, tmp_path: Path, unique: str, mass: tuple[int, int]
) -> None:
    target = f"t-{unique}"
    create_topics(kafka_bootstrap, [target])
    sc = SidecarProcess(kafka_bootstrap, tmp_path / "data", f"ingress-{unique}", f"dlq-{unique}",
                        extra=["--scheduler", "wheel", "--ingress-partitions", "1"])
    sc.start()
    assert sc.proc is not None
    proc = psutil.Process(sc.proc.pid)
    base_rss = proc.memory_info().rss
    n, tick_in_ms = mass
    p = producer(kafka_bootstrap, **{"queue.buffering.max.messages": 500_000})
    due = int(time.time() * 1000) + tick_in_ms
    for i in range(n):
        p.produce(sc.ingress, value=b"m", headers=[("delay.target-topic", target.encode()),
                                                  ("delay.deliver-at", str(due).encode())])
        if i % 10_000 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    stored_ms = _ingested_by(sc, n, due)
    print(f"\nmass expiry: {n} records stored {(due - stored_ms) / 1000:.1f} s before their tick")
    peak = [base_rss]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], proc.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        got = consume_until(kafka_bootstrap, [target], want=n, timeout_s=240)
    finally:
        stop.set()
        sampler.join(5)
        sc.stop_quietly()  # never leave a sidecar running after its test
    assert len(got) == n
    assert min(r.timestamp_ms - due for r in got) >= 0, "never early"
    drain_s = (max(r.timestamp_ms for r in got) - due) / 1000
    growth_mb = (peak[0] - base_rss) / 2**20
    print(f"\nmass expiry: {n} records due at one ms drained in {drain_s:.1f}s "
          f"({n / max(drain_s, 0.001):.0f}/s); RSS {base_rss / 2**20:.0f} MB -> peak {peak[0] / 2**20:.0f} MB")
    # Stated bound: the mmapped store pages for 200k small records (~40 MB of log, timer log and
    # slots, counted in RSS while resident; a quarter of it for 50k) plus bounded in-flight batches
    # stay under 250 MB of growth.
    assert growth_mb < 250
