"""Scenario ``append``: the storage engine's append throughput (records/s and MB/s) for 100 B and
1 KB records under each fsync policy (``batch``, ``interval``, ``none``).

This measures the store, not Kafka: it runs in the bench process itself, needs no broker and
starts no sidecar. Each cell (record size x policy x layer) gets a fresh data directory under the
work directory, removed when the cell is done. Two layers are measured, both reported:

* ``log`` — :meth:`CommitLog.append` alone: N records with a pre-built key (16 B), value (100 B
  or 1 KB), headers blob (one ``traceparent`` user header) and target topic (60 B), and a 60 B
  record id that differs per record; the due time is the batch's clock + 30 min. The policy's
  flush + checkpoint is what :meth:`PartitionStore.checkpoint` does for the log: msync the
  appended range (``batch``/``interval``), write the checkpoint (durable: temp file, fsync,
  rename, directory fsync; ``none``: temp file + rename), reclaim.
* ``store`` — the whole intake path, :meth:`PartitionStore.ingest` of
  :class:`IngressRecord` s as the loop builds them from consumed messages, with real headers that
  are parsed and validated (``delay.target-topic`` = the 60 B topic, ``delay.ms`` = 30 min,
  ``delay.id`` = the 60 B id, plus the ``traceparent`` user header passed through): duplicate-id
  lookup, planning, commit-log append, scheduling, id index; the flush + checkpoint is
  :meth:`PartitionStore.checkpoint` (data -> scheduler files -> id index -> checkpoint), for each
  scheduler measured (``levels`` and ``wheel`` by default). With a 30 min delay nothing falls due,
  so nothing is published or released during the measurement.

Both layers write the same log records (the same bytes per record), and both take the records in
batches of the loop's ``batch-size`` (1 000). The cadence is the loop's, on the time the store is
busy: after every batch, once ``commit-interval`` (1 s) has passed since the last commit tick,
``batch`` and ``none`` checkpoint; ``interval`` checkpoints only if ``fsync-interval`` (1 s) has
also passed since its last checkpoint (``Sidecar.run`` / ``_checkpoint_all``). A final checkpoint
ends every cell (the loop's shutdown checkpoint), so under ``batch`` and ``interval`` all N records
are msynced when the clock stops. The clock runs only while records are appended or checkpointed:
building a batch of ``IngressRecord`` s (librdkafka's and the loop's work in a real sidecar) is
outside it, so the rate is the store's capacity with intake running back to back.

Figures per cell: ``records_per_s`` = N / busy seconds; ``payload_mb_per_s`` = N x payload bytes
/ busy seconds / 10^6, payload = key + value + every ingress header's name and value (what the
``max-record-bytes`` check counts); ``log_bytes_per_record`` = how far the log head moved per
record (the encoded record, 8-byte aligned, plus the segment headers and sealed tails of any roll);
``checkpoints`` = flush + checkpoint operations done, the final one included;
``flush_checkpoint_p50_ms`` / ``_p99_ms`` = their duration (for ``none`` that is the checkpoint
write alone, with no msync/fsync). No goal: issue #3 states none for append, so every figure is
context (``goal`` null).

Sizes: ``small`` N = 20 000 per cell (a ``log`` cell then runs for less than one commit interval,
so only the final checkpoint happens: ``batch`` and ``interval`` cannot differ there); ``full``
N = 1 000 000 per cell, each cell capped at 90 s of busy time (a cell that stops short reports the
rate over the records it appended and ``notes`` say so).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.report import fig
from bench.workload import RECORD_SIZES, Bench, BenchError, disk_usage, log, percentile, value_of, wall_ms
from sidecar import contract as c
from sidecar.config import Settings
from sidecar.engine.loop import make_scheduler_factory
from sidecar.store import checkpoint, codec
from sidecar.store.codec import encode_headers
from sidecar.store.log import CommitLog
from sidecar.store.partition import Counters, IngressRecord, PartitionStore, compile_rules

POLICIES = ("batch", "interval", "none")
DEFAULTS = Settings()
BATCH = DEFAULTS.batch_size
DELAY_MS = 1_800_000  # 30 min: a level time, inside the wheel's window; nothing falls due
BUDGET_FULL_S = 90.0  # busy seconds per cell at --size full

INGRESS = "bench.append.ingress"
TARGET = b"bench.append.target." + b"t" * 40  # 60 bytes
ID_PREFIX = b"bench-append-record-id-" + b"i" * 25  # + 12 digits = 60 bytes
KEY = b"customer-0000042"  # 16 bytes
TRACEPARENT = ("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")


def records_for(bench: Bench) -> int:
    return 1_000_000 if bench.full else 20_000


def record_id(i: int) -> bytes:
    return ID_PREFIX + b"%012d" % i


def ingress_headers(i: int) -> list[tuple[str, bytes | None]]:
    return [TRACEPARENT, (c.TARGET_TOPIC, TARGET), (c.DELAY_MS, str(DELAY_MS).encode()), (c.ID, record_id(i))]


def payload_bytes(value_size: int) -> int:
    """key + value + headers (names and values) of one ingress record, as ``ingest`` counts them."""
    return len(KEY) + value_size + sum(len(k) + len(v or b"") for k, v in ingress_headers(0))


@dataclass
class Cadence:
    """The loop's checkpoint timing (``Sidecar.run`` + ``_checkpoint_all``) on a given clock."""

    policy: str
    commit_s: float
    fsync_interval_s: float
    last_commit: float = 0.0
    last_fsync: float = float("-inf")

    def tick(self, now: float) -> bool:
        """Called after every batch: does the loop flush + checkpoint now?"""
        if now - self.last_commit < self.commit_s:
            return False
        self.last_commit = now
        if self.policy == "interval" and now - self.last_fsync < self.fsync_interval_s:
            return False
        self.last_fsync = now
        return True


@dataclass
class Run:
    n: int = 0
    busy_s: float = 0.0
    wall_s: float = 0.0
    sync_s: list[float] = field(default_factory=list)
    capped: bool = False


def drive(n: int, build: Callable[[int, int], Sequence[Any]], ingest: Callable[[Sequence[Any]], None],
          sync: Callable[[], None], cadence: Cadence, budget_s: float | None) -> Run:
    """Feed ``n`` records in batches of ``BATCH``; the clock counts only ``ingest`` and ``sync``."""
    run = Run()
    t_start = time.perf_counter()
    for start in range(0, n, BATCH):
        batch = build(start, min(BATCH, n - start))
        t0 = time.perf_counter()
        ingest(batch)
        run.busy_s += time.perf_counter() - t0
        run.n += len(batch)
        if cadence.tick(run.busy_s):
            t0 = time.perf_counter()
            sync()
            run.sync_s.append(time.perf_counter() - t0)
            run.busy_s += run.sync_s[-1]
        if budget_s is not None and run.busy_s >= budget_s and run.n < n:
            run.capped = True
            break
    t0 = time.perf_counter()
    sync()  # the shutdown checkpoint
    run.sync_s.append(time.perf_counter() - t0)
    run.busy_s += run.sync_s[-1]
    run.wall_s = time.perf_counter() - t_start
    return run


def measure_log(directory: Path, n: int, value_size: int, cadence: Cadence, budget_s: float | None) -> dict[str, Any]:
    fsync = cadence.policy != "none"
    lg = CommitLog(directory, DEFAULTS.segment_bytes)
    for _ in lg.recover(None, None):
        pass
    value = value_of(value_size)
    blob = encode_headers([TRACEPARENT])
    head0 = lg.head

    def build(start: int, k: int) -> list[tuple[int, bytes]]:
        return [(i, record_id(i)) for i in range(start, start + k)]

    offset = 0  # next ingress offset, as the checkpoint names it

    def ingest(batch: Sequence[tuple[int, bytes]]) -> None:
        nonlocal offset
        now = wall_ms()
        due = now + DELAY_MS
        for off, rid in batch:
            lg.append(
                codec.head(
                    rtype=codec.MESSAGE, due_ms=due, enqueue_ms=now, src_offset=off, src_partition=0,
                    target_partition=-1, retry_count=0, level=0,
                ),
                rid, TARGET, KEY, value, blob,
            )
        offset = batch[-1][0] + 1

    def sync() -> None:
        if fsync:
            lg.flush()
        checkpoint.write(directory, {"topic": INGRESS, "partition": 0, "ingress_offset": offset,
                                     "log": lg.state()}, durable=fsync)
        lg.reclaim()

    try:
        run = drive(n, build, ingest, sync, cadence, budget_s)
        log_bytes = lg.head - head0
        appended = lg.appended
    finally:
        lg.close()
    if appended != run.n:
        raise BenchError(f"append log: {appended} records appended, expected {run.n}")
    return _cell(run, value_size, log_bytes, directory, {"appended": appended})


def open_store(directory: Path, settings: Settings) -> tuple[PartitionStore, Counters]:
    """Partition 0 of ``settings.ingress_topic`` in ``directory``, opened as the loop opens one."""
    rules = compile_rules(settings.ingress_topic, settings.dlq_topic, settings.levels_ms, settings.max_delay_ms,
                          settings.retry_ladder_ms, settings.max_retries, settings.max_record_bytes,
                          settings.target_allowlist)
    counters = Counters()
    store = PartitionStore(directory, settings.ingress_topic, 0, rules=rules, scheduler_name=settings.scheduler,
                           make_scheduler=make_scheduler_factory(settings), segment_bytes=settings.segment_bytes,
                           cancel_horizon_ms=settings.cancel_horizon_ms, counters=counters,
                           durable=settings.fsync != "none")
    store.open()
    return store, counters


def measure_store(directory: Path, n: int, value_size: int, scheduler: str, cadence: Cadence,
                  budget_s: float | None) -> dict[str, Any]:
    store, counters = open_store(directory, Settings(scheduler=scheduler, fsync=cadence.policy,
                                                     ingress_topic=INGRESS))
    value = value_of(value_size)
    fsync = cadence.policy != "none"
    head0 = store.log.head

    def build(start: int, k: int) -> list[IngressRecord]:
        ts = wall_ms()
        return [IngressRecord(INGRESS, 0, i, ts, KEY, value, ingress_headers(i)) for i in range(start, start + k)]

    def ingest(batch: Sequence[IngressRecord]) -> None:
        now = wall_ms()
        for m in batch:
            store.ingest(m, now)

    try:
        run = drive(n, build, ingest, lambda: store.checkpoint(fsync=fsync), cadence, budget_s)
        log_bytes = store.log.head - head0
        pending = sum(store.pending().values())
    finally:
        store.close()
    dlq = sum(counters.dlq.values())
    if counters.scheduled != run.n or pending != run.n:
        raise BenchError(f"append store {scheduler}: {counters.scheduled} scheduled, {pending} pending, {dlq} "
                         f"dead-lettered, {counters.duplicates} duplicates of {run.n} ingested")
    return _cell(run, value_size, log_bytes, directory, {"scheduled": counters.scheduled, "pending": pending,
                                                         "dlq": dlq})


def _cell(run: Run, value_size: int, log_bytes: int, directory: Path, extra: dict[str, Any]) -> dict[str, Any]:
    alloc, apparent = disk_usage(directory)
    sync_ms = sorted(s * 1000 for s in run.sync_s)
    payload = payload_bytes(value_size)
    return {
        "n": run.n, "busy_s": run.busy_s, "wall_s": run.wall_s, "capped": run.capped,
        "records_per_s": run.n / run.busy_s, "payload_bytes_per_record": payload,
        "payload_mb_per_s": run.n * payload / run.busy_s / 1e6, "log_bytes_per_record": log_bytes / run.n,
        "log_mb_per_s": log_bytes / run.busy_s / 1e6, "checkpoints": len(sync_ms),
        "flush_checkpoint_ms": {"p50": percentile(sync_ms, 50), "p99": percentile(sync_ms, 99),
                                "max": sync_ms[-1], "total": sum(sync_ms)},
        "disk_allocated": alloc, "disk_apparent": apparent, **extra,
    }


def figures(d: dict[str, Any]) -> dict[str, Any]:
    return {
        "records_per_s": fig(d["records_per_s"], "records/s"),
        "payload_mb_per_s": fig(d["payload_mb_per_s"], "MB/s"),
        "log_bytes_per_record": fig(d["log_bytes_per_record"], "B"),
        "checkpoints": fig(d["checkpoints"], "checkpoints"),
        "flush_checkpoint_p50_ms": fig(d["flush_checkpoint_ms"]["p50"], "ms"),
        "flush_checkpoint_p99_ms": fig(d["flush_checkpoint_ms"]["p99"], "ms"),
    }


def measure(workdir: Path, n: int, schedulers: Sequence[str], budget_s: float | None = None,
            commit_interval_ms: int = DEFAULTS.commit_interval_ms,
            fsync_interval_ms: int = DEFAULTS.fsync_interval_ms) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Every cell: ``(results, details, notes)``. ``results[size][policy]`` holds ``log`` and
    ``store.<scheduler>``, each a set of figures."""
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    notes: list[str] = []
    for label, size in RECORD_SIZES.items():
        for policy in POLICIES:
            res: dict[str, Any] = {}
            det: dict[str, Any] = {}
            for layer in ("log", *schedulers):
                cell_dir = Path(tempfile.mkdtemp(prefix=f"append-{label}-{policy}-{layer}-", dir=workdir))
                cadence = Cadence(policy, commit_interval_ms / 1000, fsync_interval_ms / 1000)
                try:
                    if layer == "log":
                        d = measure_log(cell_dir, n, size, cadence, budget_s)
                    else:
                        d = measure_store(cell_dir, n, size, layer, cadence, budget_s)
                finally:
                    shutil.rmtree(cell_dir, ignore_errors=True)
                where = "log" if layer == "log" else f"store {layer}"
                if d["capped"]:
                    notes.append(f"{label} {policy} {where}: stopped at {d['n']:,} of {n:,} records after "
                                 f"{d['busy_s']:.0f} s (the per-cell budget); the rate is over those")
                log(f"append {label} {policy} {where}: {d['records_per_s']:,.0f} records/s, "
                    f"{d['payload_mb_per_s']:.1f} MB/s, {d['checkpoints']} checkpoints, flush+checkpoint p50 "
                    f"{d['flush_checkpoint_ms']['p50']:.2f} ms p99 {d['flush_checkpoint_ms']['p99']:.2f} ms")
                if layer == "log":
                    res["log"], det["log"] = figures(d), d
                else:
                    res.setdefault("store", {})[layer] = figures(d)
                    det.setdefault("store", {})[layer] = d
            results.setdefault(label, {})[policy] = res
            details.setdefault(label, {})[policy] = det
    return results, details, notes


def run(bench: Bench) -> dict[str, Any]:
    n = records_for(bench)
    budget = BUDGET_FULL_S if bench.full else None
    results, details, notes = measure(bench.workdir, n, bench.schedulers, budget)
    notes.append("no goal: issue #3 states no numeric goal for append throughput, so every figure is context")
    if not bench.full:
        notes.append(f"small: {n:,} records per cell; a cell shorter than one commit interval "
                     f"({DEFAULTS.commit_interval_ms} ms) only does the final checkpoint")
    return {
        "method": "in-process, no broker: N records per cell in batches of the loop's batch-size into a fresh "
                  "data dir; log = CommitLog.append of pre-built records, store = PartitionStore.ingest of "
                  "IngressRecords with parsed headers; the loop's flush+checkpoint cadence per fsync policy on "
                  "the busy clock, plus a final checkpoint; rate = N / busy seconds",
        "settings": {"records": n, "record_sizes": RECORD_SIZES, "policies": list(POLICIES), "batch": BATCH,
                     "commit_interval_ms": DEFAULTS.commit_interval_ms,
                     "fsync_interval_ms": DEFAULTS.fsync_interval_ms, "segment_bytes": DEFAULTS.segment_bytes,
                     "delay_ms": DELAY_MS, "schedulers": bench.schedulers,
                     "payload_bytes_per_record": {k: payload_bytes(v) for k, v in RECORD_SIZES.items()},
                     "budget_s_per_cell": budget},
        "results": results,
        "details": details,
        "notes": notes,
    }
