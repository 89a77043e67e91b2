"""Handover: the loop's stores map follows the group's assignment, one owner per partition.

The group gives partitions and takes them back; Kafka I/O's rebalance callbacks (inside
``consume``) arrive here through the loop, under its store lock.

- **Assigned** (:meth:`Handover.assigned`): a standby of the partition is promoted; otherwise its
  store is opened (recovered: ``opening.StoreOpener``) and, without a changelog, joins the stores
  map at once, resuming ingress at its checkpoint's offset. With the changelog it first catches up
  with the changelog (another instance may have owned the partition since) and ingress resumes at
  the group's committed offset: every record before it is in the changelog (the commit waited).
  A store whose changelog has nothing past its checkpoint (a restart on the same node) joins at
  once, as it would after a restore, so its ingress is never held and resumed (a resumed partition
  can wait a second for librdkafka's next fetch).
- **Restoring** (:meth:`Handover.restore_step`, a slice per turn): a restored store joins the
  stores map and is checkpointed at once (in a crash loop faster than the commit interval every
  start would otherwise restore the same, growing, changelog tail again); its partition's ingress
  resumes, skipping the records the store already holds (:meth:`Handover.skip_restored`), from the
  first record consumed while it restored (:meth:`Handover.consumed_unowned`).
- **Revoked** (:meth:`Handover.revoked`): what is in flight is finished, then each store is
  checkpointed, its offset committed and closed before the new owner gets the partition; from
  then on this instance publishes nothing of it (the delivery reports of a store no longer in the
  map are dropped).
- **Lost** (the group moved on without us) and **fenced** (the consumer is dead): the stores close
  without an offset commit; their checkpoints still save a restart's replay.

Exactly-once (``exactly_once``): a revoke's stores close clean only if the transaction holding
their last deliveries committed (``revoked``'s ``commit``, from ``exactly_once.py``); otherwise they
close dirty (``discard``) and their next owner restores the committed state.

Several ingress topics (``sidecar/tenants.py``): the map's key (``stores.StoreKey``) is the
ingress topic and partition, as the callbacks name them; a store mirrors to its topic's changelog.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException

from sidecar import logs
from sidecar.config import Settings
from sidecar.engine.changelog import Restorer, StoreMirror
from sidecar.engine.clock import Clock
from sidecar.engine.durability import Durability
from sidecar.engine.kafka_io import KafkaIO
from sidecar.engine.opening import StoreOpener
from sidecar.engine.page_waits import PageWaits
from sidecar.engine.publishing import Publishing
from sidecar.engine.stores import StoreKey, Stores, named, record_key, store_key
from sidecar.engine.transactions import mark_clean
from sidecar.store.partition import PartitionStore
from sidecar.store.resume import Resume

log = logs.get("sidecar")


class Handover:
    def __init__(
        self, settings: Settings, stores: Stores, kafka: KafkaIO, pub: Publishing, durability: Durability,
        restorer: Restorer | None, opener: StoreOpener, page_waits: PageWaits, clock: Clock, *, history: Any,
        exactly_once: bool, readiness: Callable[[bool], None], space_check: Callable[[list[PartitionStore]], None],
    ) -> None:
        self.s = settings
        self.stores = stores
        self.kafka = kafka
        self.pub = pub
        self.durability = durability
        self.restorer = restorer
        self.opener = opener
        self.page_waits = page_waits
        self.clock = clock
        self.history = history
        self.exactly_once = exactly_once
        self.readiness = readiness  # (assigned): /readyz
        self.space_check = space_check  # (the stores now held): disk space for what was assigned
        # what a recovered store holds of what its partition's ingress consumes again (store/resume.py)
        self.skip: dict[StoreKey, Resume] = {}
        # records due on arrival are published from the intake (engine/direct.py): a store's
        # checkpoints name them (the first one, which opens that path, is taken at its first run)
        self.direct = False
        # restoring -> the first ingress offset consumed while it had no store: read again from
        # there once it is restored (``consumed_unowned``)
        self.refetch: dict[StoreKey, int] = {}
        # what a store's changelog writer produces with, by its ingress topic: the deployment's
        # producer, or under exactly-once its lane's (a tenant's own: engine/txn_lanes.py)
        self.port_of: Callable[[str], Any] = lambda _topic: self.kafka

    # -- what is held -----------------------------------------------------------------------------
    def held(self) -> set[StoreKey]:
        """Assigned partitions whose ingress waits: their stores are still restoring."""
        return set() if self.restorer is None else set(self.restorer.restoring)

    def all_stores(self) -> list[PartitionStore]:
        """The open stores and the ones still restoring from the changelog."""
        restoring = [] if self.restorer is None else [r.store for r in self.restorer.restoring.values()]
        return [*self.stores.values(), *restoring]

    def _changed(self) -> None:
        self.readiness(bool(self.stores) or bool(self.held()))

    # -- the group's callbacks --------------------------------------------------------------------
    def assigned(self, partitions: list[StoreKey]) -> dict[StoreKey, int | None]:
        """Open (recover) each partition's store; the ingress offset to resume at (None: the
        group's committed offset)."""
        resume: dict[StoreKey, int | None] = {}
        restore: list[PartitionStore] = []  # restored from the changelog (their offsets asked for at once)
        for key in partitions:
            warm = self.restorer.end_standby(key) if self.restorer is not None else None
            if warm is not None:
                # a standby of this partition: its store is current up to the last seconds
                warm.mirror = self._mirror(warm)
                warm.history = self.history
                resume[key] = None
                log.info("standby.promoted", partition=key.partition, topic=key.topic,
                         changelog_offset=warm.changelog_offset)
                restore.append(warm)
                continue
            store = self.opener.new(key)
            t0 = time.monotonic()
            resume[key] = offset = self.opener.open(store)
            log.info(
                "partition.recovered", partition=key.partition, topic=key.topic, resume_offset=offset,
                pending=store.pending(),
                truncated_bytes=store.truncated_bytes, dangling=len(getattr(store, "dangling", ())),
                seconds=round(time.monotonic() - t0, 3), steps=store.open_steps,
            )
            if self.restorer is None:
                self.stores[key] = store
                if store.resume is not None and store.resume.needed(offset):
                    self.skip[key] = store.resume
                store.flights.enabled = self.direct  # its next checkpoint names what is published from the intake
                continue
            store.mirror = self._mirror(store)
            resume[key] = None
            restore.append(store)
        if self.restorer is not None:
            self.restorer.begin_many(restore)
        log.info("partitions.assigned", partitions=named(partitions))
        if self.restorer is not None:
            # nothing to restore: it joins now, never held (its partition.restored follows the
            # assignment's event, as a restore's does: the bench and operators read them in order)
            for caught_up in self.restorer.caught_up():
                self._join(caught_up)
        self._changed()
        self.space_check(self.all_stores())
        return resume

    def _mirror(self, store: PartitionStore) -> StoreMirror:
        return StoreMirror(self.port_of(store.topic), self.kafka.changelog_of(store.topic), store, self.exactly_once)

    def revoked(self, partitions: list[StoreKey], commit: Callable[[], str] | None = None) -> str:
        """Finish what is in flight, then checkpoint, commit and close each revoked store.
        ``commit`` (exactly-once): commits the open transaction before the stores close; "" when
        it committed, else why not (then they close dirty). Returns that reason."""
        self.pub.drain(deadline=self.clock.monotonic() + self.s.shutdown_timeout_ms / 1000)
        self.drop_restoring(partitions)
        why = commit() if commit is not None else ""
        for key in partitions:
            store = self.stores.pop(key, None)
            if store is None:
                continue
            if why:
                self.discard(store)
            else:
                self.close_clean(store)
        if commit is None:
            log.info("partitions.revoked", partitions=named(partitions))
        else:
            log.info("partitions.revoked", partitions=named(partitions), committed=not why)
        self._changed()
        return why

    def lost(self, partitions: list[StoreKey]) -> None:
        """The group moved on without us: close the stores, commit nothing (not ours any more)."""
        self.drop_restoring(partitions)
        for key in partitions:
            store = self.stores.pop(key, None)
            if store is not None:
                self.discard(store)
        log.warning("partitions.lost", partitions=named(partitions))
        self._changed()

    def fenced(self) -> None:
        """The consumer is dead (fenced): finish what is in flight, then close every store without
        an offset commit (the new consumer resumes from the checkpoints: nothing is lost)."""
        self.pub.drain(deadline=self.clock.monotonic() + min(self.s.shutdown_timeout_ms / 1000, 10.0))
        self.drop_restoring(list(self.held()))
        stores = list(self.stores.values())
        self.stores.clear()
        for store in stores:
            self.discard(store)
        self._changed()

    # -- closing ----------------------------------------------------------------------------------
    def close_clean(self, store: PartitionStore) -> None:
        """Checkpoint, commit and close ``store`` (exactly-once: after a committed transaction,
        so it is marked clean)."""
        self.durability.checkpoint_now(store, sync=True)
        store.close()
        if self.exactly_once:
            mark_clean(store.dir)

    def discard(self, store: PartitionStore) -> None:
        """Close ``store`` without an offset commit. Exactly-once: its state may run ahead of the
        committed transactions, so it stays dirty (wiped when opened again) and the reports of its
        purged changelog writes are ignored."""
        if self.exactly_once and isinstance(store.mirror, StoreMirror):
            store.mirror.active = False
        self.durability.close_uncommitted(store)

    def drop_restoring(self, partitions: list[StoreKey]) -> None:
        """Partitions that go away: a restoring one's store keeps what it restored (uncommitted)."""
        for key in partitions:
            self.skip.pop(key, None)
            self.refetch.pop(key, None)
            self.page_waits.drop(key)
        if self.restorer is None:
            return
        for key in partitions:
            store = self.restorer.cancel(key)
            if store is not None:
                self.durability.close_uncommitted(store)

    # -- restoring --------------------------------------------------------------------------------
    def restore_step(self) -> None:
        """A slice of changelog restore; a restored store joins the loop and its ingress resumes."""
        assert self.restorer is not None
        for store in self.restorer.step():
            key = self._join(store)
            again = self.refetch.pop(key, None)
            if again is not None:
                # the usual way now: a restoring partition is held at its first record (kafka_io._assign)
                log.info("ingress.consumed_while_restoring", partition=key.partition, topic=key.topic, offset=again,
                         action="consuming it again from that offset")
                try:
                    self.kafka.seek(key, again)
                except KafkaException as e:  # not expected: it was being fetched
                    log.error("ingress.seek_failed", partition=key.partition, topic=key.topic, offset=again,
                              error=str(e))
            self.kafka.release(key)
        self._changed()

    def _join(self, store: PartitionStore) -> StoreKey:
        """A restored store joins the stores map; its ingress skips what the store holds."""
        key = store_key(store)
        store.dirty = True  # its next checkpoint records the changelog offset it now covers
        self.stores[key] = store
        store.remirror_replayed()
        store.flights.enabled = self.direct  # the checkpoint names what is published from the intake
        self.durability.checkpoint_soon(store)  # at once: see the module docstring
        # Ingress resumes at the group's committed offset, which may be older than what this
        # store holds: the records the changelog has, and those this store recovered locally
        # (written to the changelog again just now), are skipped when consumed again.
        held = (store.resume or Resume.none()).raised(store.changelog_ingress)
        end = self.kafka.ingress_end(key) if held.needed(None) else None
        if end is not None and held.end > end:
            # the store names ingress offsets this topic never had (recreated?): skipping
            # would drop new records, so nothing is skipped (duplicates by id are recognised)
            log.warning("changelog.ingress_ahead", partition=key.partition, topic=key.topic, held_until=held.end,
                        ingress_end=end, action="consuming from the committed offset without skipping")
        elif held.needed(None):
            self.skip[key] = held
        return key

    def trim_restoring(self) -> None:
        """The restoring and standby stores drop the mapped pages they no longer need."""
        if self.restorer is not None:
            for r in (*self.restorer.restoring.values(), *self.restorer.standby.values()):
                r.store.trim()

    # -- ingress ----------------------------------------------------------------------------------
    def skip_restored(self, msgs: list[Any]) -> list[Any]:
        """Drop the records a recovered store holds (``store.resume``: the local log's, and with
        the changelog what a restore brought in, ``restore_step``); a partition's skip ends at its
        first record past them (store/resume.py)."""
        skip, out = self.skip, []
        for m in msgs:
            if m.error() is None:
                key = record_key(m)
                held = skip.get(key)
                if held is not None:
                    offset = m.offset()
                    if offset >= held.end:
                        del skip[key]
                    elif held.drops(offset):
                        continue
                    elif offset in held.direct and (store := self.stores.get(key)) is not None:
                        store.flights.redone(offset)  # consumed again now: no longer the checkpoint's to name
            out.append(m)
        return out

    def consumed_unowned(self, key: StoreKey, offset: int) -> None:
        """A record of ``key`` was consumed while it has no store. Revoked in between: the new
        owner consumes it. Or assigned and still restoring (the assign callback does not pause it:
        kafka_io._assign): paused now, and consumed again from its first such record once
        restored. Dropped, it would never be stored."""
        if self.restorer is not None and key in self.restorer.restoring and key not in self.refetch:
            self.refetch[key] = offset
            self.kafka.hold(key)
