"""``delay-sidecar bench recurring`` at its small size on the real broker (bench/recurring.py):
3,000 schedules every 10 s beside a stream of 1 s delays. The report must hold its figures, and
the correctness ones must be met: no firing early, none missed, none doubled (timings are
reported, not asserted: the machine is shared)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def test_bench_recurring_small(kafka_bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "sidecar", "bench", "recurring", "--bootstrap-servers", kafka_bootstrap,
           "--schedulers", "wheel", "--size", "small", "--json", str(out)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as child:
        try:
            stdout, stderr = child.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            raise AssertionError("bench recurring did not finish within 300 s") from None
    assert out.exists(), stderr[-4000:]
    report: dict[str, Any] = json.loads(out.read_text())
    assert child.returncode == 0 and not report["summary"]["failed_scenarios"], stderr[-4000:]
    assert "| scenario | figure |" in stdout
    res = report["scenarios"]["recurring"]["results"]["wheel"]
    details = report["scenarios"]["recurring"]["details"]["wheel"]
    print(f"\nbench recurring (small): {json.dumps(details)}")
    assert res["early"]["value"] == 0 and res["missed"]["value"] == 0 and res["doubled"]["value"] == 0
    assert details["firings"] >= 3_000 * 2 and details["stream_records"] > 0
    assert res["firing_lateness_p99_ms"]["value"] is not None
