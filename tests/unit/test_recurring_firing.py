"""Recurring schedules fired by the real loop on the Kafka twin, on virtual time (store/firings.py).

Each test sends recurring records to the ingress topic, turns the real ``Sidecar`` and reads what
reached the target: the firing headers, never a firing before its nominal time, never two of one
nominal time, none past the end; cancel, replace, misfires, a restart, a handover and
exactly-once. The rules themselves (DST, cron) are tested in test_recurring_rules.py and
test_recurring_property.py; here, that the store fires them as they say.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import orjson
import pytest

from sidecar import contract as c
from sidecar.engine.loop import Sidecar
from tests.kafka_twin import TwinMessage
from tests.unit.helpers.world import INGRESS, TARGET, World

MIN = 60_000


def send(w: World, rid: bytes, *extra: tuple[str, bytes], partition: int = 0, value: bytes = b"v") -> None:
    w.cluster.append(INGRESS, partition, b"k", value, [(c.TARGET_TOPIC, TARGET.encode()), (c.ID, rid), *extra])


def firings(w: World, rid: bytes | None = None) -> list[dict[str, bytes | None]]:
    out = []
    for m in w.delivered():
        h = dict(m.headers() or [])
        if rid is None or h.get(c.ID) == rid:
            h["_ts"] = b"%d" % m.timestamp()[1]
            out.append(h)
    return out


def num(h: dict[str, bytes | None], name: str) -> int:
    v = h[name]
    assert v is not None
    return int(v)


def check(w: World, skipped: bool = False) -> Counter[tuple[bytes, int]]:
    """Never early (the delivery's own timestamp against the nominal time), never two firings of
    one (id, fire-time), deliver-at is the nominal time, the sequence counts up (from 1 again after
    a replace), next-at is the following firing's nominal time (unless ``skipped``: misfires of
    ``skip`` schedules leave gaps without a firing)."""
    seen: Counter[tuple[bytes, int]] = Counter()
    by_schedule: dict[tuple[bytes, bytes | None], list[dict[str, bytes | None]]] = {}
    for h in firings(w):
        rid = h[c.ID]
        assert rid is not None
        if c.FIRE_TIME not in h:
            continue
        fire = num(h, c.FIRE_TIME)
        assert num(h, "_ts") >= fire, f"{rid!r} fired {fire - num(h, '_ts')} ms early"
        assert num(h, c.DELIVER_AT) == fire
        seen[rid, fire] += 1
        by_schedule.setdefault((rid, h[c.SOURCE]), []).append(h)  # a replace is a schedule of its own
    assert not [k for k, n in seen.items() if n > 1], f"fired twice: {seen.most_common(3)}"
    for hs in by_schedule.values():
        hs.sort(key=lambda h: num(h, c.FIRE_TIME))
        for a, b in itertools.pairwise(hs):
            assert num(b, c.FIRE_SEQ) == num(a, c.FIRE_SEQ) + 1
            assert num(a, c.NEXT_AT) == num(b, c.FIRE_TIME) or c.MISSED in b or skipped
    return seen


def run_until(w: World, scs: list[Sidecar], until_ms: int) -> None:
    w.run(scs, lambda: w.clock.now_ms >= until_ms, max_turns=200_000)


@pytest.mark.parametrize("scheduler", ["wheel", "levels"])
def test_an_interval_fires_max_count_times_with_its_headers(tmp_path: Path, scheduler: str) -> None:
    w = World(tmp_path)
    sc = w.sidecar("a", scheduler=scheduler)
    start = w.clock.now_ms + 1000
    send(w, b"job", (c.EVERY, b"%d" % MIN), (c.START, b"%d" % start), (c.MAX_COUNT, b"5"), ("trace", b"t1"))
    run_until(w, [sc], start + 2 * MIN + 500)
    status, doc = sc.lookup(b"job")
    assert status == 200 and doc["state"] == "pending"
    assert doc["recurring"] == {"next_fire_ms": start + 3 * MIN, "fired": 3, "last_fire_ms": start + 2 * MIN,
                                "start_ms": start, "end_ms": None, "max_count": 5, "misfire": "fire-once",
                                "every_ms": MIN}
    run_until(w, [sc], start + 10 * MIN)
    got = firings(w, b"job")
    assert [num(h, c.FIRE_TIME) for h in got] == [start + k * MIN for k in range(5)]
    assert [num(h, c.FIRE_SEQ) for h in got] == [1, 2, 3, 4, 5]
    assert all(h["trace"] == b"t1" and c.CRON not in h and c.EVERY not in h for h in got)
    assert not any(name.startswith("delay.state.") for h in got for name in h)
    assert c.NEXT_AT not in got[-1] and all(c.MISSED not in h for h in got)
    check(w)
    lateness = [num(h, "_ts") - num(h, c.FIRE_TIME) for h in got]
    assert max(lateness) <= (100 if scheduler == "wheel" else 1000)
    assert sc.counters.fired == 5 and sc.counters.missed == 0
    assert sc.lookup(b"job")[1]["state"] == "delivered"
    sc.shutdown()


def test_a_cron_in_a_zone_fires_at_local_wall_time_across_dst(tmp_path: Path) -> None:
    """07:00 Paris: 06:00 UTC in winter, 05:00 UTC in summer (the EU change on 2027-03-28). The
    loop turns from a minute before each expected firing (virtual time jumps between them: idle
    turns every commit interval for days would only cost CPU); an unexpected firing in a gap
    would show up at the next one's turn, as a firing at a time not expected."""
    w = World(tmp_path)
    base = 1_806_019_200_000  # 2027-03-26 00:00 UTC
    w.clock.now_ms = base
    sc = w.sidecar("a")
    send(w, b"paris", (c.CRON, b"0 7 * * *"), (c.TZ, b"Europe/Paris"), (c.MAX_COUNT, b"4"))
    day, hour = 86_400_000, 3_600_000
    expected = [base + 6 * hour, base + day + 6 * hour, base + 2 * day + 5 * hour, base + 3 * day + 5 * hour]
    run_until(w, [sc], w.clock.now_ms + 1000)
    for at in expected:
        w.clock.advance(at - MIN - w.clock.now_ms)
        run_until(w, [sc], at + 2000)
    w.clock.advance(2 * day)
    run_until(w, [sc], w.clock.now_ms + 2000)
    assert [num(h, c.FIRE_TIME) for h in firings(w, b"paris")] == expected
    check(w)
    sc.shutdown()


def test_cancel_ends_a_schedule_and_replace_changes_it(tmp_path: Path) -> None:
    w = World(tmp_path)
    sc = w.sidecar("a")
    t0 = w.clock.now_ms
    send(w, b"a", (c.EVERY, b"%d" % MIN))
    send(w, b"b", (c.EVERY, b"%d" % MIN))
    run_until(w, [sc], t0 + 2 * MIN + 500)
    w.cluster.append(INGRESS, 0, None, None, [(c.CANCEL, b"a")])
    send(w, b"b", (c.EVERY, b"%d" % (2 * MIN)), (c.REPLACE, b"true"), value=b"v2")
    run_until(w, [sc], t0 + 9 * MIN)  # the replacement's 5th firing is a minute after that
    a = [num(h, c.FIRE_TIME) - t0 for h in firings(w, b"a")]
    assert a == [0, MIN, 2 * MIN]
    b = firings(w, b"b")
    assert [num(h, c.FIRE_TIME) - t0 for h in b[:3]] == [0, MIN, 2 * MIN]
    start = num(b[3], c.ENQUEUED_AT)  # the replacement's: its own interval from its own start
    assert start > t0 + 2 * MIN
    assert start < t0 + 3 * MIN
    assert [num(h, c.FIRE_TIME) - start for h in b[3:]] == [0, 2 * MIN, 4 * MIN, 6 * MIN]
    assert [num(h, c.FIRE_SEQ) for h in b[3:]] == list(range(1, len(b) - 2))
    check(w)
    sc.shutdown()


@pytest.mark.parametrize("misfire", ["fire-once", "skip"])
def test_a_misfire_after_downtime_fires_once_or_skips(tmp_path: Path, misfire: str) -> None:
    w = World(tmp_path)
    sc = w.sidecar("a")
    t0 = w.clock.now_ms
    send(w, b"m", (c.EVERY, b"%d" % MIN), (c.MISFIRE, misfire.encode()))
    run_until(w, [sc], t0 + MIN + 500)
    assert len(firings(w, b"m")) == 2
    sc.stop_requested = True
    sc.shutdown()
    # down for 5 minutes: the firings at 2, 3, 4, 5 and 6 min are missed (the last by 2.5 s: over
    # the 1 s grace within which a late firing is merely late, not a misfire)
    w.clock.advance(5 * MIN + 2000)
    sc2 = w.sidecar("a")
    run_until(w, [sc2], t0 + 7 * MIN + 500)
    got = firings(w, b"m")
    times = [num(h, c.FIRE_TIME) - t0 for h in got]
    if misfire == "fire-once":
        assert times == [0, MIN, 6 * MIN, 7 * MIN]
        assert num(got[2], c.MISSED) == 4 and c.MISSED not in got[3]
        assert [num(h, c.FIRE_SEQ) for h in got] == [1, 2, 3, 4]
    else:
        assert times == [0, MIN, 7 * MIN]
        assert [num(h, c.FIRE_SEQ) for h in got] == [1, 2, 3]
        assert sc2.counters.missed == 5
    check(w, skipped=misfire == "skip")
    sc2.shutdown()


def test_a_restart_and_a_handover_fire_on_without_doubles(tmp_path: Path) -> None:
    w = World(tmp_path)
    a = w.sidecar("a")
    t0 = w.clock.now_ms
    for p in range(4):
        send(w, b"s%d" % p, (c.EVERY, b"%d" % 5000), partition=p)
    run_until(w, [a], t0 + 30_000)
    a.shutdown()  # a clean restart on the same data directory
    a = w.sidecar("a")
    run_until(w, [a], t0 + 60_000)
    b = w.sidecar("b")  # scale out: half the partitions move, restored from the changelog
    run_until(w, [a, b], t0 + 120_000)
    assert a.stores and b.stores
    seen = check(w)
    for p in range(4):
        times = sorted(t - t0 for rid, t in seen if rid == b"s%d" % p)
        assert times[:13] == [k * 5000 for k in range(13)], times  # nothing missed before the handover
        assert len(times) >= 22
    a.shutdown()
    b.shutdown()


def test_crashes_miss_no_firing_and_repeat_only_those_in_flight(tmp_path: Path) -> None:
    """Killed every 7 s (no revoke, no checkpoint, nothing flushed) and started again on the same
    data directory: every nominal time fires, none before its time; a firing repeats only when
    the process died with it in flight (at most one per schedule per crash)."""
    w = World(tmp_path)
    t0 = w.clock.now_ms
    a = w.sidecar("a")
    for p in range(4):
        send(w, b"s%d" % p, (c.EVERY, b"2000"), partition=p)
    crashes = 8
    for k in range(1, crashes + 1):
        run_until(w, [a], t0 + k * 7000)
        w.cluster.leave(a.kafka.consumer)  # killed
        a.lock.release()
        a = w.sidecar("a")
    run_until(w, [a], t0 + (crashes + 1) * 7000)
    seen: Counter[tuple[bytes, int]] = Counter()
    for h in firings(w):
        fire = num(h, c.FIRE_TIME)
        assert num(h, "_ts") >= fire
        rid = h[c.ID]
        assert rid is not None
        seen[rid, fire] += 1
    for p in range(4):
        times = sorted(t - t0 for rid, t in seen if rid == b"s%d" % p)
        assert times == [k * 2000 for k in range(len(times))] and len(times) >= 30, times
    repeats = sum(n - 1 for n in seen.values())
    assert repeats <= crashes * 4, seen.most_common(5)
    a.shutdown()


def test_exactly_once_fires_each_nominal_time_once_for_read_committed(tmp_path: Path) -> None:
    w = World(tmp_path)
    sc = w.sidecar("a", delivery="exactly-once", transaction_interval_ms=300)
    t0 = w.clock.now_ms
    send(w, b"x", (c.EVERY, b"1000"), (c.MAX_COUNT, b"20"))
    run_until(w, [sc], t0 + 25_000)
    committed = [dict(m.headers() or []) for m in w.cluster.records(TARGET, committed_only=True)]
    times = [int(h[c.FIRE_TIME] or b"0") - t0 for h in committed]
    assert times == [k * 1000 for k in range(20)]
    sc.shutdown()


@pytest.mark.parametrize(("extra", "reason"), [
    (((c.CRON, b"61 * * * *"),), c.BAD_CRON),
    (((c.CRON, b"@daily"), (c.TZ, b"Mars/Olympus")), c.UNKNOWN_TIME_ZONE),
    (((c.EVERY, b"1000"), (c.START, b"2000"), (c.END, b"1000")), c.BAD_SCHEDULE),
    (((c.EVERY, b"999"),), c.BAD_SCHEDULE),
    (((c.EVERY, b"1000"), (c.DELAY_MS, b"5")), c.CONFLICTING_DELAY),
])
def test_a_bad_schedule_goes_to_the_dlq_with_its_reason(
    tmp_path: Path, extra: tuple[tuple[str, bytes], ...], reason: str
) -> None:
    w = World(tmp_path)
    sc = w.sidecar("a")
    send(w, b"bad", *extra)
    send(w, b"good", (c.EVERY, b"1000"), (c.MAX_COUNT, b"1"))
    run_until(w, [sc], w.clock.now_ms + 3000)
    dead: list[TwinMessage] = w.cluster.records(sc.s.dlq_topic)
    assert [dict(m.headers() or [])[c.DLQ_REASON] for m in dead] == [reason.encode()]
    assert [h[c.ID] for h in firings(w)] == [b"good"]
    sc.shutdown()


def test_history_records_each_firing_and_a_failed_firing_is_a_one_shot_dead_letter(tmp_path: Path) -> None:
    """Each firing is a ``delivered`` event of the history topic. A firing the target refuses for
    good goes to the DLQ as a one-shot record (the firing's headers, none of the schedule's, so a
    redrive delivers that firing once), and the schedule goes on firing."""
    w = World(tmp_path)
    w.cluster.refused.add("missing")
    sc = w.sidecar("a", history_topic="hist", delivery_attempts=1)
    t0 = w.clock.now_ms
    send(w, b"ok", (c.EVERY, b"1000"), (c.MAX_COUNT, b"3"))
    w.cluster.append(INGRESS, 1, b"k", b"v", [(c.TARGET_TOPIC, b"missing"), (c.ID, b"bad"), (c.EVERY, b"1000"),
                                               (c.MAX_COUNT, b"2")])
    run_until(w, [sc], t0 + 60_000)
    events = [orjson.loads(m.value() or b"{}") for m in w.cluster.records("hist")]
    assert [e["event"] for e in events if e["id"] == "ok"] == ["accepted", "delivered", "delivered", "delivered"]
    dead = [dict(m.headers() or []) for m in w.cluster.records(sc.s.dlq_topic)]
    assert len(dead) == 2, dead
    for n, h in enumerate(sorted(dead, key=lambda h: int(h[c.FIRE_SEQ] or b"0")), start=1):
        assert h[c.ID] == b"bad" and h[c.DLQ_REASON] == c.NOT_AUTHORIZED.encode()  # the target refuses Write
        assert h[c.FIRE_SEQ] == b"%d" % n and h[c.DELIVER_AT] == h[c.FIRE_TIME]
        assert c.EVERY not in h and c.MAX_COUNT not in h and not any(k.startswith("delay.state.") for k in h)
    assert [num(h, c.FIRE_SEQ) for h in firings(w, b"ok")] == [1, 2, 3]
    sc.shutdown()
