"""The ``append`` bench scenario (issue 3) at a tiny size: every cell measured, with real values.

No broker: the scenario runs the store in-process. The commit cadence is made deterministic by
the intervals passed in (0 ms = a checkpoint after every batch), so the checkpoint counts are exact.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import append
from bench.report import walk_figures
from bench.workload import RECORD_SIZES, Bench
from sidecar.store import codec
from sidecar.store.codec import encode_headers

SCHEDULERS = ("levels", "wheel")


def test_cadence_follows_the_loop() -> None:
    batch = append.Cadence("batch", commit_s=0.2, fsync_interval_s=1.0)
    assert [batch.tick(t) for t in (0.1, 0.2, 0.3, 0.45, 1.0)] == [False, True, False, True, True]
    interval = append.Cadence("interval", commit_s=0.2, fsync_interval_s=1.0)
    # The first commit tick checkpoints (the loop's last fsync starts at 0 on the monotonic clock);
    # later ticks only once fsync-interval has passed since the last checkpoint.
    assert [interval.tick(t) for t in (0.25, 0.5, 1.0, 1.3, 1.4, 2.4)] == [True, False, False, True, False, True]


def test_every_cell_is_measured(tmp_path: Path) -> None:
    n = 2_500  # three batches of up to 1 000
    # commit every batch; fsync-interval far away: interval checkpoints on the first tick and at the end only
    results, details, notes = append.measure(tmp_path, n, SCHEDULERS, commit_interval_ms=0,
                                             fsync_interval_ms=10**9)
    assert notes == []
    assert set(results) == set(RECORD_SIZES)
    expected_checkpoints = {"batch": 4, "interval": 2, "none": 4}  # 3 batches + the final one
    for label, size in RECORD_SIZES.items():
        assert set(results[label]) == set(append.POLICIES)
        record = codec.encoded_size(60, 60, len(append.KEY), size, len(encode_headers([append.TRACEPARENT])))
        for policy in append.POLICIES:
            cells = {"log": results[label][policy]["log"]}
            cells.update({s: results[label][policy]["store"][s] for s in SCHEDULERS})
            raw = {"log": details[label][policy]["log"]}
            raw.update({s: details[label][policy]["store"][s] for s in SCHEDULERS})
            for layer, cell in cells.items():
                where = f"{label}.{policy}.{layer}"
                assert cell["records_per_s"]["value"] > 0, where
                assert cell["payload_mb_per_s"]["value"] > 0, where
                mb = cell["records_per_s"]["value"] * append.payload_bytes(size) / 1e6
                assert cell["payload_mb_per_s"]["value"] == pytest.approx(mb, rel=1e-3), where
                assert cell["log_bytes_per_record"]["value"] == record, where
                assert cell["checkpoints"]["value"] == expected_checkpoints[policy], where
                p50, p99 = cell["flush_checkpoint_p50_ms"]["value"], cell["flush_checkpoint_p99_ms"]["value"]
                assert 0 < p50 <= p99, where
                assert raw[layer]["n"] == n and not raw[layer]["capped"], where
            for s in SCHEDULERS:
                assert details[label][policy]["store"][s]["pending"] == n
                assert details[label][policy]["store"][s]["dlq"] == 0
    assert list(tmp_path.iterdir()) == []  # every cell's data directory is removed


def test_run_report_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(append, "records_for", lambda _bench: 1_000)
    out = append.run(Bench("", tmp_path, "small", ["levels"]))
    assert {"method", "settings", "results", "details", "notes"} <= out.keys()
    figures = list(walk_figures(out["results"]))
    assert len(figures) == len(RECORD_SIZES) * len(append.POLICIES) * 2 * 6  # log + levels, 6 figures each
    for path, f in figures:
        assert f["goal"] is None and f["met"] is None, path  # no goal stated for append
        assert f["value"] is not None and f["value"] > 0, path
    assert any("no goal" in note for note in out["notes"])
