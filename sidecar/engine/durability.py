"""Durability: checkpoints, then the offset commits they allow; trimming; disk backpressure.

**The durability order** (docs/design.md): a partition's commit log data, then its id index and
scheduler files, then its checkpoint file are made durable, and only then is the ingress offset
the checkpoint names committed to Kafka. A checkpoint job (``PartitionStore.begin_checkpoint``)
snapshots the store's state on the loop thread; its syncs and the checkpoint write run on the
flusher thread (they release the GIL: the loop keeps consuming and publishing while the disk
works); ``reap`` finishes the jobs the flusher completed (reclaims the segments nothing needs any
more, on the flusher too) and commits their offsets. One job per partition at a time.

When: every ``commit-interval`` (``fsync: batch`` and ``none``); with ``fsync: interval`` only every
``fsync-interval``, because a checkpoint may only name synced data. ``fsync: none`` checkpoints
on the loop thread with no disk wait. A rebalance or a shutdown checkpoints synchronously
(``checkpoint_now``).

**Trim** (every ``TRIM_INTERVAL_S``, on its own clock: RSS must not follow the commit interval):
each store drops the mapped pages it no longer needs; a burst's heap high-water mark is given
back when the burst is over (``HeapReleaser``).

**Disk space** (every second, ``space_check``): the stores' allocated bytes against
``disk-max-bytes`` (and against what the partitions need: ``sidecar.store.space``), free space
against ``disk-min-free-bytes``; the loop pauses ingress while a limit holds, and reports a pause
that delivering cannot lift (a stall).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import psutil

from sidecar.config import Settings
from sidecar.engine.changelog import StoreMirror
from sidecar.engine.clock import Clock
from sidecar.engine.stores import StoreKey, Stores, store_key
from sidecar.runtime.heap import HeapReleaser
from sidecar.runtime.threads import demote_self
from sidecar.store import space
from sidecar.store.partition import CheckpointJob, Counters, PartitionStore

# commit(store, offset, sync): the ingress offset commit (Kafka I/O)
Commit = Callable[[PartitionStore, "int | None", bool], None]
FLUSH_LATE = -1  # Durability.needed: the job's held changelog puts are written when its syncs are done


class Durability:
    def __init__(
        self, settings: Settings, stores: Stores, counters: Callable[[], Counters], clock: Clock,
        commit: Commit, flush_changelog: Callable[[PartitionStore], bool] | None = None,
    ) -> None:
        self.s = settings
        self.stores = stores
        self.counters = counters  # the loop's totals (engine/tenant_counts.py)
        self.clock = clock
        self.commit = commit
        # before a commit outside the jobs: wait for the store's changelog writes (changelog.wait_acked)
        self.flush_changelog = flush_changelog
        # changelog writes a job's commit waits for (StoreMirror.produced once its held puts are
        # written; FLUSH_LATE until then: see checkpoint_soon)
        self.needed: dict[StoreKey, int] = {}
        self.fsync = settings.fsync != "none"
        # SCHED_BATCH: a finished sync must not preempt the loop (runtime/threads.py)
        self.flusher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kds-flush",
                                          initializer=demote_self if settings.helper_threads != "none" else None)
        # the store's key -> (store, job, the flusher's future, checkpoint written)
        self.jobs: dict[StoreKey, tuple[PartitionStore, CheckpointJob, Future[None], bool]] = {}
        # A burst leaves its heap high-water mark behind (librdkafka's pre-fetched fetch buffers,
        # freed but pinned in their arena): given back once the burst is over, off the loop thread.
        self.heap = HeapReleaser(executor=self.flusher)
        self._last_fsync = -1e18
        self._sealed = space.SealedSizes()  # space_check stats only the files that can still change

    # -- checkpoints ----------------------------------------------------------------------------
    def checkpoint_all(self) -> None:
        """Start a checkpoint job for every store with something new (see the module docstring).

        With the changelog, a job has two flusher steps: the syncs, then (once every changelog
        write its snapshot covers is acknowledged, ``reap``; at-least-once the puts held back are
        written when the syncs are done) the checkpoint file. A checkpoint thus
        never names a record whose changelog write could still be lost; the records after it are
        replayed from the local log at the next open and written to the changelog again."""
        mono = self.clock.monotonic()
        if self.s.fsync == "interval" and mono - self._last_fsync < self.s.fsync_interval_ms / 1000:
            return
        self._last_fsync = mono
        for store in self.stores.values():
            self.checkpoint_soon(store)

    def checkpoint_soon(self, store: PartitionStore) -> None:
        """Start a checkpoint job for ``store`` now if it has something new and none runs (the
        loop calls it out of turn for a store that has just restored: a crash before the next
        commit interval then restores from here, not from the old checkpoint again)."""
        key = store_key(store)
        if not store.needs_checkpoint() or key in self.jobs:
            return
        if not self.fsync:
            self.checkpoint_now(store)  # no disk wait: nothing to hand off
        elif store.mirror is not None:
            # At-least-once the job's commit covers the records whose puts are held back: they are
            # written once its syncs are done (``reap``), not at the snapshot. A record delivered
            # meanwhile (in flight at the snapshot) is settled by then and its put dropped: one
            # still held is written then, before the checkpoint and the commit, as at the snapshot.
            late = isinstance(store.mirror, StoreMirror) and not store.mirror.in_transactions
            self.needed[key] = FLUSH_LATE if late else store.mirror.produced
            job = store.begin_checkpoint(fsync=True)
            self.jobs[key] = (store, job, self.flusher.submit(job.syncs.run), False)
        else:
            job = store.begin_checkpoint(fsync=True)
            self.jobs[key] = (store, job, self.flusher.submit(job.run), True)

    def reap(self) -> None:
        """Move the checkpoint jobs the flusher completed on: write the checkpoint of a synced one
        whose changelog writes are acknowledged; finish a written one (reclaim, commit)."""
        for partition, (store, job, fut, written) in list(self.jobs.items()):
            if not fut.done():
                continue
            if written:
                self.await_job(partition, commit=True)
                continue
            self._flush_late(partition, store)
            if self._mirrored(store):
                fut.result()
                self.jobs[partition] = (store, job, self.flusher.submit(job.publish), True)

    def _flush_late(self, key: StoreKey, store: PartitionStore) -> None:
        """Write the held puts of a job whose syncs are done, if its snapshot left them
        (``checkpoint_soon``): its checkpoint and commit wait for them."""
        if self.needed.get(key) == FLUSH_LATE:
            mirror = store.mirror
            assert isinstance(mirror, StoreMirror)
            mirror.flush_held()
            self.needed[key] = mirror.produced

    def _mirrored(self, store: PartitionStore) -> bool:
        """The durability order with the changelog: every changelog write made before the job's
        snapshot is acknowledged before its checkpoint is written and its offset committed."""
        mirror = store.mirror
        if mirror is None:
            return True
        needed = self.needed.get(store_key(store), 0)
        return needed != FLUSH_LATE and mirror.acked >= needed  # FLUSH_LATE: held puts not written yet

    def _flushed(self, store: PartitionStore) -> bool:
        """Wait (bounded) for the store's changelog writes; True without a changelog."""
        return store.mirror is None or self.flush_changelog is None or self.flush_changelog(store)

    def await_job(self, partition: StoreKey, commit: bool) -> None:
        """Wait for the partition's checkpoint job, if any, and finish it; commit its offset only
        when ``commit`` (not for a partition that is gone, or with a fenced consumer). A job whose
        changelog writes are not acknowledged in time is dropped: no checkpoint, no commit."""
        entry = self.jobs.pop(partition, None)
        if entry is None:
            return
        store, job, fut, written = entry
        fut.result()  # a failed sync (EIO, ENOSPC) is fatal, as it is on the loop thread
        if not written:
            self._flush_late(partition, store)
            if not (self._mirrored(store) or self._flushed(store)):
                store.dirty = True  # the next checkpoint covers it
                return
            job.publish()
        gone = store.finish_checkpoint(job)
        if gone:
            self.flusher.submit(gone.run)  # freeing the files' blocks must not stall the loop
        if commit:
            self.commit(store, job.ingress_offset, False)

    def checkpoint_now(self, store: PartitionStore, sync: bool = False) -> None:
        """A checkpoint of ``store`` done here and now (rebalance, shutdown), then its offset commit
        (both only once its changelog writes are acknowledged)."""
        self.await_job(store_key(store), commit=True)
        if not self._flushed(store):
            return  # the changelog did not acknowledge in time: the local log replays it next time
        store.checkpoint(fsync=self.fsync)
        self.commit(store, store.commit_offset(), sync)

    def close_uncommitted(self, store: PartitionStore) -> None:
        """Checkpoint and close a store whose offsets may not be committed (the partition was
        lost, or the consumer is fenced): the checkpoint still saves a restart's replay."""
        self.await_job(store_key(store), commit=False)
        if self._flushed(store):
            store.checkpoint(fsync=self.fsync)
        store.close()

    # -- memory ---------------------------------------------------------------------------------
    def trim(self, mono: float) -> None:
        """Every ``TRIM_INTERVAL_S``: the stores' pages, then the heap if a burst is over."""
        self.trim_stores()
        k = self.counters()
        self.heap.tick(k.ingested + k.delivered + k.publish_retries + sum(k.dlq.values()), mono)

    def trim_stores(self) -> None:
        """Idle stores too (recovery, the scanners and the publisher read pages as well)."""
        for store in self.stores.values():
            store.trim()

    # -- disk space -----------------------------------------------------------------------------
    def space_check(self, stores: list[PartitionStore]) -> tuple[space.Usage, space.Decision]:
        """What ``stores`` (the open and the restoring ones) hold on disk, and whether ingress
        must pause for it (``space.decide``)."""
        use = space.usage((store.dir for store in stores), self._sealed)
        try:
            free = psutil.disk_usage(str(self.s.data_path)).free
        except OSError:
            free = self.s.disk_min_free_bytes
        minimum = len(stores) * space.partition_needs(self.s).total
        return use, space.decide(use.allocated, free, self.s.disk_max_bytes, self.s.disk_min_free_bytes, use.freeable,
                                 minimum)

    def close(self) -> None:
        self.flusher.shutdown(wait=True)
