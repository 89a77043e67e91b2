"""Listing: the records one store holds pending with a due time in ``[after, before)``, in due
order, a page at a time (``delay-sidecar list``, ``GET /pending``).

Both schedulers keep their entries by due time, so a range read only visits what covers the
range: the wheel's slots of the range, its buckets whose time range meets it and, for a range
reaching back to now, its late chain (``sidecar.wheel.listing``); each level's stretch of its
queue that holds the range, found by binary search, and for a range reaching back to now the
"due now" level (``sidecar.levels.listing``). Never a walk of the whole pending set. Each
scheduler's walk yields ``(due_ms, ref, locator)`` candidates in ``(due_ms, ref)`` order, with no
record decoded; the store decodes a candidate only when it is next in order, and stops once it
has ``limit`` entries that pass the filters (``--target``, ``--id-prefix``). So a page costs the
index entries of its range up to the page's last due time, plus one decode per entry shown or
filtered out; a filter that rejects most of a wide range costs more decodes, bounded by the
``Budget``.

Order and pages. Entries are ordered by ``(due_ms, partition, ref)``: the scheduler's ref is a
stable handle for the record's life (it survives restarts), so equal due times have a fixed
order, and a page's last key is the cursor the next page starts after. The same key orders
entries across the partitions of one sidecar and across sidecars (``sidecar.listing_client``).
A store rebuilt elsewhere from the changelog (a handover) gives its records new refs: a page
boundary that falls among records of one due ms may then repeat or skip some of them.

What is pending: a record the scheduler has not finished, the ones handed to the producer and not
yet acknowledged included (``status`` says "pending" for them too). Cancelled, delivered and
dropped entries are absent. A dead letter on its way to the DLQ is listed with kind
``dead-letter``, its original target, and its DLQ topic.

The walks are read-only: a restored entry (from before the last restart, checked by the
scheduler at its first use) is decoded with its CRC verified and must carry its entry's due
time; one that does not is skipped, not dropped (the scheduler drops it when it reaches it).

Cost bound. Every index entry a walk examines takes one unit of a ``Budget``, every record
decoded ``DECODE_COST`` (``MAX_EXAMINED`` per request: 200,000 units, about a tenth of a second
of a core, measured at ~0.5 µs a unit, during which the loop waits for the store lock the caller
holds: ``sidecar.engine.listing``; a page of 1,000 costs ~10,000, one of 10,000 ~100,000); a read
that runs out raises ``TooWide`` instead of holding the stores longer. The wheel's buckets, read apart
without the lock, have a budget of their own (``MAX_READ_APART``): they cost the loop no wait,
only a share of the interpreter while they are read.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sidecar import contract as c
from sidecar.store import codec
from sidecar.store.codec import CorruptRecord, Record, decode_headers
from sidecar.store.firings import describe
from sidecar.store.mapped import StoreError

if TYPE_CHECKING:
    from sidecar.store.partition import PartitionStore

MAX_LIMIT = 10_000  # entries per page
MAX_EXAMINED = 200_000  # units of work under the store lock per request (Budget): ~0.1 s of a core
DECODE_COST = 8  # units per record decoded; an index entry examined is one (measured: ~4 us vs ~0.5 us)
MAX_READ_APART = 5_000_000  # bucket entries read without the lock (``prepare``), per request
KINDS = {codec.MESSAGE: "message", codec.DEAD: "dead-letter", codec.RECURRING: "recurring"}

Key = tuple[int, int, int]  # (due_ms, partition, ref): the order of entries, and a page's cursor
Candidate = tuple[int, int, int]  # (due_ms, ref, locator) as a scheduler's walk yields it


class TooWide(Exception):
    """The read examined ``MAX_EXAMINED`` entries without filling the page."""


class Budget:
    """Units of work left for this request: index entries examined and records decoded (under
    the store lock: ``MAX_EXAMINED``), or bucket entries read apart (``MAX_READ_APART``)."""

    __slots__ = ("left", "total")

    def __init__(self, total: int = MAX_EXAMINED) -> None:
        self.left = self.total = total

    def spend(self, n: int = 1) -> None:
        self.left -= n
        if self.left < 0:
            raise TooWide(f"the range holds more than {self.total:,} entries to examine before the page is "
                          "full: narrow --due-after/--due-before, or drop the filter that rejects most of them")


@dataclass(frozen=True, slots=True)
class Query:
    """What to list: due in ``[after_ms, before_ms)``, optionally only one target topic and ids
    starting with ``id_prefix``; at most ``limit`` entries after ``cursor`` (a previous page's
    last key)."""

    after_ms: int
    before_ms: int
    target: str | None = None
    id_prefix: bytes | None = None
    limit: int = 100
    cursor: Key | None = None


@dataclass(slots=True)
class Entry:
    """One pending record as listed. Keep it small and flat: fields are added (recurring
    schedules' next firing and counts) without changing the existing ones."""

    id: bytes
    due_ms: int
    target_topic: str
    target_partition: int | None
    source: str  # <ingress topic>:<partition>:<offset> of the record that asked for it
    kind: str  # message, dead-letter
    partition: int  # the ingress partition (the store holding it)
    ref: int  # the scheduler's handle: the order among equal due times
    extra: dict[str, Any] = field(default_factory=dict)  # kind-specific fields (a dead letter's DLQ topic)

    @property
    def key(self) -> Key:
        return self.due_ms, self.partition, self.ref

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id.decode("utf-8", "backslashreplace"), "due_ms": self.due_ms,
                "target_topic": self.target_topic, "target_partition": self.target_partition,
                "source": self.source, "kind": self.kind, "partition": self.partition, "ref": self.ref,
                **self.extra}


class Walkable(Protocol):
    """A scheduler's range walk (``sidecar.wheel.listing``, ``sidecar.levels.listing``):
    ``prepare`` (under the store lock) returns the read of what can be read without it, whose
    candidates ``walk`` merges with its own."""

    def prepare(self, after_ms: int, before_ms: int) -> Callable[[Budget], list[Candidate]] | None: ...

    def walk(self, after_ms: int, before_ms: int, now_ms: int, budget: Budget, early: list[Candidate]
             ) -> Iterator[Candidate]: ...

    def read(self, due_ms: int, ref: int, loc: int) -> Record | None: ...


def walker(store: PartitionStore) -> Walkable:
    """The range walk of the store's scheduler (``Scheduler.range_walk``: each scheduler knows its
    own, in ``sidecar.wheel.listing`` / ``sidecar.levels.listing``, above the store)."""
    walk: Walkable = store.sched.range_walk()
    return walk


def entry(rec: Record, ref: int, partition: int, topic: str) -> Entry:
    """The listed form of a stored record."""
    e = Entry(id=bytes(rec.id), due_ms=rec.due_ms, target_topic=bytes(rec.topic).decode("utf-8", "replace"),
              target_partition=None if rec.target_partition < 0 else rec.target_partition,
              source=f"{topic}:{rec.src_partition}:{rec.src_offset}", kind=KINDS.get(rec.rtype, f"type-{rec.rtype}"),
              partition=partition, ref=ref)
    if rec.rtype == codec.DEAD:  # rec.topic is the DLQ; the target is in its headers (as status shows it)
        e.extra["dlq_topic"] = e.target_topic
        for name, value in decode_headers(rec.headers):
            if name == c.TARGET_TOPIC and value is not None:
                e.target_topic = value.decode("utf-8", "replace")
            elif name == c.DLQ_REASON and value is not None:
                e.extra["reason"] = value.decode("utf-8", "replace")
    elif rec.rtype == codec.RECURRING:  # a schedule, listed at its next firing: what status shows of it
        e.extra["recurring"] = describe(rec)
    return e


def _start(q: Query, partition: int) -> tuple[int, int, int]:
    """(the first due ms to read, the cursor's due ms, the last ref at that due ms already shown
    from this partition): where a page after ``q.cursor`` starts in ``partition``."""
    if q.cursor is None:
        return q.after_ms, -1, -1
    cdue, cpart, cref = q.cursor
    if cpart < partition:  # every entry of this partition at the cursor's due ms comes after it
        return max(q.after_ms, cdue), cdue, -1
    if cpart > partition:  # every entry of this partition at that due ms came before it
        return max(q.after_ms, cdue + 1), cdue, -1
    return max(q.after_ms, cdue), cdue, cref


def prepare(store: PartitionStore, q: Query) -> Callable[[Budget], list[Candidate]] | None:
    """Under the store lock: what of ``store`` a listing for ``q`` reads without it (the wheel's
    buckets meeting the range), as a read to call after letting the lock go, whose result goes to
    ``list_store`` as ``early``. None: nothing."""
    after = _start(q, store.partition)[0]
    return walker(store).prepare(after, q.before_ms) if after < q.before_ms else None


def list_store(store: PartitionStore, q: Query, now_ms: int, budget: Budget | None = None,
               early: list[Candidate] | None = None) -> list[Entry]:
    """Up to ``q.limit`` entries of ``store`` due in ``[q.after_ms, q.before_ms)`` with a key after
    ``q.cursor``, passing the filters, in key order. ``early``: what ``prepare``'s read found;
    without it, that read is done here. Raises ``TooWide`` (see the module docstring)."""
    budget = Budget() if budget is None else budget
    part = store.partition
    after, cdue, cref = _start(q, part)
    if after >= q.before_ms or q.limit <= 0:
        return []
    w = walker(store)
    if early is None:
        read = w.prepare(after, q.before_ms)
        early = [] if read is None else read(Budget(MAX_READ_APART))
    out: list[Entry] = []
    last = (-1, -1)
    target = None if q.target is None else q.target.encode()
    for due, ref, loc in w.walk(after, q.before_ms, now_ms, budget, early):
        if (due == cdue and ref <= cref) or (due, ref) == last:
            continue  # shown on an earlier page; or read from its bucket and found in the ring too
        last = (due, ref)
        budget.spend(DECODE_COST)
        try:
            rec = w.read(due, ref, loc)
        except (StoreError, CorruptRecord, KeyError):
            rec = None  # its body is gone or damaged: the scheduler drops it when it gets there
        if rec is None or (q.id_prefix is not None and not bytes(rec.id).startswith(q.id_prefix)):
            continue
        if target is not None and rec.rtype != codec.DEAD and bytes(rec.topic) != target:
            continue  # (a dead letter's target is in its headers: checked below)
        e = entry(rec, ref, part, store.topic)
        if q.target is not None and q.target not in (e.target_topic, e.extra.get("dlq_topic")):
            continue
        out.append(e)
        if len(out) >= q.limit:
            break
    return out


def merge(pages: list[list[Entry]], limit: int) -> list[Entry]:
    """The first ``limit`` entries of several pages (each in key order), in key order."""
    return list(heapq.merge(*pages, key=lambda e: e.key))[:limit]
