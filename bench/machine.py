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
memory latency (r near -1) moves with the machine, not with its own settings.

Each sample times two chases (:data:`LEVELS`): the large one (``memory``: DRAM, every step a
miss) and one over :data:`CACHE_MIB` MiB walked twice, the second walk timed (``cache``: a
working set that lives in the shared last-level cache while this VM has it, as a server's hash
table or a JVM's young generation does). Other tenants of the host take that cache at times: idle,
a C build of the two chases saw the small one's step go from 22-27 ns to 134 ns within minutes
while the large one's moved by 29 %, so a cache-resident process can slow far more than the DRAM
latency says."""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from bench.report import Figure, fig, spread
from bench.workload import LogProc, log, uid

SOURCE = Path(__file__).resolve().parent / "probe" / "MemoryProbe.java"
PERIOD_MS = 500
STEPS = 20_000  # 3-6 ms of chasing a sample at 150-300 ns a step
MIB = 64  # twice this VM's L3 (32 MiB): every step misses the caches
CACHE_MIB = 4  # an eighth of the L3: it stays there unless other tenants take the cache
READY_TIMEOUT_S = 60  # the JDK compiling the source, the array's shuffle
# (name, the sample's field, the key a drain's result gets) for each chase
LEVELS = (("memory", "ns", "memory_ns"), ("cache", "cache_ns", "cache_ns"))


class Sample(NamedTuple):
    t0: int  # wall ms before the chases
    t1: int  # ... and after
    ns: float  # ns per step of the large chase
    cache_ns: float  # ... and of the cache-sized one


class MemoryProbe(LogProc):
    """The probe's JVM (``java MemoryProbe.java``), its samples read from its log."""

    def __init__(self, workdir: Path) -> None:
        name = f"memory-probe-{uid()}"
        super().__init__(name, workdir / f"{name}.log")

    def start(self) -> None:
        self._spawn(["java", "-Xms96m", "-Xmx128m", "-XX:+UseSerialGC", str(SOURCE),
                     str(PERIOD_MS), str(STEPS), str(MIB), str(CACHE_MIB)])
        self.wait_event("ready", READY_TIMEOUT_S)

    def samples(self) -> list[Sample]:
        """Each sample so far."""
        return [Sample(int(e["t0"]), int(e["t1"]), float(e["ns"]), float(e["cache_ns"]))
                for e in self.poll_events() if e.get("event") == "sample"]


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


def mean_between(samples: list[Sample], window: tuple[int, int] | None, field: str = "ns") -> float | None:
    """The mean of ``field`` (ns per step) over the samples taken wholly within ``window`` (ms,
    inclusive)."""
    if window is None:
        return None
    inside = [getattr(s, field) for s in samples if s.t0 >= window[0] and s.t1 <= window[1]]
    return statistics.fmean(inside) if inside else None


def annotate(one: dict[str, Any], samples: list[Sample]) -> None:
    """Each system's result in round ``one`` gets ``memory_ns`` and ``cache_ns``: each chase's
    mean over its window."""
    for res in one.values():
        if isinstance(res, dict) and "window_ms" in res:
            for _, field, key in LEVELS:
                res[key] = mean_between(samples, res["window_ms"], field)


def summary(samples: list[Sample]) -> dict[str, Any]:
    """The probe's settings and its samples' count and range, for a scenario's details."""
    out: dict[str, Any] = {"period_ms": PERIOD_MS, "steps": STEPS, "mib": MIB, "cache_mib": CACHE_MIB,
                           "samples": len(samples)}
    for name, field, _ in LEVELS:
        ns = [getattr(s, field) for s in samples]
        prefix = "" if name == "memory" else f"{name}_"
        out |= {f"{prefix}median_ns": round(statistics.median(ns), 1) if ns else None,
                f"{prefix}min_ns": round(min(ns), 1) if ns else None,
                f"{prefix}max_ns": round(max(ns), 1) if ns else None}
    return out


def pearson(xs: list[float], ys: list[float]) -> float | None:
    """The correlation of paired values; ``None`` under three pairs or with a constant side."""
    if len(xs) < 3 or len(xs) != len(ys):
        return None
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return None


def machine_figures(rounds: list[dict[str, Any]], peer: str) -> dict[str, Figure]:
    """For each chase (``memory``, ``cache``), its latency during ``peer``'s drains over the
    rounds: the median, its spread (``(max - min) / median``, as the rates'), and its correlation
    with the peer's rate."""
    out: dict[str, Figure] = {}
    for name, _, key in LEVELS:
        pairs = [(one[peer]["records_per_s"], one[peer].get(key)) for one in rounds]
        known = [(rate, ns) for rate, ns in pairs if rate and ns]
        lat = [ns for _, ns in known]
        med = statistics.median(lat) if lat else None
        r = pearson([rate for rate, _ in known], lat)
        note = f"the {name} probe during the peer's drains, {len(lat)} of {len(rounds)} rounds"
        out |= {f"{name}_latency_ns": fig(med, "ns", note=note),
                f"{name}_latency_spread": fig(spread(lat), "x", note="(max - min) / median over the same rounds"),
                f"rate_{name}_latency_r": fig(r, "r", note="Pearson, the peer's rate against that latency")}
    return out
