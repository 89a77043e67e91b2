"""Delivery guarantees (docs/design.md 5): publish backoff, error classification, retry ladder.

Everything here is pure: clocks and random generators are passed in by the event loop.
"""

from sidecar.retry.backoff import Backoff, RandomSource
from sidecar.retry.errors import (
    DeadLetter,
    Decision,
    ErrorKind,
    KafkaErrorLike,
    PublishFailurePolicy,
    Retry,
    classify,
    describe,
    producer_must_restart,
)
from sidecar.retry.ladder import RetryLadder

__all__ = [
    "Backoff",
    "DeadLetter",
    "Decision",
    "ErrorKind",
    "KafkaErrorLike",
    "PublishFailurePolicy",
    "RandomSource",
    "Retry",
    "RetryLadder",
    "classify",
    "describe",
    "producer_must_restart",
]
