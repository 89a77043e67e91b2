"""The key of the loop's stores map: which store a consumed record or an assigned partition is for.

One consumer group reads every tenant's ingress topic (``sidecar/tenants.py``), so a store is
named by its ingress topic and partition: :class:`StoreKey`. Every engine module that keeps
something per store (the stores map ``Stores``, the page waits, the restore's skips, the
look-up's partition filter, the committed offsets) keys it by :class:`StoreKey` and gets a key
only from the functions here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sidecar.store.partition import PartitionStore


class StoreKey(NamedTuple):
    topic: str  # the ingress topic
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"  # as the store's directory is named


Stores = dict[StoreKey, PartitionStore]  # the stores the loop owns (open, restored, publishing)


def record_key(msg: Any) -> StoreKey:
    """The store a consumed ingress record goes to."""
    return StoreKey(msg.topic(), msg.partition())


def store_key(store: PartitionStore) -> StoreKey:
    """The key ``store`` is held under."""
    return StoreKey(store.topic, store.partition)


def tp_key(tp: Any) -> StoreKey:
    """The key of a ``TopicPartition`` (the rebalance callbacks', the commits')."""
    return StoreKey(tp.topic, tp.partition)


def named(keys: list[StoreKey]) -> list[int] | list[str]:
    """Partitions as logs and documents name them: numbers for one ingress topic (as before
    tenants), ``<topic>-<n>`` for several."""
    if len({k.topic for k in keys}) <= 1:
        return [k.partition for k in keys]
    return [str(k) for k in keys]


def topic_runs(msgs: list[Any]) -> list[tuple[str, list[Any]]]:
    """``msgs`` cut into runs of consecutive records of one topic, in order (an error, which
    names no topic, joins the run it falls in)."""
    runs: list[tuple[str, list[Any]]] = []
    topic: str | None = None
    run: list[Any] = []
    for m in msgs:
        t = m.topic() if m.error() is None else topic
        if t != topic and run:
            runs.append((topic or t or "", run))
            run = []
        if t is not None:
            topic = t
        run.append(m)
    if run:
        runs.append((topic or "", run))
    return runs
