"""Backpressure: ingress paused while the disk or the changelog cannot take more records.

Once a second, and when partitions are assigned, :meth:`Backpressure.check` weighs the stores'
files against ``disk-max-bytes`` and the free space against ``disk-min-free-bytes``
(``Durability.space_check``, ``sidecar.store.space``), and counts the changelog writes the broker
refused (sent again here, once a second: nothing is committed meanwhile, so nothing is lost).
Either pauses all of ingress until it clears; deliveries go on. A pause that deliveries (or
retries) will lift is backpressure (info); one that delivering cannot lift is a stall: an error
event with the fix (``ingress.stalled``), and ``/readyz`` says so until it clears.

When partitions are assigned (:meth:`Backpressure.assigned`) ``disk-max-bytes`` is also weighed
against what that many partitions need: refused (paused, not ready) before anything is consumed,
or a warning if their files can outgrow it.
"""

from __future__ import annotations

from typing import Any

from sidecar import logs
from sidecar.config import Settings
from sidecar.engine.changelog import StoreMirror
from sidecar.engine.durability import Durability
from sidecar.engine.kafka_io import KafkaIO
from sidecar.engine.stores import Stores
from sidecar.store import space
from sidecar.store.partition import PartitionStore

log = logs.get("sidecar")


class Backpressure:
    def __init__(
        self, settings: Settings, stores: Stores, kafka: KafkaIO, durability: Durability, metrics: Any, health: Any,
    ) -> None:
        self.s = settings
        self.stores = stores
        self.kafka = kafka
        self.durability = durability
        self.metrics = metrics
        self.health = health
        self.paused = False
        self.pause_reason = ""
        self.disk_stalled = ""  # the space.Decision code while delivering cannot lift a disk pause

    def assigned(self, held: list[PartitionStore]) -> None:
        """Partitions were assigned: ``held`` are every store now open or restoring."""
        note = space.budget_note(self.s, len(held))
        if note is not None:
            log.warning("disk.budget_may_stall", **note)
        self.check(held)

    def check(self, held: list[PartitionStore]) -> None:
        """Pause or resume ingress for the disk space ``held`` (the open and the restoring stores)
        take, or for refused changelog writes."""
        use, d = self.durability.space_check(held)
        mirrors = [m for m in (s.mirror for s in self.stores.values()) if isinstance(m, StoreMirror)]
        for m in mirrors:
            if m.retry:
                m.resend()
        failing = sum(m.failed for m in mirrors)
        if failing and not d.paused:
            d = space.Decision(True, False, "changelog-refused",
                               f"{failing} changelog writes were refused and are being retried")
        if d.paused and not self.paused:
            self.kafka.pause()
            self.paused = True
            log.info("ingress.paused", code=d.code, reason=d.reason)
        elif not d.paused and self.paused:
            self.kafka.resume()
            self.paused = False
            log.info("ingress.resumed")
        self.pause_reason = d.reason
        stalled = d.code if d.stalled else ""
        if stalled != self.disk_stalled:
            if stalled:
                log.error("ingress.stalled", code=d.code, reason=d.reason, fix=d.fix, store_bytes=use.allocated,
                          freeable_bytes=use.freeable, partitions=len(held))
            else:
                log.info("ingress.stall_cleared", code=self.disk_stalled, paused=self.paused)
            self.disk_stalled = stalled
            if self.health is not None:
                self.health.set_disk_stalled(stalled, d.reason, d.fix)
        if self.metrics is not None:
            self.metrics.set_store_bytes(use.allocated, use.apparent)
            self.metrics.set_ingress_paused(self.paused, d.code)
