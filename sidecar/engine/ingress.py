"""Ingress: a batch of consumed records, each into its partition's store, in order.

:meth:`Ingress.ingest` walks the batch once. Runs of common records go to the store's C intake in
one call (``PartitionStore.ingest_many``), which stops at the first record it does not take (a
cancel, a replace, a late or bad record, another partition); that record takes the reference path
(``PartitionStore.ingest_fields``), and after a run the C intake took nothing from, the next
``FAST_RETRY`` records do too, so its setup is not paid for each of a run of such records. Each
record is scheduled before the next is looked at: after the batch every consumed offset is in its
store (the checkpoint may name it).

A record whose store is not here is dropped or held: revoked in between (the new owner consumes
it), restoring (``Handover.consumed_unowned``: consumed again once restored), or held for an
id-table page (``page_waits.py``: consumed again once the page is in). The records a restore
already brought in are skipped first (``Handover.skip_restored``); before that, the records of a
topic held for a tenant lane's refused transactional id are dropped (``_held_out``: consumed
again once the lane resumes).

Several ingress topics (``sidecar/tenants.py``): the store comes from ``stores.record_key``
(topic and partition), and the C intake is told to compare each message's topic with its store's
as well as its partition (a partition of the same number in another topic stops its run). Where
a run stops at a message of another store, the walk goes on with that store's C run, not
through the reference path. (Cutting the batch into runs of one topic in Python first, as this
did, cost a call per record: 0.9 s of CPU for 1M records of ten tenants, a sixth of the loop's.)
"""

from __future__ import annotations

from typing import Any

from sidecar.config import Settings
from sidecar.engine.clock import Clock
from sidecar.engine.direct import DirectPublish
from sidecar.engine.handover import Handover
from sidecar.engine.kafka_io import KafkaIO
from sidecar.engine.page_waits import PageWaits
from sidecar.engine.stores import StoreKey, Stores, record_key
from sidecar.store.partition import FAST_INTAKE, PartitionStore

FAST_RETRY = 32  # records left to the reference path after the C intake took none


class Ingress:
    def __init__(
        self, settings: Settings, stores: Stores, kafka: KafkaIO, handover: Handover, page_waits: PageWaits,
        clock: Clock,
    ) -> None:
        self.s = settings
        self.stores = stores
        self.kafka = kafka
        self.handover = handover
        self.page_waits = page_waits
        self.clock = clock
        self.several = len(kafka.topics) > 1
        self.direct: DirectPublish | None = None  # records due on arrival published by the C run (engine/direct.py)

    def ingest(self, msgs: list[Any]) -> None:
        if self.kafka.held_topics:
            msgs = self._held_out(msgs)
        if self.handover.skip:
            msgs = self.handover.skip_restored(msgs)
        self._ingest(msgs, None if self.several else self.kafka.topics[0])

    def _held_out(self, msgs: list[Any]) -> list[Any]:
        """Drop the records of a held topic (a tenant lane waiting for its transactional id),
        before a restore's skip sees them, and pause their partitions: the lane's resume
        consumes them again from the committed offsets (``KafkaIO.release_topic``)."""
        topics, out = self.kafka.held_topics, []
        paused: set[StoreKey] = set()
        for m in msgs:
            if m.error() is None and m.topic() in topics:
                key = record_key(m)
                if key not in paused:
                    paused.add(key)
                    self.kafka.hold(key)
                continue
            out.append(m)
        return out

    def _ingest(self, msgs: list[Any], topic: str | None) -> None:
        """Records (and errors) into their stores: all of ``topic``, or of several (None)."""
        now = self.clock.wall_ms()
        stores = self.stores
        waiting = self.page_waits.held
        last: StoreKey | None = None
        store: PartitionStore | None = None
        i, n = 0, len(msgs)
        fast_at = 0 if FAST_INTAKE else n  # where to try the C fast path next
        switched = False  # the C run is tried on the first record of another store's
        while i < n:
            if store is not None and i >= fast_at:
                # the common records in one C call; it stops at the first other one (the path below)
                j = store.ingest_many(msgs, i, now, topic, None if self.direct is None else self.direct.port(store))
                # none taken: a run of other records (cancels, late ones...), so the fast path's
                # setup is not paid for each of them; at a store's first record, that one only
                # (a new queue file, a segment's end: the reference path makes it, C goes on)
                fast_at = j + (0 if j > i else 1 if switched else FAST_RETRY)
                switched = False
                i = j
                if i >= n:
                    break
                if store.page_read is not None:  # stopped for an id-table page: "Page waits"
                    self.page_waits.hold(store, msgs[i].offset())
                    store = None
            m = msgs[i]
            err = m.error()
            if err is not None:
                i += 1
                self.kafka.consume_error(err)
                continue
            key = record_key(m)
            if key != last:
                last = key
                store = None if key in waiting else stores.get(key)
                if store is not None and FAST_INTAKE:
                    fast_at, switched = i, True  # another store's records: its C run first
                    continue
            i += 1
            if store is None:
                self.handover.consumed_unowned(key, m.offset())
                continue
            ts_type, ts = m.timestamp()
            store.ingest_fields(key.topic, m.offset(), ts if ts_type else now, m.key(), m.value(), m.headers(), now)
            if store.page_read is not None:  # a cancel's look-up stopped for an id-table page
                self.page_waits.hold(store, m.offset())
                store = None
