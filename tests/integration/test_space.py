"""Disk space (issue 3): use follows pending records, not history; backpressure pauses ingress.

Disk use is measured in allocated blocks (``st_blocks``): segments and queue files are
preallocated sparse, so their ``st_size`` is a constant that says nothing. The sidecar's budget
(``disk-max-bytes``) counts the same blocks (``sidecar.store.space``); a budget the assigned
partitions cannot work in is refused loudly, and a pause that delivering cannot lift is reported
in ``/readyz`` and an ``ingress.stalled`` event with the fix, never a silent stall.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.config import Settings
from sidecar.inspect import inspect_data_dir
from sidecar.store import checkpoint, space
from tests.integration.harness import SidecarProcess, consume_until, create_topics, free_port, producer

pytestmark = pytest.mark.integration

SEGMENT = 256 * 1024
QUEUE_FILE = 64 + 65536 * 24  # one level-queue file (header + entries_per_file entries)


def blocks(root: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def files(root: Path, pattern: str) -> list[Path]:
    return sorted(root.rglob(pattern))


def send(
    bootstrap: str, ingress: str, target: str, n: int, delay_ms: int | Callable[[int], int], value_len: int, tag: str
) -> None:
    p = producer(bootstrap)
    for i in range(n):
        delay = delay_ms(i) if callable(delay_ms) else delay_ms
        p.produce(ingress, key=str(i).encode(), value=b"x" * value_len, headers=[
            ("delay.target-topic", target.encode()), ("delay.ms", str(delay).encode()),
            ("delay.id", f"{tag}-{i}".encode())])
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0


def events(sc: SidecarProcess, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in sc.log_text().splitlines() if f'"event":"{name}"' in line]


def readyz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def wait_readyz(port: int, status: int, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    got: tuple[int, dict[str, Any]] = (0, {})
    while time.monotonic() < deadline:
        got = readyz(port)
        if got[0] == status:
            return got[1]
        time.sleep(0.2)
    raise AssertionError(f"/readyz stayed {got}")


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name}")


@pytest.fixture
def make_sidecar(kafka_bootstrap: str, tmp_path: Path, unique: str) -> Iterator[object]:
    started: list[SidecarProcess] = []

    def make(*extra: str, name: str = "data") -> SidecarProcess:
        sc = SidecarProcess(
            kafka_bootstrap, tmp_path / name, f"ingress-space-{unique}", f"dlq-space-{unique}",
            extra=["--scheduler", "levels", "--ingress-partitions", "1", "--segment-bytes", "256KiB",
                   "--max-record-bytes", "64KiB", "--commit-interval", "100ms", *extra],
        )
        started.append(sc)
        return sc

    yield make
    for sc in started:
        sc.stop_quietly()


def test_delivering_everything_returns_the_data_dir_to_its_empty_size(
    make_sidecar: object, kafka_bootstrap: str, unique: str
) -> None:
    sc = make_sidecar()  # type: ignore[operator]
    target = f"space-target-{unique}"
    create_topics(kafka_bootstrap, [sc.ingress, target])
    sc.start()
    time.sleep(0.5)
    empty = blocks(sc.data_dir)
    total = 0
    for rnd, n in enumerate((8000, 16000)):  # 8 MB, then 16 MB more history
        send(kafka_bootstrap, sc.ingress, target, n, lambda i: (i % 3) * 600, 1000, f"r{rnd}")
        total += n
        got = consume_until(kafka_bootstrap, [target], want=total, timeout_s=120)
        assert len(got) >= total
        time.sleep(1.0)  # a few commit intervals: checkpoint, then reclaim
        log_files = files(sc.data_dir, "*.log")
        queue_files = files(sc.data_dir, "*.q")
        used = blocks(sc.data_dir)
        history = total * 1000
        report = inspect_data_dir(sc.data_dir)
        print(f"\nspace after {total} records ({history / 1e6:.0f} MB of history): {used / 1e6:.2f} MB on disk "
              f"(empty: {empty / 1e6:.2f} MB), {len(log_files)} segment(s), {len(queue_files)} queue file(s)")
        assert report["pending_total"] == 0
        # every sealed segment is deleted: the active one stays, and the next one when the head is
        # past the active one's half (made ahead by the page thread: store/log.py, Spare)
        (ck,) = [checkpoint.read(d) for d in sc.data_dir.iterdir() if (d / checkpoint.NAME).exists()]
        assert ck is not None
        active = ck["log"]["head"] // SEGMENT
        segments = sorted(int(f.stem) // SEGMENT for f in log_files)
        assert [i for i in segments if i < active] == [], f"sealed segments left: {segments}, head in {active}"
        assert set(segments) <= {active, active + 1} and len(log_files) <= 2, segments
        assert len(queue_files) <= 3, "one current file per used level (0, 1 and 2)"
        ids = sc.data_dir.rglob("ids.idx")
        fixed = len(log_files) * SEGMENT + len(queue_files) * QUEUE_FILE + sum(p.stat().st_size for p in ids)
        assert used <= empty + fixed, f"{used} B on disk, more than the empty store + fixed-size files ({fixed} B)"
        assert used < history / 3
    assert sc.terminate() == 0


def test_disk_max_bytes_pauses_ingress_until_deliveries_free_space(
    make_sidecar: object, kafka_bootstrap: str, unique: str
) -> None:
    # Apparent sizes: ids.idx 1 MiB + one level queue file 1.5 MiB + segments of 256 KiB. A limit
    # of 4 MiB leaves room for ~5 segments of pending records (~1,300 records of 1 KB).
    sc = make_sidecar("--disk-max-bytes", "4MiB")  # type: ignore[operator]
    target = f"space-bp-{unique}"
    create_topics(kafka_bootstrap, [sc.ingress, target])
    sc.start()
    n = 4000
    t0 = time.time()
    send(kafka_bootstrap, sc.ingress, target, n, 3000, 1000, "bp")  # level 2: due 5 s after sending
    got = consume_until(kafka_bootstrap, [target], want=n, timeout_s=120, settle_s=2)
    paused = events(sc, "ingress.paused")
    resumed = events(sc, "ingress.resumed")
    ids = Counter(r.headers["delay.id"] for r in got)
    assert len(ids) == n, f"lost {n - len(ids)}"
    assert max(ids.values()) == 1, "no duplicates in a run without crashes"
    assert min(r.lateness_ms for r in got) >= 0
    assert paused and "limit 4194304" in str(paused[0]["reason"]), sc.log_text()[-2000:]
    assert resumed, "ingress resumes once deliveries free segments"
    assert not events(sc, "ingress.stalled"), "deliveries could lift every pause"
    print(f"\nbackpressure: {len(paused)} pause(s), {len(resumed)} resume(s); all {n} delivered in "
          f"{time.time() - t0:.1f} s")
    assert sc.terminate() == 0


def test_low_free_disk_pauses_ingress(make_sidecar: object, kafka_bootstrap: str, unique: str) -> None:
    port = free_port()
    sc = make_sidecar("--disk-min-free-bytes", "1024TiB", "--http-port", str(port))  # type: ignore[operator]
    target = f"space-free-{unique}"
    create_topics(kafka_bootstrap, [sc.ingress, target])
    sc.start()
    sc.wait_for("ingress.paused", 10)
    assert "below 1125899906842624" in str(events(sc, "ingress.paused")[0]["reason"])
    # delivering cannot free a petabyte: a stall, said where an operator looks
    stalled = events(sc, "ingress.stalled")
    assert stalled and stalled[0]["level"] == "error" and stalled[0]["code"] == "disk-min-free-bytes-stalled"
    assert "lower disk-min-free-bytes" in stalled[0]["fix"]
    doc = wait_readyz(port, 503, 10)
    assert doc["not_ready"] == ["disk_ok"] and doc["disk"]["code"] == "disk-min-free-bytes-stalled"
    send(kafka_bootstrap, sc.ingress, target, 50, 0, 100, "free")
    assert consume_until(kafka_bootstrap, [target], want=1, timeout_s=4) == [], "paused: nothing is consumed"
    assert sc.terminate() == 0
    ok = make_sidecar("--http-port", str(port), name="data")  # type: ignore[operator]
    ok.start()
    got = consume_until(kafka_bootstrap, [target], want=50, timeout_s=60, settle_s=1)
    assert len({r.headers["delay.id"] for r in got}) == 50 == len(got)
    assert wait_readyz(port, 200, 10)["disk_ok"] is True


def finding_sidecar(kafka_bootstrap: str, data: Path, unique: str, budget: str, port: int) -> SidecarProcess:
    """The issue's geometry: 6 partitions of 16 MB segments, the wheel (the default scheduler)."""
    return SidecarProcess(
        kafka_bootstrap, data, f"ingress-budget-{unique}", f"dlq-budget-{unique}",
        extra=["--ingress-partitions", "6", "--segment-bytes", "16MB", "--disk-max-bytes", budget,
               "--commit-interval", "200ms", "--http-port", str(port), "--http-host", "127.0.0.1"],
    )


def test_the_budget_that_stalled_for_good_delivers_everything(
    kafka_bootstrap: str, tmp_path: Path, unique: str
) -> None:
    """``--disk-max-bytes 160MB``, 16 MB segments, 6 partitions, an empty data directory: counting
    the files' sizes (176 MB at open) paused ingress at once, for good, 0 of 300,000 delivered.
    Counting allocated blocks, the same run (scaled to 30,000 records) delivers everything without
    a pause; the start warns that the files delivering cannot free can outgrow the budget."""
    port = free_port()
    sc = finding_sidecar(kafka_bootstrap, tmp_path / "data", unique, "160MB", port)
    target = f"budget-target-{unique}"
    create_topics(kafka_bootstrap, [target])
    sc.start()
    n = 30_000
    t0 = time.time()
    send(kafka_bootstrap, sc.ingress, target, n, lambda i: (i % 5) * 500, 200, "budget")
    got = consume_until(kafka_bootstrap, [target], want=n, timeout_s=120, settle_s=1)
    ids = Counter(r.headers["delay.id"] for r in got)
    assert len(ids) == n, f"delivered {len(ids)} of {n}:\n{sc.log_text()[-2000:]}"
    assert max(ids.values()) == 1
    assert min(r.lateness_ms for r in got) >= 0
    assert not events(sc, "ingress.paused") and not events(sc, "ingress.stalled")
    s = Settings(segment_bytes=16_000_000, disk_max_bytes=160_000_000)
    warned = events(sc, "disk.budget_may_stall")
    assert warned and warned[-1]["level"] == "warning"
    assert warned[-1]["minimum"] == 6 * space.partition_needs(s).total < 160_000_000
    assert warned[-1]["ceiling"] == 6 * space.partition_ceiling(s).total > 160_000_000
    assert wait_readyz(port, 200, 10)["disk_ok"] is True
    held, sizes = metric(port, "delay_sidecar_store_bytes"), metric(port, "delay_sidecar_store_preallocated_bytes")
    print(f"\n{n} records through a 160 MB budget in {time.time() - t0:.1f} s: the store holds "
          f"{held / 1e6:.1f} MB on disk, its files' sizes {sizes / 1e6:.1f} MB")
    assert held < 160_000_000 < sizes
    assert sc.terminate() == 0


def test_a_budget_the_partitions_do_not_fit_in_is_refused_loudly(
    kafka_bootstrap: str, tmp_path: Path, unique: str
) -> None:
    """One partition fits in 60 MB, six do not: refused at the assignment (paused, not ready, an
    error event naming the minimum), nothing consumed. Below one partition: refused at start."""
    need = space.partition_needs(Settings(segment_bytes=16_000_000)).total
    port = free_port()
    sc = finding_sidecar(kafka_bootstrap, tmp_path / "data", unique, "60MB", port)
    target = f"budget-small-{unique}"
    create_topics(kafka_bootstrap, [target])
    sc.start()
    sc.wait_for("ingress.stalled", 10)
    stalled = events(sc, "ingress.stalled")[0]
    assert stalled["level"] == "error" and stalled["code"] == "disk-max-bytes-below-minimum"
    assert f"at least {6 * need}" in stalled["fix"]
    doc = wait_readyz(port, 503, 10)
    assert doc["disk"]["code"] == "disk-max-bytes-below-minimum" and f"at least {6 * need}" in doc["disk"]["fix"]
    send(kafka_bootstrap, sc.ingress, target, 20, 0, 100, "small")
    assert consume_until(kafka_bootstrap, [target], want=1, timeout_s=4) == [], "refused: nothing is consumed"
    assert sc.terminate() == 0

    tiny = finding_sidecar(kafka_bootstrap, tmp_path / "tiny", unique, "10MB", free_port())
    tiny.start(wait_assigned=False)
    assert tiny.proc is not None and tiny.proc.wait(60) == 2
    assert f"--disk-max-bytes 10000000 is below the {need} bytes" in tiny.log_text()
