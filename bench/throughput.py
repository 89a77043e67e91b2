"""Scenario ``throughput``: end-to-end records/s for 100 B and 1 KB records with random delays of
0-10 s, against a plain consume -> produce passthrough with the same client settings.

Method (fixed N, pre-loaded): N records are produced into a fresh one-partition ingress topic
(``delay.ms`` uniform in [0, 10 000], ``delay.target-topic`` set) and the bench waits until every
one of them is due (last preload timestamp + 10 s). Then the process under test is started on
its own consumer group and reads the topic from the beginning: the passthrough copies each record
to its target topic, the sidecar validates, appends to the commit log, schedules (levels: the
delay rounds up to the 1 s / 5 s / 10 s level, all already past; wheel: the 10 ms slot) and
publishes. The rate is ``(N - 1) / (last - first delivered record timestamp)``: the record
timestamp is the publisher's send time, so process start-up and group join are not counted for
either side, and the bench process itself only polls high watermarks while it waits.
Because every record is already due, this is the pipeline's capacity (consume, store, schedule,
due scan, publish, ack) on the path a backlog takes; the delays themselves only matter for
lateness (see the ``lateness`` scenario, which runs at 50 % of this figure). For the levels that
is also the path of the sustained rate. The wheel hands a record stored already due out from its
late chain (one arrival-ordered walk), while records due 1-10 s after arrival go through its slots
(one pass per distinct due ms, at scattered places): a path that costs it more per record (the
``steady`` scenario; docs/benchmarks.md).

Rounds: one measurement takes 3-6 s, and on a shared 2-core machine a neighbour's burst inside
that window moves one process's rate by 20-30 % (the same commit measured a 100 B ratio of 0.63
and 0.88 on two days; a single 1 KB passthrough once came out below the sidecar it bounds). So
``--size full`` measures ``ROUNDS_FULL`` rounds on the same pre-loaded topics, each round running
the passthrough and every scheduler back to back, in an order rotated by one each round (each
process takes each place once, so none always runs first after the preload or last after the
others). A ratio is taken within its round, between measurements seconds apart, and the reported
figure is the median over the rounds; every round's rates and ratios are in ``details``.

Changelog: each scheduler is measured in every mode of ``bench.changelog_modes`` (``--changelog``):
``on`` is the sidecar's default (every store change also written to the changelog topic, so each
record is written twice: once delivered, once mirrored, plus a tombstone; goal >= 0.6), ``off``
is ``--changelog off`` (single-instance mode; goal >= 0.85). Every sidecar measured gets its own
changelog topic: sidecars measured one after another on one pre-loaded ingress topic must not
restore each other's changelog. In a round the variants (scheduler x mode) take their rotated
places like the schedulers. ``results.<size>.<scheduler>`` holds the changelog-on figures,
``results.<size>.changelog_off.<scheduler>`` the changelog-off ones.

Exactly-once: with ``exactly-once`` in ``bench.delivery_modes`` (``--delivery``) each scheduler
is also measured with ``--delivery exactly-once`` (changelog on, which it needs; variant
``levels-exactly-once``, figures in ``results.<size>.exactly_once.<scheduler>``; goal >= 0.5,
issue 23). Its deliveries become visible to a ``read_committed`` consumer only when their
transaction commits (every ``--transaction-interval``, the default 100 ms), and the target's high
watermark also counts the commit markers: so the completion check counts the committed records
with a ``read_committed`` consumer running in the bench process (a :class:`CommittedReader`
that only counts them), and the records are read back ``read_committed``, as for every variant.
The rate is still ``(N - 1) / (last - first delivered record timestamp)`` over the committed
records: the sidecar's production rate inside transactions (a record's timestamp is its produce
time, before its commit), so it does not include the last transaction's commit wait, at most one
interval and the commit over a window of seconds; the lateness scenario measures visibility.

CPU per record: each process's CPU seconds (user + system, all threads) from when it has its
partitions until all N are delivered, over N (``cpu_us_per_record``; the passthrough measures its
own with ``getrusage``, the bench the sidecar's from ``/proc``), and ``cpu_to_passthrough`` =
sidecar / passthrough. A neighbour's burst stretches a window's wall clock, not the CPU spent in
it, so this ratio depends less on the machine than the rate ratio. Goal ``GOAL_CPU`` for the
common shape with the changelog on (issue 54), context for the rest.

Shapes (:mod:`bench.shape`, ``--shape``): the records above are the ``plain`` shape (one
partition, schedule headers only, 100 B and 1 KB). The ``common`` shape (100 B, an explicit
``delay.id``, a user header, ``shape.COMMON_PARTITIONS`` ingress and target partitions) is
pre-loaded and measured the same way, with its own passthrough on its own topics; its figures
take the place of a record size: ``results.common.<scheduler>``, ``results.common.changelog_off``
and so on.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from bench import shape
from bench.report import fig
from bench.workload import (
    RECORD_SIZES,
    Bench,
    CommittedReader,
    KHeaders,
    Preloaded,
    ScriptProc,
    cpu_seconds,
    log,
    passthrough_cmd,
    preload,
    read_range,
    sleep_until_wall_ms,
    uid,
    uniform_delays,
    wait_until,
    wall_ms,
)

# issue 21: each record written twice with the changelog; issue 23: exactly-once (a variant, not a
# changelog mode, but keyed with them: "on" and "off" are at-least-once)
GOAL_RATIO = {"on": ">= 0.6", "off": ">= 0.85", "exactly-once": ">= 0.5"}
GOAL_CPU = "<= 1.5"  # issue 54: the common shape's CPU per record, changelog on, over the passthrough's
MAX_DELAY_MS = 10_000
ROUNDS_FULL = 5  # 3 were too few: one build's per-round ratios spanned 0.55-0.94 in a day
PASSTHROUGH = "passthrough"
OFF = "changelog_off"  # the key of the changelog-off figures in the results
EOS = "exactly_once"  # ... and of the exactly-once ones
EXACTLY_ONCE = "exactly-once"
RESULT_KEYS = {"off": OFF, EXACTLY_ONCE: EOS}  # mode -> its key in results (changelog on: none)


def variant(scheduler: str, mode: str) -> str:
    """A measured variant's name in rounds and details: ``levels``, ``levels-changelog-off``,
    ``levels-exactly-once``."""
    return {"on": scheduler, "off": f"{scheduler}-changelog-off"}.get(mode, f"{scheduler}-{mode}")


def modes(bench: Bench) -> list[str]:
    """The modes measured: each changelog mode at least once (``on``, ``off``), then
    ``exactly-once`` (changelog on) when asked for."""
    out = list(bench.changelog_modes) if "at-least-once" in bench.delivery_modes else []
    return out + ([EXACTLY_ONCE] if EXACTLY_ONCE in bench.delivery_modes else [])


def sidecar_flags(mode: str) -> dict[str, str]:
    """A mode's ``changelog`` and ``delivery`` for :meth:`Bench.sidecar`."""
    if mode == EXACTLY_ONCE:
        return {"changelog": "on", "delivery": EXACTLY_ONCE}
    return {"changelog": mode, "delivery": "at-least-once"}


def results_for(results: dict[str, Any], mode: str) -> dict[str, Any]:
    """Where a mode's per-scheduler figures go: ``results`` itself (changelog on), or its
    ``changelog_off`` / ``exactly_once`` part."""
    key = RESULT_KEYS.get(mode)
    return results if key is None else results.setdefault(key, {})


def variants(bench: Bench) -> list[tuple[str, str, str]]:
    """(variant, scheduler, mode) for every scheduler and mode measured."""
    return [(variant(s, m), s, m) for m in modes(bench) for s in bench.schedulers]


def records_for(bench: Bench) -> int:
    """N: ``--throughput-records``, else the size's."""
    return int(bench.options.get("throughput_records") or (300_000 if bench.full else 20_000))


def rounds_for(bench: Bench) -> int:
    return ROUNDS_FULL if bench.full else 1


def round_order(names: list[str], r: int) -> list[str]:
    """``names`` rotated left by ``r``: over ``len(names)`` rounds each takes each place once."""
    k = r % len(names)
    return names[k:] + names[:k]


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def one_median(rounds: list[dict[str, Any]], name: str) -> float | None:
    """The median rate of one measured process over the rounds."""
    return median([one[name]["records_per_s"] for one in rounds])


def timeout_for(n: int) -> float:
    return 120 + n / 1_000  # generous: >= 1 000 records/s


def measure_sidecar(bench: Bench, pre: Preloaded, target: str, scheduler: str, tag: str,
                    changelog: str = "on", delivery: str = "at-least-once") -> dict[str, Any]:
    """Start a sidecar on the pre-loaded ingress topic; wait for all N on ``target`` (exactly-once:
    all N committed, counted by a ``read_committed`` consumer)."""
    start = bench.wm.high(target)
    want = sum(start.values()) + pre.n
    sc = bench.sidecar(pre.topic, scheduler, tag=tag, changelog=changelog, changelog_topic=f"bench.tp.cl.{uid()}",
                       delivery=delivery)
    spawned = wall_ms()
    sc.start()
    cpu0 = cpu_seconds(sc.pid)
    counter = CommittedReader(bench.bootstrap, target, start) if delivery == EXACTLY_ONCE else None
    if counter is not None:
        counter.start()
    try:
        done_yet = ((lambda: bench.wm.total(target) >= want) if counter is None else
                    (lambda: counter.count >= pre.n))
        wait_until(f"{pre.n} records delivered by the {scheduler} sidecar", done_yet,
                   timeout_for(pre.n), 0.2, sc.check_alive)
        done = wall_ms()
        cpu = cpu_seconds(sc.pid) - cpu0
        stats = sc.stats() or {}
    finally:
        if counter is not None:
            counter.stop()
        sc.stop()
    end = bench.wm.high(target)
    got = read_range(bench.bootstrap, target, start, end, headers=True)
    early = sum(1 for ts, da in zip(got.ts, got.deliver_at, strict=True) if ts < da)
    rate = got.window_rate()
    out = {
        "records_per_s": rate,
        "delivered": len(got.ts),
        "duplicates": len(got.ts) - len(set(got.ids)),
        # what the shape reached the sidecar as: the ingress partitions served, an id it delivered
        "ingress_partitions_seen": len(set(got.partitions)),
        "id_sample": got.ids[0].decode(errors="replace") if got.ids else None,
        "early": early,
        "window_s": (max(got.ts) - min(got.ts)) / 1000 if got.ts else None,
        "window_ms": got.window(),
        "spawn_to_done_s": (done - spawned) / 1000,
        "cpu_us_per_record": cpu * 1e6 / pre.n,
        "stats": {k: stats.get(k) for k in ("ingested", "scheduled", "delivered", "dlq", "early")},
    }
    if counter is not None:
        # offsets the committed records did not take: one commit marker per transaction, plus
        # the records of any aborted one
        out["target_offsets_not_records"] = sum(end.values()) - sum(start.values()) - len(got.ts)
    return out


def measure_passthrough(bench: Bench, pre: Preloaded, tag: str) -> dict[str, Any]:
    target = f"bench.pt.{tag}.{uid()}"
    bench.topics(target)
    args = ["--bootstrap", bench.bootstrap, "--source", pre.topic, "--target", target, "--count", str(pre.n),
            "--group", f"bench-pt-{uid()}", "--timeout", str(timeout_for(pre.n))]
    proc = ScriptProc("bench.passthrough", bench.workdir, args, tag=tag, cmd=passthrough_cmd(args))
    spawned = wall_ms()
    proc.start()
    res = proc.result(timeout_for(pre.n) + 60)
    done = wall_ms()
    end = bench.wm.high(target)
    got = read_range(bench.bootstrap, target, {}, end)
    return {
        "records_per_s": got.window_rate(),
        "delivered": len(got.ts),
        "acked": res.get("acked"),
        "window_s": (max(got.ts) - min(got.ts)) / 1000 if got.ts else None,
        "spawn_to_done_s": (done - spawned) / 1000,
        "cpu_us_per_record": res["cpu_s"] * 1e6 / pre.n if res.get("cpu_s") else None,
    }


def preload_workload(bench: Bench, n: int, value_size: int, label: str, partitions: int = 1,
                     extra: Callable[[int], KHeaders] | None = None) -> tuple[Preloaded, str]:
    """``n`` records pre-loaded into a fresh ingress topic of ``partitions`` (its target has as
    many); ``extra``: each record's headers beside the schedule ones (the common shape's)."""
    ingress, target = f"bench.tp.in.{label}.{uid()}", f"bench.tp.out.{label}.{uid()}"
    bench.topics(ingress, target, partitions=partitions)
    pre = preload(bench.bootstrap, ingress, n, value_size, target, uniform_delays(0, MAX_DELAY_MS), extra=extra)
    log(f"throughput: preloaded {n} x {label} in {pre.seconds:.1f} s ({n / pre.seconds:,.0f}/s)")
    return pre, target


def one_round(bench: Bench, r: int, baseline: str, measure_baseline: Callable[[], dict[str, Any]],
              measure_sched: Callable[[str], dict[str, Any]], ratio_key: str,
              names: list[str] | None = None) -> dict[str, Any]:
    """One round: ``baseline`` and every scheduler (or every variant in ``names``) back to back,
    in the order rotated by ``r``; each one's ``ratio_key`` is its rate over this round's
    baseline rate."""
    names = list(bench.schedulers) if names is None else names
    one: dict[str, Any] = {}
    for name in round_order([baseline, *names], r):
        one[name] = measure_baseline() if name == baseline else measure_sched(name)
    base = one[baseline]["records_per_s"]
    for name in names:
        rate = one[name]["records_per_s"]
        one[name][ratio_key] = rate / base if rate and base else None
    return one


def measure_rounds(bench: Bench, pre: Preloaded, target: str, label: str, rounds: int) -> list[dict[str, Any]]:
    """``rounds`` rounds of the passthrough and every variant on one pre-loaded topic."""
    by_name = {v: (s, m) for v, s, m in variants(bench)}

    def measure_variant(name: str) -> dict[str, Any]:
        sched, mode = by_name[name]
        return measure_sidecar(bench, pre, target, sched, tag=f"tp-{label}", **sidecar_flags(mode))

    out: list[dict[str, Any]] = []
    for r in range(rounds):
        one = one_round(bench, r, PASSTHROUGH, lambda: measure_passthrough(bench, pre, label), measure_variant,
                        "ratio_to_passthrough", list(by_name))
        log(f"throughput {label} round {r + 1}/{rounds}: passthrough {one[PASSTHROUGH]['records_per_s'] or 0:,.0f} "
            "records/s, " + ", ".join(
                f"{v} {one[v]['records_per_s'] or 0:,.0f} ({one[v]['ratio_to_passthrough'] or 0:.2f})"
                for v in by_name))
        out.append(one)
    return out


def preload_common(bench: Bench, n: int) -> tuple[Preloaded, str]:
    """The common producer shape's ``n`` records (``bench.shape``)."""
    return preload_workload(bench, n, shape.COMMON_VALUE_BYTES, shape.COMMON, shape.COMMON_PARTITIONS,
                            shape.common_headers)


def cpu_goal(label: str, mode: str) -> str | None:
    """The CPU-per-record goal: the common shape with the changelog on (issue 54); context else."""
    return GOAL_CPU if label == shape.COMMON and mode == "on" else None


def summarise(bench: Bench, rounds: list[dict[str, Any]], label: str) -> dict[str, Any]:
    """Median figures over the rounds (see the module docstring)."""
    def med(name: str, key: str) -> float | None:
        return median([one[name][key] for one in rounds])

    pt_cpu = med(PASSTHROUGH, "cpu_us_per_record")
    res: dict[str, Any] = {PASSTHROUGH: {"records_per_s": fig(med(PASSTHROUGH, "records_per_s"), "records/s"),
                                         "cpu_us_per_record": fig(pt_cpu, "µs")}}
    for name, sched, mode in variants(bench):
        ratios = [one[name]["ratio_to_passthrough"] for one in rounds]
        cpu = med(name, "cpu_us_per_record")
        into = results_for(res, mode)
        into[sched] = {
            "records_per_s": fig(med(name, "records_per_s"), "records/s"),
            "ratio_to_passthrough": fig(median(ratios), "x", GOAL_RATIO[mode],
                                        note=f"median of {len(rounds)} rounds" if len(rounds) > 1 else None),
            "ratio_min": fig(min((r for r in ratios if r is not None), default=None), "x"),
            "ratio_max": fig(max((r for r in ratios if r is not None), default=None), "x"),
            "cpu_us_per_record": fig(cpu, "µs"),
            "cpu_to_passthrough": fig(
                cpu / pt_cpu if pt_cpu and cpu else None, "x", cpu_goal(label, mode),
                note="sidecar CPU per record / passthrough CPU per record: less sensitive to other load "
                     "than the rates"),
            "early": fig(sum(one[name]["early"] for one in rounds), "records", "== 0"),
        }
    return res


def run(bench: Bench) -> dict[str, Any]:
    n = records_for(bench)
    rounds = rounds_for(bench)
    shapes = shape.shapes_for(bench)
    loads = ({label: preload_workload(bench, n, size, label) for label, size in RECORD_SIZES.items()}
             if shape.PLAIN in shapes else {})
    if shape.COMMON in shapes:
        loads[shape.COMMON] = preload_common(bench, n)
    sleep_until_wall_ms(max(pre.all_due_ms for pre, _t in loads.values()))
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for label, (pre, target) in loads.items():
        measured = measure_rounds(bench, pre, target, label, rounds)
        results[label] = summarise(bench, measured, label)
        details[label] = {"rounds": measured}
        log(f"throughput {label}: median " + ", ".join(
            f"{v} {median([one[v]['ratio_to_passthrough'] for one in measured]) or 0:.2f}"
            for v, _s, _m in variants(bench)))
    # median rates by name (``passthrough``, ``levels``, ``levels-changelog-off``,
    # ``levels-exactly-once``) for later scenarios
    names = [PASSTHROUGH, *(v for v, _s, _m in variants(bench))]
    bench.results["throughput"] = {
        label: {name: one_median(d["rounds"], name) for name in names} for label, d in details.items()
    }
    bench.cleanup_topics()
    return {
        "method": "fixed N pre-loaded, all due before the process starts; rate = (N-1) / (last - first delivered "
                  "record timestamp), the same for the sidecar and the passthrough, over the committed records "
                  "(read_committed); per size, ROUNDS rounds of the passthrough and each scheduler in each mode "
                  "(changelog on, off, exactly-once) back to back (order rotated each round), ratio within a "
                  "round, median over the rounds",
        "settings": {"records": n, "rounds": rounds, "shapes": shapes, "record_sizes": RECORD_SIZES,
                     "delay_ms": [0, MAX_DELAY_MS], "ingress_partitions": 1, "target_partitions": 1,
                     **({shape.COMMON: shape.describe()} if shape.COMMON in shapes else {}),
                     "schedulers": bench.schedulers,
                     "changelog_modes": bench.changelog_modes, "delivery_modes": bench.delivery_modes,
                     "modes": modes(bench), "goals": GOAL_RATIO,
                     **({"transaction_interval_ms": bench.transaction_interval_ms} if EXACTLY_ONCE in modes(bench)
                        else {})},
        "results": results,
        "details": details,
    }
