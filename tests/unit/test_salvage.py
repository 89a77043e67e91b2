"""``delay-sidecar salvage``: every readable record out of a (damaged) store, as JSON lines."""

from __future__ import annotations

import base64
import io
import json
import random
from pathlib import Path

import pytest

from sidecar import contract as c
from sidecar.levels.scheduler import LevelsScheduler
from sidecar.store import codec
from sidecar.store.idindex import id_hash
from sidecar.store.log import CorruptSegment
from sidecar.store.partition import Counters, IngressRecord, PartitionStore, compile_rules
from sidecar.store.salvage import salvage, salvage_main

LEVELS = (1000, 5000)
T0 = 1_700_000_000_000
SEG = 8192


def open_store(root: Path) -> PartitionStore:
    rules = compile_rules("in", "dlq", LEVELS, 10**9, (1000,), 3, 100_000, ())
    st = PartitionStore(
        root, "in", 0, rules=rules, scheduler_name="levels",
        make_scheduler=lambda d, lg: LevelsScheduler(d, lg, LEVELS, entries_per_file=64),
        segment_bytes=SEG, cancel_horizon_ms=60_000, counters=Counters(),
    )
    st.open()
    return st


def send(st: PartitionStore, off: int, rid: str, delay_ms: int, value: bytes) -> None:
    st.ingest(IngressRecord("in", 0, off, T0, b"key-%d" % off, value, [
        (c.TARGET_TOPIC, b"t"), (c.DELAY_MS, str(delay_ms).encode()), (c.ID, rid.encode()), ("app", b"1")]), T0)


def build(root: Path, n: int = 60, checkpoint_at: int = 60) -> tuple[dict[str, bytes], list[int]]:
    """n records, half of them (level 1) delivered; returns values by id and record positions."""
    st = open_store(root)
    values: dict[str, bytes] = {}
    for i in range(n):
        v = random.Random(i).randbytes(150)
        send(st, i, f"r{i}", 1000 if i % 2 else 4000, v)
        values[f"r{i}"] = v
        if i + 1 == checkpoint_at:
            for ref, rec in st.sched.due(T0 + 1000, 1000):
                st.delivered(ref, id_hash(bytes(rec.id)))
            st.checkpoint()
    positions = []
    for lv in st.sched.levels:
        positions += [lv.queue.read(i)[0] for i in range(lv.write)]
    st.close()
    return values, sorted(positions)


def run(root: Path, **kw: bool) -> tuple[list[dict[str, object]], object]:
    out = io.BytesIO()
    report = salvage(root, out, **kw)
    return [json.loads(line) for line in out.getvalue().splitlines()], report


def test_clean_store_everything_with_status(tmp_path: Path) -> None:
    values, _ = build(tmp_path / "data")
    docs, report = run(tmp_path / "data")
    assert len(docs) == 60 and not report.damage  # type: ignore[attr-defined]
    by_id = {d["id"]: d for d in docs}
    assert set(by_id) == set(values)
    for rid, d in by_id.items():
        assert base64.b64decode(str(d["value_b64"])) == values[rid]
        assert d["type"] == "message" and d["target_topic"] == "t" and d["partition"] == "in-0"
        assert d["headers"] == [["app", base64.b64encode(b"1").decode()]]
        level = 1 if int(rid[1:]) % 2 else 2
        assert d["level"] == level and d["due_ms"] == T0 + LEVELS[level - 1]
        assert d["status"] == ("done" if level == 1 else "pending")
    pending, _ = run(tmp_path / "data", pending_only=True)
    assert {d["id"] for d in pending} == {f"r{i}" for i in range(0, 60, 2)}


def test_records_after_the_checkpoint_count_as_pending(tmp_path: Path) -> None:
    build(tmp_path / "data", n=60, checkpoint_at=30)
    docs, _ = run(tmp_path / "data")
    status = {d["id"]: d["status"] for d in docs}
    assert all(status[f"r{i}"] == "pending" for i in range(30, 60)), "a restart would replay them"
    assert all(status[f"r{i}"] == ("done" if i % 2 else "pending") for i in range(30))


def test_damaged_sealed_segment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The store refuses to start; salvage copies out everything but the damaged record."""
    root = tmp_path / "data"
    values, positions = build(root, n=100, checkpoint_at=1)
    assert max(positions) // SEG >= 2, "segment 1 is sealed"
    victim = next(p for p in positions if p // SEG == 1 and p % SEG > 1000)
    seg = root / "in-0" / "log" / f"{SEG:020d}.log"
    raw = bytearray(seg.read_bytes())
    off = victim % SEG
    rec = codec.decode(memoryview(bytes(raw)), off)
    victim_id, length = bytes(rec.id).decode(), rec.length
    del rec
    raw[off + 100 : off + 140] = b"\xee" * 40
    seg.write_bytes(raw)
    with pytest.raises(CorruptSegment, match="salvage"):
        open_store(root)
    out = tmp_path / "salvaged.jsonl"
    assert salvage_main([str(root), "--out", str(out)]) == 1
    summary = capsys.readouterr().out
    assert "salvaged 99 records" in summary and "damaged" in summary
    docs = [json.loads(x) for x in out.read_text().splitlines()]
    assert {d["id"] for d in docs} == set(values) - {victim_id}
    for d in docs:
        assert base64.b64decode(d["value_b64"]) == values[d["id"]]
    assert salvage_main([str(root), "--out", str(out), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["damaged_regions"] == 1 and report["damaged_bytes"] == length
    assert report["damage"][0]["start"] == off and report["damage"][0]["end"] == off + length


def test_zeroed_page_and_damaged_file_header(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _values, positions = build(root)
    seg = root / "in-0" / "log" / f"{0:020d}.log"
    raw = bytearray(seg.read_bytes())
    lengths = {p: codec.peek_length(raw, p) for p in positions if p < SEG}
    raw[0:8] = b"XXXXXXXX"  # the file header
    raw[2048:4096] = bytes(2048)  # a lost page in the middle of the segment
    seg.write_bytes(raw)
    docs, report = run(root)
    lost = {p for p, n in lengths.items() if p < 4096 and p + n > 2048}
    assert lost
    got = {int(str(d["position"])) for d in docs}
    assert got == set(positions) - lost, "everything outside the lost page is recovered"
    assert report.bad_headers and "damaged file header" in report.bad_headers[0]  # type: ignore[attr-defined]
    assert len(report.damage) == 1  # type: ignore[attr-defined]


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert salvage_main([str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "holds no store" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        salvage_main([str(tmp_path)])  # --out is required


def test_a_recurring_schedule_is_salvaged_as_its_own_type(tmp_path: Path) -> None:
    """A recurring schedule's record (type 4) is read back like any record: type ``recurring``,
    its stored headers (the schedule's among them), pending."""
    st = open_store(tmp_path / "data")
    st.ingest(IngressRecord("in", 0, 0, T0, b"k", b"v", [
        (c.TARGET_TOPIC, b"t"), (c.ID, b"every-5s"), (c.EVERY, b"5000"), (c.START, b"%d" % (T0 + 5000))]), T0)
    st.checkpoint()
    st.close()
    docs, report = run(tmp_path / "data")
    assert not report.damage and report.records["recurring"] == 1  # type: ignore[attr-defined]
    [d] = docs
    assert d["type"] == "recurring" and d["id"] == "every-5s" and d["status"] == "pending"
    assert d["due_ms"] == T0 + 5000
    assert [c.EVERY, base64.b64encode(b"5000").decode()] in d["headers"]  # type: ignore[operator]
