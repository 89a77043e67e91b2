"""The peers' cancel-by-id figure: half of N pending records cancelled by id, the way each
system's users cancel, beside the sidecar cancelling the same number in the same run.

N records of 100 B, all due at T, are handed to the system (:mod:`bench.peer_expiry`'s way:
PostgreSQL rows; ingress records for the sidecar, Redis and Kafka Streams) and held before the
cancels start. Then every second one is cancelled by its id, by one client as fast as it goes:

* the sidecar and Kafka Streams: a ``delay.cancel`` ingress record per id, with the record's key
  (same partition, after it), applied when the sidecar's ``cancelled`` counter (stats lines 250
  ms apart) or the Streams application's ``ids`` changelog (a put per record, a delete per
  cancel) says so;
* PostgreSQL: ``DELETE FROM delayed WHERE id = ANY(...)``, 1,000 ids a transaction (fsync'd);
* Redis: ``ZREM`` from the sorted set and ``HDEL`` of the job, 1,000 ids a pipelined round trip
  (the append-only file fsync'd before Redis answers).

cancel rate = K / (the last cancel applied - the first sent), K = N / 2; every cancel must be
applied before T. At T the rest fall due and are drained; then, 2 s after the last expected
delivery: cancelled records delivered (must be 0), kept records lost (must be 0), early (0).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from bench import throughput
from bench.report import Figure, fig
from bench.workload import Bench, BenchError, SidecarProc, log, preload, producer, read_range, uid, wall_ms
from sidecar import client
from sidecar import contract as c

SETTLE_S = 2.0  # after the drain: a cancelled record delivered by mistake would be in by then
CANCEL_BATCH = 1_000  # ids per transaction (PostgreSQL) or per pipelined round trip (Redis)


def records_for(bench: Bench) -> int:
    """N (K = N / 2 cancels)."""
    return 1_000_000 if bench.full else 10_000


class Cancellable(Protocol):
    """A system as the cancel figure drives it."""

    def load(self, target: str, n: int, due_ms: int) -> list[bytes]:
        """Make ``n`` records for ``target`` due at ``due_ms`` reach the system; return once it
        holds every one, with their ids as the delivered records' ``delay.id`` will carry them."""

    def cancel(self, which: list[int]) -> None:
        """Cancel records ``which`` (indices into the load) by id; return once all are applied."""

    def drain(self, target: str, due_ms: int, n: int) -> None:
        """Deliver across ``due_ms``; return once ``n`` records (the ones not cancelled) are out."""

    def stop(self) -> None:
        """Stop what still runs (after the drain, or after a failure)."""


def measure(bench: Bench, name: str, system: Cancellable, n: int, lead_ms: int) -> dict[str, Any]:
    target = f"bench.{name}.cancel.{uid()}"
    bench.topics(target)
    due = wall_ms() + lead_ms
    which = list(range(0, n, 2))
    try:
        ids = system.load(target, n, due)
        t0 = time.monotonic()
        system.cancel(which)
        secs = time.monotonic() - t0
        applied = wall_ms()
        if applied >= due:
            raise BenchError(f"{name} cancel: the cancels were applied {applied - due} ms after the records' due "
                             f"time (lead {lead_ms} ms): they raced the delivery")
        system.drain(target, due, n - len(which))
        time.sleep(SETTLE_S)
    finally:
        system.stop()
    got = read_range(bench.bootstrap, target, {}, bench.wm.high(target), headers=True)
    cancelled = {ids[i] for i in which}
    kept = set(ids) - cancelled
    seen = set(got.ids)
    return {"records": n, "cancels": len(which), "cancel_s": secs,
            "cancels_per_s": len(which) / secs if secs > 0 else None,
            "applied_before_due_s": (due - applied) / 1000, "delivered": len(got.ts),
            "cancelled_delivered": len(seen & cancelled), "lost": len(kept - seen),
            "duplicates": len(got.ids) - len(seen),
            "early": sum(1 for ts, da in zip(got.ts, got.deliver_at, strict=True) if ts < da)}


def produce_cancels(bootstrap: str, ingress: str, ids: list[bytes], which: list[int], key_prefix: bytes) -> None:
    """A ``delay.cancel`` record per id in ``which`` (``sidecar.client.cancel``, as users send
    one), keyed as :func:`bench.workload.preload` keys record i (``<key_prefix><i>``); returns once
    every one is acknowledged."""
    p = producer(bootstrap)
    failed: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    for i in which:
        while True:
            try:
                client.cancel(p, ids[i], key=b"%s%d" % (key_prefix, i), ingress_topic=ingress, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
    left = p.flush(120)
    if left or failed:
        raise BenchError(f"cancel records not acknowledged: {left} left, {len(failed)} failed {failed[:3]}")


class SidecarCancel:
    """The sidecar (one scheduler, the run's changelog mode) on an ingress topic of its own."""

    def __init__(self, bench: Bench, scheduler: str) -> None:
        self.bench, self.scheduler = bench, scheduler
        self.sc: SidecarProc | None = None
        self.ingress = ""
        self.ids: list[bytes] = []

    def load(self, target: str, n: int, due_ms: int) -> list[bytes]:
        self.ingress = f"bench.cx.in.{uid()}"
        self.bench.topics(self.ingress)
        self.sc = sc = self.bench.sidecar(self.ingress, self.scheduler, tag="cx", changelog=self.bench.other_changelog)
        sc.start()
        self.ids = [b"cx-%d" % i for i in range(n)]
        preload(self.bench.bootstrap, self.ingress, n, 100, target, lambda _k: 0,
                schedule=lambda _k: [(c.DELIVER_AT, b"%d" % due_ms)], extra=lambda i: [(c.ID, self.ids[i])])
        sc.wait_counter("ingested", n, max(1.0, (due_ms - wall_ms()) / 1000))
        return self.ids

    def cancel(self, which: list[int]) -> None:
        assert self.sc is not None
        produce_cancels(self.bench.bootstrap, self.ingress, self.ids, which, b"k")
        self.sc.wait_counter("cancelled", len(which), 120)

    def drain(self, target: str, due_ms: int, n: int) -> None:
        assert self.sc is not None
        self.sc.wait_counter("delivered", n, throughput.timeout_for(n) + max(0, due_ms - wall_ms()) / 1000)

    def stop(self) -> None:
        if self.sc is not None:
            self.sc.stop()


def lead_ms(bench: Bench) -> int:
    """T after the load starts, for the sidecar: the preload and intake of N and the K cancels."""
    return 60_000 if bench.full else 15_000


def sidecar_cancels(bench: Bench, n: int) -> dict[str, dict[str, Any]]:
    """The sidecar's cancel figure beside a peer's, each scheduler."""
    out = {}
    for sched in bench.schedulers:
        m = measure(bench, f"cx-{sched}", SidecarCancel(bench, sched), n, lead_ms(bench))
        log(f"cancel beside the peers, sidecar {sched}: {m['cancels']:,} of {n:,} in {m['cancel_s']:.2f} s "
            f"({m['cancels_per_s'] or 0:,.0f}/s), cancelled delivered {m['cancelled_delivered']}, lost {m['lost']}")
        out[sched] = m
    return out


def beside(bench: Bench, scenario: str, name: str, key: str, system: Cancellable, lead: int,
           results: dict[str, Any], details: dict[str, Any]) -> None:
    """The peer's cancels and the sidecar's, into a scenario's ``results[<key>_cancel]`` and
    ``details["cancel"]``; ``name`` tags its topics, ``lead`` is the peer's T after its load."""
    n = records_for(bench)
    cx = measure(bench, name, system, n, lead)
    ours = sidecar_cancels(bench, n)
    details["cancel"] = {key: cx, **ours}
    log(f"{scenario} cancel: {cx['cancels']:,} of {n:,} in {cx['cancel_s']:.2f} s ({cx['cancels_per_s'] or 0:,.0f}/s), "
        f"cancelled delivered {cx['cancelled_delivered']}")
    results[f"{key}_cancel"] = figures(cx, ours, key)


def figures(peer: dict[str, Any], ours: dict[str, dict[str, Any]], key: str) -> dict[str, Figure]:
    """The peer's cancel figures, and each scheduler's with its ratio to the peer's rate."""
    out = {"cancels_per_s": fig(peer["cancels_per_s"], "cancels/s",
                                note=f"{peer['cancels']:,} of {peer['records']:,} pending, one client"),
           "cancelled_delivered": fig(peer["cancelled_delivered"], "records", "== 0"),
           "lost": fig(peer["lost"], "records", "== 0"),
           "early": fig(peer["early"], "records", "== 0")}
    for sched, m in ours.items():
        ratio = m["cancels_per_s"] / peer["cancels_per_s"] if m["cancels_per_s"] and peer["cancels_per_s"] else None
        out[f"{sched}_cancels_per_s"] = fig(m["cancels_per_s"], "cancels/s", note="the sidecar's, in this run")
        out[f"{sched}_ratio_to_{key}"] = fig(ratio, "x")
        out[f"{sched}_cancelled_delivered"] = fig(m["cancelled_delivered"], "records", "== 0")
        out[f"{sched}_lost"] = fig(m["lost"], "records", "== 0")
    return out
