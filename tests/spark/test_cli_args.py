"""The accuracy CLI's flag parsing (spark/cli.py), without Spark: bad flags exit 2 before a
session starts, so these run in milliseconds. Durations follow sidecar/durations.py (a unit is
required), times add ISO-8601, epoch ms and ``now-DURATION``."""

from __future__ import annotations

import re

import pytest

from spark.accuracy import DEFAULT_LEVELS_MS, isolation_level, with_isolation_level
from spark.cli import accuracy_main, build_parser, parse_time_ms

NOW = 1_700_000_000_000
BASE = ["--bootstrap-servers", "x:1", "--targets", "t"]


def test_parse_time() -> None:
    assert parse_time_ms("1700000000123") == 1_700_000_000_123
    assert parse_time_ms("2023-11-14T22:13:20Z") == NOW
    assert parse_time_ms("2023-11-14T22:13:20") == NOW
    assert parse_time_ms("2023-11-14T23:13:20+01:00") == NOW
    assert parse_time_ms("now", now_ms=NOW) == NOW
    assert parse_time_ms(" NOW ", now_ms=NOW) == NOW
    assert parse_time_ms("now-1h", now_ms=NOW) == NOW - 3_600_000
    assert parse_time_ms("now - 90s", now_ms=NOW) == NOW - 90_000
    assert parse_time_ms("-15m", now_ms=NOW) == NOW - 900_000
    assert parse_time_ms("now-250ms", now_ms=NOW) == NOW - 250
    with pytest.raises(ValueError, match=r"'soon' is not a time; .*ISO-8601.*epoch ms.*now-DURATION"):
        parse_time_ms("soon")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("now-15", r"'15' has no unit \(write 15ms or 15s\)"),
        ("-15", r"'15' has no unit"),
        ("now-1 h", r"'1 h' has a space between the number and the unit"),
        ("now-1.5h", r"'1.5h' is not a whole number"),
        ("now-", r"'' is empty"),
    ],
)
def test_time_offsets_need_a_unit(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=rf"bad offset in {text!r}: {why}.*a duration is an integer directly"):
        parse_time_ms(text, now_ms=NOW)


def test_durations_and_their_defaults() -> None:
    ns = build_parser().parse_args(["--targets", "t"])
    assert ns.grace == 0 and ns.levels == list(DEFAULT_LEVELS_MS)
    ns = build_parser().parse_args(["--targets", "t", "--grace", "2m", "--levels", "1s, 5s,10s 1m"])
    assert ns.grace == 120_000 and ns.levels == [1000, 5000, 10_000, 60_000]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--grace", "5"], r"argument --grace: '5' has no unit \(write 5ms or 5s\)"),
        (["--grace", "5 s"], r"argument --grace: '5 s' has a space between the number and the unit"),
        (["--grace", "1.5s"], r"argument --grace: '1.5s' is not a whole number"),
        (["--grace=-5s"], r"argument --grace: '-5s' is negative"),
        (["--levels", "1s 5"], r"argument --levels: in '1s 5': '5' has no unit"),
        (["--levels", "1s 1s"], r"argument --levels: levels must be positive and strictly increasing"),
        (["--levels", "0ms 1s"], r"argument --levels: levels must be positive and strictly increasing"),
        (["--since", "now-15"], r"argument --since: bad offset in 'now-15': '15' has no unit"),
        (["--until=-5"], r"argument --until: bad offset in '-5': '5' has no unit"),
        (["--since", "yesterday"], r"argument --since: 'yesterday' is not a time"),
        (["--since", "now", "--until", "now-1h"], r"--until \(\d+\) must be after --since"),
        (["--out", "hdfs://nn/acc"], r"argument --out: .*same path.*not a URI"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert accuracy_main([*BASE, *args]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kafka", "isolation.level=committed"],
         r"--read-committed / --kafka: isolation.level='committed' is not an isolation level; "
         r"expected read_uncommitted or read_committed"),
        (["--kafka", "isolation.level=read_uncommitted", "--read-committed"],
         r"--read-committed / --kafka: read_committed was asked for, but the Kafka options say "
         r"isolation.level=read_uncommitted"),
        (["--kafka", "isolation.level=read_committed", "--kafka", "kafka.isolation.level=read_uncommitted"],
         r"isolation.level is given twice with different values"),
    ],
)
def test_bad_isolation_levels_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert accuracy_main([*BASE, *args]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err


def test_isolation_level_resolution() -> None:
    assert isolation_level(None, False) == "read_uncommitted"  # the Kafka Java client's default
    assert isolation_level(None, True) == "read_committed"
    assert isolation_level({"isolation.level": "read_committed"}, False) == "read_committed"
    assert isolation_level({"kafka.isolation.level": "read_committed"}, True) == "read_committed"
    assert with_isolation_level({"kafka.isolation.level": "read_uncommitted", "security.protocol": "SSL"},
                                "read_committed") == {"security.protocol": "SSL", "isolation.level": "read_committed"}
    assert build_parser().parse_args(["--targets", "t"]).read_committed is False
    assert build_parser().parse_args(["--targets", "t", "--read-committed"]).read_committed is True
    assert "read_uncommitted" in build_parser().format_help()
