"""``deferred_sync``: the store's syncs collected on the loop thread and run on the flusher."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from sidecar.store import codec
from sidecar.store.log import CommitLog
from sidecar.store.mapped import deferred_sync, fsync_dir


def _append(log: CommitLog, i: int) -> int:
    return log.append(
        codec.head(
            rtype=1, due_ms=1000 + i, enqueue_ms=1000, src_offset=i, src_partition=0, target_partition=-1,
            retry_count=0, level=0,
        ),
        b"id%d" % i, b"t", b"k", b"v" * 50, b"",
    )


def test_flushes_inside_the_block_are_collected_and_run_later(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "p", 1 << 16)
    list(log.recover(None, None))
    positions = [_append(log, i) for i in range(2000)]  # several segments
    assert len(log.segments) > 1
    with deferred_sync() as batch:
        log.flush()
    assert sorted(batch.files) == sorted(str(seg.path) for seg in log.segments.values())
    assert batch.dirs == [str(log.dir)], "new segments: their directory entry must be synced too"
    assert log.flushed == log.head, "the log counts the flush as done: the batch owns it now"
    fds = list(batch.files.values())
    t = threading.Thread(target=batch.run)
    t.start()
    t.join()
    assert batch.files == {}
    for fd in fds:  # closed by run()
        try:
            os.fstat(fd)
        except OSError:
            continue
        raise AssertionError(f"descriptor {fd} left open")
    # the bytes the batch synced are the log's: a fresh process-independent read sees them
    rec = log.read(positions[-1], verify=True)
    assert bytes(rec.id) == b"id1999"
    log.close()


def test_outside_the_block_flush_is_immediate_and_other_threads_are_not_captured(tmp_path: Path) -> None:
    seen: list[bool] = []

    def other() -> None:
        fsync_dir(tmp_path)  # must sync now, not land in the main thread's batch
        seen.append(True)

    with deferred_sync() as batch:
        t = threading.Thread(target=other)
        t.start()
        t.join()
        fsync_dir(tmp_path / ".")
    assert seen == [True]
    assert batch.dirs == [str(tmp_path / ".")]
    batch.run()
    assert batch.files == {}
