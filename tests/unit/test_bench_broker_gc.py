"""The bench's broker GC pauses (``bench.workload.broker_gc_pauses``): read from the JVM's unified
GC log as ``LocalKafka(gc_log=True)`` writes it, by wall-clock end, every kind of pause."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from bench.workload import Bench, broker_gc_pauses

LOG = """\
[2026-11-29T20:38:08.000+0000][1.000s] Using G1
[2026-11-29T20:38:08.662+0000][728.997s] GC(543) Pause Young (Normal) (G1 Evacuation Pause) 173M->98M(197M) 20.507ms
[2026-11-29T20:38:09.100+0000][729.400s] GC(544) Pause Young (Prepare Mixed) (G1 Evacuation Pause) 170M->99M(197M) 3.1ms
[2026-11-29T20:38:09.200+0000][729.500s] GC(544) Concurrent Mark Cycle
[2026-11-29T20:38:10.300+0000][730.600s] GC(544) Pause Remark 120M->118M(197M) 1.250ms
[2026-11-29T20:58:55.400+0000][1975.1s] GC(2725) Pause Young (Normal) (G1 Evacuation Pause) 173M->157M(197M) 315.817ms
[2026-11-29T20:58:55.9
"""


@dataclass
class _Broker:
    gc_log_path: Path | None


def _ms(stamp: str) -> int:
    return int(datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() * 1000)


def _bench(broker: Any) -> Bench:
    return cast(Bench, type("B", (), {"broker": broker})())


def test_pauses_in_the_window_by_their_end(tmp_path: Path) -> None:
    log = tmp_path / "gc.log"
    log.write_text(LOG)
    bench = _bench(_Broker(log))
    every = broker_gc_pauses(bench, 0, 2**62)
    assert [ms for _, ms in every] == [20.507, 3.1, 1.25, 315.817], "pauses only, a torn last line skipped"
    assert every[0][0] == _ms("2026-11-29T20:38:08.662+0000")
    window = broker_gc_pauses(bench, _ms("2026-11-29T20:38:09.000+0000"), _ms("2026-11-29T20:38:10.300+0000"))
    assert [ms for _, ms in window] == [3.1, 1.25]


ZGC_LOG = """\
[2026-11-29T23:42:57.276+0000][0.263s] Using The Z Garbage Collector
[2026-11-29T23:43:01.091+0000][4.078s] GC(2) Pause Mark Start 0.006ms
[2026-11-29T23:43:01.162+0000][4.149s] GC(2) Concurrent Mark 70.762ms
[2026-11-29T23:43:01.162+0000][4.149s] GC(2) Pause Mark End 0.014ms
[2026-11-29T23:43:01.184+0000][4.171s] GC(2) Pause Relocate Start 0.008ms
[2026-11-29T23:43:01.205+0000][4.192s] GC(2) Garbage Collection (Warmup) 206M(20%)->114M(11%)
[2026-11-29T23:43:02.000+0000][5.000s] Allocation Stall (data-plane-kafka-request-handler-0) 12.500ms
[2026-11-29T23:43:02.100+0000][5.100s] GC(3) Allocation Stall (main) 3.250ms
"""


def test_zgc_pauses_and_allocation_stalls(tmp_path: Path) -> None:
    """LocalKafka(gc="zgc") logs gc+phases: its three pauses per cycle, and a thread's allocation
    stall (that request waits); its concurrent phases are not pauses."""
    log = tmp_path / "gc.log"
    log.write_text(ZGC_LOG)
    assert [ms for _, ms in broker_gc_pauses(_bench(_Broker(log)), 0, 2**62)] == [0.006, 0.014, 0.008, 12.5, 3.25]


def test_no_log_no_pauses(tmp_path: Path) -> None:
    assert broker_gc_pauses(_bench(None), 0, 2**62) == [], "an external broker"
    assert broker_gc_pauses(_bench(_Broker(None)), 0, 2**62) == [], "started without gc_log"
    assert broker_gc_pauses(_bench(_Broker(tmp_path / "missing.log")), 0, 2**62) == []
