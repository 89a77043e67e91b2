"""The scheduler interface shared by ``sidecar.levels`` and ``sidecar.wheel`` (docs/design.md 4).

A scheduler owns the life of a commit-log record from ``add`` until it is done. The event loop
(``sidecar.engine``) talks to it only through this protocol:

- ``plan(mode, level, requested_due_ms, enqueue_ms)`` -> ``(level, committed_due_ms)`` or ``None``
  (out of range). Pure: rounds the request **up** to what this scheduler can honour.
- ``add(due_ms, level, log_pos)`` -> ``ref``: a stable integer handle (survives restarts).
- ``due(now_ms, limit)`` -> up to ``limit`` ``(ref, record)`` pairs whose committed due time is
  ``<= now_ms``, each handed out once (until a restart); ``record`` is a decoded view of the stored
  record, valid until ``ack``.
- ``ack(ref)``: the record reached a terminal state (delivered or dead-lettered). The scheduler
  releases the log record once every earlier obligation allows it.
- ``ack_many(refs)``: ``ack`` for a batch (the loop acks what one producer poll delivered).
- ``cancel(ref)`` -> True if it was pending (not yet handed out and not done): O(1), a state
  marker the dequeue checks (RIP-43's delete magic).
- ``record(ref)`` -> the stored record if ``ref`` is still pending, else ``None``.
- ``next_due_ms()``: the earliest committed due time not yet handed out (a poll-timeout hint).
- ``flush()``, ``state()`` (JSON-able checkpoint), ``restore(state)``, ``pending()`` (count per
  tier), ``disk_bytes()``, ``close()``.
- ``trim()``: unmap the resident pages of its mmapped files from the process (RSS; nothing is
  lost, see ``sidecar.store.mapped``).
- ``arm(head, report)``: after recovery, check the entries restored from the checkpoint (they
  point below the log ``head``) against the log when first read, and ``report`` each dangling one.
- ``reclaim()``: after a checkpoint, close and delete the files it no longer needs.
- ``intake_begin()`` -> ``(st, buffers)`` or ``None``, and ``intake_end(st, count)``: the scheduler's
  side of the C intake fast path (``PartitionStore.ingest_many``, docs/storage.md 2.6). ``st`` is
  the intake state (``sidecar.store.intake_layout``: the scheduler makes it with its own part
  filled in, and the store adds the common part); ``buffers`` are the files the C loop writes.
  After the loop stored ``count`` records, ``intake_end`` takes back what it moved. ``None``: the
  next ``add`` cannot be the C loop's plain case (a scheduler without a fast path always says so).

Nothing here reads a clock: time comes in as ``now_ms``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from sidecar.store.codec import Record


class Scheduler(Protocol):
    name: str

    def plan(self, mode: str, level: int, requested_due_ms: int, enqueue_ms: int) -> tuple[int, int] | None: ...

    def add(self, due_ms: int, level: int, log_pos: int) -> int: ...

    def due(self, now_ms: int, limit: int) -> list[tuple[int, Record]]: ...

    def ack(self, ref: int) -> None: ...

    def ack_many(self, refs: list[int]) -> None: ...

    def cancel(self, ref: int) -> bool: ...

    def record(self, ref: int) -> Record | None: ...

    def next_due_ms(self) -> int | None: ...

    def flush(self) -> None: ...

    def trim(self) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any] | None) -> None: ...

    def pending(self) -> dict[str, int]: ...

    def disk_bytes(self) -> int: ...

    def close(self) -> None: ...

    def arm(self, head: int, report: Callable[[int, int, str], None] | None = None) -> None: ...

    def reclaim(self) -> None: ...

    def intake_begin(self) -> tuple[list[int], tuple[Any, ...]] | None: ...

    def intake_end(self, st: list[int], count: int) -> None: ...

    def range_walk(self) -> Any: ...  # a ``sidecar.store.listing.Walkable``: what ``list`` reads
