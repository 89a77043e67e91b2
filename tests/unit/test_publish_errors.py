"""Publish error classification and the retry-or-dead-letter policy (pure, fake clock)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from hypothesis import given
from hypothesis import strategies as st

from sidecar.config import Settings
from sidecar.contract import DELIVERY_FAILED, REASONS
from sidecar.retry import (
    Backoff,
    DeadLetter,
    ErrorKind,
    PublishFailurePolicy,
    Retry,
    classify,
    describe,
    producer_must_restart,
)
from sidecar.retry import errors as errors_mod
from sidecar.retry.errors import MISSING_TARGET_CODES, PERMANENT_CODES, RETRIABLE_CODES

E = KafkaError


@pytest.mark.parametrize(
    "code", [E._UNKNOWN_TOPIC, E.UNKNOWN_TOPIC_OR_PART, E._UNKNOWN_PARTITION]
)
def test_missing_target(code: int) -> None:
    assert classify(E(code)) is ErrorKind.MISSING_TARGET
    # the table decides, whatever librdkafka's flag says
    assert classify(E(code, retriable=True)) is ErrorKind.MISSING_TARGET


@pytest.mark.parametrize(
    "code",
    [
        E.MSG_SIZE_TOO_LARGE,
        E.INVALID_MSG_SIZE,
        E.RECORD_LIST_TOO_LARGE,
        E.INVALID_RECORD,
        E.TOPIC_AUTHORIZATION_FAILED,
        E.CLUSTER_AUTHORIZATION_FAILED,
        E._INVALID_ARG,
        E.TOPIC_EXCEPTION,  # Java: InvalidTopicException
        E.INVALID_TIMESTAMP,
        E.POLICY_VIOLATION,
    ],
)
def test_permanent(code: int) -> None:
    assert classify(E(code)) is ErrorKind.PERMANENT
    assert classify(E(code, retriable=True)) is ErrorKind.PERMANENT


@pytest.mark.parametrize(
    "code",
    [
        E._MSG_TIMED_OUT,
        E._TRANSPORT,
        E._ALL_BROKERS_DOWN,
        E.NOT_ENOUGH_REPLICAS,
        E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        E.REQUEST_TIMED_OUT,
        E.LEADER_NOT_AVAILABLE,
        E.NOT_LEADER_FOR_PARTITION,
        E._TIMED_OUT,
        E.NETWORK_EXCEPTION,
        E._QUEUE_FULL,
        E._PURGE_QUEUE,
        E._PURGE_INFLIGHT,
        E._FATAL,
        E.OUT_OF_ORDER_SEQUENCE_NUMBER,
        E._AUTHENTICATION,
    ],
)
def test_retriable(code: int) -> None:
    # KafkaError(code) carries retriable=False: the table, not the flag, makes these retriable
    assert not E(code).retriable()
    assert classify(E(code)) is ErrorKind.RETRIABLE


def test_unknown_codes_follow_the_flags() -> None:
    code = E.UNSUPPORTED_VERSION
    assert code not in MISSING_TARGET_CODES | PERMANENT_CODES | RETRIABLE_CODES
    assert classify(E(code)) is ErrorKind.PERMANENT
    assert classify(E(code, retriable=True)) is ErrorKind.RETRIABLE
    assert classify(E(code, fatal=True)) is ErrorKind.RETRIABLE  # the producer is dead, not the record


def test_tables_are_disjoint_and_resolved() -> None:
    assert not MISSING_TARGET_CODES & PERMANENT_CODES
    assert not MISSING_TARGET_CODES & RETRIABLE_CODES
    assert not PERMANENT_CODES & RETRIABLE_CODES
    assert len(MISSING_TARGET_CODES) == 3
    assert E.MSG_SIZE_TOO_LARGE in PERMANENT_CODES


def test_look_alike_errors_are_accepted() -> None:
    class Fake:
        def __init__(self, code: int, retriable: bool = False) -> None:
            self._code, self._retriable = code, retriable

        def code(self) -> int:
            return self._code

        def retriable(self) -> bool:
            return self._retriable

        def fatal(self) -> bool:
            return False

    assert classify(Fake(E._UNKNOWN_TOPIC)) is ErrorKind.MISSING_TARGET
    assert classify(Fake(12345, retriable=True)) is ErrorKind.RETRIABLE
    assert classify(Fake(12345)) is ErrorKind.PERMANENT
    assert describe(Fake(12345)).startswith("UNKNOWN_CODE (12345): ")


def test_producer_must_restart() -> None:
    assert producer_must_restart(E(E._FATAL))
    assert producer_must_restart(E(E.OUT_OF_ORDER_SEQUENCE_NUMBER, fatal=True))
    assert not producer_must_restart(E(E._MSG_TIMED_OUT))


def test_describe() -> None:
    assert describe(E(E._MSG_TIMED_OUT)) == "_MSG_TIMED_OUT (-192): Local: Message timed out"
    text = describe(E(E.UNKNOWN_TOPIC_OR_PART, "no such topic: t"))
    assert text == "UNKNOWN_TOPIC_OR_PART (3): no such topic: t"


# -- policy ----------------------------------------------------------------------------------

class Top:
    """An rng that always picks the top of the range: delay == ceiling."""

    def randint(self, a: int, b: int) -> int:
        return b


POLICY = PublishFailurePolicy(backoff=Backoff(base_ms=100, cap_ms=30_000), grace_ms=60_000, max_attempts=5)
T0 = 1_700_000_000_000


def test_retriable_retries_forever_with_capped_backoff() -> None:
    assert POLICY.decide(ErrorKind.RETRIABLE, 1, T0, T0, Top()) == Retry(T0 + 100)
    assert POLICY.decide(ErrorKind.RETRIABLE, 3, T0, T0 + 5, Top()) == Retry(T0 + 5 + 400)
    # a week of failures, a million attempts: still Retry, never more than the cap away
    now = T0 + 7 * 86_400_000
    assert POLICY.decide(ErrorKind.RETRIABLE, 1_000_000, T0, now, Top()) == Retry(now + 30_000)


def test_missing_target_waits_for_grace_then_dead_letters() -> None:
    assert POLICY.decide(ErrorKind.MISSING_TARGET, 1, T0, T0, Top()) == Retry(T0 + 100)
    # near the end of the grace period the retry is clamped to the deadline
    assert POLICY.decide(ErrorKind.MISSING_TARGET, 12, T0, T0 + 59_000, Top()) == Retry(T0 + 60_000)
    error = "UNKNOWN_TOPIC_OR_PART (3): x"
    d = POLICY.decide(ErrorKind.MISSING_TARGET, 13, T0, T0 + 60_000, Top(), error=error)
    assert isinstance(d, DeadLetter)
    assert d.reason == DELIVERY_FAILED == "delivery-failed"
    assert d.reason in REASONS
    assert "60000 ms" in d.error and "UNKNOWN_TOPIC_OR_PART" in d.error


def test_missing_target_with_zero_grace_dead_letters_at_once() -> None:
    p = PublishFailurePolicy(grace_ms=0, max_attempts=5)
    assert isinstance(p.decide(ErrorKind.MISSING_TARGET, 1, T0, T0, Top()), DeadLetter)


def test_permanent_dead_letters_after_max_attempts() -> None:
    decisions = [POLICY.decide(ErrorKind.PERMANENT, n, T0, T0, Top()) for n in range(1, 7)]
    assert decisions[:4] == [Retry(T0 + 100), Retry(T0 + 200), Retry(T0 + 400), Retry(T0 + 800)]
    assert all(isinstance(d, DeadLetter) for d in decisions[4:])
    assert "after 5 attempts" in decisions[4].error  # type: ignore[union-attr]


def test_from_settings() -> None:
    p = PublishFailurePolicy.from_settings(Settings(delivery_grace_ms=5_000, delivery_attempts=3))
    assert (p.grace_ms, p.max_attempts, p.backoff) == (5_000, 3, Backoff())


def test_attempt_is_one_based() -> None:
    with pytest.raises(ValueError):
        POLICY.decide(ErrorKind.RETRIABLE, 0, T0, T0, Top())


@given(
    kind=st.sampled_from(list(ErrorKind)),
    attempt=st.integers(min_value=1, max_value=10_000),
    elapsed=st.integers(min_value=0, max_value=10**9),
    grace=st.integers(min_value=0, max_value=10**7),
    max_attempts=st.integers(min_value=1, max_value=50),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_policy_properties(
    kind: ErrorKind, attempt: int, elapsed: int, grace: int, max_attempts: int, seed: int
) -> None:
    p = PublishFailurePolicy(backoff=Backoff(), grace_ms=grace, max_attempts=max_attempts)
    now = T0 + elapsed
    d = p.decide(kind, attempt, T0, now, random.Random(seed))
    if kind is ErrorKind.RETRIABLE:
        expect_dlq = False
    elif kind is ErrorKind.MISSING_TARGET:
        expect_dlq = elapsed >= grace
    else:
        expect_dlq = attempt >= max_attempts
    if expect_dlq:
        assert isinstance(d, DeadLetter) and d.reason == DELIVERY_FAILED
    else:
        assert isinstance(d, Retry)
        # never in the past, never more than the backoff cap away
        assert now <= d.at_ms <= now + p.backoff.cap_ms
        if kind is ErrorKind.MISSING_TARGET:
            assert d.at_ms <= T0 + grace
    # deterministic for a seeded rng
    assert d == p.decide(kind, attempt, T0, now, random.Random(seed))


def test_code_table_matches_the_installed_client() -> None:
    """sidecar/retry/codes.py copies librdkafka's numbers so the policy needs no client import:
    every entry must be the installed confluent-kafka's value under the same name."""
    from sidecar.retry.codes import CODES

    wrong = {n: (v, getattr(KafkaError, n, None)) for n, v in CODES.items() if getattr(KafkaError, n, None) != v}
    assert not wrong
    assert "import confluent_kafka" not in (src := Path(errors_mod.__file__).read_text())
    assert "from confluent_kafka" not in src
