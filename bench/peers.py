"""One throughput round of a peer design (a Redis or PostgreSQL delay queue) beside the sidecar:
the peer and every scheduler back to back on one pre-loaded workload, in the order
:func:`bench.throughput.one_round` rotates by round, each scheduler's ``ratio_to_<peer>`` taken
against this round's peer rate (the machine's speed drifts between rounds, less within one).
A peer's own rate over the rounds is summed up by its spread, ``(max - min) / median``: issue
#55 asks each baseline to vary by at most 15 % between the rounds of one run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench import throughput
from bench.report import Figure, fig
from bench.workload import Bench, Preloaded, log


def peer_round(bench: Bench, r: int, scenario: str, peer: str, label: str, measure_peer: Callable[[], dict[str, Any]],
               pre: Preloaded, target: str, tag: str) -> dict[str, Any]:
    """``scenario`` and ``label`` name the round in the log; ``tag`` the sidecars' log files."""
    mode = bench.other_changelog
    key = f"ratio_to_{peer}"
    one = throughput.one_round(bench, r, peer, measure_peer,
                               lambda s: throughput.measure_sidecar(bench, pre, target, s, tag=tag, changelog=mode),
                               key)
    log(f"{scenario} round {r + 1}: {label} {one[peer]['records_per_s'] or 0:,.0f} records/s, " + ", ".join(
        f"{s} {one[s]['records_per_s'] or 0:,.0f} ({one[s][key] or 0:.2f}x)" for s in bench.schedulers))
    return one


def spread(rates: list[float | None]) -> float | None:
    known = [r for r in rates if r]
    med = throughput.median(list(known))
    return (max(known) - min(known)) / med if known and med else None


def spread_figure(rates: list[float | None]) -> Figure:
    return fig(spread(rates), "x", "<= 0.15", note=f"(max - min) / median over {len(rates)} rounds")
