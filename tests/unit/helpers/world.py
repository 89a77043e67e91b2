"""The loop's world on virtual time: the in-memory Kafka twin (``tests/kafka_twin.py``), its
virtual clock, an ingress topic of ``PARTITIONS`` partitions (or one per tenant: ``tenants``, each
with its own DLQ ``<topic>.dlq``) and a one-partition target topic, and the real ``Sidecar``
started on it (``World.sidecar``). ``World.run`` turns sidecars until a
condition holds; ``World.check`` asserts nothing early and nothing twice.

Tests of the loop (tests/unit/test_loop_twin.py and others) build one per test; the fixture that
restores the collector settings ``Sidecar.start`` changes is in ``tests/unit/conftest.py``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar import contract as c
from sidecar.config import Settings
from sidecar.engine.loop import Sidecar
from sidecar.health import HealthServer
from sidecar.metrics import Metrics
from sidecar.tenants import TenantSpec
from tests.kafka_twin import TwinClients, TwinCluster, TwinMessage, VirtualClock

INGRESS, TARGET, GROUP = "in", "out", "g"
PARTITIONS = 4


class World:
    def __init__(self, root: Path, tenants: tuple[str, ...] = (), partitions: int = PARTITIONS) -> None:
        """``tenants``: ingress topics, one tenant each (named after it); none: the one ``INGRESS``."""
        self.root = root
        self.clock = VirtualClock()
        self.cluster = TwinCluster(self.clock)
        self.clients = TwinClients(self.cluster)
        self.tenants = tenants
        self.partitions = partitions
        for topic in tenants or (INGRESS,):
            self.cluster.create_topic(topic, partitions)
        self.cluster.create_topic(TARGET, 1)
        self.sent: dict[bytes, int] = {}  # id -> requested due time

    def sidecar(self, name: str, **extra: Any) -> Sidecar:
        specs = tuple(TenantSpec(t, t, dlq_topic=f"{t}.dlq") for t in self.tenants)
        s = Settings(
            bootstrap_servers="twin:9092", data_dir=str(self.root / name), ingress_topic=INGRESS, group_id=GROUP,
            ingress_partitions=self.partitions,
            **{"commit_interval_ms": 200, "helper_threads": "none", "tenant_specs": specs, **extra},
        )
        metrics = Metrics(ingress_topic=INGRESS, scheduler=s.scheduler, tenants=[t.name for t in s.tenants])
        health = HealthServer("127.0.0.1", 0, metrics, clock=self.clock.monotonic)
        sc = Sidecar(s, metrics=metrics, health=health, clock=self.clock, clients=self.clients)
        sc.start()
        return sc

    def send(self, n: int, delay_ms: Callable[[int], int], prefix: str = "r", topic: str = INGRESS,
             target: str = TARGET) -> None:
        for i in range(n):
            rid = f"{prefix}{i}".encode()
            d = delay_ms(i)
            if target == TARGET:
                self.sent[rid] = self.clock.now_ms + d
            self.cluster.append(topic, i % self.partitions, b"k%d" % i, b"v%d" % i, [
                (c.TARGET_TOPIC, target.encode()), (c.DELAY_MS, str(d).encode()), (c.ID, rid),
            ])

    def delivered(self) -> list[TwinMessage]:
        return self.cluster.records(TARGET)

    def run(self, sidecars: list[Sidecar], until: Callable[[], bool], max_turns: int = 20_000) -> None:
        for _ in range(max_turns):
            if until():
                return
            for sc in sidecars:
                sc.turn()
                # the disk is instant in virtual time: a checkpoint job started in this turn is
                # done before the clock moves on (the next turn reaps it and commits)
                for _store, _job, fut, _written in list(sc.durability.jobs.values()):
                    fut.result()
        raise AssertionError(f"condition not reached in {max_turns} turns")

    def run_beside(self, sc: Sidecar, ask: Callable[[], None], until: Callable[[], bool]) -> None:
        """Turn ``sc`` until ``until()`` while another thread calls ``ask()`` over and over (an HTTP
        thread's look-ups); re-raise what ``ask`` raised."""
        errors: list[BaseException] = []
        stop = threading.Event()

        def loop() -> None:
            try:
                while not stop.is_set():
                    ask()
                    stop.wait(0.002)
            except BaseException as e:  # reported by the test thread
                errors.append(e)

        t = threading.Thread(target=loop)
        t.start()
        try:
            self.run([sc], until)
        finally:
            stop.set()
            t.join(10)
        assert not errors, errors

    def check(self, expect_ids: set[bytes] | None = None) -> Counter[bytes]:
        """Nothing early (checked on the delivered record's own timestamp), each id at most once."""
        seen: Counter[bytes] = Counter()
        for m in self.delivered():
            h = dict(m.headers() or [])
            rid = h[c.ID]
            assert rid is not None
            due = int(h[c.DELIVER_AT] or b"0")
            assert m.timestamp()[1] >= due, f"{rid!r} delivered {due - m.timestamp()[1]} ms early"
            assert due == self.sent[rid]
            seen[rid] += 1
        dup = {k: n for k, n in seen.items() if n > 1}
        assert not dup, f"delivered more than once: {dup}"
        if expect_ids is not None:
            assert set(seen) == expect_ids, f"missing: {sorted(expect_ids - set(seen))[:5]}"
        return seen


def committed(w: World) -> dict[int, int]:
    return {p: off for (g, t, p), off in w.cluster.committed.items() if g == GROUP and t == INGRESS}


def parts(sc: Sidecar, topic: str = INGRESS) -> set[int]:
    """The partitions of ``topic`` whose stores ``sc`` holds."""
    return {k.partition for k in sc.stores if k.topic == topic}
