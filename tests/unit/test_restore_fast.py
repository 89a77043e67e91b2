"""The C restore fast path (``PartitionStore.restore_many`` -> ``_native.restore_run``) against the
reference path (``restore_put`` / ``restore_remove`` per changelog record): the same random
changelog batches are fed to ``Restorer._apply`` with the fast path on and off, and everything must
come out identical — the bytes of every file of both stores (commit-log segments, scheduler
files, id index, checkpoint), every plain Python-visible field of the stores, their logs, id
indexes and schedulers, and the restorer's counts, after every batch.

The batches mix what the fast path takes (puts of ids the store does not know) with everything it
must hand back at the right record: tombstones, CANCELs (pre-cancels, fresh and past the horizon),
puts of ids already pending or pre-cancelled, DEAD records, values in a non-canonical form (bytes
after the record), errors, records of another partition, a restoring partition's records at and
after its end offset, records already due or beyond the wheel's ring, records that do not fit the
rest of a segment (a small ``segment_bytes``), full timer-log or queue files (small files) and
id-index growth (a tiny initial table), while the scheduler's cursors move and checkpoints flush.
Partition 0 is restoring (with an end offset), partition 1 is a standby (no end).
"""

from __future__ import annotations

import functools
import random
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message

from sidecar.config import Settings
from sidecar.engine import loop
from sidecar.engine.changelog import Restorer, _Restoring
from sidecar.engine.stores import StoreKey
from sidecar.levels.scheduler import LevelsScheduler
from sidecar.store import codec, idgrowth
from sidecar.store import partition as partition_mod
from sidecar.store import restore as restore_mod
from sidecar.store.idindex import IdIndex
from sidecar.store.partition import PartitionStore
from sidecar.wheel import WheelScheduler
from tests.infra import needs_native
from tests.unit.helpers.id_passes import NextPollPass
from tests.unit.helpers.intake import WHEEL_WINDOW_MS, Msg, fields, files, state

pytestmark = needs_native

T0 = 1_700_000_000_000
TOPIC = "in"
LEVELS = (1000, 5000, 10_000, 60_000)
HORIZON_MS = 20_000


class Restore:
    """What ``Restorer._apply`` calls of KafkaIO's restore consumer (``ChangelogReader``)."""

    def __init__(self) -> None:
        self.unassigned: list[StoreKey] = []

    def key(self, msg: Any) -> StoreKey:
        return StoreKey(TOPIC, msg.partition())

    def unassign(self, partition: StoreKey) -> None:
        self.unassigned.append(partition)


class Kafka:
    """What ``Restorer._apply`` calls of KafkaIO."""

    def __init__(self) -> None:
        self.restore = Restore()
        self.errors = 0
        self.changelogs = {TOPIC: f"{TOPIC}.changelog"}

    def consume_error(self, _err: Any) -> None:
        self.errors += 1


def record(rng: random.Random, rid: bytes, now: int, scheduler: str, src: int) -> bytes:
    """A changelog value: a MESSAGE, DEAD or CANCEL record of ``rid``."""
    kind = rng.choices((codec.MESSAGE, codec.DEAD, codec.CANCEL), (80, 8, 12))[0]
    if kind == codec.CANCEL:
        enq = now - rng.choice((0, 1000, HORIZON_MS + 5000))  # fresh, or past the horizon
        return codec.encode(
            codec.head(
                rtype=codec.CANCEL, due_ms=enq, enqueue_ms=enq, src_offset=src, src_partition=0, target_partition=-1,
                retry_count=0, level=0,
            ),
            rid, b"", None, None, b"",
        )
    due = now + rng.choice((-60_000, -5, 0, 40, 999, 4000, 30_000, 3 * 3_600_000))  # due, soon, beyond the ring
    # (the wheel's own records have level 0; a level kept in its timer-log entry all the same)
    level = rng.choice((0, 0, 0, 2)) if scheduler == "wheel" else rng.randint(0, len(LEVELS))
    key = None if rng.random() < 0.1 else b"k%d" % src
    value = None if rng.random() < 0.05 else bytes(rng.randint(0, 700))
    headers = codec.encode_headers([("app", b"x" * rng.randint(0, 30))] if rng.random() < 0.3 else [])
    topic = b"dlq" if kind == codec.DEAD else b"out"
    return codec.encode(
        codec.head(
            rtype=kind, due_ms=due, enqueue_ms=now - rng.randint(0, 3000), src_offset=src, src_partition=0,
            target_partition=rng.choice((-1, 0, 2)), retry_count=rng.randint(0, 3), level=level,
        ),
        rid, topic, key, value, headers,
    )


def batches(seed: int, n_batches: int, scheduler: str) -> tuple[list[tuple[int, list[Any]]], int]:
    """(clock, messages) per batch, and partition 0's end offset."""
    rng = random.Random(seed)
    offsets = {0: 0, 1: 0, 2: 0}
    ids = [b"id-%d" % i for i in range(60)]
    fresh = 0
    out = []
    now = T0
    for _ in range(n_batches):
        now += rng.choice((0, 7, 250, 1500, 9000))
        msgs: list[Any] = []
        for _ in range(rng.randint(0, 150)):
            p = rng.choices((0, 1, 2), (70, 25, 5))[0]
            off = offsets[p]
            offsets[p] += 1
            if rng.random() < 0.6:  # an id never seen: what a restore mostly is
                fresh += 1
                rid = b"in:%d:%d" % (p, 1_000_000 + fresh)
            else:
                rid = rng.choice(ids)
            err = p != 0 and rng.random() < 0.03  # (partition 0 must reach its end: an error moves no position)
            r = rng.random()
            if r < 0.12:
                value: bytes | None = None  # a tombstone
            else:
                value = record(rng, rid, now, scheduler, off)
                if rng.random() < 0.03:
                    value += bytes(8)  # a record followed by more bytes: decoded, but not as it is
            if rng.random() < 0.5:
                msgs.append(Message(topic=f"{TOPIC}.changelog", partition=p, offset=off, key=rid, value=value,
                                    headers=None, timestamp=(1, now),
                                    error=KafkaError(KafkaError._PARTITION_EOF) if err else None))
            else:
                msgs.append(Msg(p, off, (1, now), rid, value, None, err=err))
        out.append((now, msgs))
    return out, offsets[0] * 9 // 10  # partition 0's last records lie beyond its end: skipped


def run(root: Path, scheduler: str, seed: int, fast: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    if not fast:
        monkeypatch.setattr(restore_mod, "_restore_run", None)
    # a tiny id index cut every 16 operations, so it grows many times and merges all the time: the
    # fast path stores records while a pass runs (three tables probed); passes run at the index's
    # next look, so both runs cut and merge at the same points
    monkeypatch.setattr(partition_mod, "IdIndex", functools.partial(IdIndex, initial_capacity=64))
    monkeypatch.setattr(idgrowth, "CUT_MIN", 16)
    monkeypatch.setattr(idgrowth.Growth, "pass_class", NextPollPass)
    s = Settings(scheduler=scheduler, data_dir=str(root), bootstrap_servers="x:1", ingress_topic=TOPIC,
                 levels_ms=LEVELS, max_delay_ms=400 * 86_400_000)
    sc = loop.Sidecar(s)
    if scheduler == "wheel":
        def make(d: Path, lg: Any) -> Any:
            return WheelScheduler(d, lg, precision_ms=10, window_ms=WHEEL_WINDOW_MS, bucket_width_ms=WHEEL_WINDOW_MS,
                                  levels_ms=LEVELS, entries_per_file=32)
    else:
        def make(d: Path, lg: Any) -> Any:
            return LevelsScheduler(d, lg, LEVELS, entries_per_file=32)
    stores = {}
    for p in (0, 1):
        st = PartitionStore(s.data_path, TOPIC, p, rules=sc.rules, scheduler_name=scheduler, make_scheduler=make,
                            segment_bytes=8192, cancel_horizon_ms=HORIZON_MS, counters=sc.counters)
        st.open()
        stores[p] = st
    kafka = Kafka()
    restorer = Restorer(kafka, None)
    data, end = batches(seed, 40, scheduler)
    restorer.restoring[StoreKey(TOPIC, 0)] = _Restoring(stores[0], end, 0, time.monotonic())
    restorer.standby[StoreKey(TOPIC, 1)] = _Restoring(stores[1], 0, 0, time.monotonic())
    rng = random.Random(seed + 1)
    states = []
    done = []
    for now, msgs in data:
        done += restorer._apply(msgs, now)
        for st in stores.values():
            st.index_step(now)  # a pass noticed, the next one cut
        rs = [(r.end, r.position, r.records, r.bytes) for r in (
            restorer.restoring[StoreKey(TOPIC, 0)], restorer.standby[StoreKey(TOPIC, 1)])]
        states.append(([state(stores[p]) for p in (0, 1)], rs, restorer.applied, kafka.errors))
        for st in stores.values():
            if rng.random() < 0.5:  # hand out and settle what is due: the cursors move
                st.acked.extend(st.sched.due(now, rng.randint(1, 200)))
                st.settle()
            if rng.random() < 0.3:
                st.checkpoint(fsync=True)
    counters = fields(sc.counters)
    for st in stores.values():
        st.checkpoint(fsync=True)
    final = [state(stores[p]) for p in (0, 1)]
    for st in stores.values():
        st.close()
    return states, final, counters, files(root), done, kafka.restore.unassigned


@pytest.mark.parametrize("scheduler", ["wheel", "levels"])
@pytest.mark.parametrize("seed", range(6))
def test_fast_restore_matches_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheduler: str, seed: int
) -> None:
    taken = [0]
    merging = [0]
    real = partition_mod.PartitionStore.restore_many

    def counting(self: PartitionStore, msgs: list[Any], start: int, end: int) -> tuple[int, int]:
        was = self.ids.merging
        out = real(self, msgs, start, end)
        taken[0] += out[0] - start
        merging[0] += (out[0] - start) * was
        return out

    monkeypatch.setattr(partition_mod.PartitionStore, "restore_many", counting)
    with monkeypatch.context() as m:
        ref = run(tmp_path / "ref", scheduler, seed, False, m)
    assert taken[0] == 0
    fast = run(tmp_path / "fast", scheduler, seed, True, monkeypatch)
    assert taken[0] > 300  # the fast path did take a good part of the records
    assert merging[0] > 20  # some of them while a pass ran (three tables in use)
    ref_states, ref_final, ref_counters, ref_files, ref_done, ref_unassigned = ref
    fast_states, fast_final, fast_counters, fast_files, fast_done, fast_unassigned = fast
    assert ref_done == [(TOPIC, 0)] and ref_unassigned == [(TOPIC, 0)]  # partition 0 reached its end once
    assert (fast_done, fast_unassigned, fast_counters) == (ref_done, ref_unassigned, ref_counters)
    for n, (a, b) in enumerate(zip(fast_states, ref_states, strict=True)):
        assert a == b, f"state after batch {n} differs"
    assert fast_final == ref_final
    assert fast_files.keys() == ref_files.keys()
    for name in ref_files:
        assert fast_files[name] == ref_files[name], name


def _store(root: Path, scheduler: str) -> PartitionStore:
    s = Settings(scheduler=scheduler, data_dir=str(root), bootstrap_servers="x:1", ingress_topic=TOPIC)
    sc = loop.Sidecar(s)
    st = PartitionStore(s.data_path, TOPIC, 0, rules=sc.rules, scheduler_name=scheduler,
                        make_scheduler=sc.make_scheduler, segment_bytes=1 << 20, cancel_horizon_ms=HORIZON_MS,
                        counters=sc.counters)
    st.open()
    return st


def _put(i: int, rtype: int = codec.MESSAGE, rid: bytes | None = None) -> Msg:
    rid = rid or b"in:0:%d" % i
    raw = codec.encode(
        codec.head(
            rtype=rtype, due_ms=T0 + 30_000, enqueue_ms=T0, src_offset=i, src_partition=0, target_partition=-1,
            retry_count=0, level=0,
        ),
        rid, b"out", b"k", b"v" * 50, b"\x00\x00",
    )
    return Msg(0, i, (1, T0), rid, raw, None)


@pytest.mark.parametrize("scheduler", ["wheel", "levels"])
def test_restore_many_stops_at_what_the_reference_handles(tmp_path: Path, scheduler: str) -> None:
    """A run stops at a tombstone, a CANCEL, an id already pending, a corrupt value and the end
    offset; each of them is left to the caller, and the run takes the plain puts before it."""
    st = _store(tmp_path, scheduler)
    st.restore_put(b"in:0:0", _put(0).value() or b"", T0)  # the wheel's cursor starts at the first add
    corrupt = bytearray(_put(7).value() or b"")
    corrupt[100] ^= 1
    msgs = [
        _put(1), _put(2),
        Msg(0, 3, (1, T0), b"in:0:1", None, None),  # a tombstone
        _put(4, codec.CANCEL),
        _put(5, rid=b"in:0:2"),  # pending already
        _put(6),
        Msg(0, 7, (1, T0), b"in:0:7", bytes(corrupt), None),  # CRC mismatch: restore_put raises
        _put(8), _put(9),
    ]
    assert st.restore_many(msgs, 0, -1) == (2, 2 * len(msgs[0].value() or b""))
    assert st.changelog_ingress == 3
    for start in (2, 3, 4, 6):
        assert st.restore_many(msgs, start, -1)[0] == start
    assert st.restore_many(msgs, 5, -1)[0] == 6
    assert st.restore_many(msgs, 7, 9)[0] == 8  # offset 9 is at the end: not taken
    assert st.pending() == ({"wheel": 5, "bucket": 0} if scheduler == "wheel" else {"level-0": 5})  # 0, 1, 2, 6, 8
    with pytest.raises(codec.CorruptRecord):
        st.restore_put(b"in:0:7", bytes(corrupt), T0)
    st.close()


def test_standby_lag_before_the_first_fetch_is_the_whole_changelog(tmp_path: Path) -> None:
    """The stats' and metrics' standby lag: before the restore consumer has fetched (no end offset
    cached yet) it is what the standby started with, not 0 (the bench took that for caught up)."""
    s = Settings(data_dir=str(tmp_path), bootstrap_servers="x:1", ingress_topic=TOPIC)
    sc = loop.Sidecar(s)
    assert sc.restorer is not None and sc.standbys is not None
    st = _store(tmp_path, "wheel")
    sc.restorer.standby[0] = _Restoring(st, 5000, 1200, time.monotonic())  # started at end offset 5000
    ends: dict[int, int | None] = {0: None}
    sc.kafka.restore.end = ends.get  # type: ignore[method-assign]
    assert sc.standbys.lag() == {0: 3800}
    ends[0] = 9000  # fetched: the end moved on
    assert sc.standbys.lag() == {0: 7800}
    st.close()
