"""Reschedule through the real event loop (intake, publishing, retries, the changelog, a handover)
on the in-memory Kafka twin and virtual time (``tests/unit/helpers/world.py``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from sidecar import contract as c
from tests.unit.helpers.world import INGRESS, PARTITIONS, TARGET, World, committed


def _send(w: World, rid: bytes, part: int, target: str, delay_ms: int, value: bytes, replace: bool) -> None:
    headers: list[tuple[str, bytes | None]] = [
        (c.TARGET_TOPIC, target.encode()), (c.DELAY_MS, str(delay_ms).encode()), (c.ID, rid)]
    if replace:
        headers.append((c.REPLACE, b"true"))
    w.cluster.append(INGRESS, part, rid, value, headers)


def _values(w: World, topic: str) -> list[tuple[bytes, bytes | None]]:
    return sorted((dict(m.headers() or [])[c.ID] or b"", m.value()) for m in w.cluster.records(topic))


def test_a_replace_wins_over_a_version_waiting_for_a_publish_retry(tmp_path: Path) -> None:
    """The old version's target refuses it (it waits in the retry heap, its due time long past); the
    replace, with a target that works, is delivered and the old version never is, not even once
    its target accepts records again, nor dead-lettered."""
    w = World(tmp_path)
    w.cluster.refused.add("refusing")
    sc = w.sidecar("a")
    _send(w, b"x", 1, "refusing", 100, b"old", replace=False)
    w.run([sc], lambda: sc.counters.publish_retries >= 1)
    _send(w, b"x", 1, TARGET, 500, b"new", replace=True)
    end = w.clock.now_ms + 1000
    w.run([sc], lambda: w.clock.now_ms >= end)
    w.cluster.refused.clear()
    end = w.clock.now_ms + 5000
    w.run([sc], lambda: w.clock.now_ms >= end)
    assert _values(w, TARGET) == [(b"x", b"new")]
    assert "refusing" not in w.cluster.topics or w.cluster.records("refusing") == []
    assert sum(sc.counters.dlq.values()) == 0
    assert sc.counters.replaced == 1
    sc.shutdown()


def test_replaces_follow_a_partition_to_its_new_owner_through_the_changelog(tmp_path: Path) -> None:
    """Records and their replaces are stored by b; b is lost with its disk; a restores b's
    partitions from the changelog and delivers the newest versions only."""
    w = World(tmp_path)
    a = w.sidecar("a")
    b = w.sidecar("b")
    w.run([a, b], lambda: len(a.stores) == 2 and len(b.stores) == 2)
    ids = [b"r%d" % i for i in range(40)]
    for i, rid in enumerate(ids):
        _send(w, rid, i % PARTITIONS, TARGET, 20_000, b"v1", replace=False)
    w.run([a, b], lambda: committed(w) == {p: 10 for p in range(PARTITIONS)})  # v1 in the changelog
    for i, rid in enumerate(ids):
        if (i // PARTITIONS) % 2 == 0:  # half the ids of every partition
            _send(w, rid, i % PARTITIONS, TARGET, 5000, b"v2", replace=True)
    w.run([a, b], lambda: sum(k.replaced for k in (a.counters, b.counters)) == 20)
    w.run([a, b], lambda: committed(w) == {p: 15 for p in range(PARTITIONS)})  # v2 in the changelog
    w.cluster.leave(b.kafka.consumer)  # b is killed, and its volume is gone
    b.durability.close()
    b.lock.release()
    shutil.rmtree(tmp_path / "b")
    w.run([a], lambda: len(a.stores) == PARTITIONS)
    end = w.clock.now_ms + 25_000
    w.run([a], lambda: w.clock.now_ms >= end)
    got = _values(w, TARGET)
    assert got == sorted((rid, b"v1" if (i // PARTITIONS) % 2 else b"v2") for i, rid in enumerate(ids))
    a.shutdown()
