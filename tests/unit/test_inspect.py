"""``delay-sidecar inspect DATA_DIR [--json]`` on stores built with PartitionStore (no Kafka), and
on the data directory of a real sidecar loop run against the in-memory Kafka twin (the changelog
position its checkpoints name, the instance id it keeps)."""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar import cli
from sidecar import contract as c
from sidecar.config import Settings
from sidecar.engine.loop import Sidecar
from sidecar.inspect import inspect_data_dir, render_text
from sidecar.levels.scheduler import LevelsScheduler
from sidecar.store.idindex import id_hash
from sidecar.store.partition import Counters, IngressRecord, PartitionStore, compile_rules
from tests.kafka_twin import TwinClients, TwinCluster, VirtualClock

LEVELS = (1000, 5000, 10_000)
T0 = 1_700_000_000_000
SEG = 8192


def open_store(root: Path, partition: int = 0) -> PartitionStore:
    rules = compile_rules("in", "dlq", LEVELS, 10**9, (1000,), 3, 100_000, ())
    st = PartitionStore(
        root, "in", partition, rules=rules, scheduler_name="levels",
        make_scheduler=lambda d, lg: LevelsScheduler(d, lg, LEVELS, entries_per_file=64),
        segment_bytes=SEG, cancel_horizon_ms=60_000, counters=Counters(),
    )
    st.open()
    return st


def send(st: PartitionStore, offset: int, rid: str, delay_ms: int, now: int = T0, pad: int = 200) -> None:
    st.ingest(IngressRecord("in", st.partition, offset, now, b"k", b"v" * pad, [
        (c.TARGET_TOPIC, b"t"), (c.DELAY_MS, str(delay_ms).encode()), (c.ID, rid.encode())]), now)


def deliver_due(st: PartitionStore, now: int) -> int:
    n = 0
    for ref, rec in st.sched.due(now, 1_000_000):
        st.delivered(ref, id_hash(bytes(rec.id)))
        n += 1
    return n


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    st = open_store(root, 0)
    for i in range(40):  # 20 x level 1 (1 s), 20 x level 2 (5 s)
        send(st, i, f"a{i}", 1000 if i % 2 else 4000)
    assert deliver_due(st, T0 + 1000) == 20
    st.checkpoint()
    st.close()
    st = open_store(root, 1)
    send(st, 0, "b0", 0)
    st.checkpoint()
    st.close()
    (root / "not-a-store").mkdir()
    return root


def test_report(data_dir: Path) -> None:
    rep = inspect_data_dir(data_dir)
    assert rep["pending_total"] == 21
    p0, p1 = rep["partitions"]
    assert Path(p0["directory"]).name == "in-0" and Path(p1["directory"]).name == "in-1"
    assert p0["pending"] == {"level-2": 20}
    assert p0["next_due"]["level-2"]["due_ms"] == T0 + 5000
    assert p0["next_due"]["level-2"]["due"].startswith("2023-11-14T22:13:25")
    assert p1["pending"] == {"level-0": 1}
    ck = p0["checkpoint"]
    assert ck["ingress_offset"] == 40 and ck["scheduler"] == "levels" and ck["sched"]["levels"][1] == [20, 20]
    segs = p0["segments"]
    assert sum(s["records"] for s in segs) == 40, "every appended record is counted"
    assert sum(s["live_records"] for s in segs) == 20
    assert [s["active"] for s in segs] == [False] * (len(segs) - 1) + [True]
    for s in segs:
        assert s["live_ratio"] == round(s["live_records"] / s["records"], 4)
        assert 0 < s["disk_bytes"] <= s["bytes"] == SEG
        assert s["used_bytes"] <= SEG - 64
    assert p0["disk_bytes"] == sum(f.stat().st_blocks * 512 for f in (data_dir / "in-0").rglob("*") if f.is_file())
    # written without a changelog (no mirror) and without a sidecar run (no kept instance id)
    assert rep["instance_id"] is None
    assert [(p["changelog_offset"], p["changelog_ingress"]) for p in (p0, p1)] == [(None, None)] * 2
    text = render_text(rep)
    assert "21 pending" in text and "level-2" in text and "(active)" in text and "live=" in text
    assert "changelog  none named by the checkpoint" in text and "instance id" not in text


def test_cli_json_and_text(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inspect", str(data_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["pending_total"] == 21 and len(doc["partitions"]) == 2
    assert cli.main(["inspect", str(data_dir)]) == 0
    assert "in-0" in capsys.readouterr().out
    assert cli.main(["inspect", str(data_dir / "missing")]) == 2


def test_read_only_beside_a_live_store(tmp_path: Path) -> None:
    """inspect opens nothing for writing: running it changes no byte and no mtime."""
    root = tmp_path / "data"
    st = open_store(root)
    for i in range(30):
        send(st, i, f"x{i}", 5000)
    st.checkpoint()
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}
    rep = inspect_data_dir(root)
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}
    assert before == after
    assert rep["pending_total"] == 30
    st.close()


def test_empty_data_dir(tmp_path: Path) -> None:
    os.makedirs(tmp_path / "d")
    assert inspect_data_dir(tmp_path / "d") == {
        "data_dir": str(tmp_path / "d"), "instance_id": None, "partitions": [], "pending_total": 0,
    }


def open_wheel(root: Path, partition: int = 0) -> PartitionStore:
    from sidecar.wheel import WheelScheduler

    rules = compile_rules("in", "dlq", LEVELS, 10**9, (1000,), 3, 100_000, ())
    st = PartitionStore(
        root, "in", partition, rules=rules, scheduler_name="wheel",
        make_scheduler=lambda d, lg: WheelScheduler(d, lg, precision_ms=10, window_ms=60_000, bucket_width_ms=30_000),
        segment_bytes=SEG, cancel_horizon_ms=60_000, counters=Counters(),
    )
    st.open()
    return st


def test_every_partition_directory_is_listed(tmp_path: Path) -> None:
    """A partition that never had a record has its files but no checkpoint: it is listed (it used
    to be left out), in partition order, and directories that are not stores are not."""
    root = tmp_path / "data"
    for p in (10, 2):
        st = open_store(root, p)
        if p == 10:
            send(st, 0, "x", 4000)
            st.checkpoint()
        st.close()
    (root / "_embedded-kafka" / "kraft-logs").mkdir(parents=True)
    (root / "in-3").mkdir()  # a name like a partition's, but no store in it
    rep = inspect_data_dir(root)
    assert [Path(p["directory"]).name for p in rep["partitions"]] == ["in-2", "in-10"]
    empty, used = rep["partitions"]
    assert empty["checkpointed"] is False and empty["pending_total"] == 0 and empty["pending"] == {}
    assert empty["disk_bytes"] > 0 and empty["preallocated_bytes"] >= SEG
    assert used["checkpointed"] is True and used["pending_total"] == 1
    assert "in-2: no checkpoint yet" in render_text(rep)


@pytest.mark.parametrize("scheduler", ["levels", "wheel"])
def test_counts_follow_the_store_when_a_cancelled_record_falls_due(tmp_path: Path, scheduler: str) -> None:
    """A cancelled record's entry is passed by the scheduler when its due time comes: the pending
    counts drop with nothing stored or delivered. The store says it needs a checkpoint then (the
    loop checkpoints only stores that do), so inspect, which reads the checkpoint, follows."""
    root = tmp_path / "data"
    st = open_store(root) if scheduler == "levels" else open_wheel(root)
    send(st, 0, "keep", 5000)
    send(st, 1, "gone", 1000)
    st.ingest(IngressRecord("in", 0, 2, T0, b"k", None, [(c.CANCEL, b"gone")]), T0)
    st.checkpoint()
    assert not st.needs_checkpoint()
    assert inspect_data_dir(root)["pending_total"] == sum(st.pending().values())
    assert st.sched.due(T0 + 2000, 1000) == []  # the cancelled one's time: nothing to hand out
    assert not st.dirty, "nothing was stored or delivered"
    assert sum(st.pending().values()) == 1, "the scheduler's cursor moved past the cancelled entry"
    assert st.needs_checkpoint()
    assert inspect_data_dir(root)["pending_total"] == 2, "the checkpoint still names it"
    st.checkpoint()
    rep = inspect_data_dir(root)
    assert rep["pending_total"] == sum(st.pending().values()) == 1
    assert rep["partitions"][0]["pending"] == {t: n for t, n in st.pending().items() if n}
    st.close()


# -- a real sidecar's data directory: the changelog position and the kept instance id --------------


@pytest.fixture
def _restore_gc() -> Iterator[None]:
    """``Sidecar.start`` sets the loop's collector settings for the whole process (``quiet_gc``)."""
    saved = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*saved)


def run_sidecar(root: Path, records: int, **extra: Any) -> tuple[Sidecar, TwinCluster]:
    """A sidecar on the Kafka twin that takes ``records`` per partition of a 2-partition ingress
    topic (all due in a minute), checkpoints them and shuts down."""
    clock = VirtualClock()
    cluster = TwinCluster(clock)
    cluster.create_topic("in", 2)
    cluster.create_topic("out", 1)
    s = Settings(bootstrap_servers="twin:9092", data_dir=str(root), ingress_topic="in", group_id="g",
                 ingress_partitions=2, commit_interval_ms=200, helper_threads="none", **extra)
    sc = Sidecar(s, clock=clock, clients=TwinClients(cluster))
    sc.start()
    for p in range(2):
        for i in range(records):
            cluster.append("in", p, b"k", b"v", [(c.TARGET_TOPIC, b"out"), (c.DELAY_MS, b"60000"),
                                                  (c.ID, f"p{p}-{i}".encode())])
    for _ in range(10_000):
        done = len(sc.stores) == 2 and all(st.next_offset == records for st in sc.stores.values())
        if done and not sc.durability.jobs:
            break
        sc.turn()
        for _store, _job, fut, _written in list(sc.durability.jobs.values()):
            fut.result()
    else:
        raise AssertionError("the sidecar did not take the records in")
    sc.shutdown()
    return sc, cluster


@pytest.mark.usefixtures("_restore_gc")
def test_changelog_position_and_kept_instance_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With the changelog on (the default), each partition's checkpoint names the changelog offset
    its store covers and the ingress offset the changelog holds every record before; a sidecar
    given no group-instance-id keeps the one it made in <data-dir>/instance-id."""
    root = tmp_path / "data"
    sc, cluster = run_sidecar(root, 7)
    rep = inspect_data_dir(root)
    assert rep["instance_id"] == sc.s.group_instance_id == (root / "instance-id").read_text().strip()
    assert [Path(p["directory"]).name for p in rep["partitions"]] == ["in-0", "in-1"]
    for p, part in enumerate(rep["partitions"]):
        written = len(cluster.topics["in.changelog"][p])
        assert written == 7  # one put per stored record, nothing delivered yet
        assert part["changelog_offset"] == written
        assert part["changelog_ingress"] == 7  # ingress offsets 0..6 are in the changelog
        assert part["pending_total"] == 7
    text = render_text(rep)
    assert f"instance id {sc.s.group_instance_id} (kept in instance-id)" in text
    assert text.count("changelog  store covers offsets < 7, changelog holds ingress offsets < 7") == 2
    capsys.readouterr()  # the sidecar's own log lines
    assert cli.main(["inspect", str(root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["instance_id"] == sc.s.group_instance_id
    assert [(p["changelog_offset"], p["changelog_ingress"]) for p in doc["partitions"]] == [(7, 7)] * 2


@pytest.mark.usefixtures("_restore_gc")
def test_changelog_off_and_a_given_instance_id(tmp_path: Path) -> None:
    """changelog off: the checkpoints name no changelog position; a given group-instance-id (the
    Helm chart's pod name) leaves no instance-id file."""
    root = tmp_path / "data"
    run_sidecar(root, 3, changelog="off", group_instance_id="kds-kafka-delay-sidecar-0")
    rep = inspect_data_dir(root)
    assert rep["instance_id"] is None and not (root / "instance-id").exists()
    assert [(p["changelog_offset"], p["changelog_ingress"], p["pending_total"]) for p in rep["partitions"]] == [
        (None, None, 3), (None, None, 3)]
    assert "changelog  none named by the checkpoint" in render_text(rep)
