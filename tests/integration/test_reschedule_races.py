"""Reschedule and cancel racing the due time, on the real broker (issue #24's goal: a replace or
cancel stored before the record's due time always wins; 0 stale deliveries).

10,000 records are scheduled a few seconds ahead, with due times spread over ~8 s; shortly before
each one's due time (20-400 ms) a replace (``delay.replace: true``, a later due time, a new
payload; three in four) or a cancel (one in four) follows it, with the same key, so it lands in
the same ingress partition after the record. A plain confluent-kafka client, none of the
sidecar's code.

What proves that a replace or cancel was *stored* before the due time: the sidecar ingests a
partition in order and synchronously, and stamps a delivered record when it produces it. So the
sender also writes, every few milliseconds, a due-now *marker* into each ingress partition: the
first marker after a replace in its partition was ingested after the replace was stored, and its
delivered timestamp is an upper bound of that moment. A race is *decided* when that bound is
before the old version's due time; then the old version must never arrive (a stale delivery).
A replace stored too late (the sidecar lagging) may legitimately let the old version fire; those
are counted and reported, not failed, but at least half the races must be decided for the test to
mean much (measured: 85-92 %).
"""

from __future__ import annotations

import bisect
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import SidecarProcess, consume_until, create_topics, producer

pytestmark = pytest.mark.integration

N = 10_000
PARTITIONS = 3
SPREAD_MS = 8000  # due times spread over this window
LEAD_MS = (20, 400)  # the replace / cancel is sent this long before the old due time
LATER_MS = 1500  # a replace moves the due time this much later


@pytest.fixture
def sidecar(kafka_bootstrap: str, tmp_path: Path, unique: str) -> Iterator[SidecarProcess]:
    sc = SidecarProcess(kafka_bootstrap, tmp_path / "data", f"ingress-{unique}", f"dlq-{unique}",
                        extra=["--scheduler", "wheel", "--ingress-partitions", str(PARTITIONS)])
    yield sc
    sc.stop_quietly()


def test_10000_replaces_and_cancels_near_the_due_time_never_let_a_stale_version_fire(
    sidecar: SidecarProcess, kafka_bootstrap: str, unique: str
) -> None:
    target, markers = f"resched-{unique}", f"markers-{unique}"
    create_topics(kafka_bootstrap, [target, markers], partitions=2)
    sidecar.start()
    p = producer(kafka_bootstrap, **{"linger.ms": 1})
    offsets: dict[str, tuple[int, int]] = {}  # id -> (partition, ingress offset) of its replace / cancel

    def noted(rid: str) -> Any:
        def cb(err: Any, msg: Any) -> None:
            assert err is None, err
            offsets[rid] = (msg.partition(), msg.offset())
        return cb

    start = int(time.time() * 1000) + 4000
    lead_span = LEAD_MS[1] - LEAD_MS[0]
    due = {i: start + i * SPREAD_MS // N for i in range(N)}
    lead = {i: LEAD_MS[0] + (i * 7919) % lead_span for i in range(N)}  # spread, deterministic
    cancel = {i for i in range(N) if i % 4 == 3}
    for i in range(N):
        rid = f"r{i}"
        p.produce(sidecar.ingress, key=rid.encode(), value=f"old-{i}".encode(), headers=[
            ("delay.target-topic", target.encode()), ("delay.deliver-at", str(due[i]).encode()),
            ("delay.id", rid.encode())])
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    assert int(time.time() * 1000) < start - LEAD_MS[1], "the originals must be sent before the races start"

    order = sorted(range(N), key=lambda i: due[i] - lead[i])
    k, n_markers = 0, 0
    while k < N:
        now = int(time.time() * 1000)
        while k < N and due[order[k]] - lead[order[k]] <= now:
            i = order[k]
            rid = f"r{i}"
            if i in cancel:
                p.produce(sidecar.ingress, key=rid.encode(), value=None, headers=[("delay.cancel", rid.encode())],
                          on_delivery=noted(rid))
            else:
                p.produce(sidecar.ingress, key=rid.encode(), value=f"new-{i}".encode(), on_delivery=noted(rid),
                          headers=[("delay.target-topic", target.encode()),
                                   ("delay.deliver-at", str(due[i] + LATER_MS).encode()),
                                   ("delay.id", rid.encode()), ("delay.replace", b"true")])
            k += 1
        for part in range(PARTITIONS):  # due now: each proves what came before it in its partition was stored
            p.produce(sidecar.ingress, partition=part, value=b"m", headers=[
                ("delay.target-topic", markers.encode()), ("delay.id", f"m{n_markers}".encode())])
            n_markers += 1
        p.poll(0)
        time.sleep(0.005)
    assert p.flush(30) == 0
    assert len(offsets) == N

    replaced = N - len(cancel)
    got = consume_until(kafka_bootstrap, [target], want=replaced, timeout_s=60, settle_s=3)
    marks = consume_until(kafka_bootstrap, [markers], want=n_markers, timeout_s=30)
    assert len({m.headers["delay.id"] for m in marks}) == n_markers, "every marker arrives"

    # per ingress partition: marker ingress offsets (sorted) and the earliest delivery at or after each
    by_part: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for m in marks:
        _topic, part, off = (m.headers["delay.source"] or b"").decode().rsplit(":", 2)
        by_part[int(part)].append((int(off), m.timestamp_ms))
    bound: dict[int, tuple[list[int], list[int]]] = {}
    for part, lst in by_part.items():
        lst.sort()
        suffix_min, best = [], 2**62
        for _off, ts in reversed(lst):
            best = min(best, ts)
            suffix_min.append(best)
        bound[part] = ([off for off, _ts in lst], suffix_min[::-1])

    def stored_by(rid: str) -> int | None:
        part, off = offsets[rid]
        offs, ts = bound.get(part, ([], []))
        j = bisect.bisect_right(offs, off)
        return ts[j] if j < len(offs) else None

    seen: Counter[tuple[str, bytes]] = Counter()
    for r in got:
        assert r.lateness_ms >= 0, "never early"
        seen[((r.headers["delay.id"] or b"").decode(), r.value or b"")] += 1
    decided, stale, late_old, margins = 0, [], 0, []
    for i in range(N):
        rid = f"r{i}"
        old = seen[(rid, f"old-{i}".encode())]
        when = stored_by(rid)
        if when is not None and when < due[i]:
            decided += 1
            margins.append(due[i] - when)
            if old:
                stale.append(rid)
        elif old:
            late_old += 1  # the replace or cancel was stored after the due time: the old one may fire
        if i in cancel:
            assert seen[(rid, f"new-{i}".encode())] == 0
        else:
            assert seen[(rid, f"new-{i}".encode())] >= 1, f"{rid}: the new version never arrived"
    dups = sum(n - 1 for n in seen.values() if n > 1)
    margins.sort()
    print(f"\n{N} races: {decided} decided before the due time (margin ms p1={margins[len(margins) // 100]} "
          f"p50={margins[len(margins) // 2]}), stale {len(stale)}, old version after a late replace {late_old}, "
          f"duplicates {dups}, markers {n_markers}")
    assert stale == [], f"{len(stale)} stale deliveries, e.g. {stale[:5]}"
    # measured on the shared 2-core machine: 85-92 % decided (the rest: leads of a few ms, or markers too coarse)
    assert decided >= N // 2, f"only {decided} of {N} races were decided before the due time: the test proves little"


def test_etf1_records_as_documented_replace_cancel_and_carry_its_headers(
    sidecar: SidecarProcess, kafka_bootstrap: str, unique: str
) -> None:
    """etf1/kafka-message-scheduler's shapes: the README's "Schedule message" (headers
    scheduler-epoch, scheduler-target-topic, scheduler-target-key, customer-header; Key
    vid1-online), a newer one under the same key, and clientlib.DeleteSchedule's tombstone
    (``Key: []byte(scheduleID)``, ``Value: nil``, no headers)."""
    target = f"online-videos-{unique}"
    create_topics(kafka_bootstrap, [target])
    sidecar.start()
    p = producer(kafka_bootstrap)
    epoch = int(time.time()) + 3

    def schedule(key: bytes, value: bytes, at: int) -> None:
        p.produce(sidecar.ingress, key=key, value=value, headers=[
            ("scheduler-epoch", str(at).encode()), ("scheduler-target-topic", target.encode()),
            ("scheduler-target-key", b"vid1"), ("customer-header", b"dummy")])

    schedule(b"vid1-online", b"video 1", epoch + 30)
    schedule(b"vid1-online", b"video 1, edited", epoch)  # replaces
    schedule(b"vid1-offline", b"video 1 off", epoch)
    p.produce(sidecar.ingress, key=b"vid1-offline", value=None)  # deletes
    assert p.flush(30) == 0
    got = consume_until(kafka_bootstrap, [target], want=1, timeout_s=30, settle_s=3)
    assert [(r.key, r.value) for r in got] == [(b"vid1", b"video 1, edited")]
    h = got[0].headers
    assert (h["customer-header"], h["scheduler-key"], h["scheduler-topic"]) == (
        b"dummy", b"vid1-online", sidecar.ingress.encode())
    assert abs(int(h["scheduler-timestamp"] or b"0") - time.time()) < 60, "the schedule record's time, in seconds"
    assert got[0].timestamp_ms >= epoch * 1000
    # every header of the schedule stays, as etf1 keeps them (tests/integration/test_etf1.py)
    assert (h["scheduler-epoch"], h["scheduler-target-topic"]) == (str(epoch).encode(), target.encode())
    # etf1-tombstones is off by default: nothing is written back to the schedules topic
    sent = consume_until(kafka_bootstrap, [sidecar.ingress], want=4, timeout_s=30, settle_s=1)
    assert len(sent) == 4
