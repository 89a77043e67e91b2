"""Standby stores: warm copies of partitions other members own, kept tailing the changelog.

With ``standby-replicas`` > 0 (and the changelog on), each turn applies what the standbys'
changelog partitions have now (``Restorer.tail``), and every ``STANDBY_REFRESH_S`` the group is
described (an admin request, its answer taken in a later turn: the loop never waits for it) and
the standbys placed again (``changelog.standby_partitions``: Kafka Streams' rule; never one of
this instance's own or restoring partitions). A standby no longer wanted is closed without an
offset commit (it owns nothing); a wanted one is opened from its local files and tails from the
offset its checkpoint covers. When the group assigns a standby's partition to this instance the
handover promotes it (``Restorer.end_standby``): only the last seconds are left to restore.
"""

from __future__ import annotations

from typing import Any

from sidecar import logs
from sidecar.config import Settings
from sidecar.engine.changelog import Restorer, standby_partitions
from sidecar.engine.clock import Clock
from sidecar.engine.durability import Durability
from sidecar.engine.kafka_io import KafkaIO
from sidecar.engine.opening import StoreOpener
from sidecar.engine.stores import StoreKey, Stores

log = logs.get("sidecar")

STANDBY_REFRESH_S = 10.0  # how often the group is described to place the standbys


class Standbys:
    def __init__(
        self, settings: Settings, stores: Stores, kafka: KafkaIO, restorer: Restorer, durability: Durability,
        opener: StoreOpener, clock: Clock,
    ) -> None:
        self.s = settings
        self.stores = stores
        self.kafka = kafka
        self.restorer = restorer
        self.durability = durability
        self.opener = opener
        self.clock = clock
        self._group: Any = None  # a pending describe of the group
        self._last_group = -STANDBY_REFRESH_S

    def step(self) -> None:
        """Tail the changelog into the standbys; place them again when a description is in."""
        restorer = self.restorer
        if restorer.standby:
            restorer.tail()
        mono = self.clock.monotonic()
        if self._group is None:
            if mono - self._last_group >= STANDBY_REFRESH_S:
                self._last_group = mono
                self._group = self.kafka.describe_group()
            return
        if not self._group.done():
            return
        fut, self._group = self._group, None
        try:
            members = fut.result()
        except Exception as e:  # the admin request failed: placed again at the next refresh
            log.warning("standby.placement_failed", error=str(e))
            return
        me = self.s.group_instance_id or ""
        want = (standby_partitions(members, me, self.s.standby_replicas, set(restorer.standby))
                - set(self.stores) - set(restorer.restoring))
        for key in set(restorer.standby) - want:
            store = restorer.end_standby(key)
            if store is not None:
                self.durability.close_uncommitted(store)
                log.info("standby.stopped", partition=key.partition, topic=key.topic)
        for key in sorted(want - set(restorer.standby)):
            store = self.opener.new(key, standby=True)
            self.opener.open(store)
            restorer.begin_standby(store)

    def drop_all(self) -> None:
        """Close every standby (shutdown): nothing to commit, the checkpoint saves a reopen."""
        for partition in list(self.restorer.standby):
            store = self.restorer.end_standby(partition)
            if store is not None:
                self.durability.close_uncommitted(store)

    def lag(self) -> dict[StoreKey, int]:
        """Changelog records each standby store has not applied yet: against the end offset the
        restore consumer last saw, or before its first fetch (no end cached yet: the lag read 0
        while the whole changelog was still to come) the one the standby started with."""
        return {p: max(0, max(self.kafka.restore.end(p) or 0, r.end) - r.position)
                for p, r in self.restorer.standby.items()}
