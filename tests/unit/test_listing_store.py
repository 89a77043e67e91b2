"""Listing what a store holds pending in a due-time range (``sidecar.store.listing``), on both
schedulers: in and out of range, every tier (the wheel's slots, buckets and late chain; each
level and the "due now" level), limits and pages, the filters, and the finished records absent."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sidecar import contract as c
from sidecar.store import listing
from sidecar.store.listing import Budget, Query, TooWide, list_store
from tests.unit.helpers.store_sim import T0, Sim


@pytest.fixture(params=["levels", "wheel"])
def sim(tmp_path: Path, request: pytest.FixtureRequest) -> Sim:
    return Sim(tmp_path, scheduler=request.param, entries_per_file=64)


def ids(entries: list[listing.Entry]) -> list[str]:
    return [e.id.decode() for e in entries]


def ls(sim: Sim, after: int, before: int, **kw: object) -> list[listing.Entry]:
    return list_store(sim.st, Query(after, before, **kw), sim.now)  # type: ignore[arg-type]


def test_in_range_out_of_range_in_due_order(sim: Sim) -> None:
    # levels: 1 s, 5 s, 10 s; the wheel: a 60 s window, 30 s buckets beyond it
    delays = {"a": 1000, "b": 5000, "c": 10_000, "d": 120_000, "e": 3_600_000, "f": 7000}
    for rid, d in delays.items():
        sim.send(rid, delay_ms=d, target="t-" + rid)
    sim.consume()
    due = {rid: e.due_ms for rid in delays for e in ls(sim, T0, T0 + 10**8) if e.id == rid.encode()}
    got = ls(sim, T0, T0 + 10**8)
    assert [e.due_ms for e in got] == sorted(e.due_ms for e in got)
    if sim.scheduler == "wheel":  # exact due times; the levels round up (f: 7 s -> 10 s), d, e: out of range
        assert due == {rid: T0 + d for rid, d in delays.items()}
    else:
        assert set(due) == {"a", "b", "c", "f"} and due["f"] == T0 + 10_000
    first = next(e for e in got if e.kind == "message")  # levels: d and e are beyond the last level: DLQ
    assert (first.id, first.kind, first.target_topic, first.target_partition, first.source, first.partition) == (
        b"a", "message", "t-a", None, "in:0:0", 0)
    # half-open range: [after, before)
    assert ids(ls(sim, T0 + 1000, T0 + 5000)) == ["a"]
    assert ids(ls(sim, T0 + 1001, T0 + 5001)) == ["b"]
    assert ls(sim, T0 + 11_000, T0 + 60_000) == []
    if sim.scheduler == "wheel":
        assert ids(ls(sim, T0 + 60_000, T0 + 200_000)) == ["d"]  # a bucket beyond the ring
        assert ids(ls(sim, T0 + 3_000_000, T0 + 4_000_000)) == ["e"]


def test_limit_and_pages_cover_the_range_once(sim: Sim) -> None:
    rng = random.Random(5)
    for i in range(300):
        sim.send(f"r{i:03d}", delay_ms=rng.choice([1000, 5000, 10_000]) if sim.scheduler == "levels"
                 else rng.choice([0, 1, 500, 1000, 30_000, 59_999, 90_000, 200_000]))
        sim.now += rng.choice([0, 0, 1, 7])  # equal due times, in several slots and levels
    sim.consume()
    everything = ls(sim, 0, T0 + 10**8, limit=1000)
    assert len(everything) == 300
    keys = [e.key for e in everything]
    assert keys == sorted(keys) and len(set(keys)) == 300
    pages, cursor = [], None
    while True:
        page = list_store(sim.st, Query(0, T0 + 10**8, limit=7, cursor=cursor), sim.now)
        pages.extend(page)
        if len(page) < 7:
            break
        cursor = page[-1].key
    assert [e.key for e in pages] == keys
    # a cursor from another partition orders by partition within a due ms
    mid = everything[150]
    before_part = list_store(sim.st, Query(0, T0 + 10**8, limit=1000, cursor=(mid.due_ms, -1, 0)), sim.now)
    after_part = list_store(sim.st, Query(0, T0 + 10**8, limit=1000, cursor=(mid.due_ms, 1, 0)), sim.now)
    assert [e.key for e in before_part] == [k for k in keys if k[0] >= mid.due_ms]
    assert [e.key for e in after_part] == [k for k in keys if k[0] > mid.due_ms]


def test_target_and_id_prefix_filters(sim: Sim) -> None:
    for i in range(40):
        sim.send(f"{'order' if i % 2 else 'user'}-{i}", delay_ms=1000 if i < 20 else 5000,
                 target="orders" if i % 3 else "audit")
    sim.consume()
    got = ls(sim, T0, T0 + 60_000, target="audit", limit=1000)
    assert {e.target_topic for e in got} == {"audit"} and len(got) == 14
    got = ls(sim, T0, T0 + 60_000, id_prefix=b"order-", limit=1000)
    assert len(got) == 20 and all(e.id.startswith(b"order-") for e in got)
    got = ls(sim, T0, T0 + 60_000, id_prefix=b"order-", target="audit", limit=3)
    assert ids(got) == ["order-3", "order-9", "order-15"]


def test_cancelled_delivered_replaced_absent_dead_letters_listed(sim: Sim) -> None:
    sim.send("keep", delay_ms=5000)
    sim.send("gone", delay_ms=5000)
    sim.send("soon", delay_ms=1000)
    sim.send("moved", delay_ms=1000)
    sim.consume()
    sim.send(cancel="gone")
    sim.send("moved", delay_ms=10_000, extra=[(c.REPLACE, b"true")])
    sim.send("bad", extra=[(c.DELAY_MS, b"soon")])  # a dead letter, due now
    sim.consume()
    got = ls(sim, 0, T0 + 60_000)
    assert sorted(ids(got)) == ["in:0:6", "keep", "moved", "soon"]
    dead = next(e for e in got if e.kind == "dead-letter")
    assert dead.extra["dlq_topic"] == "dlq" and dead.extra["reason"] in c.REASONS
    assert dead.target_topic == "target" and dead.as_dict()["dlq_topic"] == "dlq"
    assert ls(sim, T0 + 1, T0 + 60_000, target="dlq") == []  # the dead letter is due now: out of range
    assert [e.due_ms for e in ls(sim, 0, T0 + 60_000) if e.id == b"moved"] == [T0 + 10_000]
    sim.now += 1000
    handed = sim.publish(ack=False)  # handed out, not acknowledged: still pending
    assert {d.rid for d in handed} == {b"soon", b"in:0:6"}
    assert sorted(ids(ls(sim, 0, T0 + 60_000))) == ["in:0:6", "keep", "moved", "soon"]
    sim.ack_all()
    sim.st.settle(sim.now)
    assert sorted(ids(ls(sim, 0, T0 + 60_000))) == ["keep", "moved"]
    sim.restart()  # the same after a restart (restored entries: checked as they are read)
    assert sorted(ids(ls(sim, 0, T0 + 60_000))) == ["keep", "moved"]


def test_overdue_records_listed_when_the_range_reaches_now(sim: Sim) -> None:
    """A record that arrives already due (the wheel's late chain, level 0) is listed by a range
    that reaches back to it, and not by one in the future."""
    sim.send("future", delay_ms=5000)
    sim.consume()
    sim.now += 3000
    sim.publish()  # the reader moves on
    sim.send("late", extra=[(c.DELIVER_AT, str(T0 + 100).encode())])
    sim.consume()
    assert ids(ls(sim, T0, T0 + 60_000)) == ["late", "future"]
    assert ids(ls(sim, T0 + 200, T0 + 60_000)) == ["future"]


def test_budget_bounds_the_work(sim: Sim) -> None:
    for i in range(50):
        sim.send(f"x{i}", delay_ms=1000, target="a")
    sim.consume()
    with pytest.raises(TooWide, match="narrow"):
        list_store(sim.st, Query(T0, T0 + 60_000, target="nowhere"), sim.now, Budget(20))
    assert len(list_store(sim.st, Query(T0, T0 + 60_000, limit=5), sim.now, Budget(200))) == 5


def test_a_narrow_range_reads_only_what_covers_it(sim: Sim) -> None:
    """2,000 pending records over 200 s; a 1 s range costs a few hundred units of work, not a walk
    of everything pending (the budget would run out)."""
    for i in range(2000):
        sim.send(f"s{i}", delay_ms=10_000)
        sim.now += 100
    sim.consume()
    sim.now = T0
    lo = T0 + 10_000 + 100_000
    got = list_store(sim.st, Query(lo, lo + 1000, limit=1000), sim.now, Budget(500))
    assert ids(got) == [f"s{i}" for i in range(1000, 1010)]


def test_buckets_read_without_the_lock_then_checked_again(tmp_path: Path) -> None:
    """The wheel's buckets are read apart (``prepare``: what GET /pending reads without the store
    lock); a record linked into the ring meanwhile is listed once, one cancelled meanwhile not."""
    sim = Sim(tmp_path, scheduler="wheel", entries_per_file=64)
    for i in range(10):  # beyond the 60 s ring: in buckets
        sim.send(f"b{i}", delay_ms=61_000 + 1000 * i)
    sim.consume()
    q = Query(T0, T0 + 200_000, limit=100)
    read = listing.prepare(sim.st, q)
    assert read is not None
    early = read(Budget())
    assert len(early) == 10
    sim.now += 35_000
    sim.publish()
    sim.st.checkpoint()  # the ring's guard moves on with it
    sim.publish()  # the ring moved on: the bucket is linked into it
    sim.send(cancel="b3")
    sim.consume()
    wheel = sim.st.sched
    # the first bucket ([T0 + 40 s, T0 + 70 s): buckets start at multiples of 30 s) is linked in
    assert [wheel.where(ref) for _d, ref, _l in early] == ["slot"] * 9 + ["bucket"]  # type: ignore[attr-defined]
    got = list_store(sim.st, q, sim.now, early=early)
    assert ids(got) == [f"b{i}" for i in range(10) if i != 3]
    assert list_store(sim.st, q, sim.now) == got
    read = listing.prepare(sim.st, q)
    assert read is not None and [ref for _d, ref, _l in read(Budget())] == [early[-1][1]]  # b9 only
    assert listing.prepare(sim.st, Query(T0, T0 + 69_000)) is None  # no bucket left meets it


def test_a_recurring_schedule_is_listed_at_its_next_firing(sim: Sim) -> None:
    sim.send("every-5s", extra=[(c.EVERY, b"5000")])  # the first firing at its start (the record's time)
    sim.send("once", delay_ms=5000)
    sim.consume()
    got = ls(sim, 0, T0 + 60_000)
    kinds = {e.id: (e.kind, e.due_ms) for e in got}
    assert kinds[b"once"][0] == "message"
    assert kinds[b"every-5s"] == ("recurring", T0)
    [sched] = [e for e in got if e.id == b"every-5s"]
    assert sched.as_dict()["recurring"] == {
        "next_fire_ms": T0, "fired": 0, "last_fire_ms": None, "start_ms": T0, "end_ms": None, "max_count": None,
        "misfire": "fire-once", "every_ms": 5000}
