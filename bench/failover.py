"""Scenario ``failover``: partitions handed between sidecar instances of one group under load,
with the changelog on (the default): nothing lost, nothing early, how many duplicates, and how
long each handover takes.

Method, per scheduler, two runs on real sidecar processes (``python -m sidecar run``) against
the broker. Each run has its own ingress topic of ``PARTITIONS`` partitions (the sidecar's
default ``ingress-partitions``), its own target topic, and the changelog topic the sidecars
create (``<ingress>.changelog``). A paced producer (``RATE`` records/s of 100 B, unique keys;
levels: ``delay.ms`` of 1 s or 5 s, level times; wheel: uniform 1-5 s) runs from the moment the
first instance serves every partition until the last membership change has settled and
``DWELL_S`` (``--dwell``) more seconds have passed.

1. *membership*: instances of one consumer group, each with its own data directory and static
   id (``--group-instance-id``), ``session.timeout.ms`` = ``SESSION_MS``. Changes, each followed
   by a wait until the live instances serve every partition between them (each instance at least
   one, none twice; *serving* = assigned and ``partition.restored``, not revoked or lost since)
   and ``DWELL_S`` seconds: start A (1); start B (1 -> 2); start C (2 -> 3); SIGTERM B and C at
   once (3 -> 1; static members do not leave the group on close, so their partitions move when
   their sessions time out); start B again on its old data directory (1 -> 2: its stale stores
   catch up from the changelog); SIGKILL B and delete its data directory (node loss, 2 -> 1: A
   takes B's partitions when B's session times out); start B again with the same static id and an
   empty data directory (a replacement node, 1 -> 2: its stores are restored from the changelog
   alone).
2. *crash loop*: one instance with default flags (no ``--group-instance-id``: it keeps the id it
   made in ``<data-dir>/instance-id``; the sidecar's own session timeout), SIGKILLed ``CRASHES``
   times (``--crashes``) and restarted at once on the same data directory, a kill every
   ``CRASH_EVERY_S`` s after the previous spawn (and not before the new process has joined the group: it logged
   ``partitions.assigned``), after ``LEAD_S`` s of load; ``LEAD_S`` s of load after it serves every
   partition again.

After the load stops and every record is due, the bench waits until the target holds as many
records as the producer got acknowledged (or ``max delay + 60 s``), stops the instances and reads
the target topic. Per run: sent (acknowledged by the broker), delivered (distinct keys), lost
(sent keys never delivered; goal 0), early (record timestamp < ``delay.deliver-at``; goal 0),
duplicates (deliveries beyond the first of a key), lateness (record timestamp -
``delay.deliver-at``, every delivery) p50 / p99 / max.

Duplicates are expected around a handover: records the old owner delivered whose tombstone or
ingress commit had not reached the broker when it stopped owning the partition. The bound counts,
per handover (a ``partitions.revoked`` or ``partitions.lost`` event, logged once the instance has
stopped publishing them; or a SIGKILL with the partitions the victim served, timed when the victim
is known dead: ``sigkill``), the records of the partitions it moved delivered (first delivery)
within ``DUP_WINDOW_MS`` before it: one commit interval (the sidecar's default 1 s), plus one for
the checkpoint in flight (taken every commit interval, committed once synced).
``duplicates_outside_bound`` counts duplicated keys whose first delivery lies in no such window
(goal 0); its sample names, per copy, the instance that served the partition when the copy was
produced (``serving_spans``: none between owners, as for a zombie's), to tell a zombie, one owner
delivering twice and a restore that brought a delivered record back apart.

Handover time, per membership change: from the bench's action (spawn, SIGTERM, SIGKILL) to the
last ``partition.restored`` of the partitions assigned after it (before the next change); with the
records and seconds of those restores. The crash loop's goal is the lateness p99 of the records
due while it crashed (from the first kill until the last restart serves every partition again):
<= 5 s.
"""

from __future__ import annotations

import bisect
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bench.report import fig
from bench.workload import (
    Bench,
    BenchError,
    PacedProducer,
    SidecarProc,
    choice_delays,
    cut_delays,
    dwell_s,
    log,
    percentile,
    read_range,
    sleep_until_wall_ms,
    uid,
    uniform_delays,
    wait_until,
    wall_ms,
)

PARTITIONS = 6
RATE = {"small": 1_000.0, "full": 10_000.0}
DWELL_S = {"small": 0.5, "full": 30.0}
SESSION_MS = {"small": 6_000, "full": 10_000}  # 6 s: the broker's group.min.session.timeout.ms
CRASHES = {"small": 4, "full": 10}
CRASH_EVERY_S = 2.0
LEAD_S = {"small": 2.0, "full": 15.0}
LEVEL_DELAYS = (1_000, 5_000)
WHEEL_DELAYS = (1_000, 5_000)
COMMIT_INTERVAL_MS = 1_000  # the sidecar's default commit-interval
DUP_WINDOW_MS = 2 * COMMIT_INTERVAL_MS
READY_TIMEOUT_S = 180.0
CRASH_GOAL_P99_S = "<= 5"


def event_ms(ev: dict[str, Any]) -> int:
    """The sidecar's own timestamp of a log event (structlog ISO, UTC), else when the bench saw it."""
    ts = ev.get("timestamp")
    if isinstance(ts, str):
        try:
            return int(datetime.fromisoformat(ts).timestamp() * 1000)
        except ValueError:
            pass
    return int(ev.get("_seen_ms", 0))


class Member:
    """One sidecar instance across its runs: the events of every run, and the partitions it serves
    now (assigned and restored, not revoked or lost since)."""

    def __init__(self, label: str, sc: SidecarProc) -> None:
        self.label = label
        self.sc = sc
        self.past: list[dict[str, Any]] = []
        self.live = False
        self.runs = 0

    def start(self) -> int:
        log_path = self.sc.log_path
        if log_path.exists():  # the next run would replace it: keep each run's log (--keep-workdir)
            log_path.replace(log_path.with_suffix(f".run{self.runs}.log"))
        self.sc.start(wait=False)
        self.live = True
        self.runs += 1
        return self.sc.started_ms

    def send(self, sig: int) -> None:
        """Send ``sig`` without waiting (several instances stopped at once)."""
        if self.sc.proc is not None and self.sc.proc.poll() is None:
            self.sc.proc.send_signal(sig)

    def end(self, sig: int = signal.SIGTERM) -> None:
        self.sc.stop(sig)
        self.past.extend(self._tagged(self.sc.events))
        self.live = False

    def _tagged(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for ev in events:
            ev.setdefault("_member", self.label)
            ev.setdefault("_run", self.runs)
            ev.setdefault("_ms", event_ms(ev))
        return events

    def events(self) -> list[dict[str, Any]]:
        return self.past + (self._tagged(self.sc.poll_events()) if self.live else [])

    def serving(self) -> set[int]:
        if not self.live:
            return set()
        owned: set[int] = set()
        served: set[int] = set()
        for ev in self.sc.poll_events():
            name = ev.get("event")
            if name == "partitions.assigned":
                owned |= set(ev.get("partitions", []))
            elif name in ("partitions.revoked", "partitions.lost"):
                gone = set(ev.get("partitions", []))
                owned -= gone
                served -= gone
            elif name == "partition.restored" and ev.get("partition") in owned:
                served.add(int(ev["partition"]))
        return served


def wait_serving(members: list[Member], timeout_s: float = READY_TIMEOUT_S) -> int:
    """Wait until the live members serve every partition between them, each at least one and
    none twice; return the bench's wall ms when it saw that."""
    live = [m for m in members if m.live]

    def alive() -> None:
        for m in live:
            m.sc.check_alive()

    def balanced() -> bool:
        sets = [m.serving() for m in live]
        return all(sets) and sum(len(s) for s in sets) == PARTITIONS and set().union(*sets) == set(range(PARTITIONS))

    wait_until(f"{len(live)} instance(s) to serve all {PARTITIONS} partitions", balanced, timeout_s, 0.1, alive)
    return wall_ms()


@dataclass
class Handover:
    """Partitions that changed owner at ``at_ms``: the records of them delivered in the
    ``DUP_WINDOW_MS`` before may be delivered again."""

    at_ms: int
    partitions: frozenset[int]
    what: str


def sigkill(m: Member, what: str) -> Handover:
    """SIGKILL ``m``: the handover of the partitions it served, at the moment it is known dead.
    Not when the bench decided to kill it: the victim delivers until the signal lands, and what it
    had in flight then (its last few ms of deliveries, whose tombstones were not acknowledged) is
    exactly what its successor delivers again; reading its events and sending the signal take the
    bench milliseconds, tens of them on a loaded machine, and a window ending before them missed
    those duplicates (11 of the wheel's 24 in one full run of this scenario)."""
    served = frozenset(m.serving())
    m.end(signal.SIGKILL)  # returns once the process has exited
    return Handover(wall_ms(), served, what)


def handovers_of(members: list[Member], kills: list[Handover]) -> list[Handover]:
    out = list(kills)
    for m in members:
        for ev in m.events():
            if ev.get("event") in ("partitions.revoked", "partitions.lost") and ev.get("partitions"):
                out.append(Handover(int(ev["_ms"]), frozenset(ev["partitions"]), f"{m.label}: {ev['event']}"))
    return sorted(out, key=lambda h: h.at_ms)


def delays(bench: Bench) -> tuple[tuple[int, ...], tuple[int, int]]:
    """(the level times levels is sent, the wheel's uniform range): 1 s and 5 s, cut at
    ``--max-delay`` (the smoke test's shorter tail)."""
    return cut_delays(LEVEL_DELAYS, WHEEL_DELAYS, bench.options.get("max_delay_ms"))


def delays_for(bench: Bench, scheduler: str) -> Any:
    levels, wheel = delays(bench)
    return choice_delays(levels) if scheduler == "levels" else uniform_delays(*wheel)


def crashes(bench: Bench) -> int:
    """The crash loop's SIGKILLs: ``--crashes``, else ``CRASHES`` of the size."""
    k = bench.options.get("crashes")
    return CRASHES[bench.size] if k is None else int(k)


def longest_delay_ms(bench: Bench) -> int:
    levels, wheel = delays(bench)
    return max(*levels, wheel[1])


def start_load(bench: Bench, ingress: str, target: str, scheduler: str) -> PacedProducer:
    prod = PacedProducer(bench.bootstrap, ingress, target, RATE[bench.size], 100, delays_for(bench, scheduler),
                         key_prefix=f"f{uid()}-")
    prod.start()
    return prod


def alive_check(members: list[Member]) -> Callable[[], None]:
    """Raises if a live member's process has exited (a wait's ``alive`` check)."""

    def alive() -> None:
        for m in members:
            if m.live:
                m.sc.check_alive()

    return alive


def finish_load(bench: Bench, prod: PacedProducer, target: str, members: list[Member],
                delivered: Callable[[], int] | None = None, timeout_s: float = 60) -> dict[str, Any]:
    """Stop the load, wait (``timeout_s`` at most) until ``delivered()`` (default: the target's
    high watermarks) reaches what the broker accepted, stop the instances (SIGTERM)."""
    prod.stop()
    sleep_until_wall_ms(prod.stopped_ms + longest_delay_ms(bench))
    waited: dict[str, Any] = {"complete": True}
    count = delivered or (lambda: bench.wm.total(target))
    try:
        wait_until(f"{prod.accepted} records delivered to {target}", lambda: count() >= prod.accepted,
                   timeout_s, 0.25, alive_check(members))
        time.sleep(1.0)  # a duplicate still on its way
    except BenchError as e:
        waited = {"complete": False, "why": str(e)}
        log(f"{e} (reported as lost)")
    for m in members:
        if m.live:
            m.send(signal.SIGTERM)
    for m in members:
        if m.live:
            m.end()
    return waited


def _merged(spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Overlapping [lo, hi] spans merged: (sorted starts, their ends), for bisection."""
    starts: list[int] = []
    ends: list[int] = []
    for lo, hi in sorted(spans):
        if ends and lo <= ends[-1]:
            ends[-1] = max(ends[-1], hi)
        else:
            starts.append(lo)
            ends.append(hi)
    return starts, ends


def serving_spans(members: list[Member], kills: dict[str, list[int]]) -> dict[int, list[tuple[int, int, str]]]:
    """Per partition, ``(from_ms, to_ms, "<member><run>")``: when each instance served it (from its
    ``partition.restored`` to the ``partitions.revoked`` / ``partitions.lost`` that took it, the
    SIGKILL of its process (``kills``: the times by member label), or its last event)."""
    spans: dict[int, list[tuple[int, int, str]]] = {}
    for m in members:
        runs: dict[int, list[dict[str, Any]]] = {}
        for ev in m.events():
            runs.setdefault(int(ev.get("_run", 0)), []).append(ev)
        for run, evs in runs.items():
            evs.sort(key=lambda ev: int(ev["_ms"]))
            start, end = int(evs[0]["_ms"]), int(evs[-1]["_ms"])
            # its own kill: after its first event, within a stats interval of its last one
            killed = sorted(k for k in kills.get(m.label, []) if start <= k <= end + 30_000)
            last = max(killed[0], end) if killed else end
            since: dict[int, int] = {}
            for ev in evs:
                name = ev.get("event")
                if name == "partition.restored" and "partition" in ev:
                    since.setdefault(int(ev["partition"]), int(ev["_ms"]))
                elif name in ("partitions.revoked", "partitions.lost"):
                    for p in ev.get("partitions", []):
                        if p in since:
                            spans.setdefault(p, []).append((since.pop(p), int(ev["_ms"]), f"{m.label}{run}"))
            for p, t in since.items():
                spans.setdefault(p, []).append((t, last, f"{m.label}{run}"))
    return spans


def served_by(spans: dict[int, list[tuple[int, int, str]]], p: int, ts: int) -> list[str]:
    """The instances serving partition ``p`` at ``ts`` (none: between owners, or a zombie)."""
    return [who for lo, hi, who in spans.get(p, []) if lo <= ts <= hi]


def analyse(bench: Bench, target: str, prod: PacedProducer, handovers: list[Handover],
            window: tuple[int, int] | None = None,
            spans: dict[int, list[tuple[int, int, str]]] | None = None) -> dict[str, Any]:
    """Read the target; sent / delivered / lost / early / duplicates / lateness (see the module
    docstring); ``window``: also the lateness of the records due within it; ``spans``
    (``serving_spans``): the outside-bound sample names the instance serving each copy's partition
    when it was produced (a diagnosis: a zombie, the same owner twice, a restore)."""
    got = read_range(bench.bootstrap, target, {}, bench.wm.high(target), headers=True, keys=True)
    prefix = prod.key_prefix.encode()
    plen = len(prefix)

    def was_sent(k: bytes) -> bool:  # the load generator's keys are <prefix><n>, n < sent
        tail = k[plen:]
        return k.startswith(prefix) and tail.isdigit() and int(tail) < prod.sent

    first: dict[bytes, tuple[int, int]] = {}
    for k, ts, p in zip(got.keys, got.ts, got.partitions, strict=True):
        first.setdefault(k, (ts, p))
    counts = Counter(got.keys)
    delivered = sum(1 for k in first if was_sent(k))
    late = sorted(ts - da for ts, da in zip(got.ts, got.deliver_at, strict=True))
    windows = {p: _merged([(h.at_ms - DUP_WINDOW_MS, h.at_ms) for h in handovers if p in h.partitions])
               for p in range(PARTITIONS)}

    def in_window(ts: int, p: int) -> bool:
        starts, ends = windows.get(p, ([], []))
        i = bisect.bisect_right(starts, ts) - 1
        return i >= 0 and ts <= ends[i]

    bound = sum(1 for ts, p in first.values() if in_window(ts, p))
    dup_keys = [k for k, n in counts.items() if n > 1]
    outside = [k for k in dup_keys if not in_window(*first[k])]
    sample = set(outside[:10])
    outside_sample: dict[str, dict[str, Any]] = {}
    for k, ts, da, p in zip(got.keys, got.ts, got.deliver_at, got.partitions, strict=True):
        if k in sample:
            one = outside_sample.setdefault(k.decode(errors="replace"), {"partition": p, "deliver_at": da, "ts": []})
            one["ts"].append(ts)
            if spans is not None:
                one.setdefault("served_by", []).append(served_by(spans, p, ts))
    out: dict[str, Any] = {
        "sent": prod.accepted,
        "produce_failed": prod.failed,
        "delivered": delivered,
        "deliveries": len(got.ts),
        "lost": max(0, prod.accepted - delivered),
        "early": sum(1 for x in late if x < 0),
        "duplicates": len(got.ts) - len(first),
        "duplicated_keys": len(dup_keys),
        "duplicates_bound": bound,
        "duplicates_outside_bound": len(outside),
        "duplicates_outside_bound_sample": outside_sample,
        "unknown_keys": len(first) - delivered,
        "lateness_ms": {"p50": percentile(late, 50), "p99": percentile(late, 99), "max": late[-1] if late else None},
        "handovers": [{"at_ms": h.at_ms, "partitions": sorted(h.partitions), "what": h.what} for h in handovers],
    }
    if window is not None:
        lo, hi = window
        inside = sorted(ts - da for ts, da in zip(got.ts, got.deliver_at, strict=True) if lo <= da <= hi)
        out["window_ms"] = [lo, hi]
        out["window_records"] = len(inside)
        out["window_lateness_ms"] = {"p50": percentile(inside, 50), "p99": percentile(inside, 99),
                                     "max": inside[-1] if inside else None}
    return out


def change_times(members: list[Member], changes: list[dict[str, Any]]) -> None:
    """Per change: the partitions assigned after it (before the next one), and the time from the
    bench's action to the last of them restored; the records and seconds of those restores."""
    events = sorted((ev for m in members for ev in m.events()), key=lambda ev: int(ev["_ms"]))
    for i, ch in enumerate(changes):
        lo = ch["at_ms"]
        hi = changes[i + 1]["at_ms"] if i + 1 < len(changes) else 1 << 62
        moved: dict[int, str] = {}  # partition -> the member it went to (the last assignment)
        restored: dict[int, dict[str, Any]] = {}
        for ev in events:
            if not lo <= ev["_ms"] < hi:
                continue
            if ev.get("event") == "partitions.assigned":
                for p in ev.get("partitions", []):
                    moved[p] = ev["_member"]
                    restored.pop(p, None)
            elif ev.get("event") == "partition.restored" and moved.get(ev.get("partition", -1)) == ev["_member"]:
                restored.setdefault(int(ev["partition"]), ev)
        done = [restored[p] for p in moved if p in restored]
        ch["moved_partitions"] = sorted(moved)
        ch["restored_partitions"] = sorted(restored)
        ch["handover_s"] = ((max(int(ev["_ms"]) for ev in done) - lo) / 1000
                            if moved and len(done) == len(moved) else None)
        ch["restore_records"] = sum(int(ev.get("records", 0)) for ev in done)
        ch["restore_max_s"] = max((float(ev.get("seconds", 0)) for ev in done), default=None)


def membership_run(bench: Bench, scheduler: str) -> dict[str, Any]:
    ingress, target = f"bench.fo.in.{uid()}", f"bench.fo.out.{uid()}"
    bench.topics(ingress, partitions=PARTITIONS)
    bench.topics(target)
    group, dlq = f"bench-fo-{uid()}", f"bench.fo.dlq.{uid()}"
    members = [
        Member(label, bench.sidecar(ingress, scheduler, tag=f"fo-{label}", group=group, static_id=f"{group}-{label}",
                                    partitions=PARTITIONS, dlq=dlq, session_timeout_ms=SESSION_MS[bench.size]))
        for label in ("A", "B", "C")
    ]
    a, b, c = members
    dwell = dwell_s(bench, DWELL_S)
    changes: list[dict[str, Any]] = []
    kills: list[Handover] = []

    def change(name: str, kind: str, act: Any) -> None:
        at = wall_ms()
        act()
        ready = wait_serving(members, READY_TIMEOUT_S + SESSION_MS[bench.size] / 1000)
        live = sum(1 for m in members if m.live)
        changes.append({"change": name, "kind": kind, "at_ms": at, "ready_s": (ready - at) / 1000, "instances": live})
        log(f"failover {scheduler}: {name}: all partitions served again after {(ready - at) / 1000:.1f} s")
        time.sleep(dwell)

    def kill_b() -> None:
        kills.append(sigkill(b, "B: SIGKILL"))
        b.sc.wipe()

    def stop_bc() -> None:
        b.send(signal.SIGTERM)
        c.send(signal.SIGTERM)
        b.end()
        c.end()

    change("start_1", "start", a.start)
    prod = start_load(bench, ingress, target, scheduler)
    try:
        time.sleep(dwell)
        change("scale_out_1_2", "start", b.start)
        change("scale_out_2_3", "start", c.start)
        change("scale_in_3_1", "stop", stop_bc)
        change("rejoin_1_2", "start", b.start)
        change("node_loss_2_1", "kill", kill_b)
        change("replace_1_2", "start", b.start)
    except BaseException:
        prod.stop()  # the CLI stops the processes
        raise
    waited = finish_load(bench, prod, target, members)
    change_times(members, changes)
    spans = serving_spans(members, {b.label: [h.at_ms for h in kills]})
    res = analyse(bench, target, prod, handovers_of(members, kills), spans=spans)
    return {**res, "delivery_wait": waited, "changes": changes, "rate": RATE[bench.size],
            "load_s": (prod.stopped_ms - prod.started_ms) / 1000}


def read_instance_id(sc: SidecarProc) -> str | None:
    try:
        return (sc.data_dir / "instance-id").read_text().strip() or None
    except OSError:
        return None


def crash_run(bench: Bench, scheduler: str) -> dict[str, Any]:
    ingress, target = f"bench.fc.in.{uid()}", f"bench.fc.out.{uid()}"
    bench.topics(ingress, partitions=PARTITIONS)
    bench.topics(target)
    m = Member("X", bench.sidecar(ingress, scheduler, tag="crash", static_id=False, partitions=PARTITIONS,
                                  session_timeout_ms=None))
    m.start()
    wait_serving([m])
    ids = [read_instance_id(m.sc)]
    prod = start_load(bench, ingress, target, scheduler)
    kills: list[Handover] = []
    try:
        time.sleep(LEAD_S[bench.size])
        for _k in range(crashes(bench)):
            sleep_until_wall_ms(m.sc.started_ms + int(CRASH_EVERY_S * 1000))
            m.sc.wait_event("partitions.assigned", 120)
            kills.append(sigkill(m, "SIGKILL"))
            m.start()
        loop_end = wait_serving([m])
        ids.append(read_instance_id(m.sc))
        time.sleep(LEAD_S[bench.size])
    except BaseException:
        prod.stop()
        raise
    waited = finish_load(bench, prod, target, [m])
    restarts = [ev for ev in m.events() if ev.get("event") == "partition.restored"]
    res = analyse(bench, target, prod, handovers_of([m], kills), (kills[0].at_ms, loop_end),
                  spans=serving_spans([m], {m.label: [h.at_ms for h in kills]}))
    return {**res, "delivery_wait": waited, "kills": len(kills), "loop_s": (loop_end - kills[0].at_ms) / 1000,
            "kill_to_serving_s_last": (loop_end - kills[-1].at_ms) / 1000, "instance_ids": ids,
            "instance_id_kept": len(set(ids)) == 1 and ids[0] is not None,
            "restores": len(restarts), "restored_records": sum(int(ev.get("records", 0)) for ev in restarts),
            "rate": RATE[bench.size], "load_s": (prod.stopped_ms - prod.started_ms) / 1000}


def _ms_to_s(v: float | int | None) -> float | None:
    return None if v is None else v / 1000


def run(bench: Bench) -> dict[str, Any]:
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for sched in bench.schedulers:
        log(f"failover {sched}: membership changes 1 -> 2 -> 3 -> 1 -> 2, node loss, replacement ...")
        mr = membership_run(bench, sched)
        log(f"failover {sched}: membership: sent {mr['sent']}, lost {mr['lost']}, early {mr['early']}, "
            f"duplicates {mr['duplicates']} (bound {mr['duplicates_bound']}, outside {mr['duplicates_outside_bound']})")
        log(f"failover {sched}: crash loop, {crashes(bench)} SIGKILLs, default flags ...")
        cr = crash_run(bench, sched)
        log(f"failover {sched}: crash loop: lateness p99 {cr['window_lateness_ms']['p99']} ms while crashing, "
            f"lost {cr['lost']}, early {cr['early']}, duplicates {cr['duplicates']}")
        results[sched] = {
            "membership": {
                "sent": fig(mr["sent"], "records"),
                "lost": fig(mr["lost"], "records", "== 0"),
                "early": fig(mr["early"], "records", "== 0"),
                "duplicates": fig(mr["duplicates"], "records"),
                "duplicates_bound": fig(mr["duplicates_bound"], "records",
                                        note="first deliveries of moved partitions within 2 commit intervals before "
                                             "a handover"),
                "duplicates_outside_bound": fig(mr["duplicates_outside_bound"], "records", "== 0"),
                "lateness_p50_ms": fig(mr["lateness_ms"]["p50"], "ms"),
                "lateness_p99_ms": fig(mr["lateness_ms"]["p99"], "ms"),
                "lateness_max_ms": fig(mr["lateness_ms"]["max"], "ms"),
                "handover_s": {ch["change"]: fig(ch["handover_s"], "s") for ch in mr["changes"]},
                "restore_records": {ch["change"]: fig(ch["restore_records"], "records") for ch in mr["changes"]},
            },
            "crash_loop": {
                "kills": fig(cr["kills"], "SIGKILLs"),
                "loop_s": fig(cr["loop_s"], "s"),
                "sent": fig(cr["sent"], "records"),
                "lost": fig(cr["lost"], "records", "== 0"),
                "early": fig(cr["early"], "records", "== 0"),
                "duplicates": fig(cr["duplicates"], "records"),
                "duplicates_bound": fig(cr["duplicates_bound"], "records"),
                "duplicates_outside_bound": fig(cr["duplicates_outside_bound"], "records", "== 0"),
                "lateness_p99_s": fig(_ms_to_s(cr["window_lateness_ms"]["p99"]), "s", CRASH_GOAL_P99_S,
                                      note="records due from the first kill until all partitions were served again"),
                "lateness_max_s": fig(_ms_to_s(cr["window_lateness_ms"]["max"]), "s"),
                "lateness_p99_run_s": fig(_ms_to_s(cr["lateness_ms"]["p99"]), "s", note="every record of the run"),
            },
        }
        details[sched] = {"membership": mr, "crash_loop": cr}
        bench.cleanup_topics()
    return {
        "method": "a paced load through sidecar instances of one group while instances join, leave (SIGTERM), die "
                  "with their disk (SIGKILL + data dir deleted) and crash-loop (SIGKILL x N, default flags); the "
                  "target is read at the end: lost, early, duplicates against the handover windows, lateness, "
                  "and per membership change the time to the moved partitions' partition.restored",
        "settings": {"partitions": PARTITIONS, "rate": RATE[bench.size], "dwell_s": dwell_s(bench, DWELL_S),
                     "session_timeout_ms": SESSION_MS[bench.size], "crashes": crashes(bench),
                     "crash_every_s": CRASH_EVERY_S, "lead_s": LEAD_S[bench.size], "levels_delays_ms": delays(bench)[0],
                     "wheel_delays_ms": delays(bench)[1], "duplicate_window_ms": DUP_WINDOW_MS, "record_bytes": 100,
                     "schedulers": bench.schedulers},
        "results": results,
        "details": details,
    }
