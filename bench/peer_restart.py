"""The peers' restart figure: a crashed peer's start to its first on-time delivery with M records
pending, by the method of the sidecar's ``restart`` scenario (:mod:`bench.restart`).

The peer holds M pending records (due in 30 min: the memory or disk figure's). Probe records fall
due one every ``STEP_MS`` from S for W seconds; they reach the peer the way its producers write
(PostgreSQL: rows inserted before the crash; Redis and Kafka Streams: ingress records read after
the restart, as the sidecar reads its probes; RabbitMQ: each published into one TTL level a level
before its due time, all before the crash, so that level is longer than W). At S -
``KILL_LEAD_MS`` the server and every process of it are SIGKILLed (a crash: no shutdown, no final
flush). At S the worker processes are started (they keep trying to connect) and then the server,
on the same data. Restart time = the first on-time probe's delivery - S, on time meaning lateness
(record timestamp - ``delay.deliver-at``) <= ``ON_TIME_MS``; probes due before are delivered
late, never early, and counted. Resolution ``STEP_MS``; a restart longer than W is reported as
not measured (None). Beside it, the time to
the first probe after which every probe's first delivery was on time (``steady_s``): a peer that
reads its input again after the restart can be on time once and then behind. After the probes,
the pending records are counted: a committed one the crash lost would show there.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from bench.report import Figure, fig
from bench.restart import ON_TIME_MS, STEP_MS
from bench.workload import Bench, BenchError, ScriptProc, log, read_range, sleep_until_wall_ms, uid, wall_ms

KILL_LEAD_MS = 1_000
PROBES_AHEAD_MS = 3_000  # S is this far after the measurement starts


def probe_seconds(bench: Bench) -> float:
    """W: long enough for a JVM's start and a store's restore (the sidecar's own scenario: 10 s)."""
    return 60.0 if bench.full else 15.0


class Crashable(Protocol):
    """A peer as the restart figure drives it."""

    def write_probes(self, target: str, s_ms: int, n: int) -> None:
        """Make ``n`` probes for ``target`` due at ``s_ms + k * STEP_MS`` reach the peer."""

    def kill(self) -> None:
        """SIGKILL the server and every process of it."""

    def start_workers(self, target: str, until_ms: int, n: int) -> list[ScriptProc]:
        """Start (not await) the workers that deliver the ``n`` probes, retrying the connection."""

    def start(self) -> None:
        """Start the server on its data; return once it answers."""

    def pending(self) -> int | None:
        """The records the peer holds still pending (None: this peer cannot be asked)."""


def measure(bench: Bench, name: str, crash: Crashable, pending: int,
            ahead_ms: int = PROBES_AHEAD_MS) -> dict[str, Any]:
    """``ahead_ms``: S after the start, at least the time ``crash.write_probes`` takes (RabbitMQ's
    publishes each probe a level's TTL before its due time)."""
    target = f"bench.{name}.restart.{uid()}"
    bench.topics(target)
    window_ms = int(probe_seconds(bench) * 1000)
    n = window_ms // STEP_MS
    s_ms = wall_ms() + ahead_ms
    crash.write_probes(target, s_ms, n)
    sleep_until_wall_ms(s_ms - KILL_LEAD_MS)
    crash.kill()
    sleep_until_wall_ms(s_ms)
    procs = crash.start_workers(target, s_ms + window_ms + 500, n)
    crash.start()
    server_up_ms = wall_ms() - s_ms
    for p in procs:
        p.result(window_ms / 1000 + 180)
    # a peer without worker processes (the application is its own) delivers while we wait here;
    # its duplicates count in the topic, so the wait is for every probe's id
    give_up = time.monotonic() + max(0, s_ms + window_ms - wall_ms()) / 1000 + 120
    while True:
        got = read_range(bench.bootstrap, target, {}, bench.wm.high(target), headers=True)
        if len(set(got.ids)) >= n or time.monotonic() >= give_up:
            break
        time.sleep(1.0)
    left = crash.pending()
    late = [ts - da for ts, da in zip(got.ts, got.deliver_at, strict=True)]
    on_time = [ts for ts, lm in zip(got.ts, late, strict=True) if 0 <= lm <= ON_TIME_MS]
    first: dict[bytes, tuple[int, int]] = {}  # a probe's first delivery: (timestamp, due)
    for pid, ts, da in zip(got.ids, got.ts, got.deliver_at, strict=True):
        if pid not in first or ts < first[pid][0]:
            first[pid] = (ts, da)
    late_dues = [da for ts, da in first.values() if ts - da > ON_TIME_MS]
    if left is not None and left != pending:
        raise BenchError(f"{name} restart: {left} records pending after the crash, expected {pending}")
    return {"pending": pending, "pending_after": left, "probes": n, "delivered": len(got.ts),
            "lost": n - len(set(got.ids)), "duplicates": len(got.ids) - len(set(got.ids)),
            "early": sum(1 for lm in late if lm < 0), "late_probes": sum(1 for lm in late if lm > ON_TIME_MS),
            "server_answering_s": server_up_ms / 1000,
            "restart_s": (min(on_time) - s_ms) / 1000 if on_time else None,
            "steady_s": steady_s(s_ms, window_ms, late_dues, bool(on_time))}


def report(scenario: str, key: str, rs: dict[str, Any], results: dict[str, Any], details: dict[str, Any]) -> None:
    """A restart measured, into a scenario's ``details["restart"]`` and ``results[<key>_restart]``."""
    details["restart"] = rs
    log(f"{scenario} restart with {rs['pending']:,} pending: {rs['restart_s']} s to the first on-time probe")
    results[f"{key}_restart"] = figures(rs)


def steady_s(s_ms: int, window_ms: int, late_dues: list[int], any_on_time: bool) -> float | None:
    """From S to the first probe after which every probe's first delivery was on time: a peer that
    delivers one probe on time and then falls behind (reading its input again) is not back yet.
    None when the window ended late."""
    if not any_on_time:
        return None
    last_late = max(late_dues, default=s_ms - STEP_MS)
    if last_late + STEP_MS >= s_ms + window_ms:
        return None
    return max(0, last_late + STEP_MS - s_ms) / 1000


def figures(rs: dict[str, Any]) -> dict[str, Figure]:
    return {
        "restart_s": fig(rs["restart_s"], "s",
                         note=f"SIGKILL, {rs['pending']:,} pending; start to the first on-time probe"),
        "server_answering_s": fig(rs["server_answering_s"], "s", note="start to the server answering"),
        "steady_s": fig(rs["steady_s"], "s", note="start to the first probe after which every probe was on time"),
        "late_probes": fig(rs["late_probes"], "records"),
        "early": fig(rs["early"], "records", "== 0"),
        "lost": fig(rs["lost"], "records", "== 0"),
        "duplicates": fig(rs["duplicates"], "records", note="probes delivered more than once"),
    }
