"""``delay-sidecar dlq list`` and ``dlq redrive``: count dead letters, and send them back.

**What a redrive sends.** A dead letter carries the record's key, value and headers plus the
``delay.dlq.*`` headers (docs/design.md 1). Bad input keeps every header it came with; a dead
letter of a failed publish carries the control headers of an ingress record meaning the same
schedule (``delay.target-topic``, ``delay.target-partition``, ``delay.id``, ``delay.deliver-at``
= the committed due time, or ``delay.retry-count`` for a consumer retry) and
``delay.enqueued-at``. So the original control headers are the dead letter's headers without
``delay.dlq.*``:

- ``--to ingress``: those headers, back into the ingress topic (into the dead letter's source
  partition when it names one of the ingress topic's partitions, so the key keeps its partition
  and a later cancel its order). ``--delay D`` replaces the delay headers with ``delay.ms: D``.
  The sidecar parses it like any record: bad input comes back to the DLQ with its reason.
- ``--to target``: straight to ``delay.target-topic`` (or ``scheduler-target-topic``), on
  ``delay.target-partition`` if given, with the headers a delivery carries: the user headers,
  ``delay.id`` (the dead letter's, else the default ``<source-topic>:<partition>:<offset>``),
  ``delay.source``, and ``delay.deliver-at`` / ``delay.enqueued-at`` / ``delay.retry-count``
  when the dead letter has them. A dead letter with no target, a target that does not exist, an
  internal target (the ingress topic, ``__*``) or a partition the target lacks is *skipped*, and
  one whose target is the DLQ itself is *refused*; neither counts as redriven, so a later run
  can take it.

Every re-sent record carries ``delay.redrive-id: <dlq-topic>:<partition>:<offset>`` (an
ordinary header: a record redriven through ingress keeps it on delivery).

**The range.** ``--since`` / ``--until`` select, in each DLQ partition, the offsets from the
first record timestamped at or after ``--since`` to the first at or after ``--until`` (Kafka's
time index, ``offsets_for_times``); without ``--until``, to the end at the start of the run.
Within it, dead letters whose ``delay.dlq.reason`` is one of ``--reason`` are redriven.

**Exactly once per dead letter, across runs, crashes and overlapping ranges.** Kafka itself
keeps the record of what was redriven, and the re-sends and that record commit together:

- The *marker topic* ``<dlq-topic>.redrive`` (compacted, one partition) holds, under the key of
  each DLQ partition, the offset intervals already redriven per reason (JSON, ``"v": 1``).
- Re-sends go through a *transactional producer* whose ``transactional.id`` is fixed per DLQ
  topic (``delay-sidecar-redrive.<dlq-topic>``). Every ``--batch`` records (or second) one
  transaction commits the re-sent records together with the new intervals of the partitions it
  scanned. A skipped or refused dead letter is left out of the intervals.
- At the start, ``init_transactions`` fences any older producer with that id (a redrive still
  running elsewhere fails on its next commit: two redrives of one DLQ never both commit) and
  aborts the transaction a killed run left open. Only then is the marker topic read, with
  ``read_committed``: it holds exactly the intervals whose records are committed, and each dead
  letter inside one is counted as already redriven and not sent.

A run killed mid-way therefore leaves its committed transactions (records and intervals) and an
aborted one that nobody sees; the next run resends exactly the rest. Consumers see only
committed records when they read with ``isolation.level=read_committed`` (librdkafka's default,
and the sidecar's ingress consumer; the Java client's default is ``read_uncommitted``, which
also shows aborted records): a consumer that cannot, can deduplicate on ``delay.redrive-id``.

``--dry-run`` reads the same way (the marker included) and sends nothing. ``dlq list`` counts the
dead letters of the range per reason and per ``--bucket`` of their timestamps (default 1 h), and
how many of each reason the marker says were redriven.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import operator
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

import orjson

from sidecar import contract as c
from sidecar.client import AT_FORMS, deliver_at_ms
from sidecar.durations import DURATION_FORMS, parse_duration_ms
from sidecar.engine.client_conf import FETCH_QUEUE_BACKOFF_MS

MARKER_SUFFIX = ".redrive"
MARKER_VERSION = 1
TRANSACTIONAL_PREFIX = "delay-sidecar-redrive."
DLQ_GROUP_PREFIX = "delay-sidecar-dlq-"  # the readers' groups (never joined: sidecar/acls.py)
TIME_FORMS = f"{AT_FORMS}, or a duration before now (e.g. 30m, 2h, 7d: {DURATION_FORMS})"
DESTINATIONS = ("ingress", "target")
COMMIT_INTERVAL_S = 1.0  # a transaction commits at least this often (and every --batch records)
PROGRESS_INTERVAL_S = 0.2

# what a redrive does with a dead letter of the range
SENT, ALREADY, SKIPPED, REFUSED = "sent", "already-redriven", "skipped", "refused"
NO_TARGET, NOT_WRITABLE = "target topic does not exist", "target not writable"  # skip reasons
_EOF = -191  # KafkaError._PARTITION_EOF
_FENCED = (-144, 47, 90)  # KafkaError._FENCED, INVALID_PRODUCER_EPOCH, PRODUCER_FENCED
_DELAY_HEADERS = frozenset({c.DELAY_MS, c.DELIVER_AT, c.LEVEL, c.RETRY_COUNT, c.KMS_EPOCH})


class DlqInputError(ValueError):
    """A bad flag value: the message names the flag, the value and the accepted forms."""


class DlqFailed(RuntimeError):
    """The command ran and failed (Kafka unreachable, a transaction that did not commit)."""


# -- inputs ---------------------------------------------------------------------------------------
def parse_time(text: str, flag: str, now_ms: int) -> int:
    """``--since`` / ``--until``: epoch ms, ISO-8601 with a zone, or a duration before now."""
    s = text.strip()
    if s and s[-1:].isalpha() and s[0].isdigit() and not any(ch in s for ch in "-:T"):
        try:
            return max(0, now_ms - parse_duration_ms(s))
        except ValueError as e:
            raise DlqInputError(f"bad value for {flag}: {e}; {TIME_FORMS}") from None
    try:
        return deliver_at_ms(s)
    except ValueError as e:
        raise DlqInputError(f"bad value for {flag}: {str(e).split(';')[0]}; {TIME_FORMS}") from None


def parse_reasons(values: Iterable[str]) -> tuple[str, ...]:
    """``--reason`` (repeatable, or comma-separated): reason codes of the contract."""
    out: list[str] = []
    for value in values:
        for r in value.split(","):
            r = r.strip()
            if not r:
                continue
            if r not in c.REASONS:
                raise DlqInputError(f"bad value for --reason: {r!r} is not a reason code; "
                                    f"choose from {', '.join(c.REASONS)}")
            if r not in out:
                out.append(r)
    if not out:
        raise DlqInputError(f"--reason is required: one or more of {', '.join(c.REASONS)}")
    return tuple(out)


# -- what was redriven: offset intervals per reason ------------------------------------------------
@dataclass(slots=True)
class Intervals:
    """Disjoint, sorted half-open offset intervals ``[a, b)``."""

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)

    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int):
            return False
        i = bisect.bisect_right(self.starts, offset) - 1
        return i >= 0 and offset < self.ends[i]

    def add(self, a: int, b: int) -> None:
        if a >= b:
            return
        lo = bisect.bisect_left(self.ends, a)  # first interval ending at or after a: it may touch
        hi = bisect.bisect_right(self.starts, b)  # intervals starting after b stay
        if lo < hi:
            a, b = min(a, self.starts[lo]), max(b, self.ends[hi - 1])
        self.starts[lo:hi] = [a]
        self.ends[lo:hi] = [b]

    def count(self) -> int:
        return sum(b - a for a, b in zip(self.starts, self.ends, strict=True))

    def pairs(self) -> list[list[int]]:
        return [[a, b] for a, b in zip(self.starts, self.ends, strict=True)]


def add_except(iv: Intervals, a: int, b: int, holes: list[int]) -> None:
    """``iv.add(a, b)`` without the offsets in ``holes`` (sorted)."""
    for h in holes:
        if a <= h < b:
            iv.add(a, h)
            a = h + 1
    iv.add(a, b)


Marker = dict[str, Intervals]  # reason -> intervals, for one DLQ partition


def marker_value(dlq: str, partition: int, marker: Marker, now_ms: int) -> bytes:
    return orjson.dumps({"v": MARKER_VERSION, "dlq_topic": dlq, "partition": partition, "updated_ms": now_ms,
                         "done": {r: iv.pairs() for r, iv in sorted(marker.items()) if iv.starts}})


def read_marker_value(raw: bytes) -> tuple[int, Marker]:
    doc = orjson.loads(raw)
    if not isinstance(doc, dict) or doc.get("v") != MARKER_VERSION:
        raise DlqFailed(f"a redrive marker of format {doc.get('v') if isinstance(doc, dict) else '?'} "
                        f"(this delay-sidecar reads {MARKER_VERSION})")
    marker: Marker = {}
    for reason, pairs in doc["done"].items():
        iv = marker.setdefault(reason, Intervals())
        for a, b in pairs:
            iv.add(int(a), int(b))
    return int(doc["partition"]), marker


# -- one dead letter -> the record to send ------------------------------------------------------
@dataclass(slots=True)
class Outgoing:
    topic: str
    partition: int  # -1: the producer's partitioner
    key: bytes | None
    headers: list[tuple[str, bytes | None]]


def _num(raw: bytes | None) -> int | None:
    return int(raw) if raw is not None and raw.isdigit() and len(raw) <= 18 else None


@dataclass(frozen=True, slots=True)
class Plan:
    """Where things are in one layout of header names (a DLQ's dead letters share few layouts,
    so the per-record work is indexing, not a pass over names): the first index of each control
    and ``delay.dlq.*`` header, and the indexes of the headers each destination keeps."""

    at: dict[str, int]
    keep_ingress: tuple[int, ...]  # all but delay.dlq.* and delay.redrive-id
    keep_ingress_delayed: tuple[int, ...]  # and without the delay headers (--delay)
    keep_target: tuple[int, ...]  # the user headers
    source: tuple[int, int, int]  # delay.dlq.source-topic, -partition, -offset (-1: absent)
    delivery: tuple[int, ...]  # delay.deliver-at, delay.enqueued-at (those present)

    @property
    def reason(self) -> int:
        return self.at.get(c.DLQ_REASON, -1)


_TARGET_DROP = frozenset({*c.CONTROL_HEADERS, c.ID, c.REDRIVE_ID})


@functools.lru_cache(maxsize=4096)
def plan_of(names: tuple[str, ...]) -> Plan:
    at: dict[str, int] = {}
    keep_i: list[int] = []
    keep_d: list[int] = []
    keep_t: list[int] = []
    for i, name in enumerate(names):
        dlq = name.startswith(c.DLQ_PREFIX)
        if dlq or name in _TARGET_DROP:
            at.setdefault(name, i)
        if dlq or name == c.REDRIVE_ID:
            continue
        keep_i.append(i)
        if name not in _DELAY_HEADERS:
            keep_d.append(i)
        if name not in _TARGET_DROP:
            keep_t.append(i)
    source = (at.get(c.DLQ_SOURCE_TOPIC, -1), at.get(c.DLQ_SOURCE_PARTITION, -1), at.get(c.DLQ_SOURCE_OFFSET, -1))
    # as delivered: the due and enqueue times, and a recurring schedule's firing headers
    delivery = tuple(at[n] for n in (c.DELIVER_AT, c.ENQUEUED_AT, *c.FIRING_HEADERS) if n in at)
    return Plan(at, tuple(keep_i), tuple(keep_d), tuple(keep_t), source, delivery)


def names_of(headers: list[tuple[str, Any]]) -> tuple[str, ...]:
    return tuple(map(_first, headers))


_first = operator.itemgetter(0)


def to_ingress(headers: list[tuple[str, Any]], key: bytes | None, redrive_id: bytes, ingress: str,
               ingress_partitions: int, delay_ms: int | None, plan: Plan | None = None) -> Outgoing:
    """The dead letter's original ingress record (see the module docstring)."""
    plan = plan or plan_of(names_of(headers))
    keep = plan.keep_ingress if delay_ms is None else plan.keep_ingress_delayed
    out: list[tuple[str, bytes | None]] = [headers[i] for i in keep]
    if delay_ms is not None:
        out.append((c.DELAY_MS, b"%d" % delay_ms))
    out.append((c.REDRIVE_ID, redrive_id))
    at = plan.at
    src_topic = headers[at[c.DLQ_SOURCE_TOPIC]][1] if c.DLQ_SOURCE_TOPIC in at else None
    part = _num(headers[at[c.DLQ_SOURCE_PARTITION]][1]) if c.DLQ_SOURCE_PARTITION in at else None
    same = src_topic == ingress.encode() and part is not None and part < ingress_partitions
    return Outgoing(ingress, part if same and part is not None else -1, key, out)


def to_target(headers: list[tuple[str, Any]], key: bytes | None, redrive_id: bytes,
              plan: Plan | None = None) -> Outgoing | str:
    """The record as the sidecar would have delivered it, or why it cannot be (a skip reason)."""
    plan = plan or plan_of(names_of(headers))
    at = plan.at
    kms = c.TARGET_TOPIC not in at and c.KMS_TARGET_TOPIC in at
    i = at.get(c.KMS_TARGET_TOPIC if kms else c.TARGET_TOPIC, -1)
    raw_topic = headers[i][1] if i >= 0 else None
    if not raw_topic:
        return "no target topic"
    try:
        topic = raw_topic.decode()
    except UnicodeDecodeError:
        return "target topic is not UTF-8"
    partition = -1
    i = at.get(c.TARGET_PARTITION, -1)
    if i >= 0:
        p = _num(headers[i][1])
        if p is None:
            return "bad target partition"
        partition = p
    i = at.get(c.KMS_TARGET_KEY, -1)
    if kms and i >= 0 and headers[i][1]:
        key = headers[i][1]
    out: list[tuple[str, bytes | None]] = [headers[i] for i in plan.keep_target]
    src = b"%s:%s:%s" % tuple(headers[i][1] or b"" if i >= 0 else b"" for i in plan.source)
    i = at.get(c.ID, -1)
    out.append((c.ID, headers[i][1] or src if i >= 0 else src))
    out += [headers[i] for i in plan.delivery if headers[i][1]]
    out.append((c.SOURCE, src))
    i = at.get(c.RETRY_COUNT, -1)
    if i >= 0 and headers[i][1] not in (None, b"", b"0"):
        out.append(headers[i])
    out.append((c.REDRIVE_ID, redrive_id))
    return Outgoing(topic, partition, key, out)


# -- Kafka ------------------------------------------------------------------------------------------
@dataclass
class Job:
    bootstrap: str
    dlq_topic: str
    ingress_topic: str
    reasons: tuple[str, ...]
    since_ms: int | None
    until_ms: int | None
    to: str = "target"  # "ingress" | "target"
    delay_ms: int | None = None
    dry_run: bool = False
    batch: int = 10_000  # records per transaction
    rate: float = 0.0  # records/s at most (0: no limit)
    timeout_s: float = 30.0
    kafka: dict[str, Any] = field(default_factory=dict)  # librdkafka properties for every client
    # the producer's properties instead of kafka (--tenant: the tenant's kafka: over them); None: kafka
    producer_kafka: dict[str, Any] | None = None
    # the readers' group: never joined, nothing committed, but librdkafka looks its coordinator up
    group_id: str = field(default_factory=lambda: f"{DLQ_GROUP_PREFIX}{uuid.uuid4().hex[:8]}")

    @property
    def marker_topic(self) -> str:
        return self.dlq_topic + MARKER_SUFFIX

    @property
    def transactional_id(self) -> str:
        return TRANSACTIONAL_PREFIX + self.dlq_topic


def check_destination(job: Job) -> None:
    """Refuse to redrive into the DLQ (or its marker topic) before anything is read."""
    if job.to not in DESTINATIONS:
        raise DlqInputError(f"bad value for --to: {job.to!r}; choose ingress or target")
    if job.delay_ms is not None and job.to != "ingress":
        raise DlqInputError("--delay applies to --to ingress only (a redrive to the target is delivered at once)")
    if job.to == "ingress" and job.ingress_topic in (job.dlq_topic, job.marker_topic):
        raise DlqInputError(f"refusing to redrive into the DLQ itself: --ingress-topic {job.ingress_topic!r} is "
                            f"the DLQ topic (--dlq-topic {job.dlq_topic!r}) or its marker topic")


def _admin(job: Job, kafka: dict[str, Any] | None = None) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": job.bootstrap, **(job.kafka if kafka is None else kafka)})


def _producer_kafka(job: Job) -> dict[str, Any]:
    return job.kafka if job.producer_kafka is None else job.producer_kafka


def _refusal(err: Any, operation: str, resource: str, kafka: dict[str, Any]) -> str:
    """A refused operation in the words of the start-up checks: what, on what, for whom, the fix."""
    from sidecar import kafka_errors as ke

    cause = ke.classify(err.name(), err.str())
    return err.str() if cause is None else cause.about(operation, resource, ke.principal_of(kafka)).message()


def _unwritable(admin: Any, job: Job, topic: str) -> str:
    """Why the producer's principal may not write ``topic`` ("": it may, or the broker does not say):
    asked before the first record to it, since a refused record fails its whole transaction with
    no word of which topic it was."""
    from sidecar.connectivity import refused

    cause = refused(admin, "Write", topic, job.timeout_s, _producer_kafka(job))
    return "" if cause is None else f"{NOT_WRITABLE}: {cause.setting}"


class _Targets:
    """Why a redrive's target (topic, partition) is refused ("": it is not), asked once each: the
    reader's view (``_check_target``), then, for a topic it finds or cannot see, whether the
    producer's principal may write it (``_unwritable``, through one admin client as that
    principal, made at the first such question)."""

    def __init__(self, job: Job, topics: dict[str, int], asks_writes: bool) -> None:
        self.job = job
        self.topics = topics
        self.asks_writes = asks_writes  # False: a dry run, which writes nothing
        self.checked: dict[tuple[str, int], str] = {}
        self.unwritable: dict[str, str] = {}  # target -> why the producer's principal may not write it
        self.writers: Any = None

    def refused(self, out: Outgoing) -> str:
        why = self.checked.get((out.topic, out.partition))
        if why is None:
            why = self.checked[(out.topic, out.partition)] = self._why(out)
        return why

    def _why(self, out: Outgoing) -> str:
        why = _check_target(out, self.job, self.topics)
        # a topic the reader cannot see may be missing or refused to it: which?
        if why not in ("", NO_TARGET) or not self.asks_writes:
            return why
        if out.topic not in self.unwritable:
            if self.writers is None:
                self.writers = _admin(self.job, _producer_kafka(self.job))
            self.unwritable[out.topic] = _unwritable(self.writers, self.job, out.topic)
        return self.unwritable[out.topic] or why


def _topics(admin: Any, job: Job) -> dict[str, int]:
    """Partition counts of every topic (one metadata request)."""
    from confluent_kafka import KafkaException

    try:
        md = admin.list_topics(timeout=job.timeout_s)
    except KafkaException as e:
        raise DlqFailed(f"no answer from Kafka at {job.bootstrap} within {job.timeout_s:.0f} s (--timeout): "
                        f"{e.args[0].str() if e.args else e}") from None
    return {name: len(t.partitions) for name, t in md.topics.items() if t.error is None}


def _ensure_marker_topic(admin: Any, job: Job, topics: dict[str, int]) -> None:
    if job.marker_topic in topics:
        return
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    fut = admin.create_topics([NewTopic(job.marker_topic, num_partitions=1, replication_factor=-1,
                                        config={"cleanup.policy": "compact"})],
                              operation_timeout=job.timeout_s)[job.marker_topic]
    try:
        fut.result()
    except KafkaException as e:
        if e.args[0].name() != "TOPIC_ALREADY_EXISTS":
            raise DlqFailed(f"could not create the marker topic {job.marker_topic!r}: {e.args[0].str()} "
                            f"(create it: --partitions 1 --config cleanup.policy=compact)") from None


def _consumer(job: Job) -> Any:
    from confluent_kafka import Consumer

    return Consumer({
        "bootstrap.servers": job.bootstrap, "group.id": job.group_id,
        "enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": "read_committed",
        "fetch.max.bytes": 64 * 1024 * 1024, "max.partition.fetch.bytes": 16 * 1024 * 1024,
        # one 16 MiB fetch fills the local queue: not a second's wait after each (client_conf.py)
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS, **job.kafka,
    })


def read_markers(job: Job, topics: dict[str, int]) -> dict[int, Marker]:
    """The committed intervals of every DLQ partition (the newest marker per key wins)."""
    if job.marker_topic not in topics:
        return {}
    from confluent_kafka import TopicPartition

    cons = _consumer(job)
    out: dict[int, Marker] = {}
    try:
        lo, hi = cons.get_watermark_offsets(TopicPartition(job.marker_topic, 0), timeout=job.timeout_s)
        if hi <= lo:
            return {}
        cons.assign([TopicPartition(job.marker_topic, 0, lo)])
        deadline = time.monotonic() + job.timeout_s
        while time.monotonic() < deadline:
            done = False
            for m in cons.consume(num_messages=1000, timeout=0.5):
                if m.error() is not None:
                    if m.error().code() == _EOF:
                        done = True
                        continue
                    raise DlqFailed(f"reading {job.marker_topic}: {m.error().str()}")
                value = m.value()
                if value is not None:
                    p, marker = read_marker_value(value)
                    out[p] = marker
                else:
                    out.pop(int(m.key() or b"-1"), None)
            if done:
                return out
        raise DlqFailed(f"reading {job.marker_topic}: no end within {job.timeout_s:.0f} s (--timeout)")
    finally:
        cons.close()


def _ranges(cons: Any, job: Job, partitions: int) -> dict[int, tuple[int, int]]:
    """Per DLQ partition: [first offset at/after --since, first offset at/after --until)."""
    from confluent_kafka import TopicPartition

    out: dict[int, tuple[int, int]] = {}
    bounds = [cons.get_watermark_offsets(TopicPartition(job.dlq_topic, p), timeout=job.timeout_s)
              for p in range(partitions)]

    def at(ms: int | None, default: list[int]) -> list[int]:
        if ms is None:
            return default
        found = cons.offsets_for_times([TopicPartition(job.dlq_topic, p, ms) for p in range(partitions)],
                                       timeout=job.timeout_s)
        return [hi if tp.offset < 0 else tp.offset for tp, (_lo, hi) in zip(found, bounds, strict=True)]

    start = at(job.since_ms, [lo for lo, _hi in bounds])
    end = at(job.until_ms, [hi for _lo, hi in bounds])
    for p in range(partitions):
        lo, hi = bounds[p]
        a, b = max(start[p], lo), min(end[p], hi)
        if a < b:
            out[p] = (a, b)
    return out


@dataclass
class Summary:
    """Per reason: how many dead letters were sent, already redriven, skipped or refused (with why)."""

    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    why: dict[str, int] = field(default_factory=dict)
    scanned: int = 0
    seconds: float = 0.0  # the whole run
    send_seconds: float = 0.0  # from the first dead letter read to the last commit
    transactions: int = 0

    def add(self, reason: str, what: str, why: str = "") -> None:
        per = self.counts.setdefault(reason, {SENT: 0, ALREADY: 0, SKIPPED: 0, REFUSED: 0})
        per[what] += 1
        if why:
            self.why[why] = self.why.get(why, 0) + 1

    def total(self, what: str) -> int:
        return sum(v[what] for v in self.counts.values())

    def as_dict(self, job: Job) -> dict[str, Any]:
        sent = self.total(SENT)
        return {
            "action": "dlq-redrive", "dry_run": job.dry_run, "dlq_topic": job.dlq_topic, "to": job.to,
            "reasons": list(job.reasons), "since_ms": job.since_ms, "until_ms": job.until_ms,
            "by_reason": self.counts, "sent": sent, "already_redriven": self.total(ALREADY),
            "skipped": self.total(SKIPPED), "refused": self.total(REFUSED), "why": self.why,
            "scanned": self.scanned, "seconds": round(self.seconds, 3), "send_seconds": round(self.send_seconds, 3),
            "transactions": self.transactions,
            "records_per_s": round(sent / self.send_seconds, 1) if self.send_seconds > 0 and sent else None,
        }


class Progress:
    """A one-line progress bar on stderr (``\\r``-rewritten), at most every 0.2 s."""

    def __init__(self, total: int, out: TextIO | None, label: str) -> None:
        self.total, self.out, self.label = max(total, 1), out, label
        self.t0 = time.monotonic()
        self.last = 0.0

    def show(self, done: int, sent: int, force: bool = False) -> None:
        if self.out is None:
            return
        now = time.monotonic()
        if not force and now - self.last < PROGRESS_INTERVAL_S:
            return
        self.last = now
        frac = min(1.0, done / self.total)
        bar = "#" * int(frac * 30)
        rate = sent / (now - self.t0) if now > self.t0 else 0.0
        self.out.write(f"\r{self.label} [{bar:<30}] {frac * 100:5.1f}% {done}/{self.total} scanned, "
                       f"{sent} {'to send' if self.label == 'dry-run' else 'sent'}, {rate:,.0f}/s ")
        self.out.flush()

    def end(self) -> None:
        if self.out is not None:
            self.out.write("\n")
            self.out.flush()


def redrive(job: Job, progress: TextIO | None = None) -> Summary:
    """Run one redrive (see the module docstring); returns the summary."""
    from confluent_kafka import KafkaException, Producer, TopicPartition

    check_destination(job)
    admin = _admin(job)
    topics = _topics(admin, job)
    if job.dlq_topic not in topics:
        raise DlqFailed(f"the DLQ topic {job.dlq_topic!r} does not exist at {job.bootstrap} (check --dlq-topic)")
    if job.to == "ingress" and job.ingress_topic not in topics:
        raise DlqFailed(f"the ingress topic {job.ingress_topic!r} does not exist at {job.bootstrap} "
                        f"(check --ingress-topic)")
    producer: Any = None
    if not job.dry_run:
        _ensure_marker_topic(admin, job, topics)
        producer = Producer({
            "bootstrap.servers": job.bootstrap, "transactional.id": job.transactional_id,
            "linger.ms": 5, "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000,
            "transaction.timeout.ms": 60_000, **_producer_kafka(job),
        })
        try:
            producer.init_transactions(job.timeout_s)  # fences an older run, aborts what it left open
        except KafkaException as e:
            err = e.args[0]
            why = err.str()
            if err.name() == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED":
                why = _refusal(err, "Write", f"transactional-id {job.transactional_id}", _producer_kafka(job))
            raise DlqFailed(f"could not start the redrive's transactions: {why}") from None
        topics[job.marker_topic] = 1
    markers = read_markers(job, topics)
    cons = _consumer(job)
    summary = Summary()
    t0 = time.monotonic()
    try:
        ranges = _ranges(cons, job, topics[job.dlq_topic])
        bar = Progress(sum(b - a for a, b in ranges.values()), progress, "dry-run" if job.dry_run else "redrive")
        if not ranges:
            return summary
        ingress_partitions = topics.get(job.ingress_topic, 0)
        reasons = {r.encode(): r for r in job.reasons}
        scan_from = {p: a for p, (a, _b) in ranges.items()}  # not yet covered by a committed interval
        pos = dict(scan_from)
        holes: dict[int, dict[str, list[int]]] = {p: {} for p in ranges}  # skipped/refused offsets
        open_parts = set(ranges)
        cons.assign([TopicPartition(job.dlq_topic, p, a) for p, (a, _b) in ranges.items()])
        dlq_b = job.dlq_topic.encode()
        targets = _Targets(job, topics, asks_writes=producer is not None)
        uncommitted = 0
        last_commit = time.monotonic()
        if producer is not None:
            producer.begin_transaction()

        def commit(final: bool = False) -> None:
            nonlocal uncommitted, last_commit
            last_commit = time.monotonic()
            if producer is None:
                return
            now_ms = int(time.time() * 1000)
            for p in ranges:
                if pos[p] == scan_from[p]:
                    continue
                marker = markers.setdefault(p, {})
                for r in job.reasons:
                    add_except(marker.setdefault(r, Intervals()), scan_from[p], pos[p], holes[p].get(r, []))
                _produce(producer, job.marker_topic, b"%d" % p, marker_value(job.dlq_topic, p, marker, now_ms), 0)
                scan_from[p] = pos[p]
                holes[p] = {}
            try:
                producer.commit_transaction(job.timeout_s * 2)
            except KafkaException as e:
                err = e.args[0]
                why = ("another redrive of this DLQ started and fenced this one" if err.code() in _FENCED
                       else err.str())
                with contextlib.suppress(Exception):
                    producer.abort_transaction(job.timeout_s)
                raise DlqFailed(f"a transaction did not commit ({why}); the records of the committed ones stay "
                                f"redriven, run the command again for the rest") from None
            summary.transactions += 1
            uncommitted = 0
            if not final:
                producer.begin_transaction()

        started = time.monotonic()
        first: float | None = None
        sent = 0
        for r in job.reasons:
            summary.add(r, SENT)  # every reason asked for is in the summary, 0 or not
            summary.counts[r][SENT] = 0
        counts = summary.counts
        while open_parts:
            msgs = cons.consume(num_messages=min(max(job.batch, 1), 10_000), timeout=0.5)
            if first is None and msgs:
                first = time.monotonic()
            for m in msgs:
                err = m.error()
                p = m.partition()
                if err is not None:
                    if err.code() == _EOF:  # nothing more up to the end seen at the start
                        if p in open_parts:
                            pos[p] = max(pos[p], ranges[p][1])
                            open_parts.discard(p)
                        continue
                    raise DlqFailed(f"reading {job.dlq_topic}: {err.str()}")
                if p not in open_parts:
                    continue
                off = m.offset()
                end = ranges[p][1]
                if off >= end:
                    pos[p] = end
                    open_parts.discard(p)
                    continue
                pos[p] = off + 1
                if off + 1 >= end:
                    open_parts.discard(p)
                summary.scanned += 1
                headers = m.headers() or []
                plan = plan_of(tuple(map(_first, headers)))
                ri = plan.reason
                reason = reasons.get(headers[ri][1]) if ri >= 0 else None
                if reason is None:
                    continue
                marker = markers.get(p)
                if marker is not None and reason in marker and off in marker[reason]:
                    summary.add(reason, ALREADY)
                    continue
                rid = b"%s:%d:%d" % (dlq_b, p, off)
                out: Outgoing | str
                if job.to == "ingress":
                    out = to_ingress(headers, m.key(), rid, job.ingress_topic, ingress_partitions, job.delay_ms,
                                     plan)
                else:
                    out = to_target(headers, m.key(), rid, plan)
                    if isinstance(out, Outgoing) and (why := targets.refused(out)):
                        out = why
                if isinstance(out, str):
                    what = REFUSED if out.startswith("target is the DLQ") else SKIPPED
                    summary.add(reason, what, out)
                    holes[p].setdefault(reason, []).append(off)
                    continue
                counts[reason][SENT] += 1
                sent += 1
                if producer is not None:
                    try:
                        producer.produce(out.topic, m.value(), out.key, out.partition, None, None, 0, out.headers)
                    except BufferError:
                        _produce(producer, out.topic, out.key, m.value(), out.partition, out.headers)
                    uncommitted += 1
                    if job.rate > 0:
                        _pace(sent, job.rate, started, producer)
            if uncommitted >= job.batch or (uncommitted and time.monotonic() - last_commit >= COMMIT_INTERVAL_S):
                commit()
            bar.show(summary.scanned, sent)
        commit(final=True)
        summary.send_seconds = time.monotonic() - (first or started)
        bar.show(summary.scanned, summary.total(SENT), force=True)
        bar.end()
    except BaseException:
        if producer is not None:
            with contextlib.suppress(Exception):  # else the next run's init_transactions aborts it
                producer.abort_transaction(job.timeout_s)
        raise
    finally:
        summary.seconds = time.monotonic() - t0
        cons.close()
    return summary


def _produce(producer: Any, topic: str, key: bytes | None, value: bytes | None, partition: int,
             headers: list[tuple[str, bytes | None]] | None = None) -> None:
    while True:
        try:
            # positional (topic, value, key, partition, on_delivery, callback, timestamp, headers):
            # keyword parsing costs ~2 us a call (engine/publishing.py)
            producer.produce(topic, value, key, partition, None, None, 0, headers)
            return
        except BufferError:
            producer.poll(0.05)


def _pace(sent: int, rate: float, started: float, producer: Any) -> None:
    ahead = sent / rate - (time.monotonic() - started)
    if ahead > 0.001:
        producer.poll(ahead)


def _check_target(out: Outgoing, job: Job, topics: dict[str, int]) -> str:
    """Why a redrive does not send to ``out``'s target ("" if it does)."""
    if out.topic in (job.dlq_topic, job.marker_topic):
        return "target is the DLQ topic"
    if out.topic == job.ingress_topic or out.topic.startswith("__"):
        return "target is internal"
    n = topics.get(out.topic)
    if n is None:
        return NO_TARGET
    if out.partition >= n:
        return "target partition does not exist"
    return ""


# -- dlq list ---------------------------------------------------------------------------------------
def list_counts(job: Job, bucket_ms: int) -> dict[str, Any]:
    """Dead letters of the range per reason and per bucket of their timestamps, plus how many of
    each reason the marker topic says were redriven (of the whole topic, not only the range)."""
    from confluent_kafka import TopicPartition

    admin = _admin(job)
    topics = _topics(admin, job)
    if job.dlq_topic not in topics:
        raise DlqFailed(f"the DLQ topic {job.dlq_topic!r} does not exist at {job.bootstrap} (check --dlq-topic)")
    markers = read_markers(job, topics)
    cons = _consumer(job)
    buckets: dict[int, dict[str, int]] = {}
    by_reason: dict[str, int] = {}
    redriven: dict[str, int] = {}
    try:
        ranges = _ranges(cons, job, topics[job.dlq_topic])
        open_parts = set(ranges)
        if ranges:
            cons.assign([TopicPartition(job.dlq_topic, p, a) for p, (a, _b) in ranges.items()])
        while open_parts:
            for m in cons.consume(num_messages=10_000, timeout=0.5):
                err, p = m.error(), m.partition()
                if err is not None:
                    if err.code() == _EOF:
                        open_parts.discard(p)
                        continue
                    raise DlqFailed(f"reading {job.dlq_topic}: {err.str()}")
                if p not in open_parts:
                    continue
                off = m.offset()
                if off >= ranges[p][1] - 1:
                    open_parts.discard(p)
                    if off >= ranges[p][1]:
                        continue
                reason = "(none)"
                for name, value in m.headers() or []:
                    if name == c.DLQ_REASON:
                        reason = (value or b"").decode("utf-8", "replace")
                        break
                if job.reasons and reason not in job.reasons:
                    continue
                ts = m.timestamp()[1]
                row = buckets.setdefault(ts - ts % bucket_ms, {})
                row[reason] = row.get(reason, 0) + 1
                by_reason[reason] = by_reason.get(reason, 0) + 1
                if reason in markers.get(p, {}) and off in markers[p][reason]:
                    redriven[reason] = redriven.get(reason, 0) + 1
    finally:
        cons.close()
    return {"action": "dlq-list", "dlq_topic": job.dlq_topic, "since_ms": job.since_ms, "until_ms": job.until_ms,
            "bucket_ms": bucket_ms, "by_reason": by_reason, "redriven": redriven,
            "buckets": [{"start_ms": k, "counts": v} for k, v in sorted(buckets.items())]}


def render_list(report: dict[str, Any], iso: Callable[[int], str]) -> str:
    reasons = sorted(report["by_reason"])
    if not reasons:
        return f"no dead letters in {report['dlq_topic']} in the range"
    width = max(len(r) for r in [*reasons, "bucket start (UTC)"]) + 2
    lines = ["bucket start (UTC)".ljust(26) + "".join(r.rjust(width) for r in reasons)]
    for b in report["buckets"]:
        lines.append(iso(b["start_ms"]).ljust(26) + "".join(str(b["counts"].get(r, 0)).rjust(width) for r in reasons))
    lines.append("total".ljust(26) + "".join(str(report["by_reason"][r]).rjust(width) for r in reasons))
    lines.append("redriven".ljust(26) + "".join(str(report["redriven"].get(r, 0)).rjust(width) for r in reasons))
    return "\n".join(lines)


def render_summary(d: dict[str, Any]) -> str:
    verb = "would send" if d["dry_run"] else "sent"
    lines = [f"{'dry run: ' if d['dry_run'] else ''}{verb} {d['sent']} dead letters of {d['dlq_topic']} to the "
             f"{d['to']} topic in {d['seconds']:.1f} s"
             + (f" ({d['records_per_s']:,.0f}/s, {d['transactions']} transactions)" if not d["dry_run"] and
                d["records_per_s"] else "")]
    for reason, n in sorted(d["by_reason"].items()):
        lines.append(f"  {reason:<20} {verb} {n[SENT]}, already redriven {n[ALREADY]}, skipped {n[SKIPPED]}, "
                     f"refused {n[REFUSED]}")
    for why, n in sorted(d["why"].items()):
        lines.append(f"  not sent: {n} ({why})")
    return "\n".join(lines)


def progress_stream(wanted: bool) -> TextIO | None:
    return sys.stderr if wanted or sys.stderr.isatty() else None
