"""Far-future records through the time buckets, on virtual time (docs/design.md 3.2)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from sidecar.store import codec
from sidecar.store.log import CommitLog
from sidecar.wheel import WheelScheduler
from tests.unit.helpers.wheel_env import Env as WheelEnv

T0 = 1_700_000_000_000
DAY = 86_400_000
YEAR = 365 * DAY
KW: dict[str, Any] = {"precision_ms": 10, "window_ms": 60_000, "bucket_width_ms": 15_000, "entries_per_file": 64}
SEG = 4096


class Env(WheelEnv):
    """The shared commit log and wheel with buckets of 15 s, small segments and a clock of its own."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, seg=SEG, **KW)
        self.now = T0
        self.w.due(T0, 1)

    def add(self, due: int, value: bytes = b"payload") -> int:
        pos = self.log.append(
            codec.head(
                rtype=codec.MESSAGE, due_ms=due, enqueue_ms=self.now, src_offset=self.n, src_partition=3,
                target_partition=7, retry_count=2, level=0,
            ),
            b"id-%d" % self.n, b"target", b"key", value, codec.encode_headers([("h", b"v"), ("n", None)]),
        )
        self.n += 1
        return self.w.add(due, 0, pos)

    def run_until_idle(self, limit: int = 1000) -> list[tuple[int, codec.Record, int]]:
        """Jump the virtual clock from one next_due_ms() to the next, checkpointing like the loop."""
        got = []
        for _ in range(100_000):
            self.checkpoint()
            nxt = self.w.next_due_ms()
            if nxt is None:
                break
            self.now = max(self.now, nxt)
            for ref, rec in self.w.due(self.now, limit):
                assert rec.due_ms <= self.now, "early"
                got.append((ref, rec, self.now))
                self.w.ack(ref)
        self.now += 20
        self.w.due(self.now, limit)
        self.checkpoint()
        self.checkpoint()
        return got

    def restart(self) -> None:
        self.w.close()
        self.log.close()
        self.log = CommitLog(self.root, SEG)
        self.w = WheelScheduler(self.root, self.log, **KW)
        assert self.ckpt is not None
        self.w.restore(self.ckpt["sched"])
        live = {int(k): int(v) for k, v in self.ckpt["log"]["live"].items()}
        assert list(self.log.recover(int(self.ckpt["log"]["head"]), live)) == []


def test_a_one_year_delay_waits_in_a_bucket_and_frees_its_log_segment(tmp_path: Path) -> None:
    env = Env(tmp_path)
    due = T0 + YEAR + 1234
    ref = env.add(due, value=b"the body" * 10)
    assert env.w.where(ref) == "bucket"
    assert env.w.pending() == {"wheel": 0, "bucket": 1}
    assert env.log.live[0] == 0, "the commit-log slot is released as soon as the copy is in the bucket"
    rec = env.w.record(ref)
    assert rec is not None and bytes(rec.id) == b"id-0" and rec.due_ms == due
    # near-term traffic rolls the log over several segments and is delivered
    for i in range(200):
        env.add(T0 + 1000 + i)
    env.now = T0 + 2000
    out = env.w.due(env.now, 10_000)
    assert len(out) == 200
    for r, _rec in out:
        env.w.ack(r)
    env.checkpoint()
    assert min(env.log.segments) > 0, "the segment that held the one-year record is deleted"
    bucket_files = list((tmp_path / "buckets").glob("*.bkt"))
    assert len(bucket_files) == 1
    env.close()


def test_the_bucket_enters_the_wheel_and_is_delivered_exactly_on_time(tmp_path: Path) -> None:
    env = Env(tmp_path)
    due = T0 + YEAR + 1234
    headers = codec.encode_headers([("h", b"v"), ("n", None)])
    ref = env.add(due, value=b"the body" * 10)
    env.checkpoint()
    env.restart()  # a year is a long time: survive a restart on the way
    assert env.w.next_due_ms() == due  # the bucket is narrower than the window: nothing happens before
    # a year later, half a window before it is due: the reader catches up, then the bucket loads
    env.now = due - 30_000
    for _ in range(2):
        env.checkpoint()
        assert env.w.due(env.now, 10) == []
    assert env.w.where(ref) == "slot", "loaded into its slot once the window covers the bucket"
    assert env.w.pending() == {"wheel": 1, "bucket": 0}
    assert env.w.next_due_ms() == due
    assert env.w.due(due - 1, 10) == []
    out = env.w.due(due, 10)
    assert [r for r, _ in out] == [ref]
    rec = out[0][1]
    assert (bytes(rec.id), bytes(rec.topic), bytes(rec.key or b""), bytes(rec.value or b"")) == (
        b"id-0", b"target", b"key", b"the body" * 10,
    )
    assert (rec.due_ms, rec.src_partition, rec.target_partition, rec.retry_count) == (due, 3, 7, 2)
    assert bytes(rec.headers) == headers
    env.w.ack(ref)
    env.now = due + 20
    env.w.due(env.now, 10)
    env.checkpoint()
    env.checkpoint()
    assert env.w.pending() == {"wheel": 0, "bucket": 0}
    assert list((tmp_path / "buckets").glob("*.bkt")) == [], "a delivered bucket is deleted whole"
    assert all(v == 0 for v in env.log.live.values())
    env.close()


def test_cancel_in_a_bucket(tmp_path: Path) -> None:
    env = Env(tmp_path)
    a = env.add(T0 + 10 * DAY)
    b = env.add(T0 + 10 * DAY + 5)
    assert env.w.cancel(a) is True
    assert env.w.cancel(a) is False
    assert env.w.record(a) is None
    assert env.w.where(a) is None and env.w.where(b) == "bucket"
    got = env.run_until_idle()
    assert [r for r, _rec, _at in got] == [b]
    assert got[0][2] == T0 + 10 * DAY + 5
    assert list((tmp_path / "buckets").glob("*.bkt")) == []
    env.close()


def test_many_far_records_come_back_in_order_at_their_times(tmp_path: Path) -> None:
    env = Env(tmp_path)
    rnd = random.Random(7)
    dues = [T0 + rnd.choice([60_000, 3_600_000, DAY, 30 * DAY]) + rnd.randrange(0, 200_000) for _ in range(500)]
    dues += dues[:50]  # ties
    refs = {env.add(d): (d, i) for i, d in enumerate(dues)}
    assert env.w.pending()["bucket"] > 400
    env.checkpoint()
    got = env.run_until_idle(limit=7)
    assert len(got) == len(dues)
    assert [(rec.due_ms, int(bytes(rec.id)[3:])) for _r, rec, _at in got] == sorted(refs.values())
    assert all(at == rec.due_ms for _r, rec, at in got), "each one exactly at its due ms"
    assert env.w.pending() == {"wheel": 0, "bucket": 0}
    assert list((tmp_path / "buckets").glob("*.bkt")) == []
    assert all(v == 0 for v in env.log.live.values())
    env.close()


def test_a_record_due_soon_joins_a_bucket_not_yet_loaded(tmp_path: Path) -> None:
    """Equal due times keep their arrival order across the bucket and the ring."""
    env = Env(tmp_path)
    far = env.add(T0 + 70_000)  # beyond the window: a bucket [60 s, 75 s) is created
    env.now = T0 + 11_000
    env.w.due(env.now, 10)
    env.checkpoint()
    tie = env.add(T0 + 70_000)  # within the window now, but its bucket is not loaded yet
    assert env.w.where(far) == env.w.where(tie) == "bucket"
    got = env.run_until_idle()
    assert [r for r, _rec, _at in got] == [far, tie]
    env.close()
