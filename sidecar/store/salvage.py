"""``delay-sidecar salvage DATA_DIR --out FILE``: copy every readable record out of a store.

For the operator whose sidecar refuses to start (``CorruptSegment``: a damaged record inside a
sealed segment) or whose recovery reported dropped entries, and who wants the records out before
repairing or wiping the data directory. Read-only: the store is opened with plain reads, never
mapped for writing, so it is safe on a live directory and on a copy.

For every partition directory (``<topic>-<partition>/``, or DATA_DIR itself if it is one) and
every commit-log segment in it, the scan decodes record after record, verifying each CRC. Where
a record does not verify, the bytes are damaged: the scan moves forward 8 bytes at a time (records
are 8-byte aligned) to the next position where a whole record verifies and carries on from
there, reporting the skipped byte range. A damaged file header does not stop it either: the
segment's size and base come from the file itself.

Output: one JSON object per record (JSON lines), in log order::

    {"partition": "orders.delay-3", "segment": "00000000000067108864.log", "position": 67109000,
     "type": "message" | "cancel" | "dead" | "recurring", "status": "pending" | "done" | "unknown",
     "id": "...", "id_b64": "...", "target_topic": "...", "target_partition": -1,
     "due_ms": ..., "enqueue_ms": ..., "src_partition": 3, "src_offset": 1234, "retry_count": 0,
     "level": 2, "key_b64": "..." | null, "value_b64": "..." | null,
     "headers": [["name", "base64" | null], ...]}

``status`` comes from the levels scheduler's queues and the checkpoint: ``pending`` if a queue
entry still waits for the record (or the record is after the checkpointed log head, so a restart
would replay it), ``done`` if it was delivered, cancelled or dead-lettered, ``unknown`` when the
queues or the checkpoint cannot tell (the wheel scheduler, a missing checkpoint). ``dead``
records are addressed to the DLQ topic and carry the ``delay.dlq.*`` headers. Re-sending the
``pending`` messages to the ingress topic with ``delay.deliver-at: due_ms``, ``delay.id`` and
``delay.target-topic`` restores them (docs/storage.md has the recipe).

Exit status: 0 if everything was readable, 1 if damaged bytes were skipped (the readable records
were still written), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import base64
import re
import struct
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from sidecar.store import checkpoint, codec
from sidecar.store.log import MAGIC as LOG_MAGIC
from sidecar.store.log import VERSION as LOG_VERSION
from sidecar.store.mapped import HEADER, HEADER_SIZE

_TYPES = {codec.MESSAGE: "message", codec.CANCEL: "cancel", codec.DEAD: "dead", codec.RECURRING: "recurring"}
# bytes 8 and 9 of a record: type (1-3) and version (1); a cheap filter before a full decode
_CANDIDATE = re.compile(rb"[\x01\x02\x03]\x01", re.DOTALL)
_NONZERO = re.compile(rb"[^\x00]")
_ENTRY = struct.Struct("<QqB7x")


@dataclass
class Damage:
    segment: str
    start: int  # offset in the file
    end: int
    reason: str


@dataclass
class Report:
    partitions: int = 0
    segments: int = 0
    records: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_TYPES.values(), 0))
    status: dict[str, int] = field(default_factory=lambda: {"pending": 0, "done": 0, "unknown": 0})
    damage: list[Damage] = field(default_factory=list)
    bad_headers: list[str] = field(default_factory=list)

    @property
    def damaged_bytes(self) -> int:
        return sum(d.end - d.start for d in self.damage)

    def as_dict(self) -> dict[str, Any]:
        return {
            "partitions": self.partitions, "segments": self.segments, "records": self.records,
            "status": self.status, "damaged_regions": len(self.damage), "damaged_bytes": self.damaged_bytes,
            "damage": [d.__dict__ for d in self.damage[:100]], "bad_file_headers": self.bad_headers,
        }


def scan_segment(buf: bytes, name: str, report: Report) -> Iterator[tuple[int, codec.Record]]:
    """Yield ``(offset, record)`` for every record that verifies, skipping damaged bytes."""
    mv = memoryview(buf)
    size = len(mv)
    pos = HEADER_SIZE
    try:
        while pos + codec.HEAD_SIZE <= size:
            try:
                rec = codec.decode(mv, pos)
            except codec.CorruptRecord as e:
                nonzero = _NONZERO.search(buf, pos)
                if nonzero is None:
                    return  # the unused, zero tail of the segment
                if codec.peek_length(mv, pos) == 0 and nonzero.start() - pos >= codec.HEAD_SIZE:
                    reason = "zero bytes where a record should start"
                else:
                    reason = str(e)
                # (in the newest segment, bytes after the last record are usually a torn write)
                nxt = _next_record(buf, mv, pos + codec.ALIGN)
                end = nxt if nxt is not None else _last_nonzero(buf, pos)
                report.damage.append(Damage(name, pos, end, reason))
                if nxt is None:
                    return
                pos = nxt
                continue
            yield pos, rec
            pos += rec.length
    finally:
        mv.release()


def _next_record(buf: bytes, mv: memoryview, start: int) -> int | None:
    for m in _CANDIDATE.finditer(buf, start + 8):
        cand = m.start() - 8
        if cand % codec.ALIGN or cand < start:
            continue
        try:
            codec.decode(mv, cand)
        except codec.CorruptRecord:
            continue
        return cand
    return None


def _last_nonzero(buf: bytes, start: int) -> int:
    return max(start, len(buf.rstrip(b"\x00")))


def _b64(b: memoryview | bytes | None) -> str | None:
    return None if b is None else base64.b64encode(bytes(b)).decode()


def _pending_positions(part: Path, ck: dict[str, Any] | None) -> set[int] | None:
    """Log positions the levels queues still wait for, or None when that cannot be told."""
    if not ck or ck.get("scheduler") != "levels":
        return None
    out: set[int] = set()
    for n, (done, write) in enumerate((ck.get("sched") or {}).get("levels", [])):
        qdir = part / "levels" / f"{n:02d}"
        for f in sorted(qdir.glob("*.q")) if qdir.is_dir() else []:
            try:
                first = int(f.stem)
                data = f.read_bytes()
                per_file = struct.unpack_from("<Q", data, 24)[0] if len(data) >= HEADER_SIZE else 0
            except (ValueError, OSError, struct.error):
                return None
            for idx in range(max(done, first), min(write, first + per_file)):
                off = HEADER_SIZE + (idx - first) * _ENTRY.size
                if off + _ENTRY.size > len(data):
                    break
                pos, _due, state = _ENTRY.unpack_from(data, off)
                if state == 0:
                    out.add(int(pos))
    return out


def partition_dirs(root: Path) -> list[Path]:
    if (root / "log").is_dir():
        return [root]
    return sorted(d for d in root.iterdir() if (d / "log").is_dir())


def salvage(root: Path, out: IO[bytes], *, pending_only: bool = False) -> Report:
    report = Report()
    for part in partition_dirs(root):
        report.partitions += 1
        try:
            ck = checkpoint.read(part)
        except Exception:
            ck = None
        head = int(ck["log"]["head"]) if ck and ck.get("log") else None
        pending = _pending_positions(part, ck)
        for seg in sorted((part / "log").glob("*.log")):
            report.segments += 1
            try:
                base = int(seg.stem)
            except ValueError:
                report.bad_headers.append(f"{seg}: file name is not a segment base")
                continue
            data = seg.read_bytes()  # one segment at a time; plain reads, nothing mapped for writing
            if len(data) < HEADER_SIZE + codec.HEAD_SIZE:
                report.bad_headers.append(f"{seg}: {len(data)} bytes, too short for a segment")
                continue
            _check_header(data, seg, base, report)
            for off, rec in scan_segment(data, seg.name, report):
                pos = base + off
                kind = _TYPES[rec.rtype]
                if pending is None or head is None:
                    status = "unknown"
                elif rec.rtype != codec.CANCEL and (pos in pending or pos >= head):
                    status = "pending"
                else:
                    status = "done"
                report.records[kind] += 1
                report.status[status] += 1
                if pending_only and status == "done":
                    continue
                out.write(orjson.dumps(_doc(part.name, seg.name, pos, kind, status, rec)) + b"\n")
    return report


def _check_header(data: bytes, seg: Path, base: int, report: Report) -> None:
    magic, version, hsize, geom_a, _gb, hbase, _r, crc = HEADER.unpack_from(data, 0)
    if (
        codec.crc32c(data[:60]) != crc or magic != LOG_MAGIC or version != LOG_VERSION or hsize != HEADER_SIZE
        or hbase != base or geom_a != len(data)
    ):
        report.bad_headers.append(f"{seg}: damaged file header (read anyway, geometry taken from the file)")


def _doc(part: str, seg: str, pos: int, kind: str, status: str, rec: codec.Record) -> dict[str, Any]:
    return {
        "partition": part, "segment": seg, "position": pos, "type": kind, "status": status,
        "id": bytes(rec.id).decode("utf-8", "replace"), "id_b64": _b64(rec.id),
        "target_topic": bytes(rec.topic).decode("utf-8", "replace"), "target_partition": rec.target_partition,
        "due_ms": rec.due_ms, "enqueue_ms": rec.enqueue_ms, "src_partition": rec.src_partition,
        "src_offset": rec.src_offset, "retry_count": rec.retry_count, "level": rec.level,
        "key_b64": _b64(rec.key), "value_b64": _b64(rec.value),
        "headers": [[name, _b64(v)] for name, v in codec.decode_headers(rec.headers)],
    }


def salvage_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="delay-sidecar salvage",
        description="Copy every readable record out of a data directory (read-only) as JSON lines, "
        "skipping damaged bytes. Exit 0: all readable; 1: damage skipped; 2: usage error.",
    )
    p.add_argument("data_dir", metavar="DATA_DIR", help="the sidecar's data directory, or one partition directory")
    p.add_argument("--out", required=True, metavar="FILE", help="JSON-lines output file ('-': stdout)")
    p.add_argument("--pending-only", action="store_true", help="leave out records known to be done")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    ns = p.parse_args(argv)
    root = Path(ns.data_dir)
    if not root.is_dir() or not partition_dirs(root):
        print(f"delay-sidecar salvage: error: {root} holds no store (no */log/ directory)", file=sys.stderr)
        return 2
    to_stdout = ns.out == "-"
    try:
        out: IO[bytes] = sys.stdout.buffer if to_stdout else open(ns.out, "wb")  # noqa: SIM115
    except OSError as e:
        print(f"delay-sidecar salvage: error: --out {ns.out}: {e}", file=sys.stderr)
        return 2
    try:
        report = salvage(root, out, pending_only=ns.pending_only)
    finally:
        if not to_stdout:
            out.close()
    summary = sys.stderr if to_stdout else sys.stdout
    if ns.json:
        summary.write(orjson.dumps(report.as_dict()).decode() + "\n")
    else:
        r = report
        summary.write(
            f"salvaged {sum(r.records.values())} records ({', '.join(f'{k} {v}' for k, v in r.records.items())}; "
            f"pending {r.status['pending']}, done {r.status['done']}, unknown {r.status['unknown']}) "
            f"from {r.segments} segments in {r.partitions} partitions"
            + ("" if to_stdout else f" into {ns.out}") + "\n"
        )
        for d in r.damage[:20]:
            summary.write(f"  damaged: {d.segment} bytes {d.start}..{d.end} ({d.reason})\n")
        if len(r.damage) > 20:
            summary.write(f"  ... {len(r.damage) - 20} more damaged regions\n")
        for h in r.bad_headers:
            summary.write(f"  {h}\n")
        if r.damage:
            summary.write(f"{len(r.damage)} damaged regions, {r.damaged_bytes} bytes skipped\n")
    return 1 if report.damage or report.bad_headers else 0


if __name__ == "__main__":
    sys.exit(salvage_main())
