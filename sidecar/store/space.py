"""Disk space of the store: what it holds, the least a budget must give it, and the pause policy.

**Allocated, not apparent.** Every store file is created at full size with ``ftruncate`` and
filled through a mapping (``mapped.py``): a fresh 16 MB commit-log segment has ``st_size``
16,000,000 and one allocated page. Sizes say what the store *could* hold; ``st_blocks * 512``
says what it holds. ``disk-max-bytes`` is compared with the allocated bytes (:func:`usage`); the
sizes are reported beside them (``delay_sidecar_store_preallocated_bytes``). Counting sizes made a
budget of 160 MB on 6 partitions of 16 MB segments pause ingress at once, for good: the wheel's
empty files alone were 176 MB "big".

**Freeable.** Three kinds of files roll: commit-log segments (``log/*.log``), timer-log files
(``wheel/tl/*.tl``) and level queue files (``levels/NN/*.q``). In each directory the newest file
is the one being written; every older one is deleted once the records it holds are delivered
(or cancelled, dead-lettered, moved to a bucket) and a checkpoint covers that. Time-bucket files
(``buckets/*.bkt``) go once their records are delivered. So the *freeable* bytes — what
delivering every pending record gives back — are the allocated bytes of all those files but the
newest of each series. The rest (the newest of each series, the id index, the wheel's slot file,
the checkpoint) stays allocated when nothing is pending: the store's floor.

**The minimum budget** (:func:`needs`) is what a partition cannot make progress without: one full
commit-log segment plus the first record of the next (a segment is only deleted once sealed, and
the first append past it seals it), the id index at its initial size (ids hash to random slots,
so a few thousand touch every page) and two generations of its journal (the one written and the
sealed one its merge pass reads: each is deleted only after its pass and a checkpoint, so both
can be on disk at once), the scheduler's first pages and the checkpoint (and its temporary
copy). A budget below ``partitions x minimum`` deadlocks as soon as every partition has
filled its segment; it is refused at start (one partition) and at each assignment.

**The ceiling** of the files delivering cannot free is higher: the wheel's slot file
(``window / precision x 32 B``) fills as due times spread over the window, a timer-log file holds
2^20 entries (33 MiB) before it rolls, a level's queue file 2^16 entries (1.5 MiB). A budget
between the minimum and the ceiling works until those files reach it; then ingress is paused and
delivering cannot lift the pause: *stalled*. :func:`decide` says so, with the fix, instead of
waiting forever; the loop reports it in ``/readyz`` and in an ``ingress.stalled`` event.

**The policy** (:func:`decide`) is pure: paused when the budget is below the minimum, or the store
holds at least the budget, or free space is below ``disk-min-free-bytes``; stalled when it would
still be paused after every freeable byte was given back (``used - freeable``, ``free +
freeable``). ``tests/unit/test_store_space.py`` checks it against a plain model with hypothesis.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.config import ConfigError, Settings
from sidecar.store import idslot

PAGE = mmap.PAGESIZE
HEADER = 64  # mapped.HEADER_SIZE: every store file starts with it
RECORD_FRAMING = 4096  # what a record adds to its key, value and headers, at most (config: segment-bytes check)
IDS_INITIAL_SLOTS = idslot.INITIAL_SLOTS  # IdIndex's initial capacity
IDS_SLOT = idslot.SLOT_SIZE
IDS_CUT_MIN = idslot.CUT_MIN  # operations after which a journal generation is cut, at least
IDS_OP_JOURNAL = idslot.OP_JOURNAL_BYTES  # journal bytes per operation at most
TL_ENTRIES = 1 << 20  # WheelScheduler's timer-log entries per file
TL_ENTRY = 32  # plus one state byte per entry
WHEEL_SLOT = 32
LEVEL_ENTRIES = 1 << 16  # LevelsScheduler's queue entries per file
LEVEL_ENTRY = 24

_ROLLING = (".log", ".tl", ".q")  # one series per directory: the newest file is the one written
_BUCKET = ".bkt"


def pages(n: int) -> int:
    """``n`` bytes rounded up to whole pages: what a file of that size holds once written."""
    return -(-n // PAGE) * PAGE


def allocated(path: Path | str) -> int:
    """Bytes ``path`` holds on disk (``st_blocks * 512``); 0 if it is gone."""
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


@dataclass(frozen=True, slots=True)
class Usage:
    """Bytes of a set of store files: ``allocated`` on disk, ``apparent`` (their sizes, mostly
    preallocated), and ``freeable``: the allocated bytes delivering every pending record gives
    back (see the module docstring)."""

    allocated: int = 0
    apparent: int = 0
    freeable: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.allocated + other.allocated, self.apparent + other.apparent, self.freeable + other.freeable)

    @property
    def floor(self) -> int:
        """What stays allocated after every pending record is delivered."""
        return self.allocated - self.freeable


TRUST_NS = 1_000_000_000  # a directory unchanged this long before it was listed: its listing is kept


@dataclass(slots=True)
class _Listing:
    """What :func:`usage` keeps of one directory between calls (see :class:`SealedSizes`)."""

    mtime_ns: int  # the directory's mtime when it was listed
    trusted: bool  # listed at least TRUST_NS after that mtime: an unchanged mtime means unchanged entries
    subdirs: list[str]
    plain: list[tuple[str, bool]]  # files that do not roll (path, is a time bucket): stat'ed every call
    newest: str | None  # the newest file of the directory's rolling series: stat'ed every call
    sealed: dict[tuple[str, int], tuple[int, int]]  # (name, inode) -> (size, allocated) of the others
    sealed_alloc: int
    sealed_apparent: int


class SealedSizes:
    """What :func:`usage` keeps between calls so that each call stats only what can change.

    A sealed rolling file — every one but the newest of its series — is never written again,
    only deleted: its size is kept, keyed by name and inode (a file deleted and created again
    under its name is stat'ed again, unless the file system gave it the same inode number and it
    is sealed at once: then its old size is reported until it is deleted — a figure wrong, never
    a record). A directory whose mtime has not changed since it was listed holds the same entries
    and is not listed again; its mtime is trusted only if it was at least ``TRUST_NS`` older than
    the listing, since a change within the file system's timestamp granularity could leave it
    as it was. So a call stats each directory, the newest file of each series and the files that
    do not roll: ~60 calls per partition, whatever the pending set. Before, the loop stat'ed
    every file of every store once a second: at 100M pending on six partitions (~2,000 files,
    most of them sealed queue files and segments) 40-120 ms of a turn's wall time (the ``scale``
    bench scenario)."""

    __slots__ = ("dirs", "stats")

    def __init__(self) -> None:
        self.dirs: dict[str, _Listing] = {}
        self.stats = 0  # stat calls made (for the tests)


def _stat(path: str, cache: SealedSizes | None) -> tuple[int, int] | None:
    """(size, allocated) of ``path``; None if it is gone."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:  # deleted meanwhile (a reclaimed segment)
        return None
    if cache is not None:
        cache.stats += 1
    return st.st_size, st.st_blocks * 512


def _list(directory: str, mtime_ns: int, cache: SealedSizes | None, old: _Listing | None) -> _Listing | None:
    """List ``directory`` (None if it is gone), stat'ing its sealed rolling files unless ``old``
    knows them."""
    listed_ns = time.time_ns()
    subdirs: list[str] = []
    plain: list[tuple[str, bool]] = []
    series: list[tuple[int, str, int]] = []  # (numeric stem, name, inode) of the rolling files
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:  # a directory deleted meanwhile (a revoked partition)
        return None
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                subdirs.append(e.path)
                continue
        except FileNotFoundError:
            continue
        stem, dot, ext = e.name.rpartition(".")
        if dot and "." + ext in _ROLLING and stem.isdigit():
            series.append((int(stem), e.name, e.inode()))
        else:
            plain.append((e.path, dot != "" and "." + ext == _BUCKET))
    series.sort()
    sealed: dict[tuple[str, int], tuple[int, int]] = {}
    sealed_alloc = sealed_apparent = 0
    for _n, name, inode in series[:-1]:
        got = old.sealed.get((name, inode)) if old is not None else None
        if got is None:
            got = _stat(os.path.join(directory, name), cache)
            if got is None:
                continue
        sealed[(name, inode)] = got
        sealed_apparent += got[0]
        sealed_alloc += got[1]
    newest = os.path.join(directory, series[-1][1]) if series else None
    return _Listing(mtime_ns, mtime_ns <= listed_ns - TRUST_NS, subdirs, plain, newest, sealed, sealed_alloc,
                    sealed_apparent)


def _walk(directory: str, cache: SealedSizes | None, seen: dict[str, _Listing]) -> Usage:
    if cache is None:
        listing = _list(directory, 0, None, None)
    else:
        try:
            mtime_ns = os.stat(directory).st_mtime_ns
        except FileNotFoundError:
            return Usage()
        cache.stats += 1
        old = cache.dirs.get(directory)
        listing = old if old is not None and old.trusted and old.mtime_ns == mtime_ns else _list(
            directory, mtime_ns, cache, old)
    if listing is None:
        return Usage()
    seen[directory] = listing
    alloc, apparent, freeable = listing.sealed_alloc, listing.sealed_apparent, listing.sealed_alloc
    for sub in listing.subdirs:
        u = _walk(sub, cache, seen)
        alloc, apparent, freeable = alloc + u.allocated, apparent + u.apparent, freeable + u.freeable
    for path, bucket in (*listing.plain, *(((listing.newest, False),) if listing.newest else ())):
        got = _stat(path, cache)
        if got is None:
            continue
        alloc, apparent = alloc + got[1], apparent + got[0]
        if bucket:
            freeable += got[1]
    return Usage(alloc, apparent, freeable)


def usage(partition_dirs: Iterable[Path], cache: SealedSizes | None = None) -> Usage:
    """The :class:`Usage` of the stores under ``partition_dirs`` (one directory per partition).
    One ``stat`` per file, or, given the ``cache`` of an earlier call, one per directory and per
    file that can still change (:class:`SealedSizes`)."""
    seen: dict[str, _Listing] = {}
    total = Usage()
    for d in partition_dirs:
        total = total + _walk(str(d), cache, seen)
    if cache is not None:
        cache.dirs = seen  # the directories seen now: deleted ones leave the cache
    return total


# -- what a partition needs ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Needs:
    """Bytes one partition needs, by file kind (see the module docstring)."""

    log: int
    ids: int
    scheduler: int
    checkpoint: int

    @property
    def total(self) -> int:
        return self.log + self.ids + self.scheduler + self.checkpoint

    def describe(self) -> str:
        return (f"commit log {self.log}, id index and journals {self.ids}, scheduler files {self.scheduler}, "
                f"checkpoint {self.checkpoint}")


def slot_file_bytes(window_ms: int, precision_ms: int) -> int:
    return HEADER + (window_ms // precision_ms) * WHEEL_SLOT


def tl_file_bytes() -> int:
    return HEADER + TL_ENTRIES + TL_ENTRIES * TL_ENTRY


def level_file_bytes() -> int:
    return HEADER + LEVEL_ENTRIES * LEVEL_ENTRY


def ids_file_bytes() -> int:
    return HEADER + IDS_INITIAL_SLOTS * IDS_SLOT


def ids_journal_bytes() -> int:
    """A journal generation of the index at its initial size: ``IDS_CUT_MIN`` operations of
    ``IDS_OP_JOURNAL`` bytes, and two pages for the operations made before the loop's next index
    step cuts it (up to 256 removes), the block headers (8 bytes per flush, one flush per
    checkpoint) and the file's."""
    return pages(HEADER + IDS_CUT_MIN * IDS_OP_JOURNAL) + 2 * PAGE


def needs(segment_bytes: int, max_record_bytes: int, scheduler: str) -> Needs:
    """The least one partition makes progress with: the minimum budget per partition."""
    sched = 4 * PAGE if scheduler == "wheel" else 2 * PAGE  # slot file + first timer-log pages; a queue file's
    return Needs(
        log=pages(segment_bytes) + pages(HEADER + max_record_bytes + RECORD_FRAMING),
        ids=pages(ids_file_bytes()) + 2 * ids_journal_bytes(),
        scheduler=sched,
        checkpoint=2 * PAGE,
    )


def ceiling(
    segment_bytes: int, max_record_bytes: int, scheduler: str, levels: int, window_ms: int, precision_ms: int,
) -> Needs:
    """What one partition's files that delivering cannot free can grow to (before the id index
    grows with pending records): a budget of ``partitions x ceiling`` never stalls."""
    base = needs(segment_bytes, max_record_bytes, scheduler)
    if scheduler == "wheel":
        sched = pages(slot_file_bytes(window_ms, precision_ms)) + pages(tl_file_bytes()) + 2 * PAGE
    else:
        sched = (levels + 1) * (pages(level_file_bytes()) + PAGE)
    return Needs(log=base.log, ids=base.ids, scheduler=sched, checkpoint=base.checkpoint)


def partition_needs(s: Settings) -> Needs:
    """:func:`needs` of the configured store."""
    return needs(s.segment_bytes, s.max_record_bytes, s.scheduler)


def partition_ceiling(s: Settings) -> Needs:
    """:func:`ceiling` of the configured store."""
    return ceiling(s.segment_bytes, s.max_record_bytes, s.scheduler, len(s.levels_ms), s.wheel_window_ms,
                   s.wheel_precision_ms)


def check_budget(s: Settings, partitions: int = 1) -> None:
    """Refuse a ``disk-max-bytes`` below what ``partitions`` partitions need (at start: one, the
    least an instance that gets any work needs), naming the minimum and what it is made of."""
    per = partition_needs(s)
    if s.disk_max_bytes and s.disk_max_bytes < partitions * per.total:
        raise ConfigError(
            f"--disk-max-bytes {s.disk_max_bytes} is below the {partitions * per.total} bytes the store needs for "
            f"{partitions} partition(s) with --segment-bytes {s.segment_bytes} and the {s.scheduler} scheduler "
            f"(per partition: {per.describe()}); set at least {partitions * per.total}, or 0 for no limit"
        )


def budget_note(s: Settings, partitions: int) -> dict[str, Any] | None:
    """When ``disk-max-bytes`` is at least what ``partitions`` partitions need but below what their
    files that delivering cannot free can grow to: the numbers for a warning (the store works
    until those files fill the budget, then ingress stalls). None otherwise."""
    if not s.disk_max_bytes or partitions <= 0:
        return None
    minimum, top = partitions * partition_needs(s).total, partitions * partition_ceiling(s).total
    if not minimum <= s.disk_max_bytes < top:
        return None
    return {
        "budget": s.disk_max_bytes, "partitions": partitions, "minimum": minimum, "ceiling": top,
        "per_partition": partition_ceiling(s).describe(),
        "fix": f"set disk-max-bytes to at least {top} to rule out a stall, or watch for ingress.stalled",
    }


# -- the policy --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Decision:
    """``paused``: ingress must not consume. ``stalled``: paused, and delivering every pending
    record would not lift it. ``code``: a stable label (metrics, ``/readyz``); ``reason``: what
    holds; ``fix``: what the operator must do (only when stalled)."""

    paused: bool
    stalled: bool = False
    code: str = ""
    reason: str = ""
    fix: str = ""


BELOW_MINIMUM = "disk-max-bytes-below-minimum"
BUDGET = "disk-max-bytes"
FREE = "disk-min-free-bytes"


def decide(used: int, free: int, budget: int, min_free: int, freeable: int, minimum: int = 0) -> Decision:
    """The pause decision (pure). ``used``: allocated bytes of the store; ``free``: free bytes on
    its volume; ``budget``: ``disk-max-bytes`` (0: none); ``min_free``: ``disk-min-free-bytes``;
    ``freeable``: what delivering every pending record gives back (``Usage.freeable``);
    ``minimum``: the least budget the assigned partitions need (:func:`needs`).

    Paused if any limit holds; stalled if one still holds once ``freeable`` is given back (the
    store smaller by it, the volume freer by it). The reason and the fix name the first cause
    that stays (below the minimum, then the budget, then free space), else the first that holds."""
    freeable = max(0, min(freeable, used))
    floor, free_after = used - freeable, free + freeable
    causes: list[tuple[bool, str, str, str]] = []  # the limits that hold: (stays, code, reason, fix)
    if budget and budget < minimum:
        causes.append((
            True, BELOW_MINIMUM,
            f"disk-max-bytes {budget} is below the {minimum} bytes the store needs for its partitions",
            f"set disk-max-bytes to at least {minimum}, or give this instance fewer partitions "
            "(more replicas) or a smaller segment-bytes",
        ))
    if budget and used >= budget:
        stays = floor >= budget
        reason = f"the store holds {used} bytes, limit {budget}"
        if stays:
            reason += (f", and {floor} of them stay allocated when nothing is pending (active commit-log segments, "
                       "id indexes, scheduler files): delivering cannot free enough")
        fix = f"raise disk-max-bytes to at least {floor + max(minimum, 1)} and restart"
        causes.append((stays, BUDGET, reason, fix))
    if free < min_free:
        stays = free_after < min_free
        reason = f"free disk {free} bytes is below {min_free}"
        if stays:
            reason += f", and delivering every pending record frees only {freeable}"
        causes.append((
            stays, FREE, reason,
            f"free {min_free - free_after} bytes on the data directory's volume (other files hold them), "
            "or lower disk-min-free-bytes",
        ))
    if not causes:
        return Decision(False)
    staying = [c for c in causes if c[0]]
    if staying:
        _stays, code, reason, fix = staying[0]
        return Decision(True, True, code if code == BELOW_MINIMUM else code + "-stalled", reason, fix)
    _stays, code, reason, _fix = causes[0]
    return Decision(True, False, code, reason)
