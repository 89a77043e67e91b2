"""Exactly-once delivery (``--delivery exactly-once``) on a real broker.

A ``read_committed`` consumer of the target (and DLQ) topics must see every record once, none
early, through SIGKILLs under load and a zombie that comes back after its group moved on. A
``read_uncommitted`` consumer of the same topics sees the aborted transactions' records too: the
tests count them to show that the kills really caught deliveries in open transactions (what the
at-least-once mode delivers twice).
"""

from __future__ import annotations

import random
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from tests.integration.harness import Received, SidecarProcess, _received, consume_until, create_topics, producer

pytestmark = pytest.mark.integration

# a transaction timeout as short as the session (harness.SESSION_MS): the zombie test waits for both
EOS = ["--delivery", "exactly-once", "--transaction-interval", "100ms", "--transaction-timeout", "6s"]
RECORDS = 3000
RATE_PER_S = 300


def read_uncommitted(bootstrap: str, topics: list[str], timeout_s: float = 10) -> list[Received]:
    """Everything written to ``topics``, aborted transactions included, until quiet."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ru-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "isolation.level": "read_uncommitted"})
    c.subscribe(topics)
    out: list[Received] = []
    quiet_since = time.monotonic()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and time.monotonic() - quiet_since < 3:
            msgs = c.consume(num_messages=1000, timeout=0.2)
            got = [m for m in msgs if m.error() is None]
            if got:
                quiet_since = time.monotonic()
            out.extend(_received(m) for m in got)
    finally:
        c.close()
    return out


def check_once(got: list[Received], sent: set[bytes]) -> None:
    copies = Counter(r.headers["delay.id"] for r in got)
    missing = sent - set(copies)
    assert not missing, f"{len(missing)} records lost, e.g. {sorted(missing)[:5]}"
    assert set(copies) == sent, "nothing delivered that was not sent"
    dup = {k: n for k, n in copies.items() if n > 1}
    assert not dup, f"{len(dup)} records delivered more than once to a read_committed reader: {list(dup.items())[:5]}"
    early = [r for r in got if r.lateness_ms < 0]
    assert not early, f"{len(early)} early deliveries, e.g. {early[:3]}"


@pytest.fixture(params=["levels", "wheel"])
def scheduler(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=[5, pytest.param(8, marks=pytest.mark.soak)], ids=["5-kills", "8-kills"])
def kills(request: pytest.FixtureRequest) -> int:
    """SIGKILLs: 5 by default (the first ones within the 10 s of load, the last ones while its records
    are still due), 8 under ``pytest -m soak``."""
    return int(request.param)


@pytest.fixture
def procs() -> Iterator[list[SidecarProcess]]:
    made: list[SidecarProcess] = []
    yield made
    for sc in made:
        if sc.proc is not None and sc.proc.poll() is None:
            sc.proc.send_signal(signal.SIGCONT)  # a test that failed while it was stopped
        sc.stop_quietly()


def test_sigkill_under_load_delivers_each_record_once(
    kafka_bootstrap: str, tmp_path: Path, unique: str, scheduler: str, kills: int, procs: list[SidecarProcess],
) -> None:
    ingress, target = f"ingress-eos-{unique}", f"eos-target-{unique}"
    sc = SidecarProcess(kafka_bootstrap, tmp_path / "data", ingress, f"dlq-eos-{unique}",
                        extra=["--scheduler", scheduler, "--ingress-partitions", "3", *EOS])
    procs.append(sc)
    create_topics(kafka_bootstrap, [ingress, target], partitions=3)
    sc.start()
    rng = random.Random(int(unique, 16))
    sent: set[bytes] = set()
    errors: list[str] = []
    done = threading.Event()

    def produce_all() -> None:
        p = producer(kafka_bootstrap)
        t0 = time.monotonic()
        for i in range(RECORDS):
            rid = f"eos-{unique}-{i}".encode()
            p.produce(ingress, key=b"k%d" % i, value=b"v" * 100, headers=[
                ("delay.target-topic", target.encode()), ("delay.ms", str(rng.randint(0, 3000)).encode()),
                ("delay.id", rid)], on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
            sent.add(rid)
            p.poll(0)
            ahead = i / RATE_PER_S - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        p.flush(60)
        done.set()

    t = threading.Thread(target=produce_all, daemon=True)
    t.start()
    for _ in range(kills):
        time.sleep(rng.uniform(0.8, 2.0))
        sc.kill()
        sc.start()
    t.join(120)
    assert done.is_set() and not errors, errors[:3]
    got = consume_until(kafka_bootstrap, [target], want=RECORDS, timeout_s=120, settle_s=3)
    assert sc.proc is not None and sc.proc.poll() is None, sc.log_text()[-3000:]
    check_once(got, sent)
    written = read_uncommitted(kafka_bootstrap, [target])
    aborted = len(written) - len(got)
    print(f"\nexactly-once crash test ({scheduler}): {RECORDS} records, {kills} SIGKILLs, read_committed: "
          f"{len(got)} deliveries, 0 duplicates; read_uncommitted: {len(written)} ({aborted} in aborted transactions)")
    assert aborted > 0, "no kill caught a delivery in an open transaction: the test did not test anything"
    assert sc.terminate() == 0


def test_a_zombie_is_fenced_and_dead_letters_are_once(
    kafka_bootstrap: str, tmp_path: Path, unique: str, procs: list[SidecarProcess],
) -> None:
    """a owns the partitions and has deliveries in an open transaction when it is stopped
    (SIGSTOP) past its session and its transaction timeout; b takes the partitions over. When a
    runs again its transaction is gone (fenced): nothing it delivered is seen, b's deliveries are,
    once each. Records for a missing target reach the DLQ once each, through all of it."""
    ingress, target, dlq = f"ingress-zombie-{unique}", f"zombie-target-{unique}", f"dlq-zombie-{unique}"
    create_topics(kafka_bootstrap, [ingress, target], partitions=3)
    grace = ["--delivery-grace", "2s"]
    a = SidecarProcess(kafka_bootstrap, tmp_path / "a", ingress, dlq, extra=["--ingress-partitions", "3", *EOS, *grace])
    b = SidecarProcess(kafka_bootstrap, tmp_path / "b", ingress, dlq, extra=["--ingress-partitions", "3", *EOS, *grace],
                       instance="1")
    procs.extend([a, b])
    a.start()
    p = producer(kafka_bootstrap)
    sent: set[bytes] = set()
    dead: set[bytes] = set()
    for i in range(600):
        rid = f"z-{unique}-{i}".encode()
        to_dlq = i % 20 == 0
        p.produce(ingress, key=b"k%d" % i, value=b"v", headers=[
            ("delay.target-topic", b"no-such-topic" if to_dlq else target.encode()),
            ("delay.ms", str(1000 + 5 * i).encode()), ("delay.id", rid)])
        (dead if to_dlq else sent).add(rid)
    p.flush(30)
    a.wait_for("partition.restored", 30)
    time.sleep(2.0)  # a is delivering: due times run from 1 s to 4 s
    assert a.proc is not None
    a.proc.send_signal(signal.SIGSTOP)
    b.start()
    b.wait_for("partition.restored", 60)
    time.sleep(8)  # past a's session (6 s) and its transaction timeout (6 s)
    a.proc.send_signal(signal.SIGCONT)
    got = consume_until(kafka_bootstrap, [target], want=len(sent), timeout_s=90, settle_s=3)
    check_once(got, sent)
    dl = consume_until(kafka_bootstrap, [dlq], want=len(dead), timeout_s=60, settle_s=2)
    copies = Counter(r.headers["delay.id"] for r in dl)
    assert set(copies) == dead and max(copies.values()) == 1, copies.most_common(3)
    a.wait_for("transaction.aborted", 30)  # a learnt that its transaction did not commit
    written = read_uncommitted(kafka_bootstrap, [target])
    print(f"\nzombie test: read_committed {len(got)} deliveries, 0 duplicates; read_uncommitted {len(written)}; "
          f"dead letters {len(dl)} for {len(dead)} records")
    for sc in (a, b):
        assert sc.proc is not None and sc.proc.poll() is None, sc.log_text()[-3000:]
