"""Scenario ``restore``: how fast a sidecar with no local store restores N pending records from the
changelog, and when it delivers on time again.

Method, per scheduler:

1. *Template*: a sidecar (default flags: changelog on) on a scratch ingress topic stores
   ``TEMPLATE_RECORDS`` records (100 B, ``delay.ms`` 30 min, a level time) and mirrors them to its
   changelog; the bench reads those changelog records back and checks that re-encoding each with
   ``sidecar.store.codec.encode`` from its decoded fields gives the same bytes.
2. *Fill*: a fresh one-partition ingress topic ``I`` and its changelog ``I.changelog``
   (``cleanup.policy=compact``, as the sidecar creates it) are created, and N changelog records are
   produced straight into it, each the template re-encoded with only what differs between records
   of one partition: the id (the sidecar's default id ``<ingress>:0:<offset>``, at offsets from
   ``OFFSET_BASE`` so that they never meet the probes' ids), the source offset, the key, and the
   enqueue and due times (both moved by ``i // 1000`` ms, so the delay stays the template's:
   1 000 records per ms). Key = the id, value = the commit-log record: what the sidecar's own
   mirror writes for a stored record. Producing them directly takes a fraction of the time a
   sidecar takes to ingest and mirror them.
3. *Restore*: a sidecar starts on ``I`` with an empty data directory (spawn = S). From S on a paced
   producer sends probes into ``I`` (``PROBE_RATE``/s, ``delay.ms`` 1 s, a level time: the committed
   due time is the send time + 1 s for both schedulers). The sidecar restores the changelog
   before it consumes ``I``, so probes sent during the restore are delivered late, after it.

Figures: the restore rate = ``records / seconds`` of the sidecar's ``partition.restored`` event
(its own clock, from the start of the partition's restore to its end; goal >= 200 000 records/s),
S -> ``partition.restored`` as the bench sees the event's timestamp (process start, group join and
restore; goal <= 50 s at 10M), S -> the first probe delivered with lateness <= 50 ms, and the
records the restored store holds (``pending`` in the event) against N (``lost``; goal 0).

4. *Standby failover*: the restored sidecar (A) runs with ``--standby-replicas 1`` in a group of
   its own; a second one (B, same flags, an empty data directory) joins it. The one partition stays
   with A, and B keeps a standby store of it, tailing the changelog (N records and the probes'
   writes) until its ``stats`` event shows a standby lag of 0 (``STANDBY_CAUGHT_UP`` records at
   most). Then A is SIGKILLed (its disk stays, but B does not need it) while the probes go on. The
   group gives the partition to B once A's session (``SESSION_MS``) has expired; B promotes its
   standby (``standby.promoted``), restores what it had not applied (``partition.restored``) and
   delivers. Figures: kill -> B's ``partitions.assigned`` (failure detection: the session
   timeout), assigned -> the first probe delivered with lateness <= 50 ms after it (goal <= 5 s at
   10M pending: the failover proper), kill -> first on-time delivery, and the records the promoted
   standby still had to restore.
"""

from __future__ import annotations

import signal
import time
from typing import Any, cast

from confluent_kafka import Consumer, TopicPartition

from bench.failover import event_ms
from bench.report import fig
from bench.workload import (
    Bench,
    BenchError,
    PacedProducer,
    SidecarProc,
    ingress_headers,
    log,
    producer,
    read_range,
    uid,
    value_of,
    wait_until,
    wall_ms,
)
from sidecar.store import codec

TEMPLATE_RECORDS = 3
PENDING_DELAY_MS = 1_800_000  # 30 min: a level time, inside the wheel's default window
OFFSET_BASE = 10_000_000_000
PROBE_RATE = 20.0
PROBE_DELAY_MS = 1_000
ON_TIME_MS = 50
GOAL_RATE = ">= 200000"
GOAL_10M_S = "<= 50"
GOAL_FAILOVER_S = "<= 5"
SESSION_MS = 6_000  # the broker's smallest session timeout (group.min.session.timeout.ms)
STANDBY_CAUGHT_UP = 100  # standby lag (records) that counts as caught up


def counts_for(bench: Bench) -> int:
    """N: ``--restore-pending``, else the size's."""
    return int(bench.options.get("restore_pending") or (10_000_000 if bench.full else 200_000))


def read_raw(bootstrap: str, topic: str, end: int, timeout_s: float = 60) -> list[tuple[bytes, bytes | None]]:
    """(key, value) of offsets [0, end) of partition 0."""
    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-raw-{uid()}", "enable.auto.commit": False})
    cons.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[bytes, bytes | None]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < end and time.monotonic() < deadline:
            for m in cons.consume(num_messages=1000, timeout=0.5):
                if m.error() is None and cast(int, m.offset()) < end:
                    out.append((m.key() or b"", m.value()))
    finally:
        cons.close()
    if len(out) < end:
        raise BenchError(f"reading {topic}: {len(out)} of {end} records within {timeout_s} s")
    return out


def template(bench: Bench, scheduler: str) -> Any:
    """A record as this scheduler's sidecar writes it to the changelog (decoded), checked to
    re-encode to the same bytes."""
    ingress, target = f"bench.rst.tpl.{uid()}", f"bench.rst.tplout.{uid()}"
    bench.topics(ingress, target)
    sc = bench.sidecar(ingress, scheduler, tag="rst-tpl")
    sc.start()
    changelog = f"{ingress}.changelog"
    try:
        p = producer(bench.bootstrap)
        value = value_of(100)
        for i in range(TEMPLATE_RECORDS):
            p.produce(ingress, value=value, key=b"t%d" % i, headers=ingress_headers(target, PENDING_DELAY_MS))
        if p.flush(30):
            raise BenchError("template records were not acknowledged")
        wait_until("the template records in the changelog", lambda: bench.wm.total(changelog) >= TEMPLATE_RECORDS,
                   60, 0.2, sc.check_alive)
    finally:
        sc.stop()
    raws = read_raw(bench.bootstrap, changelog, TEMPLATE_RECORDS)
    recs = []
    for key, raw in raws:
        if raw is None:
            raise BenchError(f"the template's changelog holds a tombstone for {key!r}")
        rec = codec.decode(memoryview(raw), 0)
        again = codec.encode(
            codec.head(
                rtype=rec.rtype, due_ms=rec.due_ms, enqueue_ms=rec.enqueue_ms, src_offset=rec.src_offset,
                src_partition=rec.src_partition, target_partition=rec.target_partition, retry_count=rec.retry_count,
                level=rec.level,
            ),
            rec.id, rec.topic, rec.key, rec.value, rec.headers,
        )
        if rec.id != key or again != raw:
            raise BenchError("a changelog record does not re-encode to the same bytes: the bench's copy of the "
                             "format (sidecar/store/codec.py encode, key = delay.id) is out of date")
        recs.append(rec)
    return recs[0]


def fill(bench: Bench, topic: str, ingress: str, tpl: Any, n: int) -> dict[str, Any]:
    """Produce ``n`` changelog records made from ``tpl`` (see the module docstring)."""
    failed: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    p = producer(bench.bootstrap, **{"linger.ms": 20, "delivery.report.only.error": True, "on_delivery": on_delivery})
    prefix = f"{ingress}:0:".encode()
    encode = codec.encode
    rtype, due, enq, tpart, retry, level = (tpl.rtype, tpl.due_ms, tpl.enqueue_ms, tpl.target_partition,
                                            tpl.retry_count, tpl.level)
    target, value, headers = tpl.topic, tpl.value, tpl.headers
    t0 = time.monotonic()
    nbytes = 0
    for i in range(n):
        off = OFFSET_BASE + i
        rid = prefix + b"%d" % off
        shift = i // 1000
        raw = encode(
            codec.head(
                rtype=rtype, due_ms=due + shift, enqueue_ms=enq + shift, src_offset=off, src_partition=0,
                target_partition=tpart, retry_count=retry, level=level,
            ),
            rid, target, b"r%d" % i, value, headers,
        )
        nbytes += len(raw)
        while True:
            try:
                p.produce(topic, raw, rid, 0)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10_000 == 0:
            p.poll(0)
    left = p.flush(300)
    seconds = time.monotonic() - t0
    if left or failed:
        raise BenchError(f"filling {topic}: {left} unacknowledged, {len(failed)} failed ({failed[:1]})")
    return {"records": n, "value_bytes": nbytes, "seconds": seconds, "records_per_s": n / seconds if seconds else None}


def first_on_time(bench: Bench, target: str, after_ms: int, alive: Any, timeout_s: float = 60) -> int | None:
    """The delivery time of the first probe delivered after ``after_ms`` with lateness <= ON_TIME_MS."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive()
        got = read_range(bench.bootstrap, target, {}, bench.wm.high(target), headers=True)
        on_time = [ts for ts, da in zip(got.ts, got.deliver_at, strict=True)
                   if ts >= after_ms and 0 <= ts - da <= ON_TIME_MS]
        if on_time:
            return min(on_time)
        time.sleep(0.5)
    return None


def event_after(proc: SidecarProc, event: str, after_ms: int, timeout_s: float) -> dict[str, Any]:
    """The first ``event`` ``proc`` logged at or after ``after_ms`` (with a partition list, a
    non-empty one)."""
    found: list[dict[str, Any]] = []

    def seen() -> bool:
        found[:] = [ev for ev in proc.poll_events() if ev.get("event") == event and event_ms(ev) >= after_ms
                    and ev.get("partitions", True)]
        return bool(found)

    wait_until(f"{proc.name} to log {event}", seen, timeout_s, 0.05, proc.check_alive)
    return found[0]


def standby_failover(bench: Bench, a: SidecarProc, b: SidecarProc, target: str, n: int) -> dict[str, Any]:
    """Step 4 of the module docstring: B keeps a standby of A's partition; A is killed."""
    b.start(wait=False)

    def caught_up() -> bool:
        st = b.stats() or {}
        lag = st.get("standby_lag") or {}
        return bool(lag) and sum(int(x) for x in lag.values()) <= STANDBY_CAUGHT_UP

    t0 = time.monotonic()
    wait_until("the standby to catch up with the changelog", caught_up, 180 + n / 20_000, 0.25, b.check_alive)
    caught_up_s = time.monotonic() - t0
    started = b.last("standby.started") or {}
    time.sleep(1.0)
    killed = wall_ms()
    a.stop(signal.SIGKILL)
    assigned = event_after(b, "partitions.assigned", killed, 60)
    assigned_ms = event_ms(assigned)
    restored = event_after(b, "partition.restored", killed, 60)
    promoted = next((ev for ev in b.poll_events() if ev.get("event") == "standby.promoted"
                     and event_ms(ev) >= killed), None)  # None: the standby was not there to promote
    first = first_on_time(bench, target, assigned_ms, b.check_alive)
    return {
        "standby_from_offset": started.get("from_offset"),
        "standby_catch_up_s": caught_up_s,
        "kill_to_assigned_s": (assigned_ms - killed) / 1000,
        "promoted": promoted is not None,
        "promoted_changelog_offset": None if promoted is None else promoted.get("changelog_offset"),
        "promoted_restore_records": restored.get("records"),
        "promoted_restore_s": restored.get("seconds"),
        "assigned_to_first_on_time_s": (first - assigned_ms) / 1000 if first else None,
        "kill_to_first_on_time_s": (first - killed) / 1000 if first else None,
    }


def measure(bench: Bench, scheduler: str, n: int) -> dict[str, Any]:
    tpl = template(bench, scheduler)
    ingress, target = f"bench.rst.in.{uid()}", f"bench.rst.out.{uid()}"
    changelog = f"{ingress}.changelog"
    bench.topics(ingress, target)
    bench.topics(changelog, config={"cleanup.policy": "compact"})
    filled = fill(bench, changelog, ingress, tpl, n)
    log(f"restore {scheduler}: {n:,} changelog records produced in {filled['seconds']:.1f} s "
        f"({filled['value_bytes'] / n:.0f} B each)")
    group = f"bench-rst-{uid()}"
    flags = ["--standby-replicas", "1"]
    sc = bench.sidecar(ingress, scheduler, tag="rst", extra=flags, group=group, static_id=f"{group}-a",
                       session_timeout_ms=SESSION_MS)
    b = bench.sidecar(ingress, scheduler, tag="rst-standby", extra=flags, group=group, static_id=f"{group}-b",
                      session_timeout_ms=SESSION_MS)
    probes = PacedProducer(bench.bootstrap, ingress, target, PROBE_RATE, 100, lambda _i: PROBE_DELAY_MS,
                           key_prefix="probe")
    sc.start(wait=False)
    spawned = sc.started_ms
    probes.start()
    try:
        restored = sc.wait_event("partition.restored", 180 + n / 20_000)
        restored_ms = event_ms(restored)
        first = first_on_time(bench, target, 0, sc.check_alive)
        stats = sc.stats() or {}
        log(f"restore {scheduler}: restored in {restored.get('seconds')} s; standby failover ...")
        failover = standby_failover(bench, sc, b, target, n)
    finally:
        probes.stop()
        sc.stop()
        b.stop()
    got = read_range(bench.bootstrap, target, {}, bench.wm.high(target), headers=True)
    late = [ts - da for ts, da in zip(got.ts, got.deliver_at, strict=True)]
    records, seconds = int(restored.get("records", 0)), float(restored.get("seconds", 0))
    return {
        "pending": n,
        "fill": filled,
        "restored_records": records,
        "restored_bytes": restored.get("bytes"),
        "restored_pending": restored.get("pending"),
        "restore_s": seconds,
        "restore_records_per_s": records / seconds if seconds > 0 else None,
        "spawn_to_restored_s": (restored_ms - spawned) / 1000,
        "spawn_to_first_on_time_s": (first - spawned) / 1000 if first else None,
        "standby_failover": failover,
        "probes_sent": probes.accepted,
        "probes_delivered": len(got.ts),
        "probes_late": sum(1 for x in late if x > ON_TIME_MS),
        "early": sum(1 for x in late if x < 0),
        "restoring_event": sc.last("partition.restoring"),
        "stats": {k: stats.get(k) for k in ("ingested", "delivered", "pending", "early")},
    }


def run(bench: Bench) -> dict[str, Any]:
    n = counts_for(bench)
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for sched in bench.schedulers:
        m = measure(bench, sched, n)
        log(f"restore {sched}: {m['restored_records']:,} records in {m['restore_s']} s "
            f"({m['restore_records_per_s'] or 0:,.0f}/s), spawn -> restored {m['spawn_to_restored_s']:.1f} s, "
            f"-> first on-time delivery {m['spawn_to_first_on_time_s']} s")
        restored_pending = m["restored_pending"]
        fo = m["standby_failover"]
        log(f"restore {sched}: standby failover: kill -> assigned {fo['kill_to_assigned_s']:.1f} s, "
            f"assigned -> first on-time delivery {fo['assigned_to_first_on_time_s']} s "
            f"({fo['promoted_restore_records']} records restored at the promotion)")
        results[sched] = {
            "pending": fig(n, "records"),
            "restore_records_per_s": fig(m["restore_records_per_s"], "records/s", GOAL_RATE,
                                         note="partition.restored: records / seconds"),
            "restore_s": fig(m["restore_s"], "s"),
            "spawn_to_restored_s": fig(m["spawn_to_restored_s"], "s", GOAL_10M_S if n >= 10_000_000 else None,
                                       note="process start, group join and restore"),
            "spawn_to_first_on_time_s": fig(m["spawn_to_first_on_time_s"], "s", note="no local store, no standby"),
            "standby_failover_s": fig(fo["assigned_to_first_on_time_s"], "s",
                                      GOAL_FAILOVER_S if n >= 10_000_000 else None,
                                      note="standby-replicas 1: the new owner's partitions.assigned -> its first "
                                           "on-time delivery"),
            "standby_kill_to_first_on_time_s": fig(fo["kill_to_first_on_time_s"], "s",
                                                   note=f"with failure detection (session.timeout.ms {SESSION_MS})"),
            "standby_restored_records": fig(fo["promoted_restore_records"], "records",
                                            note="what the promoted standby still had to restore"),
            "lost": fig(n - int(restored_pending) if restored_pending is not None else None, "records", "== 0",
                        note="N - the restored store's pending count"),
            "early": fig(m["early"], "records", "== 0"),
            "changelog_bytes_per_record": fig(m["fill"]["value_bytes"] / n, "B"),
        }
        details[sched] = m
        bench.cleanup_topics()
    return {
        "method": "N changelog records in the sidecar's format produced straight into a compacted changelog topic, "
                  "then a sidecar with an empty data dir started on its ingress topic: restore rate from its "
                  "partition.restored event, spawn -> restored, spawn -> first probe delivered <= 50 ms late; "
                  "then a second sidecar keeps a standby (standby-replicas 1), the first is SIGKILLed: "
                  "the new owner's assignment -> its first on-time delivery",
        "settings": {"pending": n, "pending_delay_ms": PENDING_DELAY_MS, "value_bytes": 100, "probe_rate": PROBE_RATE,
                     "probe_delay_ms": PROBE_DELAY_MS, "on_time_ms": ON_TIME_MS, "schedulers": bench.schedulers,
                     "session_timeout_ms": SESSION_MS, "standby_replicas": 1},
        "results": results,
        "details": details,
    }
