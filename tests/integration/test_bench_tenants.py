"""``delay-sidecar bench tenants`` at its small size on the real broker (bench/tenants.py): tenant
a's mass expiry beside tenant b's paced stream of 1 s delays, in one sidecar. The report must hold
its figures and the correctness ones must be met: nothing early, nothing lost for either tenant,
b's stream delivered during a's drain (timings are reported, not asserted: the machine is shared)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.bench_runner import check_shape, run_bench

pytestmark = pytest.mark.integration


def test_bench_tenants_small(kafka_bootstrap: str, tmp_path: Path) -> None:
    # A's delay 5 s, not 10 s: the same drain, two shorter waits for its due time (--max-delay)
    report = run_bench(["tenants", "--bootstrap-servers", kafka_bootstrap, "--schedulers", "levels",
                        "--max-delay", "5s"], tmp_path / "bench.json", timeout_s=300)
    check_shape(report, ["tenants"])
    res = report["scenarios"]["tenants"]["results"]["levels"]
    details = report["scenarios"]["tenants"]["details"]["levels"]
    print(f"\nbench tenants (small): {json.dumps({k: v for k, v in details.items() if k != 'single_tenant'})}")
    for name in ("a_early", "a_lost", "b_early", "b_lost"):
        assert res[name]["value"] == 0, name
    assert details["a_delivered"] >= details["a_records"]
    assert details["b_sent"] > 0 and details["b_delivered"] >= details["b_sent"]
    assert details["b_due_during_drain"] > 0  # b's stream went on while a drained
    assert res["a_drain_ratio_to_single_tenant"]["value"] > 0
    assert res["b_lateness_during_drain_p99_ms"]["goal"] == "<= 50"
    assert report["scenarios"]["tenants"]["settings"]["a_delay_ms"] == 5_000
