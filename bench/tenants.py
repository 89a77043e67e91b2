"""Scenario ``tenants``: no noisy neighbour. Tenant A's mass expiry beside tenant B's paced stream.

Method: one sidecar serves two tenants (a ``tenants:`` config file: each its own one-partition
ingress topic, DLQ and changelog; each delivers to its own target topic). N records (100 B) of
tenant A are produced with one record timestamp T0 and ``delay.ms`` = D, so all of them fall due
at T0 + D (as in ``mass-expiry``); the bench checks that all N are stored before then. From
T0 + D - 3 s tenant B sends a paced stream of records with a 1 s delay, until 1.5 s after A's
last record is delivered. Then every record of both target topics is read back.

* B's lateness (delivery timestamp - ``delay.deliver-at``) p50 / p99 / p99.9 of B's records due
  during A's drain (from T0 + D to A's last delivery), and of those due before it (B alone:
  the reference for what the machine gives a stream without a neighbour);
* A's drain rate = N / (A's last delivery timestamp - (T0 + D)), next to a single-tenant
  ``mass-expiry`` drain of the same N records measured right after (``bench/mass_expiry.py``,
  seconds apart: the machine's speed drifts over minutes), and their ratio;
* early (delivered before the due time) and lost (sent, never delivered, by key) per tenant.

Ten tenants (``measure_ten``): the same total load split over ten tenants, against one. M records
(100 B, ``delay.ms`` 0: all due on arrival, a backlog) are pre-loaded into one ingress topic, and
M / 10 into each of ten tenants' ingress topics (one partition each), all aimed at one target
topic per run. Then, back to back, a sidecar with no ``tenants:`` (one implicit tenant) reads the
one topic and a sidecar with ten tenants (a ``tenants:`` file) reads the ten, each from the
beginning with its own group and changelog topics; each rate is ``(M - 1) / (last - first
delivered record timestamp)``, as in ``throughput`` (start-up and the group join not counted).
Before each run every dirty page is written back (``sync``, ``workload.quiet_disk``): the kernel
writes a page back ~30 s after it was dirtied, so the preload's and the previous run's topics and
stores (hundreds of MB) were otherwise written back during whichever run came next, on the same
two cores (0.3-1.3 GB during a 10-s run, measured); what each run still saw is in its figures
(``written_back_during_mb``).
``TEN_ROUNDS_FULL`` rounds, the order swapped each round (neither always runs first after the
preload), and the median of the rounds' ratios (ten / one): the machine's speed drifts over
minutes, the two rates of a round are seconds apart. Early and lost (by key) per run, each == 0.
Full size only (``ten_params``). It runs before the two-tenant drains, on the warmed broker as
``throughput`` does: run right after them (2M records delivered and their changelogs' puts and
tombstones written moments before), ten tenants measured 0.67-1.13 of one over 12 rounds of four
runs (median 0.77), against 0.95 and 0.98 in two rounds with nothing before them; what the broker
or the machine still did then is not traced.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench import mass_expiry
from bench.report import fig
from bench.workload import (
    Bench,
    Delivered,
    PacedProducer,
    lateness_percentiles,
    log,
    preload,
    quiet_disk,
    read_range,
    sleep_until_wall_ms,
    uid,
    wait_until,
    written_back,
)

B_DELAY_MS = 1_000
B_LEAD_MS = 3_000  # B's stream starts this long before A's due time: B alone for 2 s
B_TAIL_S = 1.5  # and goes on this long after A's drain


TENANTS = 10
TEN_ROUNDS_FULL = 5


def ten_params(bench: Bench) -> tuple[int, int]:
    """(records in all, rounds) of the ten-tenant comparison: full size only. At small size two more
    sidecars with their start-up (about 18 s in all, a third of the scenario) in CI's smoke run
    would buy a rate that 10k records cannot measure (a window of 1-2 s). 1M records, not 300k:
    300k drained in 3-4 s, and the ten tenants' first deliveries come 0.5-0.9 s apart (the
    consumer hands out one partition's first fetch after another), a seventh of that window."""
    return (1_000_000, TEN_ROUNDS_FULL) if bench.full else (0, 0)


def params(bench: Bench) -> tuple[int, int, float]:
    """(A's records, A's delay ms, B's rate records/s). ``--expiry-delay`` sets A's delay and
    ``--max-delay`` cuts it as they do ``mass-expiry``'s (the longest level time up to it; the
    smoke test's 5 s: the two waits for the due time, A's and the single tenant's, are most of its
    run)."""
    n, delay_ms, b_rate = (1_000_000, 240_000, 1_000.0) if bench.full else (20_000, 10_000, 500.0)
    return n, mass_expiry.capped_delay(bench, mass_expiry.expiry_delay(bench, delay_ms)), b_rate


def _config(a_in: str, b_in: str, b_out: str) -> str:
    return (
        "tenants:\n"
        f"  a:\n    ingress-topic: {a_in}\n    dlq-topic: {a_in}.dlq\n"
        f"  b:\n    ingress-topic: {b_in}\n    dlq-topic: {b_in}.dlq\n    target-allowlist: ['{b_out}']\n"
    )


def _counts(got: Delivered, sent: int) -> tuple[int, int]:
    """(early, lost) of what a tenant's target topic holds, ``sent`` records with distinct keys."""
    early = sum(1 for ts, da in zip(got.ts, got.deliver_at, strict=True) if ts < da)
    return early, max(0, sent - len(set(got.keys)))


def measure(bench: Bench, scheduler: str, n: int, delay_ms: int, b_rate: float) -> dict[str, Any]:
    u = uid()
    a_in, b_in, a_out, b_out = f"bench.ten.a.{u}", f"bench.ten.b.{u}", f"bench.ten.a.out.{u}", f"bench.ten.b.out.{u}"
    bench.topics(a_in, b_in, a_out, b_out)
    cfg = bench.workdir / f"tenants-{u}.yaml"
    cfg.write_text(_config(a_in, b_in, b_out))
    sc = bench.sidecar(a_in, scheduler, tag="tenants", changelog=bench.other_changelog, config=cfg)
    bench.topics_to_delete(f"{a_in}.dlq", f"{b_in}.dlq", f"{b_in}.changelog")
    sc.start()
    b: PacedProducer | None = None
    try:
        due, pre, stored = mass_expiry.preload_due_at_once(bench, sc, a_in, n, a_out, delay_ms,
                                                           f"tenants {scheduler}, tenant a's records")
        sleep_until_wall_ms(due - B_LEAD_MS)
        b = PacedProducer(bench.bootstrap, b_in, b_out, b_rate, 100, lambda _i: B_DELAY_MS)
        b.start()
        wait_until(f"{n} records of tenant a drained", lambda: bench.wm.total(a_out) >= n, 600, 0.1,
                   sc.check_alive)
        time.sleep(B_TAIL_S)
        b.stop()
        sent_b = b.accepted
        wait_until(f"{sent_b} records of tenant b delivered", lambda: bench.wm.total(b_out) >= sent_b,
                   60, 0.1, sc.check_alive)
    finally:
        if b is not None:
            b.stop()
        sc.stop()
    got_a = read_range(bench.bootstrap, a_out, {}, bench.wm.high(a_out), headers=True, keys=True)
    got_b = read_range(bench.bootstrap, b_out, {}, bench.wm.high(b_out), headers=True, keys=True)
    last_a = max(got_a.ts)
    during = [ts - da for ts, da in zip(got_b.ts, got_b.deliver_at, strict=True) if due <= da <= last_a]
    before = [ts - da for ts, da in zip(got_b.ts, got_b.deliver_at, strict=True) if da < due]
    a_early, a_lost = _counts(got_a, n)
    b_early, b_lost = _counts(got_b, sent_b)
    return {
        **{f"a_{k}": v for k, v in mass_expiry.drain_figures(n, pre, due, stored, last_a).items()},
        "a_delivered": len(got_a.ts),
        "a_early": a_early,
        "a_lost": a_lost,
        "b_sent": sent_b,
        "b_delivered": len(got_b.ts),
        "b_early": b_early,
        "b_lost": b_lost,
        "b_due_during_drain": len(during),
        "b_lateness_during_drain_ms": lateness_percentiles(during),
        "b_lateness_before_drain_ms": lateness_percentiles(before),
    }


def _ten_config(ingress: list[str], u: str) -> str:
    """Ten tenants, each its own DLQ and (fresh for each run) changelog topic."""
    lines = ["tenants:"]
    for j, topic in enumerate(ingress):
        lines.append(f"  t{j}:\n    ingress-topic: {topic}\n    dlq-topic: {topic}.dlq.{u}\n"
                     f"    changelog-topic: {topic}.cl.{u}")
    return "\n".join(lines) + "\n"


def _drain(bench: Bench, scheduler: str, ingress: list[str], target: str, n: int) -> dict[str, Any]:
    """One sidecar reads the pre-loaded ``ingress`` topics (several: one tenant each) from the
    beginning until ``target`` has their ``n`` records; its rate and correctness figures."""
    u = uid()
    cfg = None
    if len(ingress) > 1:
        cfg = bench.workdir / f"ten-{u}.yaml"
        cfg.write_text(_ten_config(ingress, u))
        bench.topics_to_delete(*(f"{t}.{k}.{u}" for t in ingress for k in ("dlq", "cl")))
    sc = bench.sidecar(ingress[0], scheduler, tag="tenants-ten", changelog=bench.other_changelog,
                       changelog_topic=None if cfg else f"bench.ten.cl.{u}", config=cfg)
    start = bench.wm.high(target)
    want = sum(start.values()) + n
    synced_s = quiet_disk()  # what ran before is written back before this run, not during it
    wb0 = written_back()
    sc.start()
    try:
        wait_until(f"{n} records from {len(ingress)} tenant(s) delivered", lambda: bench.wm.total(target) >= want,
                   120 + n / 1_000, 0.2, sc.check_alive)
    finally:
        wb1 = written_back()
        sc.stop()
    got = read_range(bench.bootstrap, target, start, bench.wm.high(target), headers=True, keys=True)
    early, lost = _counts(got, n)
    return {"tenants": len(ingress), "records_per_s": got.window_rate(), "delivered": len(got.ts),
            "early": early, "lost": lost,
            "window_s": (max(got.ts) - min(got.ts)) / 1000 if got.ts else None,
            "sync_before_s": round(synced_s, 2), "written_back_during_mb": round(wb1 - wb0)}


def measure_ten(bench: Bench, scheduler: str, n: int, rounds: int) -> dict[str, Any]:
    """The ten-tenant comparison (module docstring): every round's runs and the median ratio."""
    n = n // TENANTS * TENANTS
    u = uid()
    one_in, target = f"bench.ten.one.{u}", f"bench.ten.out.{u}"
    ten_in = [f"bench.ten.t{j}.{u}" for j in range(TENANTS)]
    bench.topics(one_in, *ten_in, target)
    preload(bench.bootstrap, one_in, n, 100, target, lambda _i: 0)
    for j, topic in enumerate(ten_in):
        preload(bench.bootstrap, topic, n // TENANTS, 100, target, lambda _i: 0, key_prefix=f"t{j}-")
    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        order = [[one_in], ten_in] if r % 2 == 0 else [ten_in, [one_in]]
        by = {len(topics): _drain(bench, scheduler, topics, target, n) for topics in order}
        one, ten = by[1], by[TENANTS]
        ratio = ten["records_per_s"] / one["records_per_s"] if ten["records_per_s"] and one["records_per_s"] \
            else None
        log(f"tenants {scheduler} round {r + 1}/{rounds}: one tenant {one['records_per_s'] or 0:,.0f}/s, "
            f"ten {ten['records_per_s'] or 0:,.0f}/s ({ratio or 0:.2f}); written back during them "
            f"{one['written_back_during_mb']} and {ten['written_back_during_mb']} MB")
        runs.append({"one": one, "ten": ten, "ratio": ratio})
    ratios = sorted(x["ratio"] for x in runs if x["ratio"] is not None)
    return {
        "records": n, "rounds": runs,
        "one_records_per_s": statistics.median([x["one"]["records_per_s"] or 0 for x in runs]),
        "ten_records_per_s": statistics.median([x["ten"]["records_per_s"] or 0 for x in runs]),
        "ratio": statistics.median(ratios) if ratios else None,
        "early": sum(x[k]["early"] for x in runs for k in ("one", "ten")),
        "lost": sum(x[k]["lost"] for x in runs for k in ("one", "ten")),
    }


def run(bench: Bench) -> dict[str, Any]:
    n, delay_ms, b_rate = params(bench)
    ten_n, ten_rounds = ten_params(bench)
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for sched in bench.schedulers:
        # ten tenants first, on the warmed broker: right after the 1M drains they measured lower
        # (module docstring)
        ten = measure_ten(bench, sched, ten_n, ten_rounds) if ten_rounds else None
        m = measure(bench, sched, n, delay_ms, b_rate)
        # the single-tenant drain of the same N right after, seconds apart (the machine drifts)
        single = mass_expiry.measure(bench, sched, n, delay_ms, b_rate)
        m["single_tenant"] = single
        rate, alone = m["a_drain_rate"], single["drain_rate"]
        ratio = rate / alone if rate and alone else None
        during, before = m["b_lateness_during_drain_ms"], m["b_lateness_before_drain_ms"]
        log(f"tenants {sched}: a drained {n:,} at {rate or 0:,.0f}/s ({ratio or 0:.2f} of one tenant's "
            f"{alone or 0:,.0f}/s); b late during it p50 {during['p50']} p99 {during['p99']} "
            f"p99.9 {during['p999']} ms ({m['b_due_during_drain']} records)")
        results[sched] = {
            "b_lateness_during_drain_p50_ms": fig(during["p50"], "ms"),
            "b_lateness_during_drain_p99_ms": fig(during["p99"], "ms", "<= 50"),
            "b_lateness_during_drain_p999_ms": fig(during["p999"], "ms", "<= 100"),
            "b_lateness_during_drain_max_ms": fig(during["max"], "ms"),
            "b_lateness_before_drain_p99_ms": fig(before["p99"], "ms", note="tenant b alone, before a's due time"),
            "a_drain_records_per_s": fig(rate, "records/s"),
            "single_tenant_drain_records_per_s": fig(alone, "records/s",
                                                     note="mass-expiry of the same N, measured right after"),
            "a_drain_ratio_to_single_tenant": fig(ratio, "x", ">= 0.8"),
            "a_early": fig(m["a_early"], "records", "== 0"),
            "a_lost": fig(m["a_lost"], "records", "== 0"),
            "b_early": fig(m["b_early"], "records", "== 0"),
            "b_lost": fig(m["b_lost"], "records", "== 0"),
        }
        if ten is None:
            details[sched] = m
            continue
        m["ten_tenants"] = ten
        results[sched].update({
            "ten_tenants_records_per_s": fig(ten["ten_records_per_s"], "records/s",
                                             note=f"{TENANTS} tenants' backlogs, the same total"),
            "one_tenant_records_per_s": fig(ten["one_records_per_s"], "records/s",
                                            note="one tenant's backlog, measured in the same rounds"),
            "ten_tenants_ratio_to_one": fig(ten["ratio"], "x", ">= 0.9"),
            "ten_tenants_early": fig(ten["early"], "records", "== 0"),
            "ten_tenants_lost": fig(ten["lost"], "records", "== 0"),
        })
        details[sched] = m
    bench.cleanup_topics()
    return {
        "method": "one sidecar, two tenants: a's N records due in one millisecond while b sends a paced stream "
                  "of 1 s delays; b's lateness for its records due during a's drain, a's drain rate vs a "
                  "single-tenant mass-expiry of the same N measured right after; and ten tenants' "
                  "backlogs (M / 10 each, due on arrival) drained by one sidecar vs one tenant's M, back "
                  "to back in each round (median ratio)",
        "settings": {"a_records": n, "a_delay_ms": delay_ms, "b_rate": b_rate, "b_delay_ms": B_DELAY_MS,
                     "record_bytes": 100, "schedulers": bench.schedulers, "ten_tenants_records": ten_n,
                     "ten_tenants_rounds": ten_rounds},
        "results": results,
        "details": details,
    }
