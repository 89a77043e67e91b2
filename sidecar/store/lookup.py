"""Look-up: what a store holds under a schedule id.

The id index (``idindex.py``) maps a 64-bit hash of the id to scheduler refs, and to pre-cancels
(``idslot.PRECANCEL`` with the cancel's time). A hash is not an answer: each ref is verified
against the stored record's id, so two ids that collide are told apart. A ref whose record the
scheduler no longer holds (delivered, cancelled) is stale.

Two kinds of callers:

- the store's own changes (``pending_refs``, ``pending_ref``, ``pending_record``: the intake's
  cancels, the restore's puts, the outcomes' history; ``request_check``: what a request under
  the id makes of the index, for the intake's ``schedule``), which also drop the stale entries
  they meet, since they write the index anyway;
- ``status`` (``delay-sidecar status``, ``GET /ids/<id>``), which changes nothing: a stale entry
  is skipped, not removed, so an answer costs no write. After the pending record it answers from
  a pre-cancel, then from the memory of recent outcomes (``recent.py``).

More than one pending ref under one id happens only while a replaced version is being delivered
(handed out, not acked yet) beside its successor.

A record published from the intake (engine/direct.py) has no index entry while its report is not
served: ``in_flight`` finds it in the store's ``flights`` (store/flights.py), and ``flight_check``
says what a record consumed under the same id makes of it (the intake's ``schedule``).
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

from sidecar import contract as c
from sidecar.store import codec
from sidecar.store.codec import Record, decode_headers
from sidecar.store.firings import describe
from sidecar.store.idindex import id_hash
from sidecar.store.idslot import PRECANCEL

if TYPE_CHECKING:
    from sidecar._native import DirectDelivery
    from sidecar.store.partition import PartitionStore


def pending_refs(store: PartitionStore, rid: bytes) -> tuple[int, list[int]]:
    """(id hash, every entry under ``rid`` not done yet); drops stale index entries."""
    h = id_hash(rid)
    refs: list[int] = []
    ids, sched = store.ids, store.sched
    for ref in ids.find(h):
        if ref & PRECANCEL:
            continue
        rec = sched.record(ref)
        if rec is None:
            ids.remove(h, ref)
        elif rec.id == rid:
            refs.append(ref)
    return h, refs


def pending_ref(store: PartitionStore, rid: bytes) -> tuple[int, int | None]:
    """(id hash, the pending entry under ``rid`` or None); drops stale index entries."""
    h, refs = pending_refs(store, rid)
    return h, refs[0] if refs else None


def pending_record(store: PartitionStore, rid: bytes) -> Record | None:
    """The pending record under ``rid`` (for its history event before it changes)."""
    _h, ref = pending_ref(store, rid)
    return None if ref is None else store.sched.record(ref)


def _version(rec: Record) -> tuple[int, int]:
    return rec.src_offset, rec.due_ms if rec.rtype == codec.RECURRING else 0


def in_flight(store: PartitionStore, rid: bytes, h: int | None = None) -> DirectDelivery | None:
    """The ``DirectDelivery`` of ``rid`` when it was published from the intake and its report is
    not served yet (engine/direct.py), else None; ``h``: its hash, when known."""
    deliveries = store.flights.deliveries
    if not deliveries:  # the common case: nothing in flight, no hash to take
        return None
    d = deliveries.get(id_hash(rid) if h is None else h)
    return d if d is not None and d.rid == rid else None


class Flight(Enum):
    """The answers of the intake's checks that are not a record or refs."""

    DUPLICATE = "duplicate"  # ``flight_check``: the record changes nothing
    PRECANCELLED = "precancelled"  # ``request_check``: a pre-cancel within its horizon cancels it


def flight_check(
    store: PartitionStore, rid: bytes, h: int, offset: int, replace: bool,
) -> DirectDelivery | Literal[Flight.DUPLICATE] | None:
    """What a record under ``rid`` (hash ``h``) from ingress ``offset`` makes of a version of its
    id published from the intake whose report is not served yet (``in_flight``): None, there is
    none; ``Flight.DUPLICATE``, it changes nothing, as a record under an id being delivered (not a
    replace, or one from an offset not after the one in flight: that record consumed again); else
    the ``DirectDelivery`` it replaces (a replace from a later offset: stored as a replace is, and
    the one in flight then leaves the id's changelog entry to it: ``superseded``)."""
    flight = in_flight(store, rid, h)
    if flight is None or (replace and offset > flight.offset):
        return flight
    return Flight.DUPLICATE


def request_check(
    store: PartitionStore, rid: bytes, h: int, offset: int, replace: bool, now_ms: int,
) -> Record | Literal[Flight.PRECANCELLED] | list[int]:
    """What the index holds under ``rid`` (hash ``h``) for a request from ingress ``offset`` (the
    intake's ``schedule``): ``Flight.PRECANCELLED``, a pre-cancel within the cancel horizon (the
    request is cancelled on arrival, the pre-cancel kept until the horizon); the pending
    ``Record`` under the id when the request changes nothing (not a replace, or this very record
    or an older one consumed again after a crash or a handover); else the refs of the versions it
    replaces (a replace from a later offset; none: a new id). Drops the stale entries and the
    expired pre-cancels it meets."""
    old: list[int] = []
    ids = store.ids
    for ref in ids.find(h):
        if ref & PRECANCEL:
            if now_ms - (ref & ~PRECANCEL) <= store.cancel_horizon_ms:
                return Flight.PRECANCELLED
            ids.remove(h, ref)
            continue
        rec = store.sched.record(ref)
        if rec is None:
            ids.remove(h, ref)  # stale: already done
        elif rec.id == rid and replace and offset > rec.src_offset:
            old.append(ref)
        elif rec.id == rid:
            return rec
    return old


def status(store: PartitionStore, rid: bytes, now_ms: int | None = None) -> dict[str, Any] | None:
    """What the store knows of ``rid``, or None: the pending record (one hash probe, verified),
    else a pre-cancel (matched on the hash, as the intake matches it; with ``now_ms``, only one
    within the cancel horizon, as the intake honours it), else a recent outcome."""
    h = id_hash(rid)
    precancel: int | None = None
    found: Record | None = None
    for ref in store.ids.find(h):
        if ref & PRECANCEL:
            at = ref & ~PRECANCEL
            if now_ms is None or now_ms - at <= store.cancel_horizon_ms:
                precancel = at
            continue
        rec = store.sched.record(ref)
        # two versions only while a replaced one (or a recurring schedule's firing) is being
        # delivered: the newer answers (the later offset; of one schedule's, the later firing)
        if rec is not None and rec.id == rid and (found is None or _version(rec) > _version(found)):
            found = rec
    if found is not None:
        rec = found
        out: dict[str, Any] = {
            "partition": store.partition, "state": "pending", "due_ms": rec.due_ms,
            "enqueued_ms": rec.enqueue_ms, "ingress_offset": rec.src_offset,
            "target_topic": rec.topic.decode("utf-8", "replace"),
            "target_partition": None if rec.target_partition < 0 else rec.target_partition,
        }
        if rec.rtype == codec.RECURRING:
            out["recurring"] = describe(rec)
        if rec.rtype == codec.DEAD:  # a dead letter on its way to the DLQ
            out["state"] = "dead-lettered"
            out["dlq_delivered"] = False
            for name, value in decode_headers(rec.headers):
                if name == c.DLQ_REASON and value is not None:
                    out["reason"] = value.decode("utf-8", "replace")
                elif name == c.TARGET_TOPIC and value is not None:
                    out["target_topic"] = value.decode("utf-8", "replace")
            out["dlq_topic"] = rec.topic.decode("utf-8", "replace")
        return out
    if precancel is not None:
        return {"partition": store.partition, "state": "cancelled", "at_ms": precancel, "before_message": True}
    d = in_flight(store, rid, h)
    if d is not None:  # published from the intake, not reported yet (engine/direct.py): never stored
        return {"partition": store.partition, "state": "pending", "due_ms": d.due, "ingress_offset": d.offset,
                "target_topic": d.topic, "being_delivered": True}
    known = store.recent.get(rid)
    if known is None:
        return None
    return {"partition": store.partition, "state": known[0], "at_ms": known[1]}
