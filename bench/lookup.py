"""Scenario ``lookup``: how long ``delay-sidecar status`` takes to answer with N records pending.

Method: a sidecar holds N pending records (100 B, 30 min delay, default ids
``<ingress>:0:<offset>``): the store the ``pending-memory`` scenario built when it ran in the same
invocation (10M at full size; the sidecar is started again on it with ``--http-port``), else one
filled here (full: 10M, small: 20k). Then 1,000 look-ups in random order, half of them pending
ids (random offsets), half unknown (offsets past N, and ids of another form), each timed:

* ``http``: one ``GET /ids/<id>`` on a new connection to the sidecar's HTTP server, as
  ``status`` sends it (``sidecar.status.ask``);
* ``cli``: the command's path in-process (``sidecar.status.find``: the owner of the id's partition
  from a description of the consumer group, then its answer), with the group described once (the
  group description is timed apart, ``describe_group_ms``), so the figure is the look-up, not
  the Python interpreter starting.

Every answer is checked: a pending id must say ``pending`` with its due time, an unknown one
``unknown`` (``wrong_answers``, goal 0). The goal, <= 10 ms, is judged on p99 of both paths.
``server_wait`` and ``server_lookup`` are the sidecar's own share of each HTTP answer (``wait_ms``
for the loop to let go of the stores, ``lookup_ms``, as the answer reports them): the rest is the
HTTP exchange and, on a busy machine, the scheduler's delays. The sidecar's page faults over each
phase are in the details: at 10M pending the store's pages (~3.5 GB) need not be in the page
cache, and a look-up whose id-index or record page is not reads it from the disk (a major
fault). Each phase draws its own ids. The look-ups start once the
sidecar's checkpoint names the whole fill (its flusher has synced it) and it idled 2 s more.
For context, the whole command (``python -m sidecar status``, a new process that imports the
package and connects to Kafka) is timed a few times (``cli_process_ms``, no goal).
"""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from bench.pending_memory import PENDING_DELAY_MS
from bench.report import fig
from bench.workload import Bench, SidecarProc, log, percentile, preload, uid, wait_until, wall_ms
from sidecar import status
from sidecar.store import checkpoint

GOAL_MS = "<= 10"
LOOKUPS = 1000
CLI_RUNS = 3
IDLE_S = 2.0


def counts_for(bench: Bench) -> int:
    return 10_000_000 if bench.full else 20_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_http(sc: SidecarProc) -> str:
    """Give ``sc`` an HTTP server on a free local port (from its next start on)."""
    port = free_port()
    sc.extra += ["--http-port", str(port), "--http-host", "127.0.0.1"]
    return f"127.0.0.1:{port}"


def fill(bench: Bench, scheduler: str, n: int) -> tuple[SidecarProc, str, int]:
    """A running sidecar with ``n`` records pending on a fresh one-partition ingress topic."""
    ingress, target = f"bench.lk.in.{uid()}", f"bench.lk.out.{uid()}"
    bench.topics(ingress, target)
    sc = bench.sidecar(ingress, scheduler, tag="lk")
    address = serve_http(sc)
    sc.start()
    t0 = wall_ms()
    preload(bench.bootstrap, ingress, n, 100, target, lambda _i: PENDING_DELAY_MS)
    wait_pending(sc, n)
    return sc, address, wall_ms() - t0


def page_faults(pid: int) -> tuple[int, int]:
    """(minor, major) page faults of process ``pid`` so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[7]), int(fields[9])


def settle(sc: SidecarProc, n: int) -> None:
    """Wait until the sidecar's checkpoint names all ``n`` records (its flusher has synced the
    fill: GBs at 10M), then ``IDLE_S`` more (its trims after going idle)."""
    store = sc.data_dir / f"{sc.ingress}-0"

    def synced() -> bool:
        return int((checkpoint.read(store) or {}).get("ingress_offset") or 0) >= n

    wait_until("the fill's checkpoint", synced, 600, 0.2, sc.check_alive)
    time.sleep(IDLE_S)


def wait_pending(sc: SidecarProc, n: int) -> None:
    def stored() -> bool:
        return int((sc.stats() or {}).get("pending", 0)) >= n

    wait_until(f"{n:,} pending", stored, max(600, n / 2_000), 0.1, sc.check_alive)


def timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t) * 1000, out


def summary(ms: list[float], goal: str | None) -> dict[str, Any]:
    s = sorted(ms)
    return {"p50_ms": fig(percentile(s, 50), "ms"), "p99_ms": fig(percentile(s, 99), "ms", goal),
            "max_ms": fig(s[-1] if s else None, "ms")}


def measure(bench: Bench, sc: SidecarProc, address: str, n: int) -> dict[str, Any]:
    rng = random.Random(24)
    prefix = f"{sc.ingress}:0:"

    def sample() -> list[tuple[bytes, bool]]:
        queries = [((prefix + str(rng.randrange(n))).encode(), True) for _ in range(LOOKUPS // 2)]
        queries += [((prefix + str(n + rng.randrange(n))).encode() if i % 2 else f"nobody-{uid()}".encode(), False)
                    for i in range(LOOKUPS - len(queries))]
        rng.shuffle(queries)
        return queries

    queries = sample()
    wrong: list[str] = []

    def check(rid: bytes, pending: bool, code: int, doc: dict[str, Any]) -> None:
        ok = (code == 200 and doc.get("state") == "pending" and isinstance(doc.get("due_ms"), int)) if pending \
            else (code == 404 and doc.get("state") == "unknown")
        if not ok and len(wrong) < 10:
            wrong.append(f"{rid!r}: HTTP {code} {doc}")
        elif not ok:
            wrong.append("")

    settle(sc, n)
    faults0 = page_faults(sc.pid)
    http_ms, wait_ms, lookup_ms = [], [], []
    for rid, pending in queries:
        ms, (code, doc) = timed(lambda rid=rid: status.ask(address, rid, None, 10))
        http_ms.append(ms)
        wait_ms.append(float(doc.get("wait_ms", 0)))
        lookup_ms.append(float(doc.get("lookup_ms", 0)))
        check(rid, pending, code, doc)
    faults = [b - a for a, b in zip(faults0, page_faults(sc.pid), strict=True)]
    admin = AdminClient({"bootstrap.servers": bench.bootstrap})
    describe_ms, members = timed(lambda: status.group_members(admin, sc.group, sc.ingress, 30))
    cli_ms = []
    faults0 = page_faults(sc.pid)
    for rid, pending in sample():  # other ids: pages the http phase read are not read again
        partition = status.default_id_partition(rid, sc.ingress)
        try:
            ms, doc = timed(lambda rid=rid, partition=partition: status.find(members, rid, partition, sc.group, 10))
        except status.StatusError as e:
            ms, doc = 0.0, {"error": str(e)}
        cli_ms.append(ms)
        check(rid, pending, 200 if doc.get("state") not in (None, "unknown") else 404, doc)
    faults += [b - a for a, b in zip(faults0, page_faults(sc.pid), strict=True)]
    process_ms = []
    for rid, _pending in queries[:CLI_RUNS]:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "sidecar", "status", rid.decode(), "--bootstrap-servers",
                        bench.bootstrap, "--group", sc.group, "--ingress-topic", sc.ingress, "--json"],
                       capture_output=True, timeout=120, check=False)
        process_ms.append((time.perf_counter() - t) * 1000)
    return {"http_ms": http_ms, "wait_ms": wait_ms, "lookup_ms": lookup_ms, "cli_ms": cli_ms,
            "describe_group_ms": describe_ms, "process_ms": process_ms, "wrong": wrong,
            "faults": faults}


def run(bench: Bench) -> dict[str, Any]:
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    stores = bench.results.get("pending-stores", {})
    for sched in bench.schedulers:
        if sched in stores:  # pending-memory's store, stopped: started again with an HTTP server
            sc, n = stores[sched]
            address = serve_http(sc)
            sc.start(timeout_s=600)
            wait_pending(sc, n)
            source, fill_ms = "store built by pending-memory", None
        else:
            n = counts_for(bench)
            sc, address, fill_ms = fill(bench, sched, n)
            source = "store filled here"
        log(f"lookup {sched}: {n:,} pending ({source}), {LOOKUPS} look-ups ...")
        try:
            m = measure(bench, sc, address, n)
        finally:
            sc.stop()
        http, cli = summary(m["http_ms"], GOAL_MS), summary(m["cli_ms"], GOAL_MS)
        log(f"lookup {sched}: http p50 {http['p50_ms']['value']} ms p99 {http['p99_ms']['value']} ms, "
            f"cli path p99 {cli['p99_ms']['value']} ms, wrong answers {len(m['wrong'])}")
        results[sched] = {
            "pending": fig(n, "records"),
            "http": http,
            "cli": cli,
            "server_wait": summary(m["wait_ms"], None),
            "server_lookup": summary(m["lookup_ms"], None),
            "wrong_answers": fig(len(m["wrong"]), "answers", "== 0"),
            "describe_group_ms": fig(m["describe_group_ms"], "ms", note="once per status command"),
            "cli_process_ms": fig(sorted(m["process_ms"])[len(m["process_ms"]) // 2], "ms",
                                  note=f"median of {CLI_RUNS} whole `delay-sidecar status` processes"),
        }
        details[sched] = {"store": source, "fill_ms": fill_ms, "wrong_answers": m["wrong"][:10],
                          "cli_process_ms": m["process_ms"],
                          "sidecar_page_faults": dict(zip(("http_minor", "http_major", "cli_minor", "cli_major"),
                                                          m["faults"], strict=True))}
    return {
        "method": f"{LOOKUPS} look-ups (half pending, half unknown, random order) with N pending: GET /ids/<id> on a "
                  "new connection, and the status command's owner-and-ask path in-process; every answer checked",
        "settings": {"pending": counts_for(bench), "lookups": LOOKUPS, "schedulers": bench.schedulers},
        "results": results,
        "details": details,
    }
