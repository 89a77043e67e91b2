"""A commit log and a timing wheel side by side in a directory (``Env``), without the partition
store: records appended and added (``add``), taken when due (``take``), checkpointed, and reopened
after a crash the way ``PartitionStore.open`` does (``crash``). ``P`` is the wheel's precision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sidecar.store import codec
from sidecar.store.log import CommitLog
from sidecar.wheel import WheelScheduler

T0 = 1_700_000_000_000
P = 10


class Env:
    """A commit log and a wheel in ``root``; ``crash`` reopens them like PartitionStore.open."""

    def __init__(self, root: Path, seg: int = 8192, **kw: Any) -> None:
        self.root = root
        self.kw = {"precision_ms": P, "window_ms": 2_000, "bucket_width_ms": 500, "entries_per_file": 8, **kw}
        self.seg = seg
        self.log = CommitLog(root, self.seg)
        list(self.log.recover(None, None))
        self.w = WheelScheduler(root, self.log, **self.kw)
        self.w.restore(None)
        self.ckpt: dict[str, Any] | None = None
        self.n = 0

    def add(self, due: int, now: int = T0) -> int:
        pos = self.log.append(
            codec.head(
                rtype=codec.MESSAGE, due_ms=due, enqueue_ms=now, src_offset=self.n, src_partition=0,
                target_partition=-1, retry_count=0, level=0,
            ),
            b"r%d" % self.n, b"t", None, b"x", b"",
        )
        self.n += 1
        return self.w.add(due, 0, pos)

    def ids(self, out: list[tuple[int, codec.Record]]) -> list[int]:
        return [int(bytes(r.id)[1:]) for _ref, r in out]

    def take(self, now: int, limit: int = 1000, ack: bool = True) -> list[int]:
        out = self.w.due(now, limit)
        for ref, rec in out:
            assert rec.due_ms <= now
            if ack:
                self.w.ack(ref)
        return self.ids(out)

    def checkpoint(self) -> None:
        self.log.flush()
        self.w.flush()
        self.ckpt = {"log": self.log.state(), "sched": self.w.state()}
        self.log.reclaim()
        self.w.reclaim()

    def crash(self) -> list[int]:
        self.w.close()
        self.log.close()
        self.log = CommitLog(self.root, self.seg)
        self.w = WheelScheduler(self.root, self.log, **self.kw)
        ck = self.ckpt
        self.w.restore(ck["sched"] if ck else None)
        head = int(ck["log"]["head"]) if ck else None
        live = {int(k): int(v) for k, v in ck["log"]["live"].items()} if ck else None
        refs = [self.w.add(rec.due_ms, rec.level, pos) for pos, rec in self.log.recover(head, live)]
        if head is not None:
            assert self.w.validate(head) == []
        return refs

    def close(self) -> None:
        self.w.close()
        self.log.close()
