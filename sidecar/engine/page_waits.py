"""Page waits: a partition held while the page thread reads an id-table page its next record needs.

The C intake (or a cancel's look-up, ``PartitionStore.ingest_fields``) stops before a record
whose id's duplicate check (or look-up) has to read a slot of the id table whose page the kernel
evicted: reading it on the loop thread waits for the disk (50-135 ms behind the id index's merge
passes' writeback in the 100M ``scale`` bench scenario on six partitions), and every other
partition's deliveries with it. Instead the page is read on the page thread
(``IdIndex.read_page``) and the partition is paused from that record on (:meth:`PageWaits.hold`):
its records still in this batch are skipped and consumed again from that offset once the page is
in memory (:meth:`PageWaits.step`, each turn while any is held), in order, so nothing is stored
twice or out of order. The checkpoint covers only what was stored, so a crash meanwhile consumes them again too.

A page not read within ``PAGE_WAIT_S`` is given up on: the partition is consumed again all the
same and its next intake reads the slot wherever it is (the loop waits, but moves on). While a
partition is held, the loop waits in ``consume`` at most ``PAGE_WAIT_POLL_S``.
"""

from __future__ import annotations

from confluent_kafka import KafkaException

from sidecar import logs
from sidecar.engine.clock import Clock
from sidecar.engine.kafka_io import KafkaIO
from sidecar.engine.stores import StoreKey, Stores, store_key
from sidecar.store.idpages import PageRead
from sidecar.store.partition import PartitionStore

log = logs.get("sidecar")

PAGE_WAIT_S = 1.0
PAGE_WAIT_POLL_S = 0.002


class PageWaits:
    def __init__(self, stores: Stores, kafka: KafkaIO, clock: Clock) -> None:
        self.stores = stores
        self.kafka = kafka
        self.clock = clock
        # the held partitions: (first ingress offset not stored, the page read asked for, since)
        self.held: dict[StoreKey, tuple[int, PageRead, float]] = {}
        self.count = 0  # partitions held for an id-table page so far (``stats``: page_waits)

    def hold(self, store: PartitionStore, offset: int) -> None:
        """``store``'s intake stopped before the record at ``offset`` for ``store.page_read``."""
        read = store.page_read
        assert read is not None
        store.page_read = None
        key = store_key(store)
        self.held[key] = (offset, read, self.clock.monotonic())
        self.count += 1
        self.kafka.hold(key)

    def step(self) -> None:
        """Consume again each partition whose page was read, or that waited ``PAGE_WAIT_S``."""
        mono = self.clock.monotonic()
        for key, (offset, read, since) in list(self.held.items()):
            if not read.done and mono - since < PAGE_WAIT_S:
                continue
            del self.held[key]
            store = self.stores.get(key)
            if store is None:
                continue
            if not read.done:
                store.page_read_skip = True
            try:
                self.kafka.seek(key, offset)
            except KafkaException as e:  # not expected: it is assigned and being fetched
                log.error("ingress.seek_failed", partition=key.partition, topic=key.topic, offset=offset, error=str(e))
            self.kafka.release(key)

    def drop(self, key: StoreKey) -> None:
        """``key`` left this instance: nothing to consume again for it here."""
        self.held.pop(key, None)

    def clear(self) -> None:
        """Every partition is consumed again from its committed offset (exactly-once's reset)."""
        self.held.clear()
