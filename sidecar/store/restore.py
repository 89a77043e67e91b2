"""Restore: re-applying records that were stored before, so that a store holds them again.

Records come back from two places:

- the store's own commit log, at ``open`` (``replay``): the records appended after the checkpoint
  go through the same scheduling decisions as when they were appended. A MESSAGE or DEAD record
  replayed under an id that is pending takes the pending entry's place: the log never holds a
  duplicate, so it is a replace, or the dead letter of a record whose publishing failed for good.
  A CANCEL record does what its level field says it did (``intake.LEVEL_MATCHED`` /
  ``LEVEL_REMEMBERED``).
- the changelog, at a handover or for a standby (``engine/changelog.py``): ``put`` and
  ``remove`` apply its puts and tombstones idempotently, ``many`` stores a run of plain puts in
  one C call. Records replayed from the log that the changelog may have lost with the process are
  written to it again (``remirror_replayed``).

Both keep the newer of two versions of an id (``_version``): the higher ingress offset (a replace
comes after what it replaces in the partition), and at the same offset the dead letter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sidecar.store import codec
from sidecar.store.codec import NATIVE, Record, native
from sidecar.store.idindex import id_hash
from sidecar.store.idslot import PRECANCEL
from sidecar.store.intake import LEVEL_MATCHED, LEVEL_REMEMBERED
from sidecar.store.intake_layout import Common
from sidecar.store.lookup import pending_ref, pending_refs
from sidecar.store.mapped import HEADER_SIZE, StoreError
from sidecar.store.mirroring import raw_of

if TYPE_CHECKING:
    from sidecar.store.partition import PartitionStore

_restore_run = native.restore_run if NATIVE else None  # the restore's fast path (many), in C


def _version(rec: Record) -> tuple[int, int, int]:
    """Which of two records under one id is newer: the higher ingress offset (a replace comes
    after what it replaces in the partition); at the same offset the dead letter of a record, and
    of a recurring schedule's firings the later one (store/firings.py: each is armed after the
    one before)."""
    return rec.src_offset, rec.rtype == codec.DEAD, rec.due_ms if rec.rtype == codec.RECURRING else 0


class Restore:
    """A store's restore (the module docstring). It holds no state of its own: ``replayed`` and
    ``in_changelog`` are the store's, since ``open`` fills them and the engine reads them."""

    __slots__ = ("store",)

    def __init__(self, store: PartitionStore) -> None:
        self.store = store

    def replay(self, pos: int, rec: Record) -> None:
        """One record of the commit log's tail, at ``open``: what appending it did, again."""
        store = self.store
        if rec.rtype == codec.CANCEL:
            if rec.level == LEVEL_MATCHED:  # it cancelled what was pending: never a pre-cancel
                h, refs = pending_refs(store, rec.id)
                for ref in refs:
                    if store.sched.cancel(ref):
                        store.ids.remove(h, ref)
            elif rec.level == LEVEL_REMEMBERED:  # nothing was pending: what replay re-added was done
                h, refs = pending_refs(store, rec.id)
                for ref in refs:
                    if store.sched.cancel(ref):
                        store.ids.remove(h, ref)
                if PRECANCEL | rec.enqueue_ms not in store.ids.find(h):
                    store.ids.put(h, PRECANCEL | rec.enqueue_ms)
            else:
                store.intake.apply_cancel(rec.id, rec.enqueue_ms)
            store.log.release(pos)
            return
        # A record for an id that is pending can only be a replace (a duplicate is never appended)
        # or the dead letter of a record whose publishing failed for good: either way it takes
        # the pending one's place, as it did when it was appended.
        h, old = pending_refs(store, rec.id)
        for ref in old:
            if store.sched.cancel(ref):
                store.ids.remove(h, ref)
        store.ids.put(h, store.sched.add(rec.due_ms, rec.level, pos))

    def remirror_replayed(self) -> int:
        """Write the records recovery replayed to the changelog again, those still pending: their
        first writes were made after the checkpoint and may have died with the process (a
        checkpoint names only records whose writes were acknowledged, durability.py). Not those
        the restore just read from the changelog (``in_changelog``): their writes did not die.
        Writing them again would grow the changelog's tail by what every restart replays, and a
        crash loop faster than the checkpoints would restore a longer tail at each start."""
        store = self.store
        replayed, store.replayed = store.replayed, []
        seen, store.in_changelog = store.in_changelog, set()
        if store.mirror is None:
            return 0
        n = 0
        for pos in replayed:
            rec = store.log.read(pos)
            if rec.id in seen:
                continue
            if rec.rtype != codec.CANCEL:  # still the pending version of its id (not replaced since)
                refs = pending_refs(store, rec.id)[1]
                held = [store.sched.record(ref) for ref in refs]
                pending = any(r is not None and _version(r) == _version(rec) for r in held)
            else:
                pending = PRECANCEL | rec.enqueue_ms in store.ids.find(id_hash(rec.id))
            if pending:
                store.mirror.put(rec.id, raw_of(rec))
                n += 1
        return n

    def put(self, rid: bytes, raw: bytes, now_ms: int) -> None:
        """A changelog record: ``raw`` (commit-log bytes) is pending under ``rid``. Idempotent: a
        record already pending under that id is kept unless ``raw`` is a newer version of it (a
        replace: a higher ingress offset; or the dead letter of it, same offset), which takes its
        place as it did on the old owner; an equal or older one is the same record replayed (from
        before the store's checkpoint). A pending pre-cancel wins, as at intake. A CANCEL is a
        pre-cancel, remembered until its horizon."""
        store = self.store
        rec = codec.decode(memoryview(raw), 0, verify=True)
        if rec.id != rid:
            raise StoreError(f"changelog record under key {rid!r} holds id {rec.id!r}")
        store.dirty = True
        if rec.rtype == codec.CANCEL:
            if now_ms - rec.enqueue_ms <= store.cancel_horizon_ms:
                h, ref = pending_ref(store, rid)
                if ref is not None and store.sched.cancel(ref):
                    store.ids.remove(h, ref)
                elif ref is None and PRECANCEL | rec.enqueue_ms not in store.ids.find(h):
                    store.ids.put(h, PRECANCEL | rec.enqueue_ms)
                elif ref is None and store.replayed:
                    store.in_changelog.add(rid)
            return
        h, refs = pending_refs(store, rid)
        for pre in store.ids.find(h):  # a record arriving after its cancel: it never fires
            if pre & PRECANCEL and now_ms - (pre & ~PRECANCEL) <= store.cancel_horizon_ms:
                return
        rank = _version(rec)
        for ref in refs:
            held = store.sched.record(ref)
            if held is not None and _version(held) >= rank:
                if store.replayed and _version(held) == rank:
                    store.in_changelog.add(rid)
                return  # the same record, or a newer version of it, is held
        pos = store.log.append(codec.head_of(rec), rec.id, rec.topic, rec.key, rec.value, rec.headers)
        new = store.sched.add(rec.due_ms, rec.level, pos)
        for ref in refs:
            if store.sched.cancel(ref):
                store.ids.remove(h, ref)
            else:
                store.superseded.add(ref)
        store.ids.put(h, new)

    def many(self, msgs: list[Any], start: int, end: int) -> tuple[int, int]:
        """Store ``msgs[start:]`` (changelog consumer Messages) in one C call (``_native.restore_run``)
        while each is a put ``put`` would append as it is: a message of this partition
        without error, below changelog offset ``end`` (-1: none, a standby), whose value is a
        MESSAGE or DEAD record of its key's id in the codec's canonical form, CRC-checked, with no
        id-index entry under the id's hash (nothing pending, no pre-cancel; in no stage and not in
        the table), room in the current segment, the scheduler's plain append, room in the open
        stage (each insert journaled as ``put`` journals it). Returns (the index of the first
        message not stored, the value bytes stored); the caller runs that message through the
        reference path (``put`` / ``remove``, which handle everything: tombstones,
        CANCELs, ids already known, a new segment) and calls again. Both leave the same bytes and
        the same state (docs/storage.md 10); ``covered`` is told the highest source offset stored."""
        store = self.store
        if _restore_run is None or type(msgs) is not list:
            return start, 0
        sched = store.sched.intake_begin()
        if sched is None:
            return start, 0
        st, bufs = sched
        st[Common.HEADER_SIZE] = HEADER_SIZE
        st[Common.NEXT_OFFSET] = -1
        st[Common.MAX_SRC_OFFSET] = -1
        seg = store.log.intake_state(st)
        idx = store.ids.intake_state(st, len(msgs) - start)
        old, old2, jnl, tags = store.ids.intake_bufs()
        stop: int = _restore_run(msgs, start, native.RestoreRun(
            seg_buf=seg, idx_buf=idx, st=st, sched_bufs=bufs, idx_old_buf=old, idx_old2_buf=old2, idx_jnl_buf=jnl,
            idx_tags_buf=tags, partition=store.partition, end=end,
        ))
        count = stop - start
        if count:
            store.dirty = True
            store.log.intake_restore(st, count)
            store.ids.intake_restore(st)
            store.sched.intake_end(st, count)
            store.covered(st[Common.MAX_SRC_OFFSET])
            return stop, st[Common.RESTORED_BYTES]
        return stop, 0

    def remove(self, rid: bytes) -> None:
        """A changelog tombstone: nothing is pending under ``rid`` (delivered, dead-lettered,
        cancelled); a record this store still holds under it is dropped without being delivered."""
        store = self.store
        h, refs = pending_refs(store, rid)
        for ref in refs:
            if store.sched.cancel(ref):
                store.ids.remove(h, ref)
                store.dirty = True
