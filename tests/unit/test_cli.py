"""The command line's input handling: durations need their unit, bad values get one clear line
naming the flag, the value and the accepted forms, every option has help, and ``run --help``
shows defaults the way a person writes them. No broker is involved: every check here happens
before ``send`` / ``cancel`` connect (tests/integration/test_cli_send.py covers the Kafka side)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sidecar import client
from sidecar.cli import attach_dash_values, build_parser, main
from sidecar.config import OPTIONS, Settings
from sidecar.durations import (
    format_duration_ms,
    format_size,
    parse_duration_list,
    parse_duration_ms,
    parse_size,
)
from sidecar.headers import MAX_EPOCH_MS

FORMS = "integer directly followed by ms, s, m, h or d"
SEND = ["send", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "--value", "v"]


# ---- the duration and size rules ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ms"),
    [("250ms", 250), ("5s", 5000), ("10m", 600_000), ("2h", 7_200_000), ("400d", 400 * 86_400_000),
     (" 5s ", 5000), ("0ms", 0), ("0s", 0)],
)
def test_durations_in_their_written_form(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("5", "'5' has no unit (write 5ms or 5s)"),
        (5, "5 has no unit"),  # a YAML integer
        ("5 s", "'5 s' has a space between the number and the unit"),
        ("-5s", "'-5s' is negative"),
        ("-5", "'-5' is negative"),
        ("1.5s", "'1.5s' is not a whole number"),
        ("5S", "'5S' is not a duration"),
        ("soon", "'soon' is not a duration"),
        ("", "'' is empty"),
        (True, "True is not a duration"),
        ("99999999999999999d", "is too long"),
    ],
)
def test_bad_durations_say_why_and_show_the_forms(value: str | int, why: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_duration_ms(value)
    assert why in str(e.value) and FORMS in str(e.value)


def test_duration_lists_name_the_bad_item() -> None:
    assert parse_duration_list("1s, 5s 10s") == [1000, 5000, 10_000]
    assert parse_duration_list(["1s", "2m"]) == [1000, 120_000]
    for bad, item in (("1s 5 10s", "'5' has no unit"), ([1000, 5000], "1000 has no unit"), ("1s -5s", "negative")):
        with pytest.raises(ValueError, match=item):
            parse_duration_list(bad)  # type: ignore[arg-type]


def test_sizes_follow_the_same_spacing_rule() -> None:
    assert parse_size("64MiB") == 64 << 20 and parse_size("1000000") == 1_000_000 and parse_size(4096) == 4096
    for bad, why in (("64 MiB", "space between"), ("-1", "negative"), (-1, "negative"), ("5furlongs", "unknown unit")):
        with pytest.raises(ValueError, match=why):
            parse_size(bad)


def test_formats_read_back() -> None:
    for ms in (0, 1, 999, 1000, 1500, 60_000, 3_600_000, 86_400_000, 400 * 86_400_000):
        assert parse_duration_ms(format_duration_ms(ms)) == ms
    for n in (0, 1, 1_000_000, 64 << 20, 256 << 20, 3 << 40):
        assert parse_size(format_size(n)) == n
    assert (format_size(64 << 20), format_size(1_000_000)) == ("64MiB", "1000000")


# ---- the client helpers: an int is milliseconds, a string needs its unit --------------------


def test_client_delay_int_is_ms_string_needs_unit() -> None:
    assert client.delay_ms(5) == 5 and client.delay_ms("5s") == 5000
    for bad in ("5", "5 s", -5, "-5s", True, 1.5):
        with pytest.raises(ValueError):
            client.delay_ms(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="has no unit"):
        client.delay_headers("t", delay="5")
    with pytest.raises(ValueError, match="has no unit"):
        client.send_delayed(None, "t", b"v", delay="5")  # refused before the producer is touched


def test_client_deliver_at_forms() -> None:
    assert client.deliver_at_ms("1767225600000") == 1_767_225_600_000
    assert client.deliver_at_ms("2026-01-01T00:00:00Z") == 1_767_225_600_000
    assert client.deliver_at_ms("2026-01-01T01:00:00+01:00") == 1_767_225_600_000
    one_us_past = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(microseconds=1)
    assert client.deliver_at_ms(one_us_past) == 1_767_225_600_001  # rounded up: never early
    assert client.deliver_at_ms(datetime(2026, 1, 1, 0, 0, 0, 123_000, tzinfo=UTC)) == 1_767_225_600_123
    for bad, why in (("2026-01-01T00:00:00", "no time zone"), ("-5", "before 1970"), ("tomorrow", "not a time"),
                     (datetime(2026, 1, 1), "no time zone"), (float("nan"), "not a time")):
        with pytest.raises(ValueError, match=why) as e:
            client.deliver_at_ms(bad)
        assert "ISO-8601 with a zone" in str(e.value)


def test_client_latest_due_time_is_the_contracts() -> None:
    assert client.LATEST_MS == MAX_EPOCH_MS
    assert client.deliver_at_ms("9999-12-31T23:59:59.999Z") == MAX_EPOCH_MS


def test_client_level_partition_and_id() -> None:
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="not a level"):
            client.delay_headers("t", level=bad)
    with pytest.raises(ValueError, match="not a partition"):
        client.delay_headers("t", target_partition=-1)
    with pytest.raises(ValueError, match=r"1\.\.255 bytes"):
        client.delay_headers("t", id="x" * 256)


# ---- bad values on the command line: exit 2, one line naming flag, value and forms ----------


def _run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = main(list(args))
    err = capsys.readouterr().err
    return rc, err


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--delay", "5"], ["--delay", "'5' has no unit", FORMS]),
        (["--delay", "5 s"], ["--delay", "'5 s' has a space", FORMS]),
        (["--delay", "-5s"], ["--delay", "'-5s' is negative", FORMS]),  # argparse alone: "expected one argument"
        (["--delay=-5s"], ["--delay", "'-5s' is negative", FORMS]),
        (["--del", "-5s"], ["--delay", "'-5s' is negative"]),  # an abbreviated option too
        (["--delay", "1.5s"], ["--delay", "'1.5s' is not a whole number", FORMS]),
        (["--at", "-5"], ["--at", "'-5' is before 1970", "ISO-8601 with a zone"]),
        (["--at", "2026-01-01T00:00:00"], ["--at", "no time zone"]),
        (["--level", "-1"], ["--level", "-1 is not a level"]),
        (["--level", "19"], ["--level", "'19' is beyond the 18 levels"]),
        (["--level", "2", "--levels", "1s 5"], ["--levels", "'5' has no unit"]),
        (["--partition", "-1"], ["--partition", "-1 is not a partition"]),
        (["--timeout", "5"], ["--timeout", "'5' has no unit"]),
        (["--timeout", "-5s"], ["--timeout", "'-5s' is negative"]),
        (["--delay", "1s", "--at", "5"], ["at most one of --delay, --at, --level"]),
        (["--kafka", "nonsense"], ["--kafka", "'nonsense' is not PROP=VALUE"]),
        (["--kafka", "no.such.property=1"], ["--kafka", 'No such configuration property: "no.such.property"']),
        (["--timeout", "2h"], ["--timeout", "'2h' is not between 1s and 1h"]),
        (["--at", "253402300800000"], ["--at", "is after the year 9999"]),
        (["--delay", "3000000d"], ["--delay", "'3000000d' reaches past the year 9999"]),
    ],
)
def test_send_refuses_bad_values_before_connecting(
    capsys: pytest.CaptureFixture[str], args: list[str], needles: list[str]
) -> None:
    rc, err = _run_main(capsys, *SEND, *args)
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("delay-sidecar send: error: "), err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["x" * 256], ["bad value for ID", "1..255 bytes"]),
        (["r1", "--delay", "5"], ["--delay", "'5' has no unit", FORMS]),
        (["r1", "--at", "2026-01-01T00:00:00"], ["--at", "no time zone", "ISO-8601 with a zone"]),
        (["r1", "--delay", "1s", "--at", "5"], ["at most one of --delay, --at, --level"]),
    ],
)
def test_reschedule_refuses_bad_values_before_connecting(
    capsys: pytest.CaptureFixture[str], args: list[str], needles: list[str]
) -> None:
    rc, err = _run_main(capsys, "reschedule", *args, "--topic", "t", "--value", "v", "--key", "k",
                        "--bootstrap-servers", "127.0.0.1:1")
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("delay-sidecar reschedule: error: "), err
    for needle in needles:
        assert needle in err, err


def test_reschedule_needs_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["reschedule", "r1", "--topic", "t", "--value", "v", "--delay", "1s"])
    assert e.value.code == 2 and "--key" in capsys.readouterr().err


def test_client_reschedule_sends_the_id_and_replace_with_the_key() -> None:
    sent: list[tuple[str, dict[str, object]]] = []

    class _Producer:
        def produce(self, topic: str, **kw: object) -> None:
            sent.append((topic, kw))

    client.reschedule(_Producer(), "order-42", "orders.timeout", b"v2", key=b"42", delay="1h", headers=[("h", b"1")])
    topic, kw = sent[0]
    assert (topic, kw["key"], kw["value"]) == ("delay.ingress", b"42", b"v2")
    assert kw["headers"] == [("h", b"1"), ("delay.target-topic", b"orders.timeout"), ("delay.ms", b"3600000"),
                             ("delay.id", b"order-42"), ("delay.replace", b"true")]
    with pytest.raises(ValueError, match=r"1\.\.255 bytes"):
        client.reschedule(_Producer(), "", "t", b"v", key=b"k")
    with pytest.raises(TypeError):
        client.reschedule(_Producer(), "a", "t", b"v")  # type: ignore[call-arg]  # the key is required


def test_cancel_refuses_a_bad_id(capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _run_main(capsys, "cancel", "x" * 256, "--key", "k", "--bootstrap-servers", "127.0.0.1:1")
    assert rc == 2 and "1..255 bytes" in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["x" * 256], "bad value for ID: "),
        (["order-42", "--partition", "-1"], "bad value for --partition: '-1' is negative; a partition is 0 or more"),
        (["order-42", "--partition", "two"], "bad value for --partition: 'two' is not a whole number"),
        (["order-42", "--key", ""], "bad value for --key: an empty key is partitioned at random"),
        (["order-42", "--timeout", "0s"], "bad value for --timeout: '0s' is not between 1s and 1h"),
    ],
)
def test_status_refuses_bad_values_before_connecting(
    capsys: pytest.CaptureFixture[str], args: list[str], needle: str,
) -> None:
    rc, err = _run_main(capsys, "status", *args, "--bootstrap-servers", "127.0.0.1:1")
    assert rc == 2 and needle in err and err.count("\n") == 1, err


def test_inspect_id_refuses_a_bad_id(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, err = _run_main(capsys, "inspect", str(tmp_path), "--id", "")
    assert rc == 2 and "bad value for --id" in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-delay", "-5s"], "flags: bad value for --max-delay: '-5s' is negative"),
        (["--commit-interval", "1000"], "flags: bad value for --commit-interval: '1000' has no unit"),
        (["--wheel-window", "1 h"], "flags: bad value for --wheel-window: '1 h' has a space"),
        (["--segment-bytes", "-1"], "flags: bad value for --segment-bytes: '-1' is negative"),
    ],
)
def test_run_refuses_bad_values(capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    rc, err = _run_main(capsys, "run", *args)
    assert rc == 2 and needle in err and err.count("\n") == 1


def test_dash_values_are_joined_only_when_not_an_option() -> None:
    p = build_parser()
    assert attach_dash_values(p, ["send", "--delay", "-5s", "--topic", "t"]) == ["send", "--delay=-5s", "--topic", "t"]
    # a missing value stays missing (argparse then says "expected one argument")
    assert attach_dash_values(p, ["send", "--delay", "--topic", "t"]) == ["send", "--delay", "--topic", "t"]
    assert attach_dash_values(p, ["send", "--json", "--delay", "5s"]) == ["send", "--json", "--delay", "5s"]
    assert attach_dash_values(p, ["run", "--max-delay", "-1d"]) == ["run", "--max-delay=-1d"]
    assert attach_dash_values(p, ["send", "--", "--delay", "-5s"]) == ["send", "--", "--delay", "-5s"]
    with pytest.raises(SystemExit):
        p.parse_args(attach_dash_values(p, ["send", "--topic", "t", "--value", "v", "--delay", "--json"]))


# ---- help text ------------------------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_option_of_every_subcommand_has_help() -> None:
    missing = []
    for name, sub in _subparsers(build_parser()).items():
        for action in sub._actions:
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"options without help: {missing}"


def test_run_help_shows_defaults_as_written() -> None:
    """Every duration/size default in ``run --help`` is in its written form (``400d``, not
    ``34560000000``) and is exactly what ``Settings`` holds once parsed."""
    run = _subparsers(build_parser())["run"]
    helps = {a.option_strings[0][2:]: a.help or "" for a in run._actions if a.option_strings}
    defaults = Settings()
    for opt in OPTIONS:
        shown = re.search(r"\(default: ([^()]*)\)$", helps[opt.name])
        assert shown, opt.name
        value = getattr(defaults, opt.attr)
        if opt.metavar == "DURATION":
            assert re.fullmatch(r"[0-9]+(ms|s|m|h|d)", shown.group(1)), (opt.name, shown.group(1))
            assert parse_duration_ms(shown.group(1)) == value
        elif opt.metavar == "DURATIONS":
            assert tuple(parse_duration_list(shown.group(1))) == value
        elif opt.metavar == "SIZE":
            assert parse_size(shown.group(1)) == value
    env = {**os.environ, "COLUMNS": "250"}  # argparse breaks long words at hyphens when it wraps
    text = " ".join(subprocess.run([sys.executable, "-m", "sidecar", "run", "--help"], capture_output=True,
                                   text=True, check=True, env=env).stdout.split())
    assert "--max-delay DURATION longest accepted delay; beyond -> DLQ delay-out-of-range (default: 400d)" in text
    assert "(default: 64MiB)" in text and "a duration is an integer directly followed by" in text
    for opt in OPTIONS:  # the same, read from what the user sees
        m = re.search(rf"--{opt.name} {re.escape(opt.metavar)} .*?\(default: ([^)]*)\)", text)
        assert m, opt.name
        if opt.metavar == "DURATION":
            assert re.fullmatch(r"[0-9]+(ms|s|m|h|d)", m.group(1)), (opt.name, m.group(1))
            assert m.group(1) != str(getattr(defaults, opt.attr)), opt.name
