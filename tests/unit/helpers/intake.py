"""Consumed records and store state for the intake tests: ``Msg`` stands in for a confluent_kafka
``Message`` of topic ``TOPIC`` (the loop's intake reads only its accessors); ``state`` and
``files`` capture everything a partition store holds (its plain fields and those of its log, id
index and scheduler; the bytes of every file), so that two paths fed the same records can be
compared whole; ``ingest_store`` opens one store the way the loop does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError

from sidecar.config import Settings
from sidecar.engine import loop
from sidecar.levels.scheduler import LevelsScheduler
from sidecar.store.partition import PartitionStore
from sidecar.wheel import WheelScheduler

TOPIC = "in"
# The wheel's ring in the fast-path-against-reference tests: 10 min at 10 ms, a 1.9 MB slot file.
# Every delay their batches draw lies either within it (up to 200 s, plus the cursor's lag behind the
# clock, which moves at most 6 min in a run) or an hour and more beyond it (a bucket), so each record
# takes the branch it took under a 1 h ring. The state compared after every batch copies the slot
# file; an 11.5 MB one (a 1 h ring) made those copies most of each test's time on a loaded machine.
WHEEL_WINDOW_MS = 600_000


class _Err:
    def code(self) -> int:
        return KafkaError._PARTITION_EOF

    def str(self) -> str:
        return "eof"

    def name(self) -> str:
        return "_PARTITION_EOF"


class Msg:
    """What ``_ingest`` calls of a confluent_kafka Message."""

    def __init__(
        self, partition: int, offset: int, ts: tuple[int, int], key: bytes | None, value: bytes | None,
        headers: list[tuple[str, bytes | None]] | None, err: bool = False, topic: str = TOPIC,
    ) -> None:
        self._p, self._o, self._ts, self._k, self._v, self._h, self._e = partition, offset, ts, key, value, headers, err
        self._t = topic

    def error(self) -> Any:
        return _Err() if self._e else None

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def timestamp(self) -> tuple[int, int]:
        return self._ts

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return None if self._h is None else list(self._h)


def plain(v: Any) -> Any:
    """A comparable copy of a plain value; None for what is not state (files, paths, callables)."""
    if v is None or isinstance(v, (bool, int, str, bytes)):
        return v
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, (list, tuple)):
        items = [plain(x) for x in v]
        return items if all(x is not None or y is None for x, y in zip(items, v, strict=True)) else None
    if isinstance(v, set):
        return sorted(plain(x) for x in v)
    if isinstance(v, dict):
        return {k: (x if x is not None else type(y).__name__) for k, y in v.items() for x in [plain(y)]}
    if hasattr(v, "__array_interface__") or type(v).__name__ == "array":
        return bytes(v)
    return None


def fields(obj: Any) -> dict[str, Any]:
    names = list(vars(obj)) if hasattr(obj, "__dict__") else list(type(obj).__slots__)
    return {k: p for k in names for p in [plain(getattr(obj, k))] if p is not None}


def state(st: PartitionStore) -> dict[str, Any]:
    out = {"store": fields(st), "log": fields(st.log), "ids": fields(st.ids), "sched": fields(st.sched)}
    out["ids"].pop("_jbuf", None)  # the C intake's scratch journal buffer (what it wrote is in the stage's records)
    if st.ids.gen is not None:
        out["ids"]["open"] = fields(st.ids.gen) | {"stage": bytes(st.ids.gen.stage.buf)}
    sched = st.sched
    if isinstance(sched, WheelScheduler):
        out |= {"tl": fields(sched.tl), "slots": fields(sched.slots), "buckets": fields(sched.buckets),
                "loading": fields(sched.loading), "recovery": fields(sched.recovery), "damage": fields(sched.damage)}
        out["buckets"]["_fds"] = list(sched.buckets._fds)  # which bucket files are open, not the OS's fd numbers
    else:
        assert isinstance(sched, LevelsScheduler)
        for n, lv in enumerate(sched.levels):
            out[f"level{n}"] = fields(lv)
            out[f"queue{n}"] = fields(lv.queue)
    return out


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def ingest_store(root: Path, scheduler: str) -> tuple[loop.Sidecar, PartitionStore]:
    s = Settings(scheduler=scheduler, data_dir=str(root), bootstrap_servers="x:1", ingress_topic=TOPIC)
    sc = loop.Sidecar(s)
    st = PartitionStore(s.data_path, TOPIC, 0, rules=sc.rules, scheduler_name=scheduler,
                        make_scheduler=sc.make_scheduler, segment_bytes=1 << 20, cancel_horizon_ms=1000,
                        counters=sc.counters)
    st.open()
    return sc, st
