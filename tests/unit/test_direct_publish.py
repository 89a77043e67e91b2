"""Records due on arrival, published by the intake itself (sidecar/engine/direct.py), on virtual
time against the Kafka twin: never stored, delivered as the stored path would deliver them, and
what a stored record guarantees still holds: nothing lost across a crash with records in flight
(the checkpoint's ``direct`` list, the capped commit, store/resume.py), an id in flight is a
duplicate, a cancel of it is too late, a replace of it wins, a failed delivery is stored and
delivered by the stored path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar import contract as c
from sidecar.engine.loop import Sidecar
from sidecar.store import checkpoint
from tests.kafka_twin import TwinProducer
from tests.unit.helpers.world import INGRESS, PARTITIONS, TARGET, World, committed


def _ready(w: World, sc: Sidecar) -> None:
    """Every store may publish from the intake: its first checkpoint, taken when it joins, names
    the ``direct`` offsets (none is published before it: engine/direct.py); and its files exist (a
    store's first record is the reference path's, which makes them: one each, delivered)."""
    w.run([sc], lambda: len(sc.stores) == PARTITIONS)
    w.run([sc], lambda: all(st.flights.checkpointed for st in sc.stores.values()))
    w.send(PARTITIONS, lambda i: 0, prefix="first")
    w.run([sc], lambda: len(w.delivered()) == PARTITIONS)


def _hold_target(prod: TwinProducer) -> list[Any]:
    """The twin's acks of records to TARGET held back (changelog writes go on): a list of them."""
    held: list[Any] = []
    real = prod._deliver

    def deliver() -> int:
        held.extend(p for p in prod.queue if p.topic == TARGET)
        prod.queue = [p for p in prod.queue if p.topic != TARGET]
        return real()

    prod._deliver = deliver  # type: ignore[method-assign]
    return held


def _append(w: World, rid: bytes, delay_ms: int, partition: int = 0, **more: bytes) -> None:
    w.sent[rid] = w.clock.now_ms + delay_ms
    headers = [(c.TARGET_TOPIC, TARGET.encode()), (c.DELAY_MS, str(delay_ms).encode()), (c.ID, rid)]
    headers += [(k, v) for k, v in more.items()]
    w.cluster.append(INGRESS, partition, b"k", rid, headers)


def _kill(w: World, sc: Sidecar) -> None:
    """SIGKILL: no revoke, no checkpoint, what the producer held is gone."""
    w.cluster.leave(sc.kafka.consumer)
    sc.durability.close()
    sc.lock.release()


@pytest.mark.parametrize("changelog", ["on", "off"])
def test_records_due_on_arrival_are_published_without_being_stored(tmp_path: Path, changelog: str) -> None:
    w = World(tmp_path)
    a = w.sidecar("a", changelog=changelog)
    _ready(w, a)
    _append(w, b"stored", 1000, **{"user": b"u"})
    w.run([a], lambda: a.counters.ingested == PARTITIONS + 1)
    appended = sum(st.log.appended for st in a.stores.values())
    w.send(400, lambda i: 0)
    _append(w, b"direct", 0, **{"user": b"u"})
    w.run([a], lambda: len(w.delivered()) >= 402 + PARTITIONS)
    seen = w.check(set(w.sent))
    assert sum(seen.values()) == 402 + PARTITIONS
    assert a.counters.published_direct >= 401  # (and the first records the C runs took)
    assert sum(st.log.appended for st in a.stores.values()) == appended, "nothing stored"
    assert a.counters.delivered == 402 + PARTITIONS and a.counters.early == 0
    # delivered as the stored path delivers: the same headers, in the same order, the same values
    by_id = {dict(m.headers() or [])[c.ID]: m for m in w.delivered()}
    stored, direct = by_id[b"stored"], by_id[b"direct"]
    assert [k for k, _v in stored.headers() or []] == [k for k, _v in direct.headers() or []]
    assert (stored.key(), stored.value(), direct.key(), direct.value()) == (b"k", b"stored", b"k", b"direct")
    h = dict(direct.headers() or [])
    assert h["user"] == b"u" and h[c.SOURCE] == b"in:0:102" and h[c.DELIVER_AT] == h[c.ENQUEUED_AT]
    st = a.stores[next(iter(a.stores))]
    assert st.lookup(b"r0" if st.partition == 0 else b"r%d" % st.partition)["state"] == "delivered"
    assert not any(st.flights.deliveries for st in a.stores.values())
    if changelog == "on":  # nothing pending, nothing written but the first records' puts and tombstones
        assert all(not st.mirror.held and not st.mirror.fresh for st in a.stores.values())  # type: ignore[union-attr]
    a.shutdown()
    assert committed(w) == {p: 101 + 2 * (p == 0) for p in range(PARTITIONS)}


@pytest.mark.parametrize("changelog", ["on", "off"])
def test_a_crash_with_records_in_flight_loses_none(tmp_path: Path, changelog: str) -> None:
    """Records published from the intake and not acknowledged when the process dies: the
    checkpoint names them and the commit stops below them; the records stored around them are
    not applied twice (store/resume.py)."""
    w = World(tmp_path)
    a = w.sidecar("a", changelog=changelog)
    _ready(w, a)
    before = a.counters.published_direct
    held = _hold_target(a.kafka.producer)
    w.send(40, lambda i: 0, prefix="d")  # in flight from here on
    w.send(40, lambda i: 60_000, prefix="s")  # stored
    w.run([a], lambda: a.counters.ingested >= 80 + PARTITIONS)
    w.clock.advance(500)
    w.run([a], lambda: not a.durability.jobs and all(
        (checkpoint.read(st.dir) or {}).get("direct") for st in a.stores.values()))
    lowest = {}
    for st in a.stores.values():
        doc = checkpoint.read(st.dir) or {}
        flying = sorted(d.offset for d in st.flights.deliveries.values())
        assert doc["ingress_offset"] == 21 and doc["direct"] == flying == list(range(1, 11))
        lowest[st.partition] = flying[0]
    w.run([a], lambda: committed(w) == lowest)  # below the first in flight
    # after the checkpoint: more in flight, and more stored, each partition's offsets interleaved
    w.send(20, lambda i: 0 if i % 8 < 4 else 60_000, prefix="late")
    w.run([a], lambda: a.counters.ingested >= 100 + PARTITIONS)
    assert len(held) == 40 + 12 and a.counters.published_direct == before + 52
    _kill(w, a)
    a2 = w.sidecar("a", changelog=changelog)
    end = max(w.sent.values()) + 1000
    w.run([a2], lambda: w.clock.now_ms >= end)
    seen = w.check(set(w.sent))  # each once: the stored ones were not consumed into the store again
    assert sum(seen.values()) == len(w.sent)
    assert a2.counters.duplicates == 0 and a2.counters.cancelled == 0
    a2.shutdown()


def test_an_id_in_flight_is_a_duplicate_its_cancel_is_too_late_and_its_replace_wins(tmp_path: Path) -> None:
    w = World(tmp_path)
    a = w.sidecar("a")
    _ready(w, a)
    prod = a.kafka.producer
    held = _hold_target(prod)
    before = a.counters.published_direct
    _append(w, b"x", 0)
    w.run([a], lambda: a.counters.published_direct == before + 1)
    st0 = next(st for st in a.stores.values() if st.partition == 0)
    answer = st0.lookup(b"x")
    assert answer is not None and answer["state"] == "pending" and answer["being_delivered"]
    _append(w, b"x", 0)  # the same id again while it is in flight: dropped
    _append(w, b"y", 0)
    w.run([a], lambda: a.counters.duplicates == 1 and a.counters.published_direct == before + 2)
    w.cluster.append(INGRESS, 0, b"k", None, [(c.CANCEL, b"x")])  # too late: it is being delivered
    w.run([a], lambda: a.counters.cancel_unmatched == 1)
    _append(w, b"y", 5000, **{c.REPLACE: b"true"})  # a newer version of y, due later: stored
    w.run([a], lambda: a.counters.replaced == 1)
    store = next(st for st in a.stores.values() if st.partition == 0)
    assert store.pending() and len(store.flights.deliveries) == 2
    prod._deliver = TwinProducer._deliver.__get__(prod)  # type: ignore[method-assign]
    prod.queue.extend(held)
    w.run([a], lambda: a.counters.delivered >= PARTITIONS + 2)
    assert not store.flights.deliveries
    # y's newer version is still pending (its changelog put was not tombstoned by the old one's
    # report), and x was not remembered as a pre-cancel: a new x is delivered
    assert store.mirror is not None and b"y" not in store.mirror.held
    _append(w, b"x2", 0)
    end = w.clock.now_ms + 6000
    w.run([a], lambda: w.clock.now_ms >= end)
    got = [dict(m.headers() or [])[c.ID] for m in w.delivered()]
    assert got.count(b"x") == 1 and got.count(b"y") == 2 and got.count(b"x2") == 1
    assert [m.value() for m in w.delivered() if dict(m.headers() or [])[c.ID] == b"y"] == [b"y", b"y"]
    a.shutdown()


def test_a_failed_delivery_is_stored_and_delivered_by_the_stored_path(tmp_path: Path) -> None:
    w = World(tmp_path)
    a = w.sidecar("a")
    _ready(w, a)
    w.cluster.down = True
    w.send(40, lambda i: 0)
    w.run([a], lambda: a.counters.published_direct > PARTITIONS
          and not any(st.flights.deliveries for st in a.stores.values()))
    assert not a.pub.state.broker_up and a.pub.state.troubled
    assert sum(sum(st.pending().values()) for st in a.stores.values()) >= a.counters.published_direct - PARTITIONS
    w.clock.advance(2000)
    w.cluster.down = False
    w.run([a], lambda: len(w.delivered()) >= 40 + PARTITIONS)
    assert sum(w.check(set(w.sent)).values()) == 40 + PARTITIONS
    before = a.counters.published_direct
    w.send(40, lambda i: 0, prefix="after")  # the broker is back: published from the intake again
    w.run([a], lambda: len(w.delivered()) >= 80 + PARTITIONS)
    assert a.counters.published_direct == before + 40
    a.shutdown()


def test_the_path_is_off_where_only_the_stored_path_keeps_a_guarantee(monkeypatch: pytest.MonkeyPatch) -> None:
    """engine/direct.py: exactly-once (a delivery, its tombstone and its offset in one
    transaction), the history topic (accepted/delivered events), etf1 tombstones, several tenants
    (the fair shares of the in-flight window), or the comparison switch: every record stored."""
    from sidecar.config import Settings
    from sidecar.engine.direct import SWITCH, enabled
    from sidecar.tenants import TenantSpec

    base = {"bootstrap_servers": "twin:9092", "data_dir": "/tmp/x", "ingress_topic": INGRESS, "group_id": "g"}
    assert enabled(Settings(**base))  # type: ignore[arg-type]
    for extra in ({"delivery": "exactly-once"}, {"history_topic": "h"}, {"etf1_tombstones": "on"},
                  {"tenant_specs": (TenantSpec("a", "a"), TenantSpec("b", "b"))}):
        assert not enabled(Settings(**base, **extra)), extra  # type: ignore[arg-type]
    monkeypatch.setenv(SWITCH, "off")
    assert not enabled(Settings(**base))  # type: ignore[arg-type]
