"""Looking an id up in a PartitionStore (``delay-sidecar status``) and the bounded memory of
recent outcomes behind it (``sidecar/store/recent.py``)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sidecar import contract as c
from sidecar.store import codec
from sidecar.store.idindex import id_hash
from sidecar.store.lookup import Flight, request_check
from sidecar.store.recent import CANCELLED, DEAD_LETTERED, DELIVERED, RecentOutcomes
from tests.unit.helpers.store_sim import T0, Sim
from tests.unit.helpers.world import World


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


class _Rec:
    def __init__(self, rid: bytes, rtype: int = codec.MESSAGE) -> None:
        self.id, self.rtype = rid, rtype


def test_recent_delivery_batches_are_bounded_before_any_lookup() -> None:
    """Deliveries are kept as id lists until a look-up folds them in: bounded all the same, the
    latest outcomes kept, dead letters told apart."""
    r = RecentOutcomes(1000)
    for b in range(100):
        batch = [(0, _Rec(b"id%d" % (b * 100 + i), codec.DEAD if i == 7 else codec.MESSAGE)) for i in range(100)]
        r.note_settled(batch, T0 + b, codec.DEAD)
        assert len(r) <= 1000 + 100
    assert r.get(b"id9999") == ("delivered", T0 + 99)
    assert r.get(b"id9907") == ("dead-lettered", T0 + 99)
    assert all(r.get(b"id%d" % i) is not None for i in range(9500, 10_000))
    assert r.get(b"id5000") is None
    assert len(r) <= 1000


def test_recent_outcomes_keep_the_order_they_happened_in() -> None:
    r = RecentOutcomes(100)
    r.note_settled([(0, _Rec(b"a"))], 10, codec.DEAD)
    r.note(b"a", CANCELLED, 11)  # later: wins over the unfolded delivery
    r.note(b"b", CANCELLED, 12)
    r.note_settled([(0, _Rec(b"b"))], 13, codec.DEAD)
    assert r.get(b"a") == ("cancelled", 11) and r.get(b"b") == ("delivered", 13)


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
    # past the cancel horizon the intake no longer honours it, and neither does the answer
    assert sim.st.lookup(b"early", T0 + sim.horizon_ms) is not None
    assert sim.st.lookup(b"early", T0 + sim.horizon_ms + 1) == {"partition": 0, "state": "cancelled", "at_ms": T0 + 10}


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


# -- Sidecar.lookup: from another thread, while the loop runs ---------------------------------------
def test_sidecar_lookup_from_another_thread_while_the_loop_runs(tmp_path: Path) -> None:
    """An HTTP-thread look-up runs beside the loop (on the in-memory Kafka twin): every answer is
    the truth at some instant (pending before its due time, delivered after), none fails."""
    w = World(tmp_path)
    sc = w.sidecar("a")
    w.send(400, lambda i: 200 + 10 * i)
    w.run([sc], lambda: sum(s.pending().get("wheel", 0) for s in sc.stores.values()) > 0)
    seen: list[tuple[bytes, int, dict[str, object]]] = []

    def ask() -> None:
        for i in range(0, 400, 7):
            rid = b"r%d" % i
            status, doc = sc.lookup(rid)
            seen.append((rid, status, doc))

    w.run_beside(sc, ask, lambda: len(w.delivered()) >= 400)
    assert {status for _r, status, _d in seen} <= {200}, "every id is pending or remembered"
    states = {d["state"] for _r, _s, d in seen}
    assert "delivered" in states and "pending" in states
    for rid, _s, d in seen:
        if d["state"] == "pending":
            assert d["due_ms"] == w.sent[rid] and d["id"] == rid.decode()
    for i in range(400):
        status, doc = sc.lookup(b"r%d" % i)
        assert status == 200 and doc["state"] == "delivered" and doc["partition"] == i % 4, doc
    assert sc.lookup(b"r400")[0] == 404
    status, doc = sc.lookup(b"r1", partition=2)  # r1 is on partition 1: not found in partition 2's store
    assert status == 404 and doc["state"] == "unknown" and doc["owned_partitions"] == [0, 1, 2, 3]
    status, doc = sc.lookup(b"r1", partition=9)
    assert status == 404 and "not owned" in doc["error"]
    sc.shutdown()


def test_sidecar_lookup_waits_for_the_loop_then_gives_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sidecar.engine import lookup

    monkeypatch.setattr(lookup, "LOOKUP_WAIT_S", 0.05)
    w = World(tmp_path)
    sc = w.sidecar("a")
    w.run([sc], lambda: bool(sc.stores))
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:  # the loop in a long turn
        with sc.store_lock:
            held.set()
            release.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    status, doc = sc.lookup(b"x")
    release.set()
    t.join(5)
    assert status == 503 and "try again" in doc["error"]
    assert sc.lookup(b"x")[0] == 404
    sc.shutdown()


# -- inspect --id: the same answers from the files, read-only -----------------------------------------
def test_inspect_finds_an_id_in_the_files(sim: Sim) -> None:
    from sidecar.inspect import find_id, render_id

    sim.send("near", delay_ms=5_000, target="orders", extra=[(c.TARGET_PARTITION, b"1")])
    sim.send("far", delay_ms=600_000)  # the wheel: beyond its 60 s window, in a bucket file
    sim.send("gone", delay_ms=5_000)
    sim.send(cancel="gone")
    sim.send(cancel="early")
    sim.send("bad", extra=[(c.DELAY_MS, b"soon")])
    sim.send("done", delay_ms=0)
    sim.consume()
    sim.now += 1
    for ref, rec in sim.st.sched.due(sim.now, 1000):
        if rec.id == b"done":
            sim.st.acked.append((ref, rec))
    sim.st.settle(sim.now)
    sim.st.checkpoint()
    (ref,) = sim.st.ids.find(id_hash(b"near"))
    sim.st.ids.put(id_hash(b"impostor"), ref)
    root = sim.root

    near = find_id(root, b"near")
    assert near["state"] == "pending" and len(near["found"]) == 1
    got = near["found"][0]
    assert (got["partition"], got["due_ms"], got["target_topic"], got["target_partition"]) == (0, T0 + 5000,
                                                                                              "orders", 1)
    assert "due=" in render_id(near)
    if sim.scheduler == "wheel":
        far = find_id(root, b"far")
        assert far["state"] == "pending" and far["found"][0]["due_ms"] == T0 + 600_000
        assert any((root / "in-0" / "buckets").glob("*.bkt"))
    for rid in (b"near", b"far", b"early", b"in:0:5", b"in:0:1"):  # the files say what the store says
        online = sim.st.lookup(rid)
        offline = find_id(root, rid)["found"]
        assert (online is None) == (not offline), rid
        if online is not None and online["state"] == "pending":
            assert {k: offline[0][k] for k in ("due_ms", "target_topic", "ingress_offset")} == {
                k: online[k] for k in ("due_ms", "target_topic", "ingress_offset")}
    early = find_id(root, b"early")
    assert early["found"] == [{"directory": "in-0", "partition": 0, "state": "cancelled", "before_message": True,
                               "at_ms": T0, "at": early["found"][0]["at"]}]
    bad = find_id(root, b"in:0:5")
    assert bad["state"] == "dead-lettered" and bad["found"][0]["reason"] in c.REASONS
    for unknown in (b"gone", b"done", b"impostor", b"never"):  # cancelled, delivered: not in the files
        assert find_id(root, unknown) == {"data_dir": str(root), "id": unknown.decode(), "state": "unknown",
                                          "found": []}
    assert "unknown" in render_id(find_id(root, b"never"))


def test_lookup_answers_the_newest_version_of_a_replaced_id(sim: Sim) -> None:
    """A replace while the old version is still being delivered: the answer is the newer
    version (the later ingress offset)."""
    sim.send("x", delay_ms=0)
    sim.consume()
    sim.now += 1
    in_flight = sim.st.sched.due(sim.now, 10)  # v1 handed out, not acked
    assert [rec.id for _ref, rec in in_flight] == [b"x"]
    sim.send("x", delay_ms=5_000, target="v2", extra=[(c.REPLACE, b"true")])
    sim.consume()
    got = sim.st.lookup(b"x")
    assert got is not None and got["state"] == "pending"
    assert (got["target_topic"], got["due_ms"], got["ingress_offset"]) == ("v2", T0 + 1 + 5_000, 1)


def test_request_check_says_what_a_request_under_an_id_makes_of_the_index(sim: Sim) -> None:
    """The intake's scan of the index for a request (``request_check``): a new id replaces
    nothing; one pending (no replace, or consumed again) is the duplicate's record; a replace from
    a later offset names the version it replaces; a pre-cancel within the horizon cancels it, and
    one past the horizon is dropped on the way."""
    sim.send("p", delay_ms=10_000)
    sim.send(cancel="pc")
    sim.consume()
    h = id_hash(b"p")
    assert request_check(sim.st, b"new", id_hash(b"new"), 5, False, sim.now) == []
    dup = request_check(sim.st, b"p", h, 5, False, sim.now)
    assert isinstance(dup, codec.Record) and dup.id == b"p"
    again = request_check(sim.st, b"p", h, 0, True, sim.now)  # the same offset consumed again
    assert isinstance(again, codec.Record) and again.id == b"p"
    assert request_check(sim.st, b"p", h, 5, True, sim.now) == sim.st.ids.find(h)
    hp = id_hash(b"pc")
    assert request_check(sim.st, b"pc", hp, 5, False, T0 + sim.horizon_ms) is Flight.PRECANCELLED
    assert request_check(sim.st, b"pc", hp, 5, False, T0 + sim.horizon_ms + 1) == []
    assert sim.st.ids.find(hp) == []  # the expired pre-cancel went with that scan
