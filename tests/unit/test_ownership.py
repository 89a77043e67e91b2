"""One owner per partition (``engine/ownership.py``) on the Kafka twin, on virtual time.

A member stopped past its session (a zombie) is expelled; the other member takes its partitions,
restores their pending records from the changelog and delivers them. When the zombie resumes, its
stores still hold those records, now due: its first turn must publish none of them (the gap makes
it prove its membership first, which the group refuses), and its next consume hands the
partitions back (the lost callback). Each record is delivered once.
"""

from __future__ import annotations

from pathlib import Path

from sidecar.engine.ownership import GAP_S
from tests.unit.helpers.world import PARTITIONS, World


def test_a_zombie_publishes_nothing_of_the_partitions_it_lost(tmp_path: Path) -> None:
    w = World(tmp_path)
    a = w.sidecar("a")
    b = w.sidecar("b")
    w.run([a, b], lambda: len(a.stores) == len(b.stores) == PARTITIONS // 2)
    w.send(40, lambda i: 5_000)
    w.run([a, b], lambda: a.counters.ingested + b.counters.ingested == 40
          and not a.durability.jobs and not b.durability.jobs)
    stopped_at = w.clock.monotonic()
    zombie_keys = set(a.stores)
    w.cluster.expel(a.kafka.consumer)  # a's session expired while it was stopped
    w.run([b], lambda: len(b.stores) == PARTITIONS and len(w.delivered()) == 40)
    assert w.clock.monotonic() - stopped_at >= GAP_S
    assert all(a.stores[k].pending() for k in zombie_keys)  # still holds the records b delivered

    a.turn()  # resumed: the gap is noticed, the group refuses the proof, nothing is published
    assert len(w.delivered()) == 40
    w.run([a], lambda: not a.stores)  # the lost callback hands the partitions back
    w.check(set(w.sent))
    assert len(w.delivered()) == 40
    for sc in (a, b):
        sc.shutdown()
