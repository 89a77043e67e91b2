"""Opening a partition's store: the store made from the settings, then recovered from its files.

Every store the loop holds, owned or standby, comes from :class:`StoreOpener`, so what a store is
made of (the rules, the scheduler, the page thread, its tenant's counts, the history writer) is
said once. ``open`` recovers it (``PartitionStore.open``) and returns the ingress offset its
checkpoint names.

Exactly-once (engine/transactions.py): a store is opened marked dirty; one still marked dirty
when opened again was not closed cleanly after a committed transaction and may hold deliveries
Kafka never committed, so it is wiped first and restored from the changelog's committed records
(without a changelog that is refused: nothing else can restore it).

Several ingress topics (``sidecar/tenants.py``): ``new`` takes the store's key (topic and
partition); the store's rules and counts (engine/tenant_counts.py) are its topic's tenant's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar import logs
from sidecar.config import Settings
from sidecar.engine.stores import StoreKey
from sidecar.engine.tenant_counts import TenantCounts
from sidecar.engine.transactions import is_dirty, mark_dirty, wipe
from sidecar.headers import Rules
from sidecar.scheduling import Scheduler
from sidecar.store.log import CommitLog
from sidecar.store.mapped import StoreError
from sidecar.store.partition import PartitionStore

log = logs.get("sidecar")


class StoreOpener:
    def __init__(
        self, settings: Settings, rules: dict[str, Rules], make_scheduler: Callable[[Path, CommitLog], Scheduler],
        counts: TenantCounts, pages: Any, history: Any, *, changelog: bool, exactly_once: bool,
    ) -> None:
        self.s = settings
        self.rules = rules  # by ingress topic: each tenant's
        self.make_scheduler = make_scheduler
        self.counts = counts
        self.pages = pages  # mapped.PageWorker: pages faulted in ahead and dropped, off the loop
        self.history = history  # the HistoryWriter, or None
        self.changelog = changelog
        self.exactly_once = exactly_once

    def new(self, key: StoreKey, standby: bool = False) -> PartitionStore:
        """The store held under ``key``, not opened yet."""
        s = self.s
        tally = self.counts.by_topic[key.topic]
        store = PartitionStore(
            s.data_path, key.topic, key.partition, rules=self.rules[key.topic], scheduler_name=s.scheduler,
            make_scheduler=self.make_scheduler, segment_bytes=s.segment_bytes,
            cancel_horizon_ms=s.cancel_horizon_ms, counters=tally.counters, durable=s.fsync != "none",
            status_memory=s.status_memory, pages=self.pages,
        )
        store.lateness = tally.lateness
        if not standby:
            store.history = self.history  # a standby applies the changelog: no state change of its own
        return store

    def open(self, store: PartitionStore) -> int | None:
        """Open (recover) ``store``; the ingress offset to resume at (see the module docstring)."""
        if is_dirty(store.dir):
            if not self.changelog:
                raise StoreError(
                    f"{store.dir}: this store was used with --delivery exactly-once and not closed cleanly; only "
                    "the changelog's committed records can restore it: run with --changelog on")
            log.info("store.wiped", partition=store.partition, topic=store.topic,
                     reason="not closed after a committed transaction (exactly-once)")
            wipe(store.dir)
        if self.exactly_once:
            mark_dirty(store.dir)
        return store.open()
