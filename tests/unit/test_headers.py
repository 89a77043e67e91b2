"""The wire contract's validation: every reason code, the check order, and the accepted forms."""

from __future__ import annotations

import dataclasses
import re

import pytest

from sidecar import contract as c
from sidecar.config import DEFAULT_LEVELS, DEFAULT_RETRY_LADDER
from sidecar.durations import parse_duration_list
from sidecar.headers import Cancel, Rejection, Request, Rules, parse_ingress
from sidecar.retry.ladder import RetryLadder

LEVELS = tuple(parse_duration_list(DEFAULT_LEVELS))
RULES = Rules(
    ingress_topic="delay.ingress", dlq_topic="delay.dlq", levels_ms=LEVELS, max_delay_ms=400 * 86_400_000,
    retry_ladder=RetryLadder(tuple(parse_duration_list(DEFAULT_RETRY_LADDER)), 16), max_record_bytes=1000,
)
TS = 1_700_000_000_000
NOW = TS + 5


def parse(*headers: tuple[str, bytes | None], size: int = 10, rules: Rules = RULES) -> object:
    return parse_ingress(list(headers), TS, NOW, size, rules)


def reason(*headers: tuple[str, bytes | None], **kw: object) -> str:
    r = parse(*headers, **kw)  # type: ignore[arg-type]
    assert isinstance(r, Rejection), r
    assert r.error  # a human-readable explanation always comes with the code
    return r.reason


T = (c.TARGET_TOPIC, b"orders")


def test_delay_ms_is_relative_to_the_record_timestamp() -> None:
    r = parse(T, (c.DELAY_MS, b"1500"))
    assert isinstance(r, Request)
    assert (r.mode, r.due_ms, r.target_topic, r.target_partition, r.id) == ("ms", TS + 1500, "orders", -1, None)


def test_deliver_at_is_absolute_and_level_uses_the_table() -> None:
    r = parse(T, (c.DELIVER_AT, str(TS + 42).encode()))
    assert isinstance(r, Request) and (r.mode, r.due_ms) == ("at", TS + 42)
    r = parse(T, (c.LEVEL, b"3"))
    assert isinstance(r, Request) and (r.mode, r.level, r.due_ms) == ("level", 3, TS + 10_000)


def test_no_delay_header_means_due_now_and_past_due_is_accepted() -> None:
    r = parse(T)
    assert isinstance(r, Request) and (r.mode, r.due_ms) == ("now", TS)
    r = parse(T, (c.DELIVER_AT, b"5"))
    assert isinstance(r, Request) and r.due_ms == 5


def test_user_headers_pass_through_and_id_and_partition_are_read() -> None:
    r = parse(T, ("trace", b"abc"), (c.ID, b"order-1"), (c.TARGET_PARTITION, b"2"), ("empty", None))
    assert isinstance(r, Request)
    assert r.user_headers == (("trace", b"abc"), ("empty", None))
    assert (r.id, r.target_partition) == (b"order-1", 2)


def test_cancel_is_a_command_whatever_else_is_there() -> None:
    assert parse((c.CANCEL, b"order-1"), T, (c.DELAY_MS, b"x")) == Cancel(b"order-1")


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ((T, (c.DELAY_MS, b"\xff\xfe")), c.BAD_HEADER),
        ((T, (c.DELAY_MS, b"")), c.BAD_HEADER),
        ((T, (c.DELAY_MS, None)), c.BAD_HEADER),
        ((T, (c.DELAY_MS, b"12s")), c.BAD_HEADER),
        ((T, (c.DELAY_MS, b"+5")), c.BAD_HEADER),
        ((T, (c.DELAY_MS, b" 5")), c.BAD_HEADER),
        ((T, (c.DELAY_MS, b"5_000")), c.BAD_HEADER),
        ((T, (c.DELAY_MS, "٣".encode())), c.BAD_HEADER),  # a non-ASCII digit
        ((T, (c.ID, b"x" * 256)), c.BAD_HEADER),
        ((T, (c.ID, b"")), c.BAD_HEADER),
        ((T, (c.TARGET_PARTITION, b"-1")), c.BAD_HEADER),
        ((T, (c.TARGET_PARTITION, b"one")), c.BAD_HEADER),
        (((c.TARGET_TOPIC, b"bad topic!"),), c.BAD_HEADER),
        ((T, (c.DELAY_MS, b"1"), (c.DELAY_MS, b"2")), c.BAD_HEADER),
        (((c.CANCEL, b""),), c.BAD_HEADER),
        (((c.CANCEL, b"y" * 256),), c.BAD_HEADER),
        ((T, (c.DELAY_MS, b"1"), (c.LEVEL, b"1")), c.CONFLICTING_DELAY),
        ((T, (c.DELAY_MS, b"1"), (c.DELIVER_AT, b"1")), c.CONFLICTING_DELAY),
        ((T, (c.LEVEL, b"2"), (c.RETRY_COUNT, b"1")), c.CONFLICTING_DELAY),
        ((T, (c.DELAY_MS, b"-1")), c.DELAY_OUT_OF_RANGE),
        ((T, (c.DELAY_MS, str(401 * 86_400_000).encode())), c.DELAY_OUT_OF_RANGE),
        ((T, (c.DELIVER_AT, b"999999999999999999")), c.DELAY_OUT_OF_RANGE),
        # valid decimals too large for 64 bits: impossible values, not malformed headers
        ((T, (c.DELIVER_AT, b"99999999999999999999")), c.DELAY_OUT_OF_RANGE),
        ((T, (c.DELAY_MS, b"1" * 100_000)), c.DELAY_OUT_OF_RANGE),
        ((T, (c.DELAY_MS, b"-18446744073709551617")), c.DELAY_OUT_OF_RANGE),
        ((T, (c.LEVEL, b"18446744073709551617")), c.UNKNOWN_LEVEL),
        ((T, (c.RETRY_COUNT, b"18446744073709551617")), c.RETRIES_EXHAUSTED),
        ((T, (c.TARGET_PARTITION, b"18446744073709551617")), c.BAD_HEADER),
        ((T, (c.LEVEL, b"0")), c.UNKNOWN_LEVEL),
        ((T, (c.LEVEL, b"19")), c.UNKNOWN_LEVEL),
        ((T, (c.LEVEL, b"-3")), c.UNKNOWN_LEVEL),
        (((c.DELAY_MS, b"5"),), c.MISSING_TARGET),
        (((c.TARGET_TOPIC, None),), c.BAD_HEADER),
        (((c.TARGET_TOPIC, b"delay.ingress"),), c.TARGET_IS_INTERNAL),
        (((c.TARGET_TOPIC, b"delay.dlq"),), c.TARGET_IS_INTERNAL),
        (((c.TARGET_TOPIC, b"__consumer_offsets"),), c.TARGET_IS_INTERNAL),
        ((T, (c.RETRY_COUNT, b"17")), c.RETRIES_EXHAUSTED),
        ((T, (c.RETRY_COUNT, b"-2")), c.BAD_HEADER),
    ],
)
def test_reason_codes(headers: tuple[tuple[str, bytes | None], ...], expected: str) -> None:
    assert reason(*headers) == expected


def test_too_large_and_allowlist() -> None:
    assert reason(T, size=1001) == c.TOO_LARGE
    allow = dataclasses.replace(RULES, target_allowlist=(re.compile(r"orders\..*"),))
    assert reason(T, rules=allow) == c.TARGET_IS_INTERNAL
    assert isinstance(parse((c.TARGET_TOPIC, b"orders.eu"), rules=allow), Request)


def test_bad_encoding_wins_over_every_other_fault() -> None:
    # missing target AND conflicting delays AND a bad encoding: bad-header, always
    assert reason((c.DELAY_MS, b"1"), (c.LEVEL, b"\xff")) == c.BAD_HEADER


def test_retry_count_takes_the_ladder_step_and_the_last_step_repeats() -> None:
    r = parse(T, (c.RETRY_COUNT, b"1"))
    assert isinstance(r, Request) and (r.mode, r.due_ms, r.retry_count) == ("retry", TS + 10_000, 1)
    short = Rules(
        ingress_topic="i", dlq_topic="d", levels_ms=LEVELS, max_delay_ms=10**12,
        retry_ladder=RetryLadder((1000, 2000), 5), max_record_bytes=1000,
    )
    r = parse(T, (c.RETRY_COUNT, b"4"), rules=short)
    assert isinstance(r, Request) and r.due_ms == TS + 2000


def test_kafka_message_scheduler_headers_are_accepted() -> None:
    r = parse((c.KMS_TARGET_TOPIC, b"orders"), (c.KMS_EPOCH, b"1700000100"), (c.KMS_TARGET_KEY, b"k2"))
    assert isinstance(r, Request)
    assert (r.target_topic, r.due_ms, r.key_override, r.mode) == ("orders", 1_700_000_100_000, b"k2", "at")


def test_parser_never_raises_on_garbage() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    names = st.sampled_from([*sorted(c.CONTROL_HEADERS), c.ID, "x"])
    values = st.one_of(st.none(), st.binary(max_size=30), st.integers(-10**20, 10**20).map(lambda i: str(i).encode()))

    @given(st.lists(st.tuples(names, values), max_size=8), st.integers(0, 2000))
    def check(headers: list[tuple[str, bytes | None]], size: int) -> None:
        r = parse_ingress(headers, TS, NOW, size, RULES)
        assert isinstance(r, (Request, Cancel, Rejection))
        if isinstance(r, Rejection):
            assert r.reason in c.REASONS
        if isinstance(r, Request):
            assert r.due_ms >= 0 or r.mode == "at"

    check()


# -- unknown delay.* headers (issue: a typo or a newer producer must never mean "deliver now") ---------
RECURRING = ("delay.cron", "delay.every", "delay.tz", "delay.start", "delay.end", "delay.max-count", "delay.misfire")


@pytest.mark.parametrize("name", [c.STATE_LAST, c.STATE_FIRED, "delay.deliver_at", "delay.", "delay.DELAY-MS",
                                  "delay.é"])
def test_an_unknown_delay_header_is_bad_header_naming_it(name: str) -> None:
    for headers in (
        (T, (name, b"*/5 * * * *")),  # with a valid request: today it would be delivered at once
        ((name, None), T, (c.DELAY_MS, b"5")),  # first, with a null value
        ((c.CANCEL, b"order-1"), (name, b"1")),  # a cancel too: the whole record is not understood
        ((c.KMS_TARGET_TOPIC, b"orders"), (c.KMS_EPOCH, b"1700000100"), (name, b"1")),  # etf1 mode too
    ):
        r = parse(*headers)
        assert isinstance(r, Rejection), (headers, r)
        assert r.reason == c.BAD_HEADER and repr(name) in r.error, r.error


def test_unknown_header_wins_over_every_other_fault() -> None:
    r = parse((c.DELAY_MS, b"1"), (c.LEVEL, b"\xff"), ("delay.crons", b"@daily"), size=5000)
    assert isinstance(r, Rejection) and r.reason == c.BAD_HEADER and "delay.crons" in r.error


def test_other_prefixes_and_pass_through_headers_are_user_headers() -> None:
    user = (("delayed", b"1"), ("Delay.ms", b"x"), ("x-delay.cron", b"y"), (c.REDRIVE_ID, b"delay.dlq:0:7"),
            (c.DLQ_REASON, b"too-large"), (c.DLQ_ERROR, b"e"))
    r = parse(T, *user, (c.DELAY_MS, b"5"))
    assert isinstance(r, Request) and r.user_headers == user and r.due_ms == TS + 5


def test_every_delay_name_of_the_contract_is_known() -> None:
    """The contract module is the one list: each ``delay.*`` header it declares is a control header
    or passes through, so adding one there (and nowhere else) is enough for the parser and C."""
    from sidecar.headers import _CONTROL

    declared = {v for k, v in vars(c).items() if k.isupper() and isinstance(v, str) and v.startswith(c.PREFIX)}
    state = {c.STATE_LAST, c.STATE_FIRED}  # a stored recurring record's own: never accepted on ingress
    declared -= {c.PREFIX, c.DLQ_PREFIX, *state}
    assert declared and declared <= _CONTROL | c.PASS_THROUGH
    for name in sorted(declared):
        r = parse(T, (name, b"1"))
        assert not (isinstance(r, Rejection) and "unknown header" in r.error), name
    for name in sorted(state):
        r = parse(T, (name, b"1"))
        assert isinstance(r, Rejection) and "unknown header" in r.error, name
    assert set(RECURRING) == set(c.RECURRING_HEADERS)


def test_a_recurring_header_makes_a_recurring_request_the_store_arms() -> None:
    """The schedule's own checks are sidecar/recurring/spec.py's, made by the store when it arms
    it (store/firings.py); the parser only routes the record there, with its control headers."""
    for name in RECURRING:
        r = parse(T, (c.ID, b"job"), (name, b"x"), ("trace", b"1"))
        assert isinstance(r, Request) and r.mode == "recurring", (name, r)
        assert r.control is not None and r.control[name] == b"x" and r.user_headers == (("trace", b"1"),)
    r = parse(T, (c.EVERY, b"1000"), (c.RETRY_COUNT, b"1"))
    assert isinstance(r, Rejection) and r.reason == c.CONFLICTING_DELAY
    r = parse((c.KMS_TARGET_TOPIC, b"orders"), (c.KMS_EPOCH, b"1700000100"), (c.CRON, b"@daily"))
    assert isinstance(r, Rejection) and r.reason == c.BAD_SCHEDULE and c.KMS_TARGET_TOPIC in r.error


# -- kafka-message-scheduler (etf1) mode: repeated headers ---------------------------------------------
def test_a_repeated_etf1_header_counts_by_its_first_occurrence() -> None:
    """etf1 reads a header with schedule/kafka/schedule.go::

        func (s Schedule) getHeaderValue(key string) []byte {
            for i := 0; i < len(s.Headers); i++ {
                if s.Headers[i].Key == key {
                    return s.Headers[i].Value

    (used by ``Epoch()``, ``TargetTopic()`` and ``TargetKey()``): the first one wins, whatever
    follows. A retry library re-sending a delivered record with new scheduler-* headers in front
    relies on it. Every header stays on the delivered record, in order."""
    headers = [
        (c.KMS_EPOCH, b"1700000100"), (c.KMS_TARGET_TOPIC, b"orders"), (c.KMS_TARGET_KEY, b"k2"),
        ("customer-header", b"dummy"),
        (c.KMS_EPOCH, b"1700000999"), (c.KMS_TARGET_TOPIC, b"elsewhere"), (c.KMS_TARGET_KEY, b"old"),
        (c.KMS_TIMESTAMP, b"1600000000"), (c.KMS_KEY, b"old-id"), (c.KMS_TOPIC, b"schedules"),
    ]
    r = parse(*headers)
    assert isinstance(r, Request), r
    assert (r.target_topic, r.due_ms, r.key_override, r.kms) == ("orders", 1_700_000_100_000, b"k2", True)
    assert list(r.user_headers) == headers
    # a repeat of a delay.* control header with another value stays a fault: there is no etf1 rule
    assert reason(T, (c.DELAY_MS, b"1"), (c.DELAY_MS, b"2")) == c.BAD_HEADER


def test_etf1_mode_keeps_pass_through_drops_delay_control_headers() -> None:
    r = parse((c.KMS_TARGET_TOPIC, b"orders"), (c.ID, b"s1"), (c.REDRIVE_ID, b"d:0:1"), (c.KMS_EPOCH, b"1700000100"))
    assert isinstance(r, Request) and r.user_headers == (
        (c.KMS_TARGET_TOPIC, b"orders"), (c.REDRIVE_ID, b"d:0:1"), (c.KMS_EPOCH, b"1700000100"))
