"""Look-up: ``GET /ids/<id>`` answered from the stores, on an HTTP thread, under the store lock.

The stores belong to the loop thread. A look-up (:meth:`Lookup.lookup`) reads them holding
:attr:`Lookup.lock`, which the loop holds for each turn's work and lets go of only while it waits
in ``consume`` (the rebalance callbacks, which run inside ``consume``, take it too; it is
reentrant because they also run inside ``close`` at shutdown, which holds it already).

Why a lock and not a query handed to the loop: the loop waits in ``consume`` up to 100 ms when
idle, and librdkafka's wait cannot be woken, so a queued query would wait up to that. Why not a
lock-free read: a look-up decodes from the mmapped files, and the loop unmaps, rebuilds and
closes them (a segment reclaimed, the id index grown, a store closed on revoke); a read between
two of those steps could see a closed map (and an export of a map makes the loop's ``close``
fail). With the lock the loop never changes a store during a look-up, an idle loop answers at
once and a busy one after its turn (a few ms: :meth:`Lookup.let_in` keeps the loop from taking the
lock straight back). A look-up costs one hash probe and one record decode under the lock: the
loop barely notices. One that waits ``LOOKUP_WAIT_S`` for the lock is answered 503.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from sidecar.config import Settings
from sidecar.engine.clock import Clock
from sidecar.engine.stores import StoreKey, Stores, named
from sidecar.store.recent import iso_ms

LOOKUP_WAIT_S = 1.0  # how long a look-up waits for the stores (then 503)
LOOKUP_YIELD_S = 0.0002  # a busy loop pauses this long before taking the stores back from a waiting look-up


def _text(rid: bytes) -> str:
    return rid.decode("utf-8", "backslashreplace")


class Lookup:
    def __init__(self, settings: Settings, stores: Stores, clock: Clock, held: Callable[[], set[StoreKey]]) -> None:
        self.s = settings
        self.stores = stores
        self.clock = clock
        self.held = held  # the partitions still restoring
        self.topics = sorted({t.ingress_topic for t in settings.tenants})
        self.lock = threading.RLock()
        self._waiting = False

    def let_in(self) -> None:
        """The loop, between its wait and its work: a look-up waiting for the lock gets it first
        (a busy loop would take it back before the woken look-up thread gets to it)."""
        if self._waiting:
            self._waiting = False
            time.sleep(LOOKUP_YIELD_S)

    def enter(self) -> bool:
        """Take the stores from the loop (then ``lock.release()``), waiting at most
        ``LOOKUP_WAIT_S``: False when the loop did not let go. Called on an HTTP thread."""
        self._waiting = True
        if not self.lock.acquire(timeout=LOOKUP_WAIT_S):
            return False
        self._waiting = False
        return True

    def lookup(self, rid: bytes, partition: int | None = None, topic: str | None = None) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON document) for ``rid`` in this instance's stores (``partition``:
        that ingress partition only, of every tenant's topic unless ``topic`` names one tenant's
        ingress topic). Called on an HTTP thread."""
        t0 = time.perf_counter()
        if not self.enter():
            return 503, {"error": f"the event loop did not free the stores within {LOOKUP_WAIT_S:g} s (a long "
                                  "turn: a rebalance, a shutdown); try again", "id": _text(rid)}
        t1 = time.perf_counter()
        try:
            owned_keys = sorted(self.stores)
            restoring_keys = sorted(self.held())
            stores = [s for k, s in self.stores.items()
                      if (partition is None or k.partition == partition) and (topic is None or k.topic == topic)]
            found = None
            now = self.clock.wall_ms()
            for store in stores:
                found = store.lookup(rid, now)
                if found is not None:
                    break
        finally:
            self.lock.release()
        t2 = time.perf_counter()
        # where the time went: waiting for the loop to let go of the stores, and the look-up itself
        owned = {k.partition for k in owned_keys if topic is None or k.topic == topic}
        restoring = {k.partition for k in restoring_keys if topic is None or k.topic == topic}
        base = {"id": _text(rid), "ingress_topic": self.topics[0] if len(self.topics) == 1 else self.topics,
                "instance": self.s.group_instance_id, "owned_partitions": named(owned_keys),
                "wait_ms": round((t1 - t0) * 1000, 3),
                "lookup_ms": round((t2 - t1) * 1000, 3)}
        if found is None:
            if partition is not None and partition in restoring:
                return 503, {**base, "error": f"partition {partition} is restoring from the changelog; try again"}
            why = ("not pending here, and no outcome remembered" if partition is None or partition in owned
                   else f"partition {partition} is not owned by this instance")
            return 404, {**base, "state": "unknown", "error": why, "restoring_partitions": named(restoring_keys)}
        for field in ("due_ms", "at_ms", "enqueued_ms"):
            if field in found:
                found[field[:-3]] = iso_ms(found[field])
        return 200, {**base, **found}
