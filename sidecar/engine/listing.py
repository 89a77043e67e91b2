"""``GET /pending``: one sidecar's page of the records pending in a due-time range, read from its
stores on the HTTP thread that asks, under the loop's store lock.

Where the read runs. The stores belong to the loop thread; a listing reads them on the HTTP thread
holding the lock the loop lets go of while it waits in ``consume`` — the lock look-ups take
(``sidecar.engine.lookup``, which says why it is a lock and not a request handed to the loop: the
loop's wait in ``consume`` cannot be woken, so a queued request would wait up to 100 ms on an idle
sidecar; and not a lock-free read: the loop unmaps and closes the files a read decodes from). A
listing differs from a look-up in its size, so it takes the lock once per store and lets it go
between stores: the loop gets a turn between two partitions' reads, and waits at most one store's
read. What a store's read would read whole — the wheel's buckets meeting the range, which have no
index inside — is read without the lock: under it the store only opens them (``prepare``), the HTTP
thread reads them after letting it go, and takes it again for the rest (``sidecar.wheel.listing``
says why that is safe). The locked read is bounded: the range walk reads only the index entries
covering the range and stops once the page is full (``sidecar.store.listing``), and every entry
examined is charged to one ``Budget`` per request (``MAX_EXAMINED``), so a range that is too wide
or a filter that rejects almost everything gets an error (HTTP 422) instead of a long hold. The
time each answer held the stores is in its ``list_ms``.

Each store is read at its own instant (a record can be delivered between two stores' reads:
that is the truth of one moment per partition, as a look-up is). A partition revoked between
two reads is skipped; one still restoring from the changelog is named in
``restoring_partitions`` (its records are not listed yet).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sidecar.config import Settings
from sidecar.engine.clock import Clock
from sidecar.engine.lookup import LOOKUP_WAIT_S, Lookup
from sidecar.engine.stores import StoreKey, Stores, named
from sidecar.store.listing import (
    MAX_READ_APART,
    Budget,
    Candidate,
    Entry,
    TooWide,
    list_store,
    merge,
    prepare,
)
from sidecar.store.listing_params import cursor_text, from_params
from sidecar.store.mapped import StoreError
from sidecar.store.recent import iso_ms


class Listing:
    def __init__(self, settings: Settings, stores: Stores, clock: Clock, lookups: Lookup) -> None:
        self.s = settings
        self.stores = stores
        self.clock = clock
        self.lookups = lookups  # its lock, and its way of taking it from a busy loop

    def answer(self, params: str) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON document) for ``GET /pending?<params>``. Called on an HTTP thread."""
        try:
            q = from_params(params)
        except ValueError as e:
            return 400, {"error": str(e)}
        budget, apart = Budget(), Budget(MAX_READ_APART)
        pages: list[list[Entry]] = []
        held_s = waited_s = 0.0
        lookups = self.lookups
        owned: list[StoreKey] | None = None  # the partitions, as they were at the first read
        restoring: list[StoreKey] = []
        i = 0
        early: Callable[[Budget], list[Candidate]] | None = None  # the next store's read without the lock
        found: list[Candidate] | None = None
        try:
            while owned is None or i < len(owned):
                t0 = time.perf_counter()
                if not lookups.enter():
                    return 503, {"error": f"the event loop did not free the stores within {LOOKUP_WAIT_S:g} s "
                                          "(a long turn: a rebalance, a shutdown); try again"}
                t1 = time.perf_counter()
                try:
                    if owned is None:
                        owned, restoring = sorted(self.stores), sorted(lookups.held())
                    store = self.stores.get(owned[i]) if i < len(owned) else None  # None: revoked since
                    if store is not None and found is None:
                        early = prepare(store, q)
                    if store is not None and early is None:
                        pages.append(list_store(store, q, self.clock.wall_ms(), budget, found))
                finally:
                    lookups.lock.release()
                held_s += time.perf_counter() - t1
                waited_s += t1 - t0
                if early is not None:  # read it now, without the lock; then the store again, with it
                    found, early = early(apart), None
                    continue
                found = None
                i += 1
        except TooWide as e:
            return 422, {"error": str(e)}
        except StoreError as e:
            return 500, {"error": f"a store could not be read: {e}"}
        entries = merge(pages, q.limit)
        doc: dict[str, Any] = {
            "entries": [{**e.as_dict(), "due": iso_ms(e.due_ms)} for e in entries],
            "owned_partitions": named(owned or []), "restoring_partitions": named(restoring),
            "instance": self.s.group_instance_id, "wait_ms": round(waited_s * 1000, 3),
            "list_ms": round(held_s * 1000, 3),
        }
        if len(entries) == q.limit:
            doc["next"] = cursor_text(entries[-1].key)
        return 200, doc
