"""Running ``delay-sidecar bench`` from a test: ``run_bench`` starts it in its own process group
at ``--size small`` and returns its JSON report (failing on a failed scenario or a timeout, which
stops its sidecars and brokers too); ``check_shape`` checks a report's documented keys and that
every figure is shaped ``{value, unit, goal, met}`` with ``met`` consistent with its goal, and no
``early`` or ``lost`` figure is above 0. Shared by the bench smoke tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.report import walk_figures

# throughput and lateness at their shortest: every variant (scheduler x changelog x delivery) still
# runs through the same code and reports the same figures, on 5,000 records each and 1 s of paced
# load with delays of at most 2 s (levels: the 1 s level; wheel: 1-2 s), not --size small's 20,000
# and 5 s with delays up to 10 s (each lateness variant waits out its longest delay after its load);
# a second of load at half the measured rate is still thousands of records per percentile
SHORT = ["--throughput-records", "5000", "--lateness-seconds", "1", "--max-delay", "2s"]
MACHINE_KEYS = {"cpu_count", "cpu_model", "memory_bytes", "python", "confluent_kafka", "librdkafka", "git_commit"}


def run_bench(args: list[str], out: Path, timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "sidecar", "bench", *args, "--size", "small", "--json", str(out)]
    # its own process group: a timeout stops the bench's sidecars and brokers with it (they
    # outlived a killed bench before and loaded the machine for the rest of the session)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as child:
        try:
            stdout, stderr = child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.communicate()
            raise AssertionError(f"bench {args[0]} did not finish within {timeout_s:.0f} s") from None
    proc = subprocess.CompletedProcess(cmd, child.returncode, stdout, stderr)
    assert out.exists(), f"no report written (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    report: dict[str, Any] = json.loads(out.read_text())
    failed = report["summary"]["failed_scenarios"]
    assert proc.returncode == 0 and not failed, f"bench failed ({failed}):\n{proc.stderr[-4000:]}"
    assert "| scenario | figure |" in proc.stdout  # the Markdown table
    return report


def check_shape(report: dict[str, Any], scenarios: list[str]) -> None:
    assert report["size"] == "small"
    assert report["machine"].keys() >= MACHINE_KEYS
    assert report["machine"]["cpu_count"] >= 1
    scheds = report["settings"]["schedulers"]
    assert scheds and set(scheds) <= {"levels", "wheel"}, scheds
    assert set(report["scenarios"]) == set(scenarios)
    for name in scenarios:
        sc = report["scenarios"][name]
        assert {"method", "settings", "results", "details", "seconds"} <= sc.keys(), name
        figures = list(walk_figures(sc["results"]))
        assert figures, name
        for path, f in figures:
            assert f["unit"], path
            if f["goal"] is None:
                assert f["met"] is None, path
            elif f["value"] is None:
                assert f["met"] in (None, False), path  # not measured, or known to be beyond the goal
            else:
                assert isinstance(f["met"], bool), path
            if path.endswith("early") or path.endswith("lost"):
                assert f["value"] == 0, path
    assert report["summary"]["figures"] > 0
