"""``delay-sidecar inspect DATA_DIR``: what a data directory holds, read from its checkpoints and
file listing only — safe to run beside a live sidecar (it opens nothing for writing).

Every partition directory is listed (``<topic>-<partition>`` holding store files), also one
without a checkpoint yet: a partition assigned to a sidecar that has stored nothing in it has its
files but writes its first checkpoint with its first record (``checkpointed: false``, nothing
pending).

Per partition: the checkpoint (ingress offset, scheduler, cursors), pending records per tier and
level, the next due times (levels: the head of each level queue), commit-log segments with their
live record counts (from the checkpoint), the records they hold and the live ratio (records
counted by hopping over the records' length fields, through a read-only mapping: no CRC, no
record bodies read), time buckets (wheel), and bytes on disk (allocated blocks: files are
preallocated sparse, so ``st_size`` says nothing about use; the sizes are ``preallocated_bytes``).

Per partition also the changelog position the checkpoint names (``engine/changelog.py``):
``changelog_offset``, the changelog offset the store covers (a restore on assignment reads the
changelog from there), and ``changelog_ingress``, the ingress offset the changelog holds every
record before. Each is None when the checkpoint names none: the store was written with the
changelog off, or checkpointed before its first restore finished (a restore then reads the
changelog from its beginning). For the whole directory: ``instance_id``, the group membership id
the sidecar made and kept in ``<data-dir>/instance-id`` (None when the file is absent: the sidecar
was given ``group-instance-id``, or has not started with this directory).

``inspect DATA_DIR --id ID`` (``find_id``) looks one ``delay.id`` up in every partition's store,
the way the sidecar does (docs/design.md 3.3), through read-only mappings and reads: the id
index's probe chain for the id's BLAKE2b-64 hash, each hit resolved through the scheduler's entry
(a level queue entry; a timer-log entry or a bucket entry) to the record in the commit log or a
bucket file, CRC-checked and verified against the id. Only a record whose entry is still pending
counts; a pre-cancel (a cancel that came before its message) is reported as such. Beside a live
sidecar it sees the files as they are at that moment (writes after the checkpoint included); what
became of ids no longer pending is kept in the sidecar's memory only (``status``).

The counts are the checkpoint's, and a live sidecar writes one every ``commit-interval`` when
anything changed, including its schedulers' cursors moving past cancelled records (the pending
counts then drop with no record stored or delivered): they equal the sidecar's
``delay_sidecar_pending_records`` as of its last checkpoint. As there, a cancelled record's entry
counts until its due time passes.
"""

from __future__ import annotations

import mmap
import re
import struct
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sidecar.engine.identity import ID_FILE
from sidecar.levels.queue import IDX_BITS, IDX_MASK
from sidecar.store import checkpoint, codec, idjournal, space
from sidecar.store.buckets import BUCKET_BIT, ENTRY_HEAD, ENTRY_HEAD_SIZE, ENTRY_MAGIC, split_ref
from sidecar.store.idindex import NEXT as IDX_NEXT
from sidecar.store.idindex import id_hash
from sidecar.store.idslot import EMPTY, PRECANCEL, SLOT, SLOT_SIZE, journal_ops
from sidecar.store.mapped import HEADER, HEADER_SIZE, StoreError
from sidecar.wheel.layout import ENTRY as TL_ENTRY

_ENTRY = struct.Struct("<QqB7x")
_REC_HEAD = 72  # codec.HEAD_SIZE
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")
_STORE_FILES = (checkpoint.NAME, "log", "ids.idx")  # what a partition directory has from its open on


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _instance_id(root: Path) -> str | None:
    try:
        return (root / ID_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def _level_head_due(qdir: Path, idx: int) -> int | None:
    for f in sorted(qdir.glob("*.q")):
        first = int(f.stem)
        with f.open("rb") as fh:
            head = fh.read(HEADER_SIZE)
            per_file = struct.unpack_from("<Q", head, 24)[0]
            if first <= idx < first + per_file:
                fh.seek(HEADER_SIZE + (idx - first) * _ENTRY.size)
                raw = fh.read(_ENTRY.size)
                if len(raw) == _ENTRY.size:
                    return int(_ENTRY.unpack(raw)[1])
    return None


def _count_records(path: Path, limit: int | None) -> tuple[int, int]:
    """(records, bytes used) of a segment, hopping over length fields up to ``limit`` (the log head
    inside this segment, if it is the active one)."""
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        if size <= HEADER_SIZE:
            return 0, 0
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            end = size if limit is None else min(size, limit)
            pos, n = HEADER_SIZE, 0
            while pos + _REC_HEAD <= end:
                (length,) = struct.unpack_from("<I", mm, pos)
                if length == 0 or length % 8 or length < _REC_HEAD or pos + length > end:
                    break
                n += 1
                pos += length
            return n, pos - HEADER_SIZE
        finally:
            mm.close()


def inspect_partition(d: Path) -> dict[str, Any]:
    found = checkpoint.read(d)
    ck = found or {}
    out: dict[str, Any] = {"directory": str(d), "checkpointed": found is not None, "checkpoint": ck,
                           "changelog_offset": _opt_int(ck.get("changelog")),
                           "changelog_ingress": _opt_int(ck.get("changelog_ingress"))}
    live = {int(k): int(v) for k, v in (ck.get("log") or {}).get("live", {}).items()}
    head = (ck.get("log") or {}).get("head")
    segs = []
    for f in sorted((d / "log").glob("*.log")):
        base = int(f.stem)
        st = f.stat()
        size = st.st_size
        index = base // size if size else 0
        limit = head - base if isinstance(head, int) and base <= head < base + size else None
        records, used = _count_records(f, limit)
        n_live = live.get(index)
        segs.append({
            "file": f.name, "base": base, "bytes": size, "disk_bytes": st.st_blocks * 512,
            "records": records, "used_bytes": used, "live_records": n_live,
            "live_ratio": round(n_live / records, 4) if n_live is not None and records else None,
            "active": limit is not None,
        })
    out["segments"] = segs
    pending: dict[str, int] = {}
    next_due: dict[str, Any] = {}
    sched = ck.get("sched") or {}
    if ck.get("scheduler") == "levels":
        for n, (done, write) in enumerate(sched.get("levels", [])):
            if write > done:
                pending[f"level-{n}"] = write - done
                due = _level_head_due(d / "levels" / f"{n:02d}", done)
                next_due[f"level-{n}"] = {"due_ms": due, "due": _iso(due)}
    else:
        counts = sched.get("n")  # the wheel checkpoints [timer-log entries, bucket records]
        if isinstance(counts, list) and len(counts) == 2:
            for tier, n in zip(("wheel", "bucket"), counts, strict=True):
                if int(n) > 0:
                    pending[tier] = int(n)
        starts = []
        for b in (d / "buckets").glob("*.bkt") if (d / "buckets").is_dir() else []:
            head, _, _width = b.stem.partition("-")
            if head.isdigit():
                starts.append(int(head))
        if starts and pending.get("bucket"):  # a bucket's records fall due from its start on
            next_due["bucket"] = {"due_ms": min(starts), "due": _iso(min(starts)), "bound": "bucket start"}
    out["pending"] = pending
    out["pending_total"] = sum(pending.values())
    out["next_due"] = next_due
    buckets = []
    for f in sorted((d / "buckets").glob("*")) if (d / "buckets").is_dir() else []:
        buckets.append({"file": f.name, "bytes": f.stat().st_size})
    out["buckets"] = buckets
    use = space.usage([d])
    out["disk_bytes"] = use.allocated
    out["preallocated_bytes"] = use.apparent
    return out


def _partition_dirs(root: Path) -> list[Path]:
    """The partition directories under ``root``, by topic and partition number."""
    found: list[tuple[str, int, Path]] = []
    for d in root.iterdir():
        m = _PARTITION_DIR.match(d.name)
        if m and d.is_dir() and any((d / name).exists() for name in _STORE_FILES):
            found.append((m.group(1), int(m.group(2)), d))
    return [d for _t, _p, d in sorted(found)]


def inspect_data_dir(root: Path) -> dict[str, Any]:
    parts = [inspect_partition(d) for d in _partition_dirs(root)]
    return {"data_dir": str(root), "instance_id": _instance_id(root), "partitions": parts,
            "pending_total": sum(p["pending_total"] for p in parts)}


# -- one id (--id) ---------------------------------------------------------------------------------
def _read_only(path: Path) -> mmap.mmap | None:
    try:
        with path.open("rb") as fh:
            if fh.seek(0, 2) <= HEADER_SIZE:
                return None
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        return None


def _index_refs(d: Path, h: int) -> list[int]:
    """The refs under hash ``h`` in the id index (store/idindex.py), read-only: the table
    ``<d>/ids.idx`` (and a grown one not yet named, ``ids.idx.next.<n>``), then the journals'
    operations on ``h`` in order (``ids.jnl.<g>``: what the stages hold, not yet merged; a journal
    already merged only repeats what the table has). A ref no longer pending only adds a ref the
    caller verifies against the record."""
    out: dict[int, None] = {}
    for f in [d / "ids.idx", *sorted(d.glob(f"{IDX_NEXT}*"))]:
        out.update(dict.fromkeys(_table_refs(f, h)))
    for g in idjournal.generations(d):
        try:
            records, _n = idjournal.scan(d, g)
        except StoreError:
            continue
        try:
            for rh, ref, gone in journal_ops(records):
                if rh != h:
                    continue
                if gone:
                    out.pop(ref, None)
                else:
                    out[ref] = None
        except ValueError:
            continue
    return list(out)


def _table_refs(path: Path, h: int) -> list[int]:
    mm = _read_only(path)
    if mm is None:
        return []
    try:
        cap = (len(mm) - HEADER_SIZE) // SLOT_SIZE
        if cap <= 0 or cap & (cap - 1):
            return []
        i, out = h & (cap - 1), []
        for _ in range(cap):
            sh, ref = SLOT.unpack_from(mm, HEADER_SIZE + i * SLOT_SIZE)
            if sh == EMPTY:
                break
            if sh == h:
                out.append(int(ref))
            i = (i + 1) & (cap - 1)
        return out
    finally:
        mm.close()


def _numbered_files(directory: Path, suffix: str) -> list[tuple[int, Path]]:
    out = []
    for f in directory.glob(f"*{suffix}") if directory.is_dir() else []:
        if f.stem.isdigit():
            out.append((int(f.stem), f))
    return sorted(out)


def _log_record(d: Path, pos: int) -> codec.Record | None:
    for base, f in reversed(_numbered_files(d / "log", ".log")):
        if base <= pos:
            mm = _read_only(f)
            if mm is None or pos - base >= len(mm):
                return None
            try:
                return _decode_copy(mm, pos - base)
            finally:
                mm.close()
    return None


def _decode_copy(mm: mmap.mmap, off: int) -> codec.Record | None:
    """The record at ``off``, decoded from a copy (the mapping is closed after), CRC-checked."""
    if off + _REC_HEAD > len(mm):
        return None
    (length,) = struct.unpack_from("<I", mm, off)
    if length < _REC_HEAD or off + length > len(mm):
        return None
    try:
        return codec.decode(memoryview(bytes(mm[off : off + length])), 0, verify=True)
    except codec.CorruptRecord:
        return None


def _bucket_entry(d: Path, ref: int) -> tuple[int, int, codec.Record | None] | None:
    """(state, timer-log index, record) of the bucket entry ``ref`` names."""
    seq, off = split_ref(ref)
    for f in (d / "buckets").glob("*.bkt") if (d / "buckets").is_dir() else []:
        mm = _read_only(f)
        if mm is None:
            continue
        try:
            if HEADER.unpack_from(mm, 0)[4] != seq or off + ENTRY_HEAD_SIZE > len(mm):
                continue
            state, magic, _r, check, tl_idx = ENTRY_HEAD.unpack_from(mm, off)
            if magic != ENTRY_MAGIC or check != (off >> 3) & 0xFFFFFFFF:
                return None
            return state, tl_idx, _decode_copy(mm, off + ENTRY_HEAD_SIZE)
        finally:
            mm.close()
    return None


def _wheel_entry(d: Path, idx: int) -> tuple[int, int, int] | None:
    """(state, due, loc) of timer-log entry ``idx``."""
    for first, f in reversed(_numbered_files(d / "wheel" / "tl", ".tl")):
        if first <= idx:
            mm = _read_only(f)
            if mm is None:
                return None
            try:
                per_file = HEADER.unpack_from(mm, 0)[4]
                if idx - first >= per_file:
                    return None
                due, loc = TL_ENTRY.unpack_from(mm, HEADER_SIZE + per_file + (idx - first) * TL_ENTRY.size)[:2]
                return mm[HEADER_SIZE + idx - first], due, loc
            finally:
                mm.close()
    return None


def _pending_record(d: Path, scheduler: str, ref: int) -> codec.Record | None:
    """The record behind scheduler ref ``ref`` if its entry is still pending (state 0)."""
    if scheduler == "levels":
        n, idx = ref >> IDX_BITS, ref & IDX_MASK
        for first, f in reversed(_numbered_files(d / "levels" / f"{n:02d}", ".q")):
            if first <= idx:
                with f.open("rb") as fh:
                    per_file = HEADER.unpack(fh.read(HEADER_SIZE))[4]
                    if idx - first >= per_file:
                        return None
                    fh.seek(HEADER_SIZE + (idx - first) * _ENTRY.size)
                    raw = fh.read(_ENTRY.size)
                if len(raw) < _ENTRY.size:
                    return None
                pos, _due, state = _ENTRY.unpack(raw)
                return _log_record(d, pos) if state == 0 else None
        return None
    if ref & BUCKET_BIT:
        got = _bucket_entry(d, ref)
        if got is None:
            return None
        state, tl_idx, rec = got
        if tl_idx < 0:  # still only in its bucket
            return rec if state == 0 else None
        ref = tl_idx
    ent = _wheel_entry(d, ref)
    if ent is None or ent[0] != 0:
        return None
    _state, _due, loc = ent
    if loc & BUCKET_BIT:
        got = _bucket_entry(d, loc)
        return None if got is None else got[2]
    return _log_record(d, loc)


def find_id(root: Path, rid: bytes) -> dict[str, Any]:
    """What the stores under ``root`` hold for ``rid`` (see the module docstring)."""
    h = id_hash(rid)
    found: list[dict[str, Any]] = []
    for d in _partition_dirs(root):
        scheduler = (checkpoint.read(d) or {}).get("scheduler") or ("levels" if (d / "levels").is_dir() else "wheel")
        for ref in _index_refs(d, h):
            where = {"directory": d.name, "partition": int(_PARTITION_DIR.match(d.name).group(2))}  # type: ignore[union-attr]
            if ref & PRECANCEL:
                at = ref & ~PRECANCEL
                found.append({**where, "state": "cancelled", "before_message": True, "at_ms": at, "at": _iso(at)})
                continue
            rec = _pending_record(d, scheduler, ref)
            if rec is None or bytes(rec.id) != rid:
                continue  # a stale entry, or another id under the same hash
            dead = rec.rtype == codec.DEAD
            out = {**where, "state": "dead-lettered" if dead else "pending", "due_ms": rec.due_ms,
                   "due": _iso(rec.due_ms), "enqueued_ms": rec.enqueue_ms, "ingress_offset": rec.src_offset,
                   "target_topic": bytes(rec.topic).decode("utf-8", "replace"),
                   "target_partition": None if rec.target_partition < 0 else rec.target_partition}
            if dead:
                for name, value in codec.decode_headers(rec.headers):
                    if name == "delay.dlq.reason" and value is not None:
                        out["reason"] = value.decode("utf-8", "replace")
            found.append(out)
    state = found[0]["state"] if found else "unknown"
    return {"data_dir": str(root), "id": rid.decode("utf-8", "backslashreplace"), "state": state, "found": found}


def render_id(report: dict[str, Any]) -> str:
    if not report["found"]:
        return (f"id {report['id']}: unknown in {report['data_dir']} (not pending; delivered, cancelled and "
                "dead-lettered ids are remembered by the running sidecar only: delay-sidecar status)")
    lines = []
    for f in report["found"]:
        if f.get("before_message"):
            lines.append(f"id {report['id']}: cancelled before its message arrived (at {f['at']}) in {f['directory']}")
            continue
        tp = "" if f["target_partition"] is None else f"[{f['target_partition']}]"
        reason = f" reason={f['reason']}" if f.get("reason") else ""
        lines.append(f"id {report['id']}: {f['state']} in {f['directory']} due={f['due']} "
                     f"target={f['target_topic']}{tp} ingress_offset={f['ingress_offset']}{reason}")
    return "\n".join(lines)


def _dash(v: int | None) -> str:
    return "-" if v is None else str(v)


def render_text(report: dict[str, Any]) -> str:
    lines = [f"data dir {report['data_dir']}: {report['pending_total']} pending"]
    if report.get("instance_id"):
        lines.append(f"instance id {report['instance_id']} (kept in {ID_FILE})")
    for p in report["partitions"]:
        ck = p["checkpoint"]
        if not p.get("checkpointed", True):
            lines.append(
                f"- {Path(p['directory']).name}: no checkpoint yet (nothing stored) pending=0 disk={p['disk_bytes']} B"
            )
            continue
        lines.append(
            f"- {Path(p['directory']).name}: scheduler={ck.get('scheduler')} "
            f"ingress_offset={ck.get('ingress_offset')} pending={p['pending_total']} disk={p['disk_bytes']} B "
            f"segments={len(p['segments'])} buckets={len(p['buckets'])}"
        )
        if p["changelog_offset"] is None and p["changelog_ingress"] is None:
            lines.append("    changelog  none named by the checkpoint")
        else:
            lines.append(f"    changelog  store covers offsets < {_dash(p['changelog_offset'])}, "
                         f"changelog holds ingress offsets < {_dash(p['changelog_ingress'])}")
        for tier, n in sorted(p["pending"].items()):
            nd = p["next_due"].get(tier, {})
            lines.append(f"    {tier:<10} {n:>10} pending   next due {nd.get('due') or '-'}")
        for s in p["segments"]:
            ratio = "-" if s["live_ratio"] is None else f"{s['live_ratio']:.0%}"
            lines.append(
                f"    segment {s['file']}{' (active)' if s['active'] else ''} records={s['records']} "
                f"live={s['live_records']} ({ratio}) used={s['used_bytes']} B on-disk={s['disk_bytes']} B"
            )
        for b in p["buckets"]:
            lines.append(f"    bucket {b['file']} {b['bytes']} B")
    return "\n".join(lines)
