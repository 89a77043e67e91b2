"""One throughput round of a peer design (a Redis, PostgreSQL or RabbitMQ delay queue) beside the sidecar:
the peer and every scheduler back to back on one pre-loaded workload, in the order
:func:`bench.throughput.one_round` rotates by round, each scheduler's ``ratio_to_<peer>`` taken
against this round's peer rate (the machine's speed drifts between rounds, less within one).
A peer's own rate over the rounds is summed up by its spread, ``(max - min) / median``: issue
#55 asks each baseline to vary by at most 15 % between the rounds of one run (at full size after a
warm-up round that is not counted: ``rounds_after_warm_up``). The helpers below
are what the peers' scenarios share: running their worker processes, reading back and counting
what they delivered, and the sidecar's and the lateness run's figures."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench import machine, throughput
from bench.lateness import WHEEL_DELAYS
from bench.report import Figure, fig, spread
from bench.workload import (
    Bench,
    Delivered,
    LogProc,
    PacedProducer,
    Preloaded,
    ScriptProc,
    lateness_percentiles,
    log,
    read_range,
    sleep_until_wall_ms,
    uid,
    uniform_delays,
    wait_until,
    wall_ms,
)


def peer_round(bench: Bench, r: int, scenario: str, peer: str, label: str, measure_peer: Callable[[], dict[str, Any]],
               pre: Preloaded, target: str, tag: str) -> dict[str, Any]:
    """``scenario`` and ``label`` name the round in the log; ``tag`` the sidecars' log files."""
    mode = bench.other_changelog
    key = f"ratio_to_{peer}"
    one = throughput.one_round(bench, r, peer, measure_peer,
                               lambda s: throughput.measure_sidecar(bench, pre, target, s, tag=tag, changelog=mode),
                               key)
    name = "warm-up round" if r < 0 else f"round {r + 1}"
    log(f"{scenario} {name}: {label} {one[peer]['records_per_s'] or 0:,.0f} records/s, " + ", ".join(
        f"{s} {one[s]['records_per_s'] or 0:,.0f} ({one[s][key] or 0:.2f}x)" for s in bench.schedulers))
    return one


FAST_PEER_RECORDS = 1_000_000


def fast_peer_records(bench: Bench) -> int:
    """N of a peer that drains a backlog at 150-400k records/s (PostgreSQL, Kafka Streams): 1M at
    full size (``--throughput-records`` sets it), so that its round's drain lasts 3-7 s rather
    than 1-2 s, and one scheduling hiccup of two shared cores is not a fifth of it (Kafka Streams'
    rate spread over five rounds: 0.26 at 300k, 0.135 at 1M). The slower peers' rounds last 8-10 s
    at the ``throughput`` scenario's N."""
    given = bench.options.get("throughput_records")
    return int(given) if given else (FAST_PEER_RECORDS if bench.full else throughput.records_for(bench))


def backlog(bench: Bench, n: int) -> tuple[Preloaded, str]:
    """The throughput rounds' backlog: the ``throughput`` scenario's ``n`` records of 100 B
    pre-loaded (delays 0-10 s), once all of them are due (the first round's sidecar would
    otherwise wait for the last ones and its rate measure their delays); (records, target)."""
    pre, target = throughput.preload_workload(bench, n, 100, "100B")
    sleep_until_wall_ms(pre.all_due_ms)
    return pre, target


def pending_counts(bench: Bench, small: int) -> list[int]:
    """The pending counts a peer's memory and disk are measured at (issue #55: 1M and 10M at full
    size; ``small`` at small size; ``--peer-pending`` sets them). The first is also the count its
    restart is measured with; each further one is a fresh fill measured at the end of the run."""
    asked = bench.options.get("peer_pending")
    if asked:
        return list(asked)
    return [1_000_000, 10_000_000] if bench.full else [small]


def count_label(n: int) -> str:
    """``1M``, ``10M``, ``100k``: the suffix of the figures measured at ``n`` pending."""
    return f"{n / 1_000_000:g}M" if n >= 1_000_000 else f"{n / 1000:g}k"


def rounds_after_warm_up(bench: Bench, one: Callable[[int], dict[str, Any]],
                         details: dict[str, Any]) -> list[dict[str, Any]]:
    """The measured throughput rounds, ``one(r)`` each, after one round at full size that is not
    counted (``details["warm_up_round"]``, ``one(-1)``): a peer's first round can run cold (Kafka
    Streams' JVM compiling its code: its first round at a quarter of the others' rate), and the
    spread asked of each baseline is of its steady rate. Every system in the round, the sidecar
    included, runs its warm-up round alike. The machine's memory latency is sampled beside them
    (:mod:`bench.machine`): each result with a ``window_ms`` gets ``memory_ns`` and ``cache_ns``, and
    ``details["memory_probe"]`` sums the samples up."""
    with machine.probing(bench.workdir) as probe:

        def probed(r: int) -> dict[str, Any]:
            out = one(r)
            if probe is not None:
                machine.annotate(out, probe.samples())
            return out

        if bench.full:
            details["warm_up_round"] = probed(-1)  # r = -1: the log names it the warm-up round
        rounds = [probed(r) for r in range(throughput.rounds_for(bench))]
        if probe is not None:
            details["memory_probe"] = machine.summary(probe.samples())
    return rounds


QUIET_CORES = 0.05  # a server below this many cores of CPU over QUIET_WINDOW_S is at rest
QUIET_WINDOW_S = 1.0
QUIET_TIMEOUT_S = 60.0


def wait_quiet(cpu_seconds: Callable[[], float], timeout_s: float = QUIET_TIMEOUT_S,
               window_s: float = QUIET_WINDOW_S) -> float:
    """Wait until a peer's server is at rest (below :data:`QUIET_CORES` of CPU over a
    ``window_s`` window; ``cpu_seconds``: its CPU so far) and return the seconds waited
    (``timeout_s`` at most: then the round goes on, its wait recorded). A round's drain starts
    from a server at rest, so that work left from the round before (a queue log's compaction, a
    flush) falls into none of them rather than into some."""
    t0 = time.monotonic()
    last = cpu_seconds()
    while time.monotonic() - t0 < timeout_s:
        time.sleep(window_s)
        now = cpu_seconds()
        if now - last < QUIET_CORES * window_s:
            break
        last = now
    return round(time.monotonic() - t0, 2)


def worker_timeout(count: int, until_ms: int) -> float:
    """A worker's ``--timeout``: the time ``count`` records take, plus the wait until ``until_ms``."""
    return throughput.timeout_for(count) + max(0, until_ms - wall_ms()) / 1000


def start_workers(bench: Bench, module: str, args: list[str], workers: int, count: int, until_ms: int,
                  tag: str) -> list[ScriptProc]:
    """``workers`` processes of a peer's worker ``module`` (``python -m``) with ``args`` plus the
    bootstrap, ``--until-ms`` and :func:`worker_timeout`; started, not awaited."""
    timeout = worker_timeout(count, until_ms)
    procs = [ScriptProc(module, bench.workdir, [*args, "--bootstrap", bench.bootstrap, "--until-ms", str(until_ms),
                                                "--timeout", str(timeout)], tag=tag) for _ in range(workers)]
    for p in procs:
        p.start()
    return procs


def run_workers(bench: Bench, module: str, args: list[str], workers: int, count: int, until_ms: int,
                tag: str) -> list[dict[str, Any]]:
    """:func:`start_workers`, and their ``done`` events."""
    timeout = worker_timeout(count, until_ms)
    return [p.result(timeout + 60) for p in start_workers(bench, module, args, workers, count, until_ms, tag)]


def delivered(bench: Bench, target: str, start: dict[int, int], n: int,
              res: list[dict[str, Any]]) -> tuple[Delivered, dict[str, Any]]:
    """What a peer delivered to ``target`` since ``start``, of ``n`` expected: the records and the
    figures every peer reports (rate, losses, early ones, lateness, the workers' CPU per record)."""
    got = read_range(bench.bootstrap, target, start, bench.wm.high(target), headers=True)
    return got, {"records_per_s": got.window_rate(), "window_ms": got.window(), "delivered": len(got.ts), "expected": n,
                 "duplicates": len(got.ids) - len(set(got.ids)), "lost": n - len(set(got.ids)),
                 "early": sum(1 for ts, da in zip(got.ts, got.deliver_at, strict=True) if ts < da),
                 "late_ms": [ts - da for ts, da in zip(got.ts, got.deliver_at, strict=True)],
                 "cpu_us_per_record": sum(r["cpu_s"] for r in res) * 1e6 / n if n else None}


def sidecar_figures(bench: Bench, rounds: list[dict[str, Any]], scenario: str, peer: str, label: str,
                    note: str | None) -> dict[str, Any]:
    """Each scheduler's figures beside a peer: its median rate, ratio and CPU over the rounds."""
    out: dict[str, Any] = {}
    for sched in bench.schedulers:
        ratio = throughput.median([one[sched][f"ratio_to_{peer}"] for one in rounds])
        log(f"{scenario}: sidecar {sched} median {ratio or 0:.2f}x the {label}")
        out[sched] = {"records_per_s": fig(throughput.one_median(rounds, sched), "records/s"),
                      f"ratio_to_{peer}": fig(ratio, "x", ">= 2", note=note),
                      "cpu_us_per_record": fig(throughput.median(
                          [one[sched]["cpu_us_per_record"] for one in rounds]), "us")}
    return out


def lateness_figures(lat: dict[str, Any], note: str | None = None) -> dict[str, Figure]:
    """A peer's lateness run: offered rate, percentiles, early, lost, duplicates."""
    return {"offered_rate": fig(lat["offered_rate"], "records/s"),
            **{f"{k}_ms": fig(lat[k], "ms", note=note) for k in ("p50", "p99", "p999", "max")},
            "early": fig(lat["early"], "records", "== 0"),
            "lost": fig(lat["lost"], "records", "== 0"),
            "duplicates": fig(lat["duplicates"], "records")}


def spread_figure(rates: list[float | None]) -> Figure:
    return fig(spread(rates), "x", "<= 0.15", note=f"(max - min) / median over {len(rates)} rounds")


def peer_figures(rounds: list[dict[str, Any]], peer: str, rate: float | None, note: str | None,
                 duplicates_note: str) -> dict[str, Figure]:
    """A peer's throughput figures over the rounds: its median rate, the spread of its rate, and the
    early, lost and duplicate records summed over every run."""
    rates = [one[peer]["records_per_s"] for one in rounds]

    def total(key: str) -> int:
        return sum(int(one[peer][key]) for one in rounds)

    return {"records_per_s": fig(rate, "records/s", note=note),
            "rate_spread": spread_figure(rates),
            **machine.machine_figures(rounds, peer),
            "early": fig(total("early"), "records", "== 0"),
            "lost": fig(total("lost"), "records", "== 0"),
            "duplicates": fig(total("duplicates"), "records", note=duplicates_note)}


def paced_lateness(bench: Bench, name: str, rate: float, seconds: float,
                   start: Callable[[str, str], LogProc]) -> dict[str, Any]:
    """Lateness at ``rate`` through a peer that reads an ingress topic as the sidecar does: ``start(ingress,
    target)`` starts it (ready to read), a paced producer writes ``rate`` records/s (delays uniform
    1-10 s) for ``seconds``, and once every accepted record is delivered the percentiles of the
    delivered timestamps minus their ``delay.deliver-at``. The caller stops the peer's process (it
    may want its own counters first)."""
    ingress, target = f"bench.{name}.lat.in.{uid()}", f"bench.{name}.lat.out.{uid()}"
    bench.topics(ingress, target)
    proc = start(ingress, target)
    prod = PacedProducer(bench.bootstrap, ingress, target, rate, 100, uniform_delays(*WHEEL_DELAYS),
                         duration_s=seconds)
    prod.start()
    prod.join(seconds + 120)
    if prod.is_alive():
        prod.stop()
    sent = prod.accepted  # what the broker refused never reached the peer: not "lost"
    wait_until(f"{sent} records delivered by the {name} peer", lambda: bench.wm.total(target) >= sent,
               max(WHEEL_DELAYS) / 1000 + 120, 0.25, proc.check_alive)
    got = read_range(bench.bootstrap, target, {}, bench.wm.high(target), headers=True)
    late = [ts - da for ts, da in zip(got.ts, got.deliver_at, strict=True)]
    return {"offered_rate": rate, "sent": sent, "delivered": len(got.ts), "lost": sent - len(set(got.ids)),
            "duplicates": len(got.ids) - len(set(got.ids)), "early": sum(1 for lt in late if lt < 0),
            **lateness_percentiles(late)}
