"""The C intake fast path (``PartitionStore.ingest_many`` -> ``_native.ingest_run``) against the
reference path (``ingest_fields`` per record): the same random consumer batches are fed to
``Ingress.ingest`` with the fast path on and off, and everything must come out identical — the
bytes of every file of both partition stores (commit-log segments, scheduler files, id index,
checkpoint) and every plain Python-visible field of the store, its log, id index and scheduler,
after every batch.

The batches mix what the fast path takes (plain requests) with everything it must hand back to
the reference path at the right record: errors, records of another (or no) partition, cancels
before and after their message, duplicates, level requests, bad input bound for the DLQ (an
unknown ``delay.*`` header too), pass-through ``delay.*`` headers, records already due or beyond
the wheel's ring, records that do not fit the rest of a segment (a small ``segment_bytes``), a
full timer-log or queue file (small files), id-index growth (a tiny initial table), while the
scheduler's cursors move (records handed out and settled) and checkpoints flush and reset the
dirty ranges. Some batches mix two ingress topics (tenants) with partitions of the same numbers:
a run of one topic's partition must stop at the other topic's record of that partition number.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message

from sidecar import contract as c
from sidecar.config import Settings
from sidecar.engine import ingress, loop
from sidecar.engine.stores import StoreKey, store_key
from sidecar.levels.scheduler import LevelsScheduler
from sidecar.store import codec, idgrowth
from sidecar.store import intake as intake_mod
from sidecar.store import partition as partition_mod
from sidecar.store.idindex import IdIndex
from sidecar.store.partition import IngressRecord, PartitionStore
from sidecar.wheel import WheelScheduler
from tests.infra import needs_native
from tests.kafka_twin import VirtualClock
from tests.unit.helpers.id_passes import NextPollPass
from tests.unit.helpers.intake import TOPIC, WHEEL_WINDOW_MS, Msg, fields, files, ingest_store, state

pytestmark = needs_native

T0 = 1_700_000_000_000
LEVELS = (1000, 5000, 10_000, 60_000)


def batches(seed: int, n_batches: int, topics: tuple[str, ...] = (TOPIC,)) -> list[tuple[int, list[Msg | Message]]]:
    """(clock, messages) per batch: a random mix of every kind of consumed record, as the client's
    ``Message`` or the stand-in above; with several ``topics``, in runs of one topic (partitions of
    the same number in each)."""
    rng = random.Random(seed)
    offsets = {(t, p): 0 for t in topics for p in (0, 1, 2)}
    topic = topics[0]
    ids = [b"id-%d" % i for i in range(40)]
    out = []
    now = T0
    for _ in range(n_batches):
        now += rng.choice((0, 7, 250, 1500, 9000))
        msgs = []
        for _ in range(rng.randint(0, 120)):
            if len(topics) > 1 and rng.random() < 0.15:
                topic = rng.choice(topics)
            p = rng.choices((0, 1, 2), (85, 12, 3))[0]
            off = offsets[topic, p]
            offsets[topic, p] += 1
            ts = (1, now - rng.randint(0, 3000)) if rng.random() < 0.95 else (0, 0)
            key = None if rng.random() < 0.1 else b"k%d" % off
            value = None if rng.random() < 0.05 else bytes(rng.randint(0, 700))
            h: list[tuple[str, bytes | None]] = [(c.TARGET_TOPIC, b"out")]
            r = rng.random()
            if r < 0.5:
                h.append((c.DELAY_MS, str(rng.choice((0, 1, 5, 999, 4000, 30_000, 200_000))).encode()))
            elif r < 0.6:  # already due, or beyond the wheel's ring (a bucket)
                h.append((c.DELIVER_AT, str(now + rng.choice((-60_000, -5, 0, 3 * 3_600_000))).encode()))
            elif r < 0.65:
                h.append((c.LEVEL, str(rng.randint(0, 5)).encode()))
            elif r < 0.75:
                h = [(c.CANCEL, rng.choice(ids))]
            elif r < 0.8:  # bad input: to the DLQ
                h = rng.choice(([(c.DELAY_MS, b"5")], [(c.TARGET_TOPIC, b"out"), (c.DELAY_MS, b"x")],
                                [(c.TARGET_TOPIC, b"out"), (c.DELAY_MS, b"1"), (c.DELIVER_AT, b"1")]))
            if rng.random() < 0.3 and h[0][0] != c.CANCEL:
                h.append((c.ID, rng.choice(ids)))
            if rng.random() < 0.3:
                h.append(("app", None if rng.random() < 0.2 else b"x" * rng.randint(0, 40)))
            if rng.random() < 0.1:
                h.append((c.TARGET_PARTITION, str(rng.randint(0, 3)).encode()))
            if rng.random() < 0.04:  # a delay.* header it does not know (DLQ bad-header) or a pass-through one
                h.insert(rng.randint(0, len(h)), (rng.choice(("delay.cron", "delay.every", c.REDRIVE_ID)), b"1"))
            hs = None if rng.random() < 0.02 else h
            err = rng.random() < 0.03
            if rng.random() < 0.5:  # the client's own type, mixed with the stand-in (the C side caches per type)
                msgs.append(Message(topic=topic, partition=p, offset=off, key=key, value=value, headers=hs,
                                    timestamp=ts, error=KafkaError(KafkaError._PARTITION_EOF) if err else None))
            else:
                msgs.append(Msg(p, off, ts, key, value, hs, err=err, topic=topic))
        out.append((now, msgs))
    return out


class Recorder:
    """A store's ``history``: the events it reported, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def event(self, event: str, rid: bytes, **kw: Any) -> None:
        self.events.append((event, rid, *sorted(kw.items())))


def run(root: Path, scheduler: str, seed: int, fast: bool, monkeypatch: pytest.MonkeyPatch,
        topics: tuple[str, ...] = (TOPIC,)) -> tuple[Any, ...]:
    clock = VirtualClock(T0)
    monkeypatch.setattr(ingress, "FAST_INTAKE", fast)
    monkeypatch.setattr(ingress, "FAST_RETRY", seed % 3)  # retry soon after a bail: more boundaries tested
    # a tiny id index cut every 16 operations, so it grows many times and merges all the time: the
    # fast path stores records while a pass runs (three tables probed); passes run at the index's
    # next look, so both runs cut and merge at the same points
    monkeypatch.setattr(partition_mod, "IdIndex", functools.partial(IdIndex, initial_capacity=64))
    monkeypatch.setattr(idgrowth, "CUT_MIN", 16)
    monkeypatch.setattr(idgrowth.Growth, "pass_class", NextPollPass)
    s = Settings(scheduler=scheduler, data_dir=str(root), bootstrap_servers="x:1", ingress_topic=TOPIC,
                 levels_ms=LEVELS, max_delay_ms=400 * 86_400_000)
    sc = loop.Sidecar(s, clock=clock)
    if scheduler == "wheel":
        def make(d: Path, lg: Any) -> Any:
            return WheelScheduler(d, lg, precision_ms=10, window_ms=WHEEL_WINDOW_MS, bucket_width_ms=WHEEL_WINDOW_MS,
                                  levels_ms=LEVELS, entries_per_file=32)
    else:
        def make(d: Path, lg: Any) -> Any:
            return LevelsScheduler(d, lg, LEVELS, entries_per_file=32)
    keys = [StoreKey(t, p) for t in topics for p in (0, 1)]
    for key in keys:
        st = PartitionStore(s.data_path, key.topic, key.partition, rules=sc.rules, scheduler_name=scheduler,
                            make_scheduler=make, segment_bytes=8192, cancel_horizon_ms=20_000, counters=sc.counters)
        st.open()
        st.history = Recorder()  # the history events too must be the same on both paths
        sc.stores[store_key(st)] = st
    sc.ingress.several = len(topics) > 1  # as a tenants: file makes it (one consumer, several topics)
    rng = random.Random(seed + 1)
    states = []
    for now, msgs in batches(seed, 40, topics):
        clock.now_ms = now
        sc.ingress.ingest(msgs)
        for st in sc.stores.values():
            st.index_step(now)  # the loop's index step: a pass noticed, the next one cut
        states.append([state(sc.stores[k]) for k in keys])
        for st in sc.stores.values():
            if rng.random() < 0.5:  # hand out and settle what is due: the cursors move
                st.acked.extend(st.sched.due(now, rng.randint(1, 200)))
                st.settle()
            if rng.random() < 0.3:
                st.checkpoint(fsync=True)
    counters = fields(sc.counters)
    for st in sc.stores.values():
        st.checkpoint(fsync=True)
    final = [state(sc.stores[k]) for k in keys]
    history = [st.history.events for st in sc.stores.values() if isinstance(st.history, Recorder)]
    for st in sc.stores.values():
        st.close()
    return states, final, counters, files(root), history


@pytest.mark.parametrize("scheduler", ["wheel", "levels"])
@pytest.mark.parametrize(("seed", "topics"), [*((s, (TOPIC,)) for s in range(6)),
                                              *((s, (TOPIC, "in.b")) for s in range(6, 9))])
def test_fast_intake_matches_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheduler: str, seed: int, topics: tuple[str, ...]
) -> None:
    taken = [0]
    merging = [0]
    real = partition_mod.PartitionStore.ingest_many

    def counting(self: PartitionStore, msgs: list[Any], start: int, now_ms: int, topic: str | None,
                 direct: Any = None) -> int:
        was = self.ids.merging
        end = real(self, msgs, start, now_ms, topic, direct)
        taken[0] += end - start
        merging[0] += (end - start) * was
        return end

    monkeypatch.setattr(partition_mod.PartitionStore, "ingest_many", counting)
    ref = run(tmp_path / "ref", scheduler, seed, False, monkeypatch, topics)
    assert taken[0] == 0
    fast = run(tmp_path / "fast", scheduler, seed, True, monkeypatch, topics)
    assert taken[0] > 100  # the fast path did take a good part of the records
    assert merging[0] > 20  # some of them while a pass ran (three tables in use)
    ref_states, ref_final, ref_counters, ref_files, ref_history = ref
    fast_states, fast_final, fast_counters, fast_files, fast_history = fast
    assert fast_counters == ref_counters
    assert fast_history == ref_history
    kinds = {e[0] for events in ref_history for e in events}
    assert {"accepted", "delivered", "dead-lettered", "cancelled"} <= kinds
    for n, (a, b) in enumerate(zip(fast_states, ref_states, strict=True)):
        assert a == b, f"state after batch {n} differs"
    assert fast_final == ref_final
    assert fast_files.keys() == ref_files.keys()
    for name in ref_files:
        assert fast_files[name] == ref_files[name], name


def test_fast_intake_is_off_without_the_extension(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no extension the loop never calls the fast path, and ``ingest_many`` takes nothing."""
    monkeypatch.setattr(intake_mod, "_run", None)
    _sc, st = ingest_store(tmp_path, "levels")
    msgs = [Msg(0, 0, (1, T0), b"k", b"v", [(c.TARGET_TOPIC, b"out"), (c.DELAY_MS, b"5")])]
    assert st.ingest_many(msgs, 0, T0, TOPIC) == 0
    st.close()


def test_a_slot_started_by_the_fast_intake_is_seen_by_the_next_due_time(tmp_path: Path) -> None:
    """The wheel remembers its search for the next occupied slot (``_next_send``); a slot chain the
    C intake starts must show in ``next_due_ms`` at once, not after the memo ages out."""
    sc, st = ingest_store(tmp_path, "wheel")
    w = st.sched
    assert isinstance(w, WheelScheduler)

    def msg(i: int, delay: int) -> Msg:
        return Msg(0, i, (1, T0), b"k", b"v", [(c.TARGET_TOPIC, b"out"), (c.DELAY_MS, str(delay).encode())])

    far = T0 + 2 * 3_600_000  # beyond the 1 h ring: a bucket record, no slot
    sc.stores[store_key(st)] = st
    sc.ingress.ingest([msg(0, far - T0)])
    assert w.due(T0, 10) == [] and w.next_due_ms() == far  # no slot occupied: the memo says so
    sc.ingress.ingest([msg(1, 5_000)])  # the timer log's first entry: the Python path opens its file
    assert w.next_due_ms() == T0 + 5_000
    for i, delay in enumerate([900, 40], start=2):
        assert st.ingest_many([msg(i, delay)], 0, T0, TOPIC) == 1  # taken by the C intake
        assert w.next_due_ms() == T0 + delay  # each one due sooner than the last
    assert [rec.due_ms for _ref, rec in w.due(T0 + 900, 10)] == [T0 + 40, T0 + 900]
    assert w.next_due_ms() == T0 + 5_000
    st.close()


@pytest.mark.parametrize("scheduler", ["wheel", "levels"])
def test_the_fast_intake_hands_an_unknown_delay_header_back(tmp_path: Path, scheduler: str) -> None:
    """A plain request carrying an unknown ``delay.*`` header (a typo of ``delay.deliver-at``) in a
    run of plain requests: ``ingest_run`` stops at it, the reference path dead-letters it as
    bad-header naming the header, and the run goes on after it. Never scheduled as a plain delay
    (the header silently ignored)."""
    sc, st = ingest_store(tmp_path, scheduler)
    st.rules.checked_targets.add("out")  # (accepted before by the full parser: the fast path's condition)
    plain_h = [(c.TARGET_TOPIC, b"out"), (c.DELAY_MS, b"60000")]
    msgs: list[Any] = [Msg(0, i, (1, T0), b"k", b"v", list(plain_h)) for i in range(5)]
    msgs[2] = Msg(0, 2, (1, T0), b"k", b"v", [*plain_h, ("delay.deliver_at", b"1700000000000")])
    sc.stores[store_key(st)] = st
    sc.ingress.ingest(msgs[:1])  # the first one opens the scheduler's files (the reference path does)
    assert st.ingest_many(msgs, 1, T0, TOPIC) == 2  # taken: msgs[1]; handed back: msgs[2]
    assert st.ingest_many(msgs, 2, T0, TOPIC) == 2
    st.ingest(IngressRecord(TOPIC, 0, 2, T0, b"k", b"v", msgs[2].headers()), T0)  # the reference path
    assert st.ingest_many(msgs, 3, T0, TOPIC) == 5  # the rest, plain, taken
    assert sc.counters.dlq[c.BAD_HEADER] == 1 and sc.counters.scheduled == 4 and st.next_offset == 5
    dead = [rec for _ref, rec in st.sched.due(T0, 100)]
    assert len(dead) == 1 and bytes(dead[0].topic) == b"delay.dlq"
    error = dict(codec.decode_headers(dead[0].headers))[c.DLQ_ERROR]
    assert error is not None and b"'delay.deliver_at'" in error
    st.close()
