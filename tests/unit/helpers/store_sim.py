"""One partition's store driven by hand (``Sim``): records sent to an in-memory ingress, consumed
and published when the test says, on a clock it moves (``now``), with crashes (unmap without a
checkpoint) and graceful restarts. ``Sim.delivered`` lists what left, with its due and actual
times. Tests of the store's behaviour (test_partition_store.py, test_reschedule.py, ...) build one.

``make_store`` opens a store the test drives directly (its own ingests and scheduler calls), with
4 MiB segments and optionally a page thread.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from sidecar import contract as c
from sidecar.levels.scheduler import LevelsScheduler
from sidecar.scheduling import Scheduler
from sidecar.store import codec
from sidecar.store.idindex import id_hash
from sidecar.store.log import CommitLog
from sidecar.store.mapped import PageWorker
from sidecar.store.partition import Counters, IngressRecord, PartitionStore, compile_rules
from sidecar.wheel import WheelScheduler

LEVELS = (1000, 5000, 10_000)
T0 = 1_700_000_000_000
TOPIC = "in"


@dataclass
class Delivery:
    rid: bytes
    topic: str
    due_ms: int
    at_ms: int
    headers: list[tuple[str, bytes | None]]


@dataclass
class Sim:
    root: Path
    segment_bytes: int = 8192
    entries_per_file: int = 16
    horizon_ms: int = 60_000
    now: int = T0
    ingress: list[IngressRecord] = field(default_factory=list)
    position: int = 0
    delivered: list[Delivery] = field(default_factory=list)
    in_flight: list[tuple[int, bytes]] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    store: PartitionStore | None = None
    opens: int = 0
    scheduler: str = "levels"

    def __post_init__(self) -> None:
        self.open()

    # -- lifecycle ------------------------------------------------------------------------------
    def open(self) -> None:
        rules = compile_rules(
            TOPIC, "dlq", LEVELS, max_delay_ms=10**9, retry_ladder_ms=(1000, 5000), max_retries=3,
            max_record_bytes=4000, allowlist=(),
        )
        if self.scheduler == "wheel":
            make = lambda d, lg: WheelScheduler(  # noqa: E731
                d, lg, precision_ms=10, window_ms=60_000, bucket_width_ms=30_000, levels_ms=LEVELS,
                entries_per_file=self.entries_per_file,
            )
        else:
            make = lambda d, lg: LevelsScheduler(d, lg, LEVELS, entries_per_file=self.entries_per_file)  # noqa: E731
        self.store = PartitionStore(
            self.root, TOPIC, 0, rules=rules, scheduler_name=self.scheduler, make_scheduler=make,
            segment_bytes=self.segment_bytes, cancel_horizon_ms=self.horizon_ms, counters=self.counters,
        )
        resume = self.store.open()
        self.position = resume or 0
        self.in_flight = []
        self.opens += 1

    @property
    def st(self) -> PartitionStore:
        assert self.store is not None
        return self.store

    def crash(self) -> None:
        """SIGKILL: unmap without a checkpoint; in-flight deliveries are never acknowledged."""
        self.st.close()
        self.open()

    def restart(self) -> None:
        """Graceful: acknowledge what is in flight, checkpoint, close, reopen."""
        self.ack_all()
        self.st.checkpoint()
        self.st.close()
        self.open()

    # -- producing to the ingress ---------------------------------------------------------------
    def send(self, rid: str | None = None, *, delay_ms: int | None = None, level: int | None = None,
             cancel: str | None = None, target: str = "target", extra: list[tuple[str, bytes]] | None = None,
             ts: int | None = None) -> int:
        headers: list[tuple[str, bytes | None]] = []
        if cancel is not None:
            headers.append((c.CANCEL, cancel.encode()))
        else:
            headers.append((c.TARGET_TOPIC, target.encode()))
            if delay_ms is not None:
                headers.append((c.DELAY_MS, str(delay_ms).encode()))
            if level is not None:
                headers.append((c.LEVEL, str(level).encode()))
            if rid is not None:
                headers.append((c.ID, rid.encode()))
        headers += extra or []
        off = len(self.ingress)
        self.ingress.append(IngressRecord(TOPIC, 0, off, self.now if ts is None else ts, b"k", b"v%d" % off, headers))
        return off

    # -- the loop -------------------------------------------------------------------------------
    def consume(self, limit: int = 1_000_000) -> None:
        end = min(len(self.ingress), self.position + limit)
        for m in self.ingress[self.position : end]:
            self.st.ingest(m, self.now)
        self.position = end

    def publish(self, ack: bool = True, limit: int = 1_000_000) -> list[Delivery]:
        out = []
        for ref, rec in self.st.sched.due(self.now, limit):
            assert rec.due_ms <= self.now, "never handed out early"
            d = Delivery(
                bytes(rec.id), bytes(rec.topic).decode(), rec.due_ms, self.now, codec.decode_headers(rec.headers)
            )
            out.append(d)
            self.delivered.append(d)
            self.in_flight.append((ref, bytes(rec.id)))
        if ack:
            self.ack_all()
        return out

    def ack_all(self) -> None:
        for ref, rid in self.in_flight:
            self.st.delivered(ref, id_hash(rid))
        self.in_flight = []

    def ack_some(self, rng: random.Random) -> None:
        rng.shuffle(self.in_flight)
        k = rng.randint(0, len(self.in_flight))
        for ref, rid in self.in_flight[:k]:
            self.st.delivered(ref, id_hash(rid))
        self.in_flight = self.in_flight[k:]

    def step(self, ms: int) -> None:
        self.now += ms
        self.consume()
        self.publish()

    def run_until_idle(self, max_ms: int = 60_000, step: int = 100) -> None:
        end = self.now + max_ms
        while self.now < end:
            self.step(step)
            if not self.st.pending() and not self.in_flight:
                break
        self.st.checkpoint()

    def ids_delivered(self, topic: str = "target") -> list[bytes]:
        return [d.rid for d in self.delivered if d.topic == topic]


def make_store(root: Path, scheduler: str, counters: Counters, partition: int = 0,
               pages: PageWorker | None = None, entries_per_file: int = 4096) -> PartitionStore:
    rules = compile_rules(
        "in", "dlq", LEVELS, max_delay_ms=10**9, retry_ladder_ms=(1000,), max_retries=3, max_record_bytes=8000,
        allowlist=(),
    )

    def make(d: Path, lg: CommitLog) -> Scheduler:
        if scheduler == "levels":
            return LevelsScheduler(d, lg, LEVELS, entries_per_file=entries_per_file)
        return WheelScheduler(d, lg, precision_ms=10, window_ms=60_000, bucket_width_ms=30_000,
                              levels_ms=LEVELS, entries_per_file=entries_per_file)

    store = PartitionStore(root, "in", partition, rules=rules, scheduler_name=scheduler, make_scheduler=make,
                           segment_bytes=4 << 20, cancel_horizon_ms=60_000, counters=counters, pages=pages)
    store.open()
    return store
