"""``delay-sidecar inspect DATA_DIR``: what a data directory holds, read from its checkpoints and
file listing only — safe to run beside a live sidecar (it opens nothing for writing).

Per partition: the checkpoint (ingress offset, scheduler, cursors), pending records per tier and
level, the next due times (levels: the head of each level queue), commit-log segments with their
live record counts, time buckets (wheel), and bytes on disk.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sidecar.store import checkpoint
from sidecar.store.mapped import HEADER_SIZE

_ENTRY = struct.Struct("<QqB7x")


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


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


def inspect_partition(d: Path) -> dict[str, Any]:
    ck = checkpoint.read(d) or {}
    out: dict[str, Any] = {"directory": str(d), "checkpoint": ck}
    live = {int(k): int(v) for k, v in (ck.get("log") or {}).get("live", {}).items()}
    segs = []
    for f in sorted((d / "log").glob("*.log")):
        base = int(f.stem)
        size = f.stat().st_size
        index = base // size if size else 0
        segs.append({"file": f.name, "bytes": size, "disk_bytes": f.stat().st_blocks * 512,
                     "live_records": live.get(index)})
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
        for tier in ("wheel", "bucket"):
            if isinstance(sched.get(f"{tier}_pending"), int):
                pending[tier] = sched[f"{tier}_pending"]
    out["pending"] = pending
    out["pending_total"] = sum(pending.values())
    out["next_due"] = next_due
    buckets = []
    for f in sorted((d / "buckets").glob("*")) if (d / "buckets").is_dir() else []:
        buckets.append({"file": f.name, "bytes": f.stat().st_size})
    out["buckets"] = buckets
    out["disk_bytes"] = sum(p.stat().st_blocks * 512 for p in d.rglob("*") if p.is_file())
    return out


def inspect_data_dir(root: Path) -> dict[str, Any]:
    parts = [inspect_partition(d) for d in sorted(root.iterdir()) if (d / checkpoint.NAME).exists()]
    return {"data_dir": str(root), "partitions": parts,
            "pending_total": sum(p["pending_total"] for p in parts)}


def render_text(report: dict[str, Any]) -> str:
    lines = [f"data dir {report['data_dir']}: {report['pending_total']} pending"]
    for p in report["partitions"]:
        ck = p["checkpoint"]
        lines.append(
            f"- {Path(p['directory']).name}: scheduler={ck.get('scheduler')} "
            f"ingress_offset={ck.get('ingress_offset')} pending={p['pending_total']} disk={p['disk_bytes']} B "
            f"segments={len(p['segments'])} buckets={len(p['buckets'])}"
        )
        for tier, n in sorted(p["pending"].items()):
            nd = p["next_due"].get(tier, {})
            lines.append(f"    {tier:<10} {n:>10} pending   next due {nd.get('due') or '-'}")
        for s in p["segments"]:
            lines.append(f"    segment {s['file']} live={s['live_records']} on-disk={s['disk_bytes']} B")
        for b in p["buckets"]:
            lines.append(f"    bucket {b['file']} {b['bytes']} B")
    return "\n".join(lines)
