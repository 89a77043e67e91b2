"""Disk space accounting and the pause policy (``sidecar.store.space``) on real store files."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar import contract as c
from sidecar.config import ConfigError, Settings
from sidecar.engine.loop import make_scheduler_factory
from sidecar.store import idjournal, idslot, space
from sidecar.store.idindex import IdIndex, id_hash
from sidecar.store.partition import Counters, IngressRecord, PartitionStore, compile_rules

T0 = 1_700_000_000_000


def open_store(root: Path, s: Settings, partition: int = 0) -> PartitionStore:
    rules = compile_rules(s.ingress_topic, s.dlq_topic, s.levels_ms, s.max_delay_ms, s.retry_ladder_ms,
                          s.max_retries, s.max_record_bytes, s.target_allowlist)
    st_ = PartitionStore(
        root, s.ingress_topic, partition, rules=rules, scheduler_name=s.scheduler,
        make_scheduler=make_scheduler_factory(s), segment_bytes=s.segment_bytes,
        cancel_horizon_ms=s.cancel_horizon_ms, counters=Counters(), durable=False,
    )
    st_.open()
    return st_


def send(st_: PartitionStore, offset: int, delay_ms: int, pad: int, now: int = T0) -> None:
    st_.ingest(IngressRecord(st_.topic, st_.partition, offset, now, b"k", b"v" * pad, [
        (c.TARGET_TOPIC, b"t"), (c.DELAY_MS, str(delay_ms).encode()), (c.ID, f"r{offset}".encode())]), now)


def deliver_due(st_: PartitionStore, now: int) -> int:
    n = 0
    while batch := st_.sched.due(now, 100_000):
        for ref, rec in batch:
            st_.delivered(ref, id_hash(bytes(rec.id)))
        n += len(batch)
    return n


def blocks(root: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def sizes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("scheduler", ["wheel", "levels"])
def test_usage_counts_allocated_blocks_and_what_delivering_frees(tmp_path: Path, scheduler: str) -> None:
    s = Settings(scheduler=scheduler, segment_bytes=64 * 1024, max_record_bytes=8 * 1024)
    st_ = open_store(tmp_path, s)
    st_.checkpoint(fsync=False)
    empty = space.usage([st_.dir])
    assert empty.allocated == blocks(st_.dir) and empty.apparent == sizes(st_.dir)
    assert empty.allocated < empty.apparent / 20, "preallocated files hold a few pages when empty"
    assert empty.freeable == 0, "an empty store has nothing to free"
    for i in range(600):  # ~600 KB of records: ~10 segments
        send(st_, i, 1000 + (i % 3) * 1000, 900)
    st_.checkpoint(fsync=False)
    full = space.usage([st_.dir])
    assert full.allocated == blocks(st_.dir) and full.apparent == sizes(st_.dir)
    segments = sorted((st_.dir / "log").glob("*.log"))
    sealed = sum(p.stat().st_blocks * 512 for p in segments[:-1])
    assert len(segments) >= 8 and full.freeable >= sealed > 0
    assert deliver_due(st_, T0 + 10_000) == 600
    st_.ids.growth.cut(force=True)  # the id index's journal merged (and deleted by the checkpoints below)
    st_.ids.wait()
    st_.checkpoint(fsync=False)  # covers the releases: the sealed segments go
    st_.dirty = True
    st_.checkpoint(fsync=False)  # no longer names the merged journal
    after = space.usage([st_.dir])
    assert after.freeable == 0
    assert len(list((st_.dir / "log").glob("*.log"))) == 1
    # what usage called freeable is what delivering gave back (the floor stays, give or take the
    # pages the cursors and tombstones wrote into files that were already allocated)
    assert full.floor - 4 * space.PAGE <= after.allocated <= full.floor + 4 * space.PAGE
    st_.close()


def test_usage_of_missing_or_vanishing_files(tmp_path: Path) -> None:
    assert space.usage([tmp_path / "gone"]) == space.Usage()
    (tmp_path / "p-0" / "log").mkdir(parents=True)
    for n in (0, 1, 2):
        with open(tmp_path / "p-0" / "log" / f"{n * 4096:020d}.log", "wb") as f:
            f.write(b"x" * 4096)
    u = space.usage([tmp_path / "p-0"])
    assert u.allocated == 3 * 4096 and u.freeable == 2 * 4096, "all but the newest of a series is freeable"


def test_predicted_file_sizes_are_the_real_ones(tmp_path: Path) -> None:
    s = Settings(scheduler="wheel", segment_bytes=64 * 1024, wheel_window_ms=60_000, wheel_precision_ms=10,
                 bucket_width_ms=30_000)
    st_ = open_store(tmp_path / "w", s)
    send(st_, 0, 1000, 10)
    w = st_.dir / "wheel"
    assert (w / "slots.whl").stat().st_size == space.slot_file_bytes(60_000, 10)
    assert next((w / "tl").glob("*.tl")).stat().st_size == space.tl_file_bytes()
    assert (st_.dir / "ids.idx").stat().st_size == space.ids_file_bytes()
    st_.close()
    s = Settings(scheduler="levels", segment_bytes=64 * 1024)
    st_ = open_store(tmp_path / "l", s)
    send(st_, 0, 1000, 10)
    assert next((st_.dir / "levels").rglob("*.q")).stat().st_size == space.level_file_bytes()
    st_.close()


def test_a_journal_generation_fits_its_share_of_the_minimum(tmp_path: Path) -> None:
    """The minimum counts two journal generations at the initial size: the costliest operations
    (removes: a marker and the pair), flushed as a checkpoint would, up to the step that cuts the
    generation, stay within ``ids_journal_bytes``; and the constants are the index's."""
    assert space.IDS_CUT_MIN == idslot.CUT_MIN and space.IDS_OP_JOURNAL == 2 * idslot.SLOT_SIZE
    assert IdIndex.__init__.__defaults__[0] == space.IDS_INITIAL_SLOTS  # type: ignore[index]
    ix = IdIndex(tmp_path, native=False)
    ix.restore(None)
    biggest, now, g0 = 0, 1, ix.state()["gen"]
    for batch in range(40):
        for i in range(500):
            ix.remove(id_hash(b"%d" % (batch * 500 + i)), 7)
        ix.flush()
        sizes = [space.allocated(idjournal.path_of(tmp_path, g)) for g in idjournal.generations(tmp_path)]
        biggest = max(biggest, *sizes)
        now += 50
        ix.step(now, 1 << 40)
    assert ix.state()["gen"] > g0, "a generation was cut"
    assert 0 < biggest <= space.ids_journal_bytes()
    ix.close()


def test_the_minimum_holds_a_full_segment_and_a_largest_record(tmp_path: Path) -> None:
    """A store that fills one segment and rolls into the next with a record of max-record-bytes
    holds no more than the minimum (the log part) plus its files' first pages."""
    s = Settings(scheduler="levels", segment_bytes=64 * 1024, max_record_bytes=16 * 1024)
    st_ = open_store(tmp_path, s)
    i = 0
    while len(list((st_.dir / "log").glob("*.log"))) < 2:
        send(st_, i, 1000, 1000)
        i += 1
    send(st_, i, 1000, 16 * 1024 - 100)  # the largest record there is, in the new segment
    st_.checkpoint(fsync=False)
    log_bytes = sum(p.stat().st_blocks * 512 for p in (st_.dir / "log").glob("*.log"))
    need = space.partition_needs(s)
    assert log_bytes <= need.log
    assert space.usage([st_.dir]).allocated <= need.total + 2 * space.PAGE  # + the queue file's pages
    st_.close()


def test_check_budget_refuses_a_budget_no_partition_fits_in() -> None:
    s = Settings(scheduler="wheel", segment_bytes=64 * 1024 * 1024)
    per = space.partition_needs(s).total
    space.check_budget(Settings(scheduler="wheel", segment_bytes=64 * 1024 * 1024, disk_max_bytes=per))
    space.check_budget(Settings(scheduler="wheel", segment_bytes=64 * 1024 * 1024, disk_max_bytes=0))
    with pytest.raises(ConfigError, match=rf"--disk-max-bytes {per - 1} is below the {per} bytes .* 1 partition"):
        space.check_budget(Settings(scheduler="wheel", segment_bytes=64 * 1024 * 1024, disk_max_bytes=per - 1))
    with pytest.raises(ConfigError, match=rf"below the {6 * per} bytes .* 6 partition"):
        space.check_budget(Settings(scheduler="wheel", segment_bytes=64 * 1024 * 1024, disk_max_bytes=per * 5), 6)


def test_the_finding_geometry() -> None:
    """160 MB on 6 partitions of 16 MB segments (wheel): the files' sizes were 176 MB at open, so
    counting sizes paused ingress for good. The minimum is below the budget (accepted), the
    ceiling above it (a warning names it)."""
    s = Settings(scheduler="wheel", segment_bytes=16_000_000, disk_max_bytes=160_000_000)
    assert 6 * space.partition_needs(s).total < 160_000_000
    note = space.budget_note(s, 6)
    assert note is not None and note["minimum"] == 6 * space.partition_needs(s).total
    assert note["ceiling"] == 6 * space.partition_ceiling(s).total > 160_000_000
    assert space.budget_note(Settings(scheduler="wheel", segment_bytes=16_000_000, disk_max_bytes=0), 6) is None
    big = Settings(scheduler="wheel", segment_bytes=16_000_000, disk_max_bytes=note["ceiling"])
    assert space.budget_note(big, 6) is None


# -- the policy against a plain model --------------------------------------------------------------
def model(used: int, free: int, budget: int, min_free: int, freeable: int, minimum: int) -> tuple[bool, bool]:
    """(paused, stalled), spelled out: a limit holds now; one still holds after delivering every
    pending record (the store smaller by what that frees, the volume freer by it)."""
    freeable = max(0, min(freeable, used))

    def limited(u: int, f: int) -> bool:
        return (budget > 0 and (budget < minimum or u >= budget)) or f < min_free

    paused = limited(used, free)
    return paused, paused and limited(used - freeable, free + freeable)


sizes_ = st.integers(min_value=0, max_value=10**12)


@given(used=sizes_, free=sizes_, budget=st.one_of(st.just(0), sizes_), min_free=sizes_, freeable=sizes_,
       minimum=st.integers(min_value=0, max_value=10**9))
def test_decide_agrees_with_the_model(used: int, free: int, budget: int, min_free: int, freeable: int,
                                      minimum: int) -> None:
    d = space.decide(used, free, budget, min_free, freeable, minimum)
    assert (d.paused, d.stalled) == model(used, free, budget, min_free, freeable, minimum)
    assert bool(d.reason) == bool(d.code) == d.paused
    assert bool(d.fix) == d.stalled, "a stall always says what to do, a pause deliveries lift needs nothing"
    if d.stalled:
        assert d.code.endswith("-stalled") or d.code == space.BELOW_MINIMUM
        if d.code == space.BUDGET + "-stalled":
            # following the fix lifts the pause once everything is delivered
            target = int(d.fix.split("at least ")[1].split()[0])
            assert not model(used - min(freeable, used), 10**13, target, 0, 0, minimum)[0]


@given(used=sizes_, free=sizes_, budget=sizes_, min_free=sizes_, freeable=sizes_, more=sizes_)
def test_more_use_or_less_free_space_never_lifts_a_pause(used: int, free: int, budget: int, min_free: int,
                                                         freeable: int, more: int) -> None:
    if space.decide(used, free, budget, min_free, freeable).paused:
        assert space.decide(used + more, free, budget, min_free, freeable).paused
        assert space.decide(used, max(0, free - more), budget, min_free, freeable).paused


def test_decide_examples() -> None:
    assert space.decide(100, 10**9, 0, 10, 0) == space.Decision(False)
    d = space.decide(200, 10**9, 150, 10, freeable=120)
    assert d.paused and not d.stalled and d.code == "disk-max-bytes" and "limit 150" in d.reason
    d = space.decide(200, 10**9, 150, 10, freeable=20, minimum=30)
    assert d.stalled and d.code == "disk-max-bytes-stalled" and "180 of them stay allocated" in d.reason
    assert d.fix == "raise disk-max-bytes to at least 210 and restart"
    d = space.decide(0, 10**9, 150, 10, 0, minimum=151)
    assert d.stalled and d.code == "disk-max-bytes-below-minimum" and "at least 151" in d.fix
    d = space.decide(100, 5, 0, 10, freeable=4)
    assert d.stalled and d.code == "disk-min-free-bytes-stalled" and d.fix.startswith("free 1 bytes")
    d = space.decide(100, 5, 0, 10, freeable=50)
    assert d.paused and not d.stalled and "below 10" in d.reason


@contextmanager
def listings() -> Iterator[list[str]]:
    """The directories ``space`` lists (``os.scandir``) while the block runs."""
    listed: list[str] = []
    real = os.scandir

    def counting(path: str) -> object:
        listed.append(str(path))
        return real(path)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(space.os, "scandir", counting)
        yield listed


def test_usage_is_cheap_enough_for_the_loop(tmp_path: Path) -> None:
    """The loop measures every second, on its own thread: a few dozen stats per partition."""
    s = Settings(scheduler="levels", segment_bytes=64 * 1024)
    stores = [open_store(tmp_path, s, p) for p in range(6)]
    for st_ in stores:
        st_.checkpoint(fsync=False)
    with listings() as listed:
        space.usage(st_.dir for st_ in stores)
    assert len(listed) <= 6 * 25  # the partition, log/, levels/ and its 19 level directories
    for st_ in stores:
        st_.close()


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def _sealed(root: Path) -> int:
    """Rolling files that are not the newest of their directory's series."""
    n = 0
    for d in {p.parent for p in _files(root)}:
        rolling = [p for p in d.iterdir() if p.suffix in (".log", ".tl", ".q") and p.stem.isdigit()]
        n += max(len(rolling) - 1, 0)
    return n


@pytest.mark.parametrize("scheduler", ["wheel", "levels"])
def test_usage_with_sealed_sizes_kept_agrees_and_stats_only_what_can_change(tmp_path: Path, scheduler: str) -> None:
    s = Settings(scheduler=scheduler, segment_bytes=64 * 1024, max_record_bytes=8 * 1024)
    st_ = open_store(tmp_path, s)
    cache = space.SealedSizes()
    steps = [lambda i=i: send(st_, i, 1000 + (i % 3) * 1000, 900) for i in range(600)]
    for k in range(0, len(steps), 100):  # fill: segments roll, sealed ones are cached
        for step in steps[k : k + 100]:
            step()
        st_.checkpoint(fsync=False)
        assert space.usage([st_.dir], cache) == space.usage([st_.dir])
    assert _sealed(st_.dir) >= 8
    cache.stats = 0
    again = space.usage([st_.dir], cache)
    assert again == space.usage([st_.dir])
    dirs = 1 + sum(1 for p in st_.dir.rglob("*") if p.is_dir())
    assert cache.stats == dirs + len(_files(st_.dir)) - _sealed(st_.dir), "sealed files are not stat'ed again"
    assert deliver_due(st_, T0 + 10_000) == 600  # delivered: the sealed segments go at the checkpoints
    st_.ids.growth.cut(force=True)
    st_.ids.wait()
    st_.checkpoint(fsync=False)
    st_.dirty = True
    st_.checkpoint(fsync=False)
    assert space.usage([st_.dir], cache) == space.usage([st_.dir])
    assert space.usage([st_.dir], cache).freeable == 0
    st_.close()


def test_a_sealed_file_created_again_under_its_name_is_stat_ed_again(tmp_path: Path) -> None:
    log = tmp_path / "p-0" / "log"
    log.mkdir(parents=True)
    for n in (0, 1, 2):
        (log / f"{n * 4096:020d}.log").write_bytes(b"x" * 4096)
    cache = space.SealedSizes()
    assert space.usage([tmp_path / "p-0"], cache).allocated == 3 * 4096
    first = log / f"{0:020d}.log"
    old_ino = first.stat().st_ino
    first.unlink()
    (log / "keep").write_bytes(b"")  # takes the freed inode number, if the file system reuses it
    first.write_bytes(b"x" * 3 * 4096)
    if first.stat().st_ino == old_ino:
        pytest.skip("the file system gave the file its old inode number: (path, inode) cannot tell them apart")
    u = space.usage([tmp_path / "p-0"], cache)
    assert u == space.usage([tmp_path / "p-0"])
    assert u.allocated == 5 * 4096 and u.freeable == 4 * 4096


def test_a_directory_unchanged_since_long_before_its_listing_is_not_listed_again(tmp_path: Path) -> None:
    root = tmp_path / "p-0"
    q = root / "levels" / "18"
    q.mkdir(parents=True)
    for n in range(50):
        (q / f"{n:020d}.q").write_bytes(b"x" * 4096)
    (root / "checkpoint.json").write_bytes(b"{}")
    old = time.time() - 10
    for d in (root, root / "levels", q):
        os.utime(d, (old, old))
    cache = space.SealedSizes()
    first = space.usage([root], cache)
    with listings() as listed:
        cache.stats = 0
        assert space.usage([root], cache) == first
        assert listed == [] and cache.stats == 3 + 2  # the directories; the checkpoint and the newest queue file
        (q / f"{50:020d}.q").write_bytes(b"x" * 8192)  # the directory changes: listed again
        (q / f"{0:020d}.q").unlink()
        grown = space.usage([root], cache)
        assert listed == [str(q)]
    assert grown == space.usage([root])
    assert grown.allocated == first.allocated + 4096 and grown.freeable == first.freeable
