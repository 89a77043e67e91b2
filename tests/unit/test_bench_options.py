"""The bench's scenario options (bench/options.py), each declared once: ``delay-sidecar bench``'s
parser (bench/cli.py) takes every one's flag, and ``Bench.options`` holds every one's parsed value
under its declared key, the key the scenarios read; a bad value exits 2 naming the flag and the
value. No broker: only the parser."""

from __future__ import annotations

from typing import Any

import pytest

from bench import options
from bench.cli import parse_args

BASE = ["throughput", "--json", "x.json"]

# a sample value for every declared flag, and what it is parsed into
SAMPLES: dict[str, tuple[str, Any]] = {
    "--shape": ("common", ["common"]),
    "--scale-pending": ("5k", 5_000),
    "--scale-rate": ("20000", 20_000),
    "--lateness-rate": ("27k", 27_000),
    "--throughput-records": ("300000", 300_000),
    "--restore-pending": ("10M", 10_000_000),
    "--lateness-seconds": ("60", 60),
    "--max-delay": ("2s", 2_000),
    "--expiry-delay": ("30s", 30_000),
    "--dwell": ("1s", 1_000),
    "--crashes": ("3", 3),
    "--list-pending": ("3M", 3_000_000),
    "--recurring-schedules": ("100k", 100_000),
    "--recurring-period": ("10s", 10_000),
    "--recurring-kills": ("10", 10),
    "--peer-pending": ("1M,10M", [1_000_000, 10_000_000]),
    "--scale-layouts": ("1,6", [1, 6]),
}

# a bad value for every declared flag, and what the error says about it
BAD: dict[str, tuple[str, str]] = {
    "--shape": ("oval", "--shape 'oval': give plain, common or plain,common"),
    "--scale-pending": ("0", "argument --scale-pending: '0': give a positive count such as 2500000, 500k or 20M"),
    "--scale-rate": ("fast", "argument --scale-rate: 'fast': give a positive count"),
    "--lateness-rate": ("-5", "argument --lateness-rate: '-5': give a positive count"),
    "--throughput-records": ("2G", "argument --throughput-records: '2G': give a positive count"),
    "--restore-pending": ("1.5M", "argument --restore-pending: '1.5M': give a positive count"),
    "--lateness-seconds": ("0", "argument --lateness-seconds: '0': give a positive count"),
    "--max-delay": ("11s", "argument --max-delay: '11s': give a duration from 1s to 10s, such as 2s"),
    "--expiry-delay": ("7s", "argument --expiry-delay: '7s': give a level time: 1s, 5s, 10s, 30s, 1m, 2m, 3m or 4m"),
    "--dwell": ("11m", "argument --dwell: '11m': give a duration from 0s to 10m, such as 1s"),
    "--crashes": ("k", "argument --crashes: 'k': give a positive count"),
    "--list-pending": ("many", "argument --list-pending: 'many': give a positive count"),
    "--recurring-schedules": ("0k", "argument --recurring-schedules: '0k': give a positive count"),
    "--recurring-period": ("500ms", "argument --recurring-period: '500ms': give a period of at least 1s"),
    "--recurring-kills": ("x", "argument --recurring-kills: invalid int value: 'x'"),
    "--peer-pending": ("1M,ten", "argument --peer-pending: 'ten': give a positive count"),
    "--scale-layouts": ("0,65", "argument --scale-layouts: '0,65': give partition counts 1-64, comma-separated"),
}

BY_FLAG = {o.flag: o for o in options.OPTIONS}


def test_every_option_has_a_sample_and_a_bad_value() -> None:
    assert set(SAMPLES) == set(BY_FLAG) == set(BAD)


def test_flags_and_keys_are_declared_once() -> None:
    assert len(BY_FLAG) == len(options.OPTIONS)
    assert len({o.key for o in options.OPTIONS}) == len(options.OPTIONS)


def test_without_flags_every_key_is_none() -> None:
    got = options.bench_options(parse_args(BASE))
    assert got == {o.key: None for o in options.OPTIONS}
    assert "transaction_interval_ms" not in got and "transaction_interval" not in got  # passed to Bench on its own


@pytest.mark.parametrize("flag", list(SAMPLES))
def test_a_flag_lands_under_its_key(flag: str) -> None:
    text, want = SAMPLES[flag]
    got = options.bench_options(parse_args([*BASE, flag, text]))
    key = BY_FLAG[flag].key
    assert got[key] == want
    assert all(v is None for k, v in got.items() if k != key)


def test_the_keys_the_scenarios_read() -> None:
    argv = [a for flag, (text, _want) in SAMPLES.items() for a in (flag, text)]
    got = options.bench_options(parse_args([*BASE, *argv]))
    assert got == {
        "shapes": ["common"], "scale_pending": 5_000, "scale_rate": 20_000, "lateness_rate": 27_000,
        "throughput_records": 300_000, "restore_pending": 10_000_000, "lateness_seconds": 60,
        "max_delay_ms": 2_000, "expiry_delay_ms": 30_000, "dwell_ms": 1_000, "crashes": 3,
        "list_pending": 3_000_000, "recurring_schedules": 100_000, "recurring_period_ms": 10_000,
        "recurring_kills": 10, "peer_pending": [1_000_000, 10_000_000], "scale_layouts": [1, 6],
    }


def test_shapes_are_checked_and_kept_in_order() -> None:
    ns = parse_args([*BASE, "--shape", " common , plain "])
    assert (ns.shape, ns.shapes) == (" common , plain ", ["common", "plain"])
    assert options.bench_options(ns)["shapes"] == ["common", "plain"]


@pytest.mark.parametrize("flag", list(BAD))
def test_a_bad_value_exits_2_naming_the_flag_and_the_value(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    text, message = BAD[flag]
    with pytest.raises(SystemExit) as exited:
        parse_args([*BASE, flag, text])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"delay-sidecar bench: error: {message}" in err, err


@pytest.mark.parametrize(("value", "message"), [
    ("6s", "argument --transaction-interval: '6s': give a duration from 1ms to 5s, such as 50ms, 500ms or 1s"),
    ("100", "argument --transaction-interval: '100': "),
])
def test_transaction_interval_is_parsed_as_before(value: str, message: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args([*BASE, "--transaction-interval", "50ms"]).transaction_interval == 50
    with pytest.raises(SystemExit) as exited:
        parse_args([*BASE, "--transaction-interval", value])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_help_lists_the_options_with_their_metavars_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    at = [out.index(f"{o.flag} {o.metavar}") for o in options.OPTIONS]
    assert at == sorted(at)
    assert out.index("--delivery MODES") < at[0] < out.index("--transaction-interval DURATION")
    assert out.index("--profile DIR") < at[1]
