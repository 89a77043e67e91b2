"""The machine's memory latency beside the peers' throughput rounds: the noise floor their spreads
sit on.

On this 2-core VM a CPU-bound, memory-heavy peer's rate moved by 0.2-0.4 between rounds however
it was tuned (docs/benchmarks.md, streams-punctuator). :class:`MemoryProbe` runs
bench/probe/MemoryProbe.java beside the rounds: a dependent pointer chase over an array larger
than the caches, a short sample every :data:`PERIOD_MS` ms (each the same work, so what it
measures is the memory system's latency at that moment; its cost is about 1 % of one core).
Each system's drain in a round gets the probe's mean over its delivery window (``window_ms`` of
its result: first and last delivered timestamps), and :func:`machine_figures` sums a peer's rounds
up: the median latency during its drains, that latency's own spread over the rounds, and the
Pearson correlation between the peer's rate and it. A peer whose rate follows the machine's
memory latency (r near -1) moves with the machine, not with its own settings."""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.report import Figure, fig, spread
from bench.workload import LogProc, log, uid

SOURCE = Path(__file__).resolve().parent / "probe" / "MemoryProbe.java"
PERIOD_MS = 500
STEPS = 20_000  # 3-6 ms of chasing a sample at 150-300 ns a step
MIB = 64  # twice this VM's L3 (32 MiB): every step misses the caches
READY_TIMEOUT_S = 60  # the JDK compiling the source, the array's shuffle


class MemoryProbe(LogProc):
    """The probe's JVM (``java MemoryProbe.java``), its samples read from its log."""

    def __init__(self, workdir: Path) -> None:
        name = f"memory-probe-{uid()}"
        super().__init__(name, workdir / f"{name}.log")

    def start(self) -> None:
        self._spawn(["java", "-Xms96m", "-Xmx128m", "-XX:+UseSerialGC", str(SOURCE),
                     str(PERIOD_MS), str(STEPS), str(MIB)])
        self.wait_event("ready", READY_TIMEOUT_S)

    def samples(self) -> list[tuple[int, int, float]]:
        """(start ms, end ms, ns per step) of each sample so far."""
        return [(int(e["t0"]), int(e["t1"]), float(e["ns"])) for e in self.poll_events() if e.get("event") == "sample"]


@contextmanager
def probing(workdir: Path) -> Iterator[MemoryProbe | None]:
    """A :class:`MemoryProbe` running for the block; ``None`` where there is no ``java``."""
    if shutil.which("java") is None:
        log("memory probe: no java on PATH, the rounds' memory latency is not measured")
        yield None
        return
    probe = MemoryProbe(workdir)
    probe.start()
    try:
        yield probe
    finally:
        probe.stop()


def mean_between(samples: list[tuple[int, int, float]], window: tuple[int, int] | None) -> float | None:
    """The mean ns per step of the samples taken wholly within ``window`` (ms, inclusive)."""
    if window is None:
        return None
    inside = [ns for t0, t1, ns in samples if t0 >= window[0] and t1 <= window[1]]
    return statistics.fmean(inside) if inside else None


def annotate(one: dict[str, Any], samples: list[tuple[int, int, float]]) -> None:
    """Each system's result in round ``one`` gets ``memory_ns``: the probe's mean over its window."""
    for res in one.values():
        if isinstance(res, dict) and "window_ms" in res:
            res["memory_ns"] = mean_between(samples, res["window_ms"])


def summary(samples: list[tuple[int, int, float]]) -> dict[str, Any]:
    """The probe's settings and its samples' count and range, for a scenario's details."""
    ns = [s[2] for s in samples]
    return {"period_ms": PERIOD_MS, "steps": STEPS, "mib": MIB, "samples": len(ns),
            "median_ns": round(statistics.median(ns), 1) if ns else None,
            "min_ns": round(min(ns), 1) if ns else None, "max_ns": round(max(ns), 1) if ns else None}


def pearson(xs: list[float], ys: list[float]) -> float | None:
    """The correlation of paired values; ``None`` under three pairs or with a constant side."""
    if len(xs) < 3 or len(xs) != len(ys):
        return None
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return None


def machine_figures(rounds: list[dict[str, Any]], peer: str) -> dict[str, Figure]:
    """The memory latency during ``peer``'s drains over the rounds: its median, its spread
    (``(max - min) / median``, as the rates'), and its correlation with the peer's rate."""
    pairs = [(one[peer]["records_per_s"], one[peer].get("memory_ns")) for one in rounds]
    known = [(rate, ns) for rate, ns in pairs if rate and ns]
    lat = [ns for _, ns in known]
    med = statistics.median(lat) if lat else None
    r = pearson([rate for rate, _ in known], lat)
    note = f"the memory probe during the peer's drains, {len(lat)} of {len(rounds)} rounds"
    return {"memory_latency_ns": fig(med, "ns", note=note),
            "memory_latency_spread": fig(spread(lat), "x", note="(max - min) / median over the same rounds"),
            "rate_memory_latency_r": fig(r, "r", note="Pearson, the peer's rate against that latency")}
