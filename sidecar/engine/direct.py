"""Records due when they arrive, published by the intake itself: never stored.

Most records a backlog or a zero delay brings are due when they are consumed. Stored, each costs
a commit-log append, a scheduler entry, an id-index insert and its journal record, a decode when
the scheduler hands it out, and a settle (index removal, scheduler ack, changelog tombstone):
about half the loop thread's CPU per record over a plain consume -> produce. Here the C intake
(``_native.ingest_run`` with the store's ``DirectPort``, sidecar/native/direct.c) produces such a
record as soon as it has checked it, with the headers the stored record would be delivered with,
and only what a delivery report needs is kept: the record's ``DirectDelivery`` in the store's
``flights`` (store/flights.py: id hash -> it) until its report.

What a stored record guarantees holds for it:

- **Never early**: it is taken only when its committed due time is at or before the run's clock
  reading (``due <= now`` in the run: by construction).
- **Durability order**: until its report, its ingress offset is in the checkpoint's ``direct``
  list and the offset commit stops below it (``PartitionStore.commit_offset``); a crash or a
  handover consumes it again (store/resume.py: where a recovered store resumes, and what it drops
  of what it consumes again). With the changelog its commit-log bytes are held as its put and
  its id marked ``fresh`` (engine/changelog.py "Held puts"): written only if a checkpoint or a
  later put comes first, in ingress order; at its report the held put is dropped and nothing is
  written, or the tombstone when the put was.
- **One owner**: its report for a store that is no longer the stores map's does nothing (its next
  owner consumes it again: the commit stopped below it); a revoke waits for the in-flight count,
  which counts it (``Publishing.drain``).
- **Ids**: the C intake takes only an id with no id-index entry (no pending record, no
  pre-cancel) and stops at an id in ``flights``: the reference path (store/intake.py) counts a
  second record under it a duplicate, stores a replace from a later offset (the one in flight
  then leaves the changelog to it: ``superseded``), and answers a cancel "too late", as for a
  record being delivered.
- **Failure**: its failed report (and any report that is not plain: a troubled target, the broker
  seen down) comes to :meth:`DirectPublish.report`; a failure marks its target troubled (the
  direct path stops while any target is, as the C publish path does) and stores the record
  (``Intake.store_unsent``), so the stored path delivers it with the retry ladder and the DLQ.
- A success's id goes to the store's recent outcomes ("delivered"), its lateness to the metrics:
  the reports run inside a producer poll, wherever ``Publishing`` polls (between two chunks, at
  the end of a turn, in a drain), and :meth:`DirectPublish.settle` takes their ids right after
  each (``Publishing.settle_direct``), as ``Publishing.poll`` settles the stored path's.

What lives where: this module decides when a store's run may publish (``port``), makes its
``DirectPort`` with ``Publishing.native_publisher`` (the C ``Publisher``, which the stored path's
C reports count through too: one in-flight count for both), settles the deliveries and takes
the reports the C one does not; ``Publishing`` keeps only what both paths share (a target's
health, the broker's readiness: ``delivered_to``, ``failure_seen``).

Off (the stored path takes every record) under exactly-once, with the history topic, etf1
tombstones, several tenants (the in-flight window's fair shares are the stored path's), a
tenant's quota or delivery rate, without the extension, or with ``KDS_DIRECT_PUBLISH=off``; and per run
when the group has not confirmed this member since a gap, the producer queue was full (the
backlog), or a target is troubled.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from sidecar.config import Settings
from sidecar.engine.clock import Clock
from sidecar.engine.durability import Durability
from sidecar.engine.publishing import Publishing
from sidecar.engine.stores import Stores, store_key
from sidecar.store.codec import NATIVE, native
from sidecar.store.intake import FAST_INTAKE
from sidecar.store.partition import PartitionStore

if TYPE_CHECKING:
    from sidecar._native import DirectDelivery

# KDS_DIRECT_PUBLISH=off: every record takes the stored path (a comparison's other side, as
# KDS_PURE_PYTHON=1 turns the C paths off)
SWITCH = "KDS_DIRECT_PUBLISH"


def enabled(settings: Settings) -> bool:
    """Whether the deployment publishes records due on arrival from the intake (module docstring)."""
    return (NATIVE and FAST_INTAKE and os.environ.get(SWITCH, "on") != "off" and not settings.exactly_once
            and not settings.history_topic and settings.etf1_tombstones != "on" and len(settings.tenants) == 1)


class DirectPublish:
    def __init__(
        self, settings: Settings, stores: Stores, pub: Publishing, durability: Durability, clock: Clock,
    ) -> None:
        self.s = settings
        self.durability = durability
        self.stores = stores
        self.pub = pub
        self.clock = clock
        self.on = enabled(settings)
        self.confirmed = False  # this turn: the group confirmed this member (the loop sets it)
        if self.on:
            # every producer poll serves its reports too, wherever Publishing polls (a chunk, a
            # turn, a drain): what they delivered is settled right after, as the stored path's is
            pub.settle_direct = self.settle

    def port(self, store: PartitionStore) -> Any:
        """The store's ``DirectPort`` for a C intake run now, or None: the run stores every record."""
        if not (self.on and self.confirmed) or store.history is not None or store.rules.quota is not None:
            return None
        flights = store.flights
        if not flights.checkpointed:
            # its first checkpoint naming the records in flight opens this path: taken now (a
            # job on the flusher, done within a few turns), not at the next commit interval
            flights.enabled = store.dirty = True
            self.durability.checkpoint_soon(store)
            return None
        pub = self.pub
        if pub.backlog or (pub.held and store.topic in pub.held) or store.topic in pub.pacing.buckets:
            return None
        mirror = store.mirror
        port = flights.port
        if port is None or flights.port_mirror is not mirror:
            held = getattr(mirror, "held", None) if mirror is not None else None
            port = flights.port = native.DirectPort(
                publisher=pub.native_publisher, store=store, key=store.key, lateness=store.lateness,
                topic_bytes=store.topic_bytes, partition=store.partition, flights=flights.deliveries, delivered=[],
                held=held, fresh=mirror.fresh if held is not None else None,  # type: ignore[union-attr]
                mirror_remove=mirror.remove if held is not None else None,  # type: ignore[union-attr]
                fallback=self.report,
            )
            flights.port_mirror = mirror
        port.produce = pub.tenants.of(store.topic, pub.producer).produce
        port.max_in_flight = self.s.max_in_flight
        return port

    def settle(self) -> None:
        """After each producer poll (``Publishing.poll``): the ids of the records its reports
        delivered (each store's port's ``delivered``) counted and remembered as delivered."""
        now = -1
        for store in self.stores.values():
            port = store.flights.port
            if port is not None and port.delivered:
                if now < 0:
                    now = self.clock.wall_ms()
                store.outcomes.settle_direct(port.delivered, now)

    def report(self, d: DirectDelivery, err: Any, msg: Any) -> None:
        """A report the C one does not take (after its in-flight counts): a failure, or a success
        while a target is troubled or the broker was seen down, or for a store no longer here."""
        port = d.port
        store: PartitionStore = port.store
        deliveries = store.flights.deliveries
        if deliveries.get(d.hash) is d:
            del deliveries[d.hash]
        if self.stores.get(store_key(store)) is not store:
            return  # revoked or lost: its next owner consumes it again (the commit stopped below it)
        pub = self.pub
        if err is None:
            pub.delivered_to(d.topic)
            lateness = msg.timestamp()[1] - d.due
            if lateness < 0:
                pub.counters.early += 1
            port.lateness.append(lateness)
            if store.mirror is not None and not d.superseded:
                store.mirror.remove(d.rid)
            port.delivered.append(d.rid)
            return
        pub.failure_seen(err, d.topic, store.topic)
        if d.superseded:
            return  # a newer version of its id is pending
        store.intake.store_unsent(d.msg, self.clock.wall_ms())

