"""Looking an id up in a PartitionStore (``delay-sidecar status``) and the bounded memory of
recent outcomes behind it (``sidecar/store/recent.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar import contract as c
from sidecar.store import codec
from sidecar.store.idindex import id_hash
from sidecar.store.recent import CANCELLED, DEAD_LETTERED, DELIVERED, RecentOutcomes
from tests.unit.test_partition_store import T0, Sim


# -- the memory of recent outcomes ----------------------------------------------------------------
def test_recent_outcomes_are_bounded_and_keep_the_latest() -> None:
    r = RecentOutcomes(1000)
    for i in range(10_000):
        r.note(b"id%d" % i, DELIVERED, T0 + i)
        assert len(r) <= 1000
    assert all(r.get(b"id%d" % i) == ("delivered", T0 + i) for i in range(10_000 - 500, 10_000))
    assert r.get(b"id0") is None and r.get(b"id8000") is None


def test_recent_outcome_newest_note_wins_and_zero_remembers_nothing() -> None:
    r = RecentOutcomes(4)
    r.note(b"a", DELIVERED, 5)
    r.note(b"b", CANCELLED, 6)  # cur full: it becomes old
    r.note(b"a", DEAD_LETTERED, 7)  # a newer outcome under the same id (the id was used again)
    assert r.get(b"a") == ("dead-lettered", 7) and r.get(b"b") == ("cancelled", 6)
    off = RecentOutcomes(0)
    off.note(b"a", DELIVERED, 5)
    assert off.get(b"a") is None and len(off) == 0
    with pytest.raises(ValueError, match="negative"):
        RecentOutcomes(-1)


# -- PartitionStore.lookup --------------------------------------------------------------------------
def _settle_due(sim: Sim) -> None:
    """What the loop does: hand out the due records, then their delivery reports, then settle."""
    for ref, rec in sim.st.sched.due(sim.now, 1000):
        sim.st.acked.append((ref, rec))
    sim.st.settle(sim.now)


@pytest.fixture(params=["levels", "wheel"])
def sim(tmp_path: Path, request: pytest.FixtureRequest) -> Sim:
    return Sim(tmp_path, scheduler=request.param)


def test_lookup_pending_delivered_cancelled_unknown(sim: Sim) -> None:
    sim.send("later", delay_ms=10_000, target="orders", extra=[(c.TARGET_PARTITION, b"2")])
    sim.send("soon", delay_ms=0)
    sim.send("gone", delay_ms=10_000)
    sim.send(cancel="gone")
    sim.consume()
    got = sim.st.lookup(b"later")
    assert got is not None
    assert got["state"] == "pending" and got["due_ms"] == T0 + 10_000
    assert (got["target_topic"], got["target_partition"], got["partition"]) == ("orders", 2, 0)
    assert got["ingress_offset"] == 0
    assert sim.st.lookup(b"gone") == {"partition": 0, "state": "cancelled", "at_ms": T0}
    assert sim.st.lookup(b"nobody") is None
    sim.now += 50
    _settle_due(sim)
    assert sim.st.lookup(b"soon") == {"partition": 0, "state": "delivered", "at_ms": T0 + 50}
    assert sim.st.lookup(b"later")["state"] == "pending"  # type: ignore[index]


def test_lookup_cancel_before_its_message(sim: Sim) -> None:
    sim.send(cancel="early")
    sim.consume()
    assert sim.st.lookup(b"early") == {"partition": 0, "state": "cancelled", "at_ms": T0, "before_message": True}
    sim.now += 10
    sim.send("early", delay_ms=1000)  # the message, dropped by its pre-cancel
    sim.consume()
    assert sim.st.lookup(b"early")["state"] == "cancelled"  # type: ignore[index]


def test_lookup_dead_letters(sim: Sim) -> None:
    sim.send("bad", extra=[(c.DELAY_MS, b"soon")])  # two delay headers' worth of nonsense: DLQ
    sim.consume()
    got = sim.st.lookup(b"in:0:0")  # a rejected record keeps its default id
    assert got is not None and got["state"] == "dead-lettered" and got["dlq_delivered"] is False
    assert got["dlq_topic"] == "dlq" and got["reason"] in c.REASONS
    sim.now += 10
    _settle_due(sim)
    assert sim.st.lookup(b"in:0:0") == {"partition": 0, "state": "dead-lettered", "at_ms": T0 + 10}
    # a publish that failed for good: the record becomes a dead letter under the same id
    sim.send("fails", delay_ms=0, target="t")
    sim.consume()
    (ref, rec), = sim.st.sched.due(sim.now, 10)
    sim.st.dead_letter(ref, rec, c.DELIVERY_FAILED, "boom", 5, sim.now)
    # its dead letter is not indexed under the id (a new record under it is not a duplicate)
    assert sim.st.lookup(b"fails") == {"partition": 0, "state": "dead-lettered", "at_ms": T0 + 10}


def test_lookup_verifies_the_stored_id_on_a_hash_collision(sim: Sim) -> None:
    """An index entry under another id's hash (what a 64-bit collision looks like) is not taken
    for that id: the stored record's id is compared."""
    sim.send("real", delay_ms=10_000)
    sim.consume()
    (ref,) = sim.st.ids.find(id_hash(b"real"))
    sim.st.ids.put(id_hash(b"impostor"), ref)
    assert sim.st.ids.find(id_hash(b"impostor")) == [ref]
    assert sim.st.lookup(b"impostor") is None
    assert sim.st.lookup(b"real")["state"] == "pending"  # type: ignore[index]


def test_lookup_is_read_only(sim: Sim) -> None:
    """A look-up never writes: a stale index entry stays (the intake removes it lazily)."""
    sim.send("x", delay_ms=0)
    sim.consume()
    (ref,) = sim.st.ids.find(id_hash(b"x"))
    rec = sim.st.sched.record(ref)
    assert rec is not None and rec.rtype == codec.MESSAGE
    sim.st.ids.put(id_hash(b"stale"), ref)
    dirty, live = sim.st.dirty, sim.st.ids.live
    assert sim.st.lookup(b"stale") is None
    assert (sim.st.dirty, sim.st.ids.live) == (dirty, live)
    assert ref in sim.st.ids.find(id_hash(b"stale"))


def test_status_memory_zero_forgets_outcomes(tmp_path: Path) -> None:
    sim = Sim(tmp_path)
    sim.st.recent = RecentOutcomes(0)
    sim.send("a", delay_ms=0)
    sim.consume()
    _settle_due(sim)
    assert sim.st.lookup(b"a") is None
