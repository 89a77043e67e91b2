"""Resident memory of a running sidecar (docs/storage.md 9): the store's pages leave the process on
the trim clock (200 ms), not at the checkpoints, so a long ``commit-interval`` does not let the
mmapped commit log pile up in RSS."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bench.workload import memory_of
from tests.integration.harness import SidecarProcess, create_topics, producer

pytestmark = pytest.mark.integration


def ingested(sc: SidecarProcess) -> int:
    last = 0
    for line in sc.log_text().splitlines():
        if '"event":"stats"' in line:
            last = json.loads(line)["ingested"]
    return last


def test_store_pages_leave_between_checkpoints(kafka_bootstrap: str, tmp_path: Path, unique: str) -> None:
    """~100 MiB appended to the commit log while no checkpoint runs (a 10 min commit interval):
    the appended pages are still dropped, and RssFile stays near where it started."""
    target = f"t-{unique}"
    create_topics(kafka_bootstrap, [target])
    sc = SidecarProcess(kafka_bootstrap, tmp_path / "data", f"ingress-{unique}", f"dlq-{unique}",
                        extra=["--scheduler", "levels", "--ingress-partitions", "1", "--commit-interval", "10m"])
    sc.start()
    assert sc.proc is not None
    try:
        time.sleep(1)
        base = memory_of(sc.proc.pid)["RssFile"]
        n, value = 100_000, b"v" * 1000
        p = producer(kafka_bootstrap)
        for i in range(n):
            p.produce(sc.ingress, value=value, key=b"%d" % i,
                      headers=[("delay.target-topic", target.encode()), ("delay.level", b"16")])
            if i % 10_000 == 0:
                p.poll(0)
        assert p.flush(60) == 0
        deadline = time.monotonic() + 120
        while ingested(sc) < n:
            assert time.monotonic() < deadline, f"only {ingested(sc)} of {n} ingested"
            assert sc.proc.poll() is None, sc.log_text()[-4000:]
            time.sleep(0.2)
        time.sleep(1.0)  # five trim intervals
        growth = memory_of(sc.proc.pid)["RssFile"] - base
        log_bytes = sum(f.stat().st_blocks * 512 for f in (tmp_path / "data").rglob("log/*") if f.is_file())
        assert log_bytes >= n * 1000, f"the commit log holds only {log_bytes} bytes"
        for ck in (tmp_path / "data").rglob("checkpoint.json"):  # no checkpoint covers the records
            assert (json.loads(ck.read_bytes()).get("ingress_offset") or 0) < n
        assert growth <= 24 * 2**20, f"RssFile grew by {growth / 2**20:.1f} MiB for {log_bytes / 2**20:.0f} MiB of log"
    finally:
        sc.stop_quietly()
