"""When the loop must wake for publishing: how long its ``consume`` may wait for ingress records.

The loop waits in ``consume`` between turns, at most ``MAX_WAIT_S``, and must be back when the
next record falls due. :func:`next_due` is the earliest due time any owned partition's scheduler
has not handed out yet, leaving out the stores whose lane waits for its transactional id
(``held``) and, for a paced tenant (``max-delivery-rate``, engine/pacing.py), not before its next
token. :func:`wait_s` adds the publisher's own queues: a backlog (records a full producer queue
refused) means no wait; the retry heap's earliest entry counts as a due time. Both read state and
decide nothing else: the publisher (engine/publishing.py) owns the queues they look at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sized
from typing import Any

from sidecar.engine.pacing import Pacing
from sidecar.store.partition import PartitionStore

MAX_WAIT_S = 0.1  # the loop's longest wait in consume with nothing due sooner


def next_due(stores: Iterable[PartitionStore], held: set[str], pacing: Pacing, now_ms: int) -> int | None:
    """The earliest due time of ``stores`` not handed out yet (see the module docstring);
    ``now_ms`` is read only for paced tenants."""
    nxt: int | None = None
    paced = pacing.buckets
    for store in stores:
        if held and store.topic in held:
            continue
        d = store.sched.next_due_ms()
        if paced:
            d = pacing.wake(store.topic, d, now_ms)  # a paced tenant: not before its next token
        if d is not None and (nxt is None or d < nxt):
            nxt = d
    return nxt


def wait_s(now_ms: int, next_due: Callable[[], int | None], backlog: Sized, retries: list[Any]) -> float:
    """How long the loop may wait (capped at ``MAX_WAIT_S``): until the next due time
    (``next_due``, :func:`next_due` of the publisher's stores: asked only when the queues do not
    already say "now") or the retry heap's earliest entry (``retries[0][0]``); none with a
    ``backlog``."""
    if backlog or (retries and retries[0][0] <= now_ms):
        return 0.0
    nxt = next_due()
    if retries:
        nxt = retries[0][0] if nxt is None else min(nxt, retries[0][0])
    if nxt is None:
        return MAX_WAIT_S
    return max(0.0, min(MAX_WAIT_S, (nxt - now_ms) / 1000))
