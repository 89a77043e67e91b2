"""The wire contract (docs/design.md 1): header names and DLQ reason codes.

These strings are the user-facing API. Never rename one; add new ones beside them.
"""

from __future__ import annotations

from typing import Final

# Every Prometheus series the sidecar exports starts with this (dashboards and alerts name them).
METRIC_PREFIX: Final = "delay_sidecar_"


def restore_group(group_id: str) -> str:
    """The group the changelog reader names (never joined; librdkafka looks its coordinator up):
    ACLs grant Describe on it (sidecar/acls.py)."""
    return f"{group_id}.restore"

# -- ingress control headers -------------------------------------------------------------------
# Every header whose name starts with PREFIX belongs to the sidecar: an ingress record carrying one
# that is neither a control header nor in PASS_THROUGH goes to the DLQ as bad-header (a typo, or a
# producer newer than the sidecar, must never turn a schedule into an immediate delivery).
PREFIX: Final = "delay."
TARGET_TOPIC: Final = "delay.target-topic"
DELAY_MS: Final = "delay.ms"
DELIVER_AT: Final = "delay.deliver-at"
LEVEL: Final = "delay.level"
TARGET_PARTITION: Final = "delay.target-partition"
ID: Final = "delay.id"
CANCEL: Final = "delay.cancel"
REPLACE: Final = "delay.replace"  # "true": replace the pending record with this delay.id (reschedule)
REPLACE_VALUES: Final = (b"true", b"false")
RETRY_COUNT: Final = "delay.retry-count"

# etf1/kafka-message-scheduler compatibility (accepted as an alternative on ingress). A repeated
# one counts by its first occurrence, as etf1's Schedule.getHeaderValue reads it.
KMS_EPOCH: Final = "scheduler-epoch"
KMS_TARGET_TOPIC: Final = "scheduler-target-topic"
KMS_TARGET_KEY: Final = "scheduler-target-key"
# ... and the headers it adds to a delivered record (its README, "Triggered message"): the
# schedule record's timestamp (epoch seconds), key (the schedule id) and topic (our ingress topic)
KMS_TIMESTAMP: Final = "scheduler-timestamp"
KMS_KEY: Final = "scheduler-key"
KMS_TOPIC: Final = "scheduler-topic"
KMS_ADDED: Final = (KMS_TIMESTAMP, KMS_KEY, KMS_TOPIC)

# -- headers the sidecar adds on delivery ------------------------------------------------------
ENQUEUED_AT: Final = "delay.enqueued-at"
SOURCE: Final = "delay.source"
# Headers a delivered firing carries, beside those of any delivered record (delay.deliver-at is
# the firing's nominal time). Consumers deduplicate firings on (delay.id, delay.fire-time).
FIRE_TIME: Final = "delay.fire-time"  # the firing's nominal time, epoch ms UTC
FIRE_SEQ: Final = "delay.fire-seq"  # 1 for the first firing, then 2, 3, ...
NEXT_AT: Final = "delay.next-at"  # the next firing's nominal time; absent after the last
MISSED: Final = "delay.missed"  # after a misfire: how many earlier nominal times this one stands for
FIRING_HEADERS: Final = (FIRE_TIME, FIRE_SEQ, NEXT_AT, MISSED)

# Removed from delivered records (delay.id stays; deliver-at and retry-count are re-added).
# A firing's own headers (above) are accepted on ingress and do nothing, like delay.enqueued-at: a
# delivered firing sent back (a retry library, a redrive) is a one-shot record.
CONTROL_HEADERS: Final = frozenset(
    {TARGET_TOPIC, DELAY_MS, DELIVER_AT, LEVEL, TARGET_PARTITION, CANCEL, REPLACE, RETRY_COUNT,
     ENQUEUED_AT, SOURCE, KMS_EPOCH, KMS_TARGET_TOPIC, KMS_TARGET_KEY,
     *FIRING_HEADERS}
)

# -- dead-letter headers -----------------------------------------------------------------------
DLQ_REASON: Final = "delay.dlq.reason"
DLQ_ERROR: Final = "delay.dlq.error"
DLQ_SOURCE_TOPIC: Final = "delay.dlq.source-topic"
DLQ_SOURCE_PARTITION: Final = "delay.dlq.source-partition"
DLQ_SOURCE_OFFSET: Final = "delay.dlq.source-offset"
DLQ_ATTEMPTS: Final = "delay.dlq.attempts"
DLQ_PREFIX: Final = "delay.dlq."  # every dead-letter header starts with it; a redrive removes them all

# -- DLQ redrive (sidecar/dlq.py) --------------------------------------------------------------
# On every record `delay-sidecar dlq redrive` re-sends: <dlq-topic>:<partition>:<offset> of the
# dead letter it came from. An ordinary header on ingress, so a redriven record keeps it on delivery.
REDRIVE_ID: Final = "delay.redrive-id"

# delay.* headers accepted on ingress that control nothing: they reach the target as they are
# (a redriven record's id, and the headers of a dead letter sent back by hand)
PASS_THROUGH: Final = frozenset(
    {REDRIVE_ID, DLQ_REASON, DLQ_ERROR, DLQ_SOURCE_TOPIC, DLQ_SOURCE_PARTITION, DLQ_SOURCE_OFFSET, DLQ_ATTEMPTS}
)

# -- DLQ reason codes (stable machine codes) ---------------------------------------------------
BAD_HEADER: Final = "bad-header"
CONFLICTING_DELAY: Final = "conflicting-delay"
DELAY_OUT_OF_RANGE: Final = "delay-out-of-range"
UNKNOWN_LEVEL: Final = "unknown-level"
MISSING_TARGET: Final = "missing-target"
TARGET_IS_INTERNAL: Final = "target-is-internal"
TOO_LARGE: Final = "too-large"
DELIVERY_FAILED: Final = "delivery-failed"
RETRIES_EXHAUSTED: Final = "retries-exhausted"
QUOTA_EXCEEDED: Final = "quota-exceeded"  # over the tenant's max-pending or max-disk-bytes (store/quota.py)
NOT_AUTHORIZED: Final = "not-authorized"  # the broker refused the delivery's principal Write on the target

ONE_SHOT_REASONS: Final = (
    BAD_HEADER, CONFLICTING_DELAY, DELAY_OUT_OF_RANGE, UNKNOWN_LEVEL, MISSING_TARGET,
    TARGET_IS_INTERNAL, TOO_LARGE, DELIVERY_FAILED, RETRIES_EXHAUSTED, QUOTA_EXCEEDED, NOT_AUTHORIZED,
)

MAX_ID_BYTES: Final = 255

# -- recurring schedules (sidecar/recurring/; docs/design.md "Recurring schedules") -------------
# Ingress headers of a recurring record (with delay.id): delay.cron or delay.every, and options.
CRON: Final = "delay.cron"  # 5 or 6 fields (seconds first), or an @alias
EVERY: Final = "delay.every"  # interval in ms, an integer >= MIN_EVERY_MS; first firing at the start
TZ: Final = "delay.tz"  # IANA zone name (cron only; default UTC)
START: Final = "delay.start"  # epoch ms; default the ingress record's timestamp
END: Final = "delay.end"  # epoch ms, inclusive: no firing after it
MAX_COUNT: Final = "delay.max-count"  # at most this many firings
MISFIRE: Final = "delay.misfire"
MISFIRE_FIRE_ONCE: Final = "fire-once"  # after missed firings: one firing, the latest missed time
MISFIRE_SKIP: Final = "skip"  # after missed firings: none until the next time
MISFIRE_VALUES: Final = (MISFIRE_FIRE_ONCE, MISFIRE_SKIP)
MIN_EVERY_MS: Final = 1000
RECURRING_HEADERS: Final = (CRON, EVERY, TZ, START, END, MAX_COUNT, MISFIRE)

# A recurring record's state, kept in its stored headers only (never accepted on ingress, never
# delivered): the nominal time of the last firing made and how many were made.
STATE_LAST: Final = "delay.state.last-fire"
STATE_FIRED: Final = "delay.state.fired"

# DLQ reason codes for recurring records
BAD_CRON: Final = "bad-cron"  # delay.cron does not parse, or never matches
UNKNOWN_TIME_ZONE: Final = "unknown-time-zone"  # delay.tz is not a zone of the pinned tzdata
BAD_SCHEDULE: Final = "bad-schedule"  # an inconsistent combination (end before start, no firing at all, ...)
RECURRING_REASONS: Final = (BAD_CRON, UNKNOWN_TIME_ZONE, BAD_SCHEDULE)
REASONS: Final = (*ONE_SHOT_REASONS, *RECURRING_REASONS)
