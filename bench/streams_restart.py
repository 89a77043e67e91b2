"""``streams-punctuator``'s pending figures: memory and disk per pending record, and the restart
after a crash with them pending (:mod:`bench.peer_restart`, the sidecar's ``restart`` method).

* Pending: M ingress records with a 30 min delay, read by a fresh application until its
  ``pending`` store's changelog holds M puts (the ``ids`` store takes only records with a
  ``delay.id`` of their own; these have none). The JVM's RSS growth over M (RocksDB's memtables
  and block cache are outside the heap, the heap is sized up front) and the state directory's
  size over M (RocksDB's files, allocated bytes).
* Restart: probes written to the application's ingress topic (its producers write to Kafka, which
  stays up), the JVM SIGKILLed, then the same application (its id, its state directory) started
  again: at_least_once keeps the local stores after a crash and restores from each store's last
  checkpoint to its changelog's end. "Answering" is the application's RUNNING state, after that
  restore. The pending count is not read back from this peer (its stores answer only inside the
  JVM); the probes' delivery and lateness are.
"""

from __future__ import annotations

import signal
from typing import Any

from bench import peer_restart
from bench.report import Figure, fig
from bench.restart import STEP_MS
from bench.streams_peer import StreamsPeerProc, changelog_topics
from bench.workload import (
    Bench,
    BenchError,
    ScriptProc,
    disk_usage,
    log,
    preload,
    rss_of,
    uid,
    wait_until,
)
from sidecar import contract as c

PENDING_DELAY_MS = 1_800_000
READY_TIMEOUT_S = 300  # the restarted JVM restores before RUNNING


class StreamsCrash:
    """The Kafka Streams application as :func:`bench.peer_restart.measure` crashes it."""

    def __init__(self, bench: Bench, proc: StreamsPeerProc, ingress: str) -> None:
        self.bench, self.proc, self.ingress = bench, proc, ingress

    def write_probes(self, target: str, s_ms: int, n: int) -> None:
        preload(self.bench.bootstrap, self.ingress, n, 100, target, lambda _k: 0,
                schedule=lambda k: [(c.DELIVER_AT, b"%d" % (s_ms + k * STEP_MS))])

    def kill(self) -> None:
        self.proc.stop(signal.SIGKILL, 30)

    def start_workers(self, target: str, until_ms: int, n: int) -> list[ScriptProc]:
        return []  # the application is its own worker

    def start(self) -> None:
        self.proc.start()
        self.proc.wait_event("ready", READY_TIMEOUT_S)

    def pending(self) -> int | None:
        return None


def measure(bench: Bench, proc: StreamsPeerProc, ingress: str, m: int) -> dict[str, Any]:
    """``proc`` runs (RUNNING) on ``ingress``, nothing stored yet; it is left running. ``m``
    records pending, then the restart with them."""
    pend = fill(bench, proc, ingress, m)
    pend["restart"] = peer_restart.measure(bench, "sp", StreamsCrash(bench, proc, ingress), m)
    return pend


def fill(bench: Bench, proc: StreamsPeerProc, ingress: str, m: int) -> dict[str, Any]:
    """``m`` records of 100 B stored by ``proc`` (due in 30 min): its RSS and state directory growth."""
    anon0, rss0 = rss_of(proc.pid)
    target = f"bench.sp.pending.out.{uid()}"
    bench.topics(target)
    preload(bench.bootstrap, ingress, m, 100, target, lambda _i: PENDING_DELAY_MS)
    pending_log = changelog_topics(proc.app_id)[0]
    wait_until(f"Kafka Streams to store {m:,} records", lambda: _total(bench, pending_log) >= m, 600 + m / 5_000,
               0.5, proc.check_alive)
    anon1, rss1 = rss_of(proc.pid)
    alloc, _apparent = disk_usage(proc.state_dir)
    log(f"streams-punctuator: {m:,} pending, RSS +{(rss1 - rss0) / m:.0f} B, state {alloc / m:.0f} B per record")
    return {"pending": m, "rss_before": rss0, "rss_after": rss1, "anon_before": anon0, "anon_after": anon1,
            "state_dir_bytes": alloc}


def figures(p: dict[str, Any]) -> dict[str, Figure]:
    m = p["pending"]
    return {"rss_bytes_per_pending": fig((p["rss_after"] - p["rss_before"]) / m, "B",
                                         note=f"the JVM's RSS growth over {m:,} pending"),
            "disk_bytes_per_pending": fig(p["state_dir_bytes"] / m, "B",
                                          note="the state directory (RocksDB), allocated, without the changelogs")}


def _total(bench: Bench, topic: str) -> int:
    try:
        return bench.wm.total(topic)
    except BenchError:  # the changelog topic appears with the first put
        return 0
