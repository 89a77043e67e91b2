"""The peers' mass-expiry figure: N records due in the same millisecond, by the method of the
sidecar's ``mass-expiry`` scenario (:mod:`bench.mass_expiry`), beside the sidecar's own drain in
the same run.

The peer is handed N records of 100 B, every one due at T, the way its producers write
(PostgreSQL: rows inserted; Redis and Kafka Streams: ingress records with ``delay.deliver-at`` = T
that its intake reads), and must hold all N before T: a peer still storing at T would measure its
intake, not its expiry. T is ``lead_ms`` after the load starts, sized per peer for its intake on
this machine. Its delivery runs across T (PostgreSQL's workers polling, the Redis mover, the
Streams punctuator) until every record is delivered. Figures, as the sidecar's:

* drain rate = N / (last delivered timestamp - T);
* the first and the last record's lateness (timestamp - T); early (must be 0), lost, duplicates.

The sidecar drains its N in the same scenario (:func:`sidecar_drains`: ``mass_expiry.measure``
for each scheduler, one level time as the delay, its background stream of new records beside
the drain, which the peers do not get), so the ratio compares two drains minutes apart on one
machine, not two runs.
"""

from __future__ import annotations

from typing import Any, Protocol

from bench import mass_expiry
from bench.report import Figure, fig
from bench.workload import Bench, BenchError, log, read_range, uid, wall_ms


def records_for(bench: Bench) -> int:
    """N: the ``mass-expiry`` scenario's (1M full)."""
    return 1_000_000 if bench.full else 10_000


class Expirable(Protocol):
    """A peer as the mass-expiry figure drives it."""

    def load(self, target: str, n: int, due_ms: int) -> None:
        """Make ``n`` records for ``target``, all due at ``due_ms``, reach the peer; return once
        the peer holds every one (delivery may already be running, waiting for ``due_ms``)."""

    def drain(self, target: str, due_ms: int, n: int) -> None:
        """Deliver across ``due_ms``; return once the ``n`` records are delivered."""

    def stop(self) -> None:
        """Stop what of the peer's delivery still runs (after the drain, or after a failure)."""


def measure(bench: Bench, name: str, peer: Expirable, n: int, lead_ms: int) -> dict[str, Any]:
    target = f"bench.{name}.expiry.{uid()}"
    bench.topics(target)
    due = wall_ms() + lead_ms
    try:
        peer.load(target, n, due)
        stored = wall_ms()
        if stored >= due:
            raise BenchError(f"{name} mass expiry: {n:,} records held {stored - due} ms after their due time, not "
                             f"before it (lead {lead_ms} ms): the figure would be the intake's")
        peer.drain(target, due, n)
    finally:
        peer.stop()
    got = read_range(bench.bootstrap, target, {}, bench.wm.high(target), headers=True)
    if not got.ts:
        raise BenchError(f"{name} mass expiry: nothing delivered")
    last = max(got.ts)
    drain_s = (last - due) / 1000
    return {"records": n, "stored_before_due_s": (due - stored) / 1000, "drain_s": drain_s,
            "drain_rate": n / drain_s if drain_s > 0 else None, "delivered": len(got.ts),
            "first_lateness_ms": min(got.ts) - due, "last_lateness_ms": last - due,
            "early": sum(1 for ts, da in zip(got.ts, got.deliver_at, strict=True) if ts < da),
            "lost": n - len(set(got.ids)), "duplicates": len(got.ids) - len(set(got.ids))}


def sidecar_drains(bench: Bench, n: int) -> dict[str, dict[str, Any]]:
    """The sidecar's drain of ``n`` records due at once, each scheduler, by ``mass-expiry``'s
    method with the shortest level time that leaves it the time to store them (60 s full, 10 s
    small; ``--expiry-delay`` / ``--max-delay`` as there)."""
    delay = mass_expiry.capped_delay(bench, mass_expiry.expiry_delay(bench, 60_000 if bench.full else 10_000))
    bg_rate = 2_000.0 if bench.full else 1_000.0
    out = {}
    for sched in bench.schedulers:
        m = mass_expiry.measure(bench, sched, n, delay, bg_rate)
        log(f"mass expiry beside the peers, sidecar {sched}: {n:,} in {m['drain_s']:.2f} s "
            f"({m['drain_rate'] or 0:,.0f}/s), early {m['early']}")
        out[sched] = m
    return out


def beside(bench: Bench, scenario: str, name: str, key: str, peer: Expirable, lead_ms: int,
           results: dict[str, Any], details: dict[str, Any]) -> None:
    """The peer's mass expiry and the sidecar's, into a scenario's ``results[<key>_mass_expiry]``
    and ``details["mass_expiry"]``; ``name`` tags its topics."""
    n = records_for(bench)
    me = measure(bench, name, peer, n, lead_ms)
    ours = sidecar_drains(bench, n)
    details["mass_expiry"] = {key: me, **ours}
    log(f"{scenario} mass expiry: {n:,} due in one ms drained at {me['drain_rate'] or 0:,.0f}/s, "
        f"last {me['last_lateness_ms']} ms late")
    results[f"{key}_mass_expiry"] = figures(me, ours, key)


def figures(peer: dict[str, Any], ours: dict[str, dict[str, Any]], key: str) -> dict[str, Figure]:
    """The peer's drain figures, and each scheduler's drain and its ratio to the peer's
    (``<scheduler>_ratio_to_<key>``)."""
    out = {"drain_records_per_s": fig(peer["drain_rate"], "records/s",
                                      note=f"{peer['records']:,} due in one ms, stored "
                                           f"{peer['stored_before_due_s']:.1f} s before"),
           "first_record_lateness_ms": fig(peer["first_lateness_ms"], "ms"),
           "last_record_lateness_ms": fig(peer["last_lateness_ms"], "ms"),
           "early": fig(peer["early"], "records", "== 0"),
           "lost": fig(peer["lost"], "records", "== 0"),
           "duplicates": fig(peer["duplicates"], "records")}
    for sched, m in ours.items():
        ratio = m["drain_rate"] / peer["drain_rate"] if m["drain_rate"] and peer["drain_rate"] else None
        out[f"{sched}_drain_records_per_s"] = fig(m["drain_rate"], "records/s",
                                                  note="the sidecar's drain in this run, a background stream beside")
        out[f"{sched}_ratio_to_{key}"] = fig(ratio, "x", ">= 2")
        out[f"{sched}_early"] = fig(m["early"], "records", "== 0")
    return out
