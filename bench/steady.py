"""Scenario ``steady``: the sidecar's own main-thread CPU per record in a steady state, in-process.

Why: ``lateness`` runs the broker, the load generator and the sidecar on the same machine, so on
2 cores what it measures is the machine's headroom as much as the sidecar. This scenario takes
Kafka out and measures what one record costs the sidecar's loop thread when records arrive at a
steady rate and fall due 1-10 s later, the ``lateness`` workload, so the two schedulers (and builds)
can be compared on their own work. It needs no broker and starts no sidecar.

Method: the loop's own turn functions (``Ingress.ingest``, ``Publishing.publish``, ``poll``) and a real
``PartitionStore`` on a fresh data directory run in the bench process, single-threaded. An
in-process stand-in for the consumer hands the loop ``RATE`` records/s in real time, in 5 ms ticks
(the load generator's), each tick's records stamped with the wall clock as the broker's CreateTime
would be: 100 B value, a key, ``delay.target-topic`` and ``delay.ms`` — level times (1 s, 5 s,
10 s) for ``levels``, uniform 1-10 s in ms for ``wheel`` (so nearly every ms holds due records:
the wheel makes one pass per distinct due ms). A stand-in for the producer takes every produce
call and acks it at the next poll, with the poll's wall clock as the delivered record's timestamp.
Between turns the loop sleeps until the next due time or the next tick, like ``consume`` with the
loop's timeout. It checkpoints every ``commit-interval`` through the loop's own checkpoint path
(``fsync: batch``): the snapshot and the reclaim on the loop thread, the syncs and the checkpoint
write on the loop's flusher thread, whose CPU is not counted. The syncs matter to the loop thread
all the same: a page they wrote back is write-protected again, so the next write to it faults
(the id index is written at random places by both schedulers; the wheel took ~1.1 faults per
record with its acks inside the timer-log entries, ~0.8 since its timer log keeps the states
apart). The garbage collector is set as ``Sidecar.run`` sets it (``quiet_gc``).
The run ends when every record was acked. ``--max-delay D`` cuts the delays as it does for
``lateness`` (the smoke test's short run).

Figures per scheduler: main-thread CPU (``time.thread_time``) per record over the whole run, split
into ingest (consumed record -> store -> scheduler), publish (``due`` + produce calls + delivery
reports + acks and releases) and checkpoint; turns; and the in-process lateness of the acks
(p50 / p99 / max, and early). No goal: it is context for ``lateness`` (the fake clients cost
less than librdkafka's, so real per-record costs are higher).
"""

from __future__ import annotations

import gc
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.lateness import capped_delays
from bench.report import fig
from bench.workload import Bench, log, percentile, value_of, wall_ms
from sidecar import contract as c
from sidecar.config import Settings
from sidecar.engine.loop import INGEST_SLICE, Sidecar, quiet_gc
from sidecar.engine.stores import store_key
from sidecar.store.partition import TRIM_INTERVAL_S, PartitionStore

TICK_S = 0.005
LEVEL_DELAYS = (1_000, 5_000, 10_000)
WHEEL_DELAYS = (1_000, 10_000)
TARGET = b"bench.steady.out"


def plan(bench: Bench) -> tuple[float, float]:
    """(records/s, seconds of arrivals)."""
    return (40_000.0, 10.0) if bench.full else (5_000.0, 2.0)


class _Msg:
    """What the loop reads of a consumed message (confluent_kafka.Message's methods)."""

    __slots__ = ("_h", "_k", "_o", "_ts", "_v")

    def __init__(self, offset: int, key: bytes, value: bytes, headers: list[tuple[str, bytes]], ts: int = 0) -> None:
        self._o, self._k, self._v, self._h, self._ts = offset, key, value, headers, ts

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "in"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._o

    def timestamp(self) -> tuple[int, int]:
        return 1, self._ts

    def key(self) -> bytes:
        return self._k

    def value(self) -> bytes:
        return self._v

    def headers(self) -> list[tuple[str, bytes]]:
        return list(self._h)


class _Delivered:
    __slots__ = ("ts",)

    def __init__(self, ts: int) -> None:
        self.ts = ts

    def timestamp(self) -> tuple[int, int]:
        return 1, self.ts


class _Consumer:
    """What the loop's checkpoint path calls on the consumer: the offset commit, taken and dropped."""

    def commit(self, offsets: Any = None, asynchronous: bool = True) -> None:
        return None


class _Producer:
    """Takes produce calls (the client's positional order) and acks them all at the next poll."""

    def __init__(self) -> None:
        self.pending: list[Callable[[Any, Any], Any]] = []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = -1,
                callback: Any = None, on_delivery: Any = None, timestamp: int = 0, headers: Any = None) -> None:
        self.pending.append(callback or on_delivery)

    def poll(self, _timeout: float = 0) -> int:
        pending, self.pending = self.pending, []
        done = _Delivered(wall_ms())
        for cb in pending:
            cb(None, done)
        return len(pending)


def measure(workdir: Path, scheduler: str, rate: float, seconds: float,
            delays_ms: tuple[tuple[int, ...], tuple[int, int]] = (LEVEL_DELAYS, WHEEL_DELAYS)) -> dict[str, Any]:
    """One scheduler's run; ``delays_ms``: (the level times, the wheel's uniform range)."""
    levels, wheel = delays_ms
    d = Path(tempfile.mkdtemp(prefix=f"steady-{scheduler}-", dir=workdir))
    saved_gc = gc.get_threshold()
    sc: Sidecar | None = None
    try:
        s = Settings(scheduler=scheduler, data_dir=str(d), bootstrap_servers="127.0.0.1:9", ingress_topic="in")
        sc = Sidecar(s)
        st = PartitionStore(s.data_path, "in", 0, rules=sc.rules, scheduler_name=scheduler,
                            make_scheduler=sc.make_scheduler, segment_bytes=s.segment_bytes,
                            cancel_horizon_ms=s.cancel_horizon_ms, counters=sc.counters)
        st.open()
        sc.stores[store_key(st)] = st
        sc.pub.producer = _Producer()
        sc.kafka.consumer = _Consumer()  # the checkpoint path's offset commits
        n = int(rate * seconds)
        rng = random.Random(8)
        value = value_of(100)
        target = (c.TARGET_TOPIC, TARGET)
        delays = [str(rng.choice(levels) if scheduler == "levels" else rng.randint(*wheel)).encode()
                  for _ in range(n)]
        msgs = [_Msg(i, b"s%d" % i, value, [target, (c.DELAY_MS, delays[i])]) for i in range(n)]
        del delays
        # the loop's collector settings (``Sidecar.run``): with the default thresholds the
        # young-generation collections the delivery path's short-lived tuples trigger would be
        # counted here and not in the sidecar
        gc.collect()
        quiet_gc()
        commit_s = s.commit_interval_ms / 1000
        cpu = [0.0, 0.0, 0.0]  # ingest, publish, checkpoint
        turns = i = 0
        t0 = last = last_trim = time.monotonic()
        m0 = time.thread_time()
        deadline = t0 + seconds + max(wheel) / 1000 + 120
        while sc.counters.delivered < n:
            now_m = time.monotonic()
            if now_m > deadline:
                raise RuntimeError(f"steady {scheduler}: {sc.counters.delivered} of {n} acked in time")
            want = min(n, int((now_m - t0) / TICK_S) * int(rate * TICK_S))
            a = time.thread_time()
            if want > i:
                now = wall_ms()
                batch = msgs[i:want]
                for m in batch:
                    m._ts = now
                for j in range(0, len(batch), INGEST_SLICE):
                    sc.ingress.ingest(batch[j : j + INGEST_SLICE])
                i = want
            b = time.thread_time()
            sc.pub.publish()
            sc.pub.poll(0)
            turns += 1
            e = time.thread_time()
            cpu[0] += b - a
            cpu[1] += e - b
            if now_m - last >= commit_s:
                # the loop's own checkpoint path: snapshot here, the syncs and the checkpoint
                # write on its flusher thread (not this thread's CPU), finish here
                sc.durability.reap()
                sc.durability.checkpoint_all()
                last = now_m
            if now_m - last_trim >= TRIM_INTERVAL_S:
                sc.durability.trim_stores()  # on its own clock, as in the loop
                last_trim = now_m
            cpu[2] += time.thread_time() - e
            nxt = sc.pub.next_due()
            wait = TICK_S - (time.monotonic() - t0) % TICK_S if i < n else 0.1
            if nxt is not None:
                wait = min(wait, max(0.0, (nxt - wall_ms()) / 1000))
            time.sleep(wait)
        total = time.thread_time() - m0
        wall = time.monotonic() - t0
        late = sorted(st.lateness)
        sc.durability.await_job(store_key(st), commit=False)
        st.close()
        us = 1e6 / n
        return {
            "records": n,
            "cpu_us_per_record": round(total * us, 2),
            "ingest_us_per_record": round(cpu[0] * us, 2),
            "publish_us_per_record": round(cpu[1] * us, 2),
            "checkpoint_us_per_record": round(cpu[2] * us, 2),
            "turns": turns,
            "wall_s": round(wall, 1),
            "lateness_p50_ms": percentile(late, 50),
            "lateness_p99_ms": percentile(late, 99),
            "lateness_max_ms": float(late[-1]) if late else None,
            "early": sum(1 for x in late if x < 0),
        }
    finally:
        if sc is not None:
            sc.durability.close()
        gc.unfreeze()
        gc.set_threshold(*saved_gc)
        shutil.rmtree(d, ignore_errors=True)


def run(bench: Bench) -> dict[str, Any]:
    rate, seconds = plan(bench)
    delays_ms = capped_delays(bench)  # --max-delay: the smoke test's short tail
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for sched in bench.schedulers:
        log(f"steady {sched}: {rate:,.0f} records/s for {seconds:.0f} s, in-process")
        m = details[sched] = measure(bench.workdir, sched, rate, seconds, delays_ms)
        log(f"steady {sched}: {m['cpu_us_per_record']} us/record (ingest {m['ingest_us_per_record']}, "
            f"publish {m['publish_us_per_record']}, checkpoint {m['checkpoint_us_per_record']}), {m['turns']} turns")
        results[sched] = {
            "cpu_us_per_record": fig(m["cpu_us_per_record"], "us/record"),
            "ingest_us_per_record": fig(m["ingest_us_per_record"], "us/record"),
            "publish_us_per_record": fig(m["publish_us_per_record"], "us/record"),
            "early": fig(m["early"], "records", "== 0"),
        }
    return {
        "method": "in-process, no broker: the loop's turn functions and a real store, a stand-in consumer handing "
                  "records over at a steady rate in 5 ms ticks (delays 1-10 s) and a stand-in producer acking at "
                  "the next poll; main-thread CPU per record over arrivals + drain",
        "settings": {"rate": rate, "seconds": seconds, "tick_s": TICK_S, "record_bytes": 100,
                     "level_delays_ms": list(delays_ms[0]), "wheel_delays_ms": list(delays_ms[1]),
                     "schedulers": bench.schedulers},
        "results": results,
        "details": details,
        "notes": ["no goal: context for lateness (what one record costs the loop thread without Kafka); the "
                  "stand-in clients cost less than librdkafka's"],
    }
