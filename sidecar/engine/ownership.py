"""One owner per partition: after a gap between turns, nothing is published until the group confirms.

A turn that starts ``GAP_S`` or more after the previous one ended (the process was stopped,
starved or swapped out) may belong to a member the group has expelled meanwhile, whose partitions
a successor now owns. :meth:`Ownership.confirmed` then answers False, and the loop publishes
nothing, until the group confirms this member (``KafkaIO.prove_membership``: a synchronous commit
of the last committed offsets, which the coordinator refuses for a fenced or expired member), or
moves the partitions away (the consume calls meanwhile run the revoke and lost callbacks), or,
with nothing committed yet to prove it with, ``UNPROVEN_HOLD_S`` has passed. A zombie (stopped
past its session, then resumed) thus never publishes a record of a partition its successor owns.

The time this process spent in its own rebalance callbacks (opening, restoring and handing over
stores) is work, not a stop: the gap is confirmed all the same, but logged at info, not as a
warning (``loop.gap``).
"""

from __future__ import annotations

from sidecar import logs
from sidecar.engine.clock import Clock
from sidecar.engine.kafka_io import KafkaIO
from sidecar.engine.stores import Stores

log = logs.get("sidecar")

GAP_S = 2.0
UNPROVEN_HOLD_S = 6.0  # with nothing committed yet to prove it: two heartbeat intervals


class Ownership:
    def __init__(self, stores: Stores, kafka: KafkaIO, clock: Clock) -> None:
        self.stores = stores
        self.kafka = kafka
        self.clock = clock
        self._turn_end = 0.0
        self._callbacks_at_turn_end = 0.0
        self._suspect_since: float | None = None  # a gap was seen: ownership not yet confirmed

    def turn_ended(self) -> None:
        self._turn_end = self.clock.monotonic()
        self._callbacks_at_turn_end = self.kafka.callback_s

    def confirmed(self) -> bool:
        """May this turn publish? (see the module docstring)"""
        mono = self.clock.monotonic()
        if self._suspect_since is None:
            if not self._turn_end or mono - self._turn_end < GAP_S:
                return True
            self._suspect_since = mono
            gap = mono - self._turn_end
            own = self.kafka.callback_s - self._callbacks_at_turn_end
            (log.info if gap - own < GAP_S else log.warning)(
                "loop.gap", seconds=round(gap, 1), in_rebalance_callbacks=round(own, 1),
                action="confirming group membership before publishing")
        proof = self.kafka.prove_membership(list(self.stores))
        if proof or (proof is None and mono - self._suspect_since >= UNPROVEN_HOLD_S) or not self.stores:
            self._suspect_since = None
            return True
        return False
