"""Ingress header parsing and validation (docs/design.md 1) — a pure function.

``parse_ingress`` turns one ingress record's headers into exactly one of:

- ``Cancel(id)`` — the record is a command (``delay.cancel``),
- ``Request(...)`` — a message to schedule, with its *requested* due time (``replace``: it takes
  the place of the pending record with its id, ``delay.replace: true`` or kafka-message-scheduler
  mode, where the record key is the id: see ``Intake.schedule``, store/intake.py),
- ``Rejection(reason, error)`` — bad input, bound for the DLQ with a stable reason code.

``kms_delete`` recognises a kafka-message-scheduler delete (a tombstone keyed by the schedule id)
and the tombstone such a scheduler writes back after a delivery (``AfterDelivery``: it deletes
nothing, see its docstring).

Every ``delay.*`` header belongs to the contract: one the sidecar does not know (neither a control
header nor ``contract.PASS_THROUGH``) is ``bad-header``, named in the error, whatever else the
record carries (a cancel too). The C fast path never decides such a record: it hands back every
record with a ``delay.*`` header it does not handle itself, so this parser rejects it.

kafka-message-scheduler mode (``scheduler-target-topic`` and no ``delay.target-topic``) follows
etf1: a repeated ``scheduler-*`` header counts by its first occurrence (etf1's
``Schedule.getHeaderValue``), and the delivered record keeps every header of the schedule record,
the ``scheduler-*`` ones included, in order (etf1's ``produceTargetMessage`` copies
``msg.Headers`` and appends its own three: ``PartitionStore._kms_id``).

It never raises on user input. The check order is fixed so that a record with several faults
always gets the same reason: an unknown ``delay.*`` header, then decoding (``bad-header``) -> size
(``too-large``) -> target (``missing-target``, ``target-is-internal``) -> delay headers
(``conflicting-delay``, ``unknown-level``, ``delay-out-of-range``, ``retries-exhausted``).

Numbers are strict ASCII decimal integers (``int()`` would also take ``"+5"``, ``" 5"``,
``"5_000"`` and non-ASCII digits, which the contract does not allow).

The scheduler-specific rounding (levels round a delay up to the next level; the wheel rounds up to
its precision) happens later, in the scheduler's planner: this module only says what was asked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sidecar import contract as c
from sidecar.retry.ladder import RetryLadder
from sidecar.store.codec import NATIVE
from sidecar.store.codec import native as _native

if TYPE_CHECKING:
    from sidecar.store.quota import Quota

_INT = re.compile(rb"^-?[0-9]+\Z")
_HUGE = 10**19  # stands for a decimal too long for 64 bits: beyond every range checked below
_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}\Z")
# Latest due time the store's fields and every consumer's date library can hold: 9999-12-31.
MAX_EPOCH_MS = 253_402_300_799_999

HeaderList = Sequence[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class Rules:
    ingress_topic: str
    dlq_topic: str
    levels_ms: tuple[int, ...]
    max_delay_ms: int
    retry_ladder: RetryLadder  # consumer retries: delay.retry-count -> delay, or exhausted
    max_record_bytes: int
    target_allowlist: tuple[re.Pattern[str], ...] = ()
    internal_topics: frozenset[str] = frozenset()  # the sidecar's other topics (every tenant's: sidecar/tenants.py)
    checked_targets: set[str] = field(default_factory=set, init=False, compare=False, repr=False)  # accepted
    quota: Quota | None = field(default=None, compare=False, repr=False)  # the tenant's (store/quota.py)


@dataclass(slots=True)
class Request:
    target_topic: str
    target_partition: int  # -1: let the producer's partitioner choose (by key)
    id: bytes | None  # None: the sidecar's default <topic>:<partition>:<offset>
    due_ms: int  # requested due time (epoch ms); <= now means due now
    mode: str  # "now" | "ms" | "at" | "level" | "retry" | "recurring" (due_ms: the record's timestamp)
    level: int  # 1-based level for mode "level" (0 otherwise)
    retry_count: int  # 0 unless a consumer retry
    key_override: bytes | None  # scheduler-target-key (kafka-message-scheduler compatibility)
    user_headers: tuple[tuple[str, bytes | None], ...]  # headers to pass through
    replace: bool = False  # delay.replace: true (or kafka-message-scheduler mode): replaces a pending id
    kms: bool = False  # kafka-message-scheduler mode: the record key is the id (Intake.schedule)
    # mode "recurring": the record's control headers, for sidecar.recurring.spec (store/firings.py)
    control: dict[str, bytes | None] | None = None


@dataclass(slots=True)
class Cancel:
    id: bytes


@dataclass(slots=True)
class Rejection:
    reason: str
    error: str


@dataclass(slots=True)
class AfterDelivery:
    """The tombstone an etf1-style scheduler writes back to the schedules topic once it delivered
    a schedule (null value, the schedule id as key, the delivered record's headers, so with
    ``scheduler-key``): etf1's handler.go ``produceTombstoneMessageForOriginalSchedule``, and the
    sidecar's own with ``etf1-tombstones: on`` (sidecar/engine/etf1.py). It only keeps a compacted
    schedules topic bounded: the schedule it names was delivered, and a newer schedule under the
    same key that arrived meanwhile must stay, so the intake skips it."""

    id: bytes


Parsed = Request | Cancel | Rejection


class _Bad(Exception):
    def __init__(self, reason: str, error: str) -> None:
        super().__init__(error)
        self.reason = reason
        self.error = error


def _text(name: str, raw: bytes | None) -> str:
    if raw is None or raw == b"":
        raise _Bad(c.BAD_HEADER, f"header {name} is empty")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _Bad(c.BAD_HEADER, f"header {name} is not valid UTF-8") from None


def _int(name: str, raw: bytes | None) -> int:
    if raw is not None and raw.isdigit() and len(raw) <= 18:
        return int(raw)  # the common case: bytes.isdigit() is ASCII digits only
    if raw is None or raw == b"":
        raise _Bad(c.BAD_HEADER, f"header {name} is empty")
    if not _INT.match(raw):
        shown = raw[:40].decode("utf-8", "replace")
        raise _Bad(c.BAD_HEADER, f"header {name} is not a decimal integer: {shown!r}")
    if len(raw.lstrip(b"-")) > 18:
        # a valid decimal with an impossible value (the range checks reject it with their own
        # reason, e.g. delay-out-of-range), never converted: a megabyte of digits costs nothing
        return -_HUGE if raw.startswith(b"-") else _HUGE
    return int(raw)


def _check_target(topic: str, rules: Rules) -> None:
    """Raise ``_Bad`` for a target the rules refuse. A target is checked once, then remembered
    (a workload has few targets; the check is a regex and the allowlist)."""
    known = rules.checked_targets
    if topic in known:
        return
    _check_target_uncached(topic, rules)
    if len(known) >= 10_000:
        known.clear()
    known.add(topic)


def _check_target_uncached(topic: str, rules: Rules) -> None:
    if not _TOPIC.match(topic):
        raise _Bad(c.BAD_HEADER, f"target topic {topic[:60]!r} is not a legal Kafka topic name")
    if topic in (rules.ingress_topic, rules.dlq_topic) or topic in rules.internal_topics or topic.startswith("__"):
        raise _Bad(c.TARGET_IS_INTERNAL, f"target topic {topic!r} is internal to Kafka or the sidecar")
    if rules.target_allowlist and not any(p.fullmatch(topic) for p in rules.target_allowlist):
        raise _Bad(c.TARGET_IS_INTERNAL, f"target topic {topic!r} is not in the target allowlist")


def record_size(key: bytes | None, value: bytes | None, headers: HeaderList | None) -> int:
    n = len(key or b"") + len(value or b"")
    for name, v in headers or ():
        n += len(name) + len(v or b"")
    return n


def parse_ingress(
    headers: HeaderList | None,
    timestamp_ms: int,
    now_ms: int,
    size: int,
    rules: Rules,
    *,
    headers_in_size: bool = True,
) -> Parsed:
    """Classify one ingress record. ``timestamp_ms`` is the record's Kafka timestamp (the base of
    ``delay.ms``, ``delay.level`` and retry delays); ``now_ms`` bounds ``max-delay``. ``size`` is
    ``record_size(key, value, headers)``, or only the key and value bytes with
    ``headers_in_size=False`` (the headers are then counted here, in the same pass)."""
    try:
        return _parse(headers or (), timestamp_ms, now_ms, size, rules, not headers_in_size)
    except _Bad as bad:
        return Rejection(bad.reason, bad.error)


_CONTROL = frozenset((*c.CONTROL_HEADERS, *c.RECURRING_HEADERS, c.ID))
_KMS_FIRST = frozenset((c.KMS_EPOCH, c.KMS_TARGET_TOPIC, c.KMS_TARGET_KEY))  # repeated: the first counts (etf1)
_PREFIX = c.PREFIX
_DELAY_CONTROL = frozenset(n for n in _CONTROL if n.startswith(_PREFIX))


def _unknown(name: str) -> _Bad:
    shown = name[:80]
    return _Bad(c.BAD_HEADER, f"unknown header {shown!r}: delay.* headers are the sidecar's, and this one is "
                "not in its contract (a typo, or a producer newer than the sidecar)")


# User header names already found not to be unknown delay.* ones: a workload has few names, and a
# set lookup costs less than the prefix test (a method call) on every header of every record.
_USER_NAMES: set[str] = set()


def _user_name(name: str) -> None:
    """Raise ``_Bad`` for an unknown ``delay.*`` name; else remember ``name`` as a user header."""
    if name.startswith(_PREFIX) and name not in c.PASS_THROUGH:
        raise _unknown(name)
    if len(_USER_NAMES) >= 10_000:
        _USER_NAMES.clear()
    _USER_NAMES.add(name)


def _check_recurring(control: dict[str, bytes | None], kms: bool) -> None:
    """What the parser refuses of a recurring record; the rest is sidecar/recurring/spec.py's."""
    if kms:
        raise _Bad(c.BAD_SCHEDULE, f"{c.KMS_TARGET_TOPIC} beside a recurring header: etf1 schedules are one-shot "
                   f"(use {c.TARGET_TOPIC})")
    if c.RETRY_COUNT in control:
        raise _Bad(c.CONFLICTING_DELAY, f"{c.RETRY_COUNT} beside a recurring header: a record is one-shot or recurring")


def _parse(headers: HeaderList, ts: int, now: int, size: int, rules: Rules, count_headers: bool) -> Parsed:
    control: dict[str, bytes | None] = {}
    user: list[tuple[str, bytes | None]] = []
    for name, value in headers:
        if count_headers:
            size += len(name) + (0 if value is None else len(value))
        if name in _CONTROL:
            if name in control:
                if name in _KMS_FIRST:
                    continue
                if control[name] != value:
                    raise _Bad(c.BAD_HEADER, f"header {name} appears more than once with different values")
            control[name] = value
        else:
            if name not in _USER_NAMES:
                _user_name(name)
            user.append((name, value))

    if c.CANCEL in control:
        target_id = _text(c.CANCEL, control[c.CANCEL]).encode()
        if len(target_id) > c.MAX_ID_BYTES:
            raise _Bad(c.BAD_HEADER, f"header {c.CANCEL} is over {c.MAX_ID_BYTES} bytes")
        return Cancel(target_id)

    # Decode every control header first so that a bad encoding always wins as the reason.
    for name, raw in control.items():
        if not raw or not raw.isascii():
            _text(name, raw)  # raises for an empty or non-UTF-8 value (valid non-ASCII passes)

    if size > rules.max_record_bytes:
        raise _Bad(c.TOO_LARGE, f"record is {size} bytes, over the limit of {rules.max_record_bytes}")

    key_override: bytes | None = None
    kms = c.TARGET_TOPIC not in control and c.KMS_TARGET_TOPIC in control
    raw_topic = control.get(c.KMS_TARGET_TOPIC if kms else c.TARGET_TOPIC)
    topic = raw_topic.decode() if raw_topic else None
    if not topic:
        raise _Bad(c.MISSING_TARGET, f"no {c.TARGET_TOPIC} header")
    _check_target(topic, rules)

    partition = -1
    if c.TARGET_PARTITION in control:
        partition = _int(c.TARGET_PARTITION, control[c.TARGET_PARTITION])
        if partition < 0 or partition > 1_000_000:
            raise _Bad(c.BAD_HEADER, f"header {c.TARGET_PARTITION} is not a partition number: {partition}")

    replace = False
    if c.REPLACE in control:
        raw = control[c.REPLACE]
        if raw not in c.REPLACE_VALUES:
            shown = (raw or b"")[:40].decode("utf-8", "replace")
            raise _Bad(c.BAD_HEADER, f"header {c.REPLACE} is {shown!r}; accepted: true, false")
        replace = raw == b"true"
        if replace and c.ID not in control and not kms:
            raise _Bad(c.BAD_HEADER, f"header {c.REPLACE}: true needs {c.ID} (the id of the record it replaces)")

    rid: bytes | None = None
    if c.ID in control:
        rid = control[c.ID] or b""  # validated above: valid UTF-8, as given
        if len(rid) > c.MAX_ID_BYTES:
            raise _Bad(c.BAD_HEADER, f"header {c.ID} is over {c.MAX_ID_BYTES} bytes")

    if any(name in control for name in c.RECURRING_HEADERS):
        _check_recurring(control, kms)  # the schedule's own checks: the store's, when it arms it
        return Request(topic, partition, rid, ts, "recurring", 0, 0, None, tuple(user), replace, False, control)
    given: list[str] = [h for h in (c.DELAY_MS, c.DELIVER_AT, c.LEVEL) if h in control]
    if kms and c.KMS_EPOCH in control:
        given.append(c.KMS_EPOCH)
        if c.KMS_TARGET_KEY in control:
            key_override = control[c.KMS_TARGET_KEY] or b""
    retry = 0
    if c.RETRY_COUNT in control:
        retry = _int(c.RETRY_COUNT, control[c.RETRY_COUNT])
        if retry < 0:
            raise _Bad(c.BAD_HEADER, f"header {c.RETRY_COUNT} is negative: {retry}")
    if len(given) > 1 or (given and retry > 0):
        names = [*given, c.RETRY_COUNT] if retry > 0 else given
        raise _Bad(c.CONFLICTING_DELAY, f"more than one delay header: {', '.join(names)}")

    mode, level, due = "now", 0, ts
    if retry > 0:
        step = rules.retry_ladder.delay_for(retry)
        if step is None:
            raise _Bad(
                c.RETRIES_EXHAUSTED, f"retry {retry} is beyond max-retries {rules.retry_ladder.max_retries}"
            )
        mode, due = "retry", ts + step
    elif given:
        h = given[0]
        n = _int(h, control[h])
        if h == c.DELAY_MS:
            if n < 0:
                raise _Bad(c.DELAY_OUT_OF_RANGE, f"{c.DELAY_MS} is negative: {n}")
            mode, due = "ms", ts + n
        elif h == c.DELIVER_AT:
            mode, due = "at", n
        elif h == c.KMS_EPOCH:
            mode, due = "at", n * 1000
        else:
            if not 1 <= n <= len(rules.levels_ms):
                raise _Bad(c.UNKNOWN_LEVEL, f"{c.LEVEL} {n} is outside 1..{len(rules.levels_ms)}")
            mode, level, due = "level", n, ts + rules.levels_ms[n - 1]
    if due > MAX_EPOCH_MS or due - max(now, ts) > rules.max_delay_ms:
        raise _Bad(c.DELAY_OUT_OF_RANGE, f"due time {due} is beyond the maximum delay of {rules.max_delay_ms} ms")
    if kms:  # the record key is the schedule id, and a newer record under it replaces (etf1 semantics)
        replace = True
        # etf1 delivers every header of the schedule record, its own scheduler-* ones included
        user = [(n, v) for n, v in headers if n not in _DELAY_CONTROL]
    return Request(topic, partition, rid, due, mode, level, retry, key_override, tuple(user), replace, kms)



def kms_delete(
    key: bytes | None, value: bytes | None, headers: HeaderList | None
) -> Cancel | Rejection | AfterDelivery | None:
    """An etf1/kafka-message-scheduler delete: a tombstone (null value) whose key is the schedule
    id, with no ``delay.*`` header but the pass-through ones (etf1's ``clientlib.DeleteSchedule``
    sends no headers). A tombstone carrying ``scheduler-key`` is the one a scheduler writes after
    a delivery (``AfterDelivery``), not a delete. None: neither (``parse_ingress`` decides)."""
    if value is not None or key is None:
        return None
    after = False
    for name, _v in headers or ():
        if name.startswith(_PREFIX) and name not in c.PASS_THROUGH:
            return None
        after = after or name == c.KMS_KEY
    if key == b"" or len(key) > c.MAX_ID_BYTES:
        return Rejection(
            c.BAD_HEADER, f"kafka-message-scheduler delete: the key (the schedule id) is {len(key)} bytes, "
            f"not 1..{c.MAX_ID_BYTES}",
        )
    return AfterDelivery(key) if after else Cancel(key)


# -- the C fast path -----------------------------------------------------------------------------
# ``sidecar._native.parse_request`` answers for the common request only (see its comment in
# sidecar/native/parse.c) and returns None for everything else, which then goes through ``_parse``:
# also every record with a ``delay.*`` header it has no code for (``setup_parser`` gets the prefix
# from here), so an unknown one is rejected by ``_parse`` alone and no list of names lives in C.
# Its codes: which control headers it handles; 0 sends the record to the full parser. ``delay.every``
# and ``delay.start`` (6, 7) are taken only by the intake's C run (``Intake.ingest_many``: the common
# recurring record, stored as store/firings.py ``arm`` stores it); ``parse_request`` leaves them here.
_FAST_CODES = {
    **dict.fromkeys(_CONTROL, 0),
    c.TARGET_TOPIC: 1, c.DELAY_MS: 2, c.DELIVER_AT: 3, c.TARGET_PARTITION: 4, c.ID: 5, c.EVERY: 6, c.START: 7,
}
FastRequest = tuple[str, int, bytes | None, int, str, tuple[tuple[str, bytes | None], ...]]


def py_parse_request(
    headers: HeaderList | None, ts: int, now: int, size: int, rules: Rules
) -> FastRequest | None:
    """The reference of the C fast path: what ``_parse`` says, when it is a request the fast
    path handles (a known target, no level, retry or kafka-message-scheduler headers, ASCII
    control values); else None. ``size`` excludes the headers."""
    names = [name for name, _v in headers or ()]
    handled = {n for n, code in _FAST_CODES.items() if code}
    control = [n for n in names if n in _CONTROL]
    if any(n not in handled for n in control) or len(control) != len(set(control)):
        return None
    if any(n.startswith(_PREFIX) and n not in handled for n in names):
        return None  # a delay.* header it does not handle (pass-through, unknown): the full parser's
    if any(not v or not v.isascii() for n, v in headers or () if n in _CONTROL):
        return None
    if rules.checked_targets.isdisjoint(
        {v.decode() for n, v in headers or () if n == c.TARGET_TOPIC and v and v.isascii()}
    ):
        return None
    parsed = parse_ingress(headers, ts, now, size, rules, headers_in_size=False)
    if not isinstance(parsed, Request) or parsed.mode == "recurring":
        return None
    return (parsed.target_topic, parsed.target_partition, parsed.id, parsed.due_ms, parsed.mode, parsed.user_headers)


if NATIVE:
    _native.setup_parser(_FAST_CODES, _PREFIX, c.MIN_EVERY_MS)
