"""Shared workload machinery for every scenario: broker topics, producers, the processes under
test (the sidecar, the passthrough baseline, the Redis worker), readers of what they delivered,
and memory/disk probes.

Processes under test always run as subprocesses (``python -m ...``) so that they get their own
interpreter and GIL, their RSS is theirs alone, and the bench process itself stays idle (it polls
high watermarks and log files a few times a second) while something is being measured. Every
process started here is registered and stopped by :func:`stop_all` (called by the CLI in a
``finally``), with bounded waits: SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any, cast

import orjson
import psutil
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from sidecar import contract as c
from sidecar.config import Settings
from sidecar.engine.client_conf import FETCH_QUEUE_BACKOFF_MS

SIZES = ("small", "full")
RECORD_SIZES = {"100B": 100, "1KB": 1024}

# The producer settings the sidecar uses for delivery (sidecar/engine/kafka_io.py); the passthrough
# baseline and the Redis worker publish with exactly these.
DELIVERY_PRODUCER: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 2,
    "batch.num.messages": 10_000,
    "queue.buffering.max.messages": 100_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "message.timeout.ms": 120_000,
}
# ... and the consumer settings it reads the ingress topic with.
INGRESS_CONSUMER: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "partition.assignment.strategy": "cooperative-sticky",
    "fetch.wait.max.ms": 10,
    "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
    "session.timeout.ms": 10_000,
}
SIDECAR_PYTHON_ENV = "KDS_BENCH_SIDECAR_PYTHON"  # see SidecarProc.start
PASSTHROUGH_ENV = "KDS_BENCH_PASSTHROUGH"  # see passthrough_cmd
CONSUME_BATCH = 5_000
MAX_IN_FLIGHT = 20_000
# --delivery exactly-once commits a transaction this often: the sidecar's default, unless the
# bench is given --transaction-interval
TRANSACTION_INTERVAL_MS = Settings().transaction_interval_ms

_PROCS: list[subprocess.Popen[bytes]] = []
_PROCS_LOCK = threading.Lock()


class BenchError(RuntimeError):
    """A scenario could not be measured (the message says what did not happen in time)."""


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def uid() -> str:
    return uuid.uuid4().hex[:8]


# what every wait checks (see watch): each returns None, or why the bench cannot go on
_WATCHED: list[Callable[[], str | None]] = []


def watch(check: Callable[[], str | None]) -> None:
    """Every wait of the bench (``wait_until``, the preload's flush) calls ``check``; a message from
    it (a process the whole run needs has ended) fails that wait at once with a ``BenchError``."""
    _WATCHED.append(check)


MIN_FREE_BYTES = 1 << 30
"""The free space under the work directory below which the bench stops (:func:`disk_low`)."""


def disk_low(path: Path, min_free: int = MIN_FREE_BYTES) -> str | None:
    """Why the bench must stop, when the file system holding ``path`` has less than ``min_free``
    bytes free; None otherwise (or when it cannot be read). A broker, a peer or a sidecar whose
    disk fills fails in ways that hide the cause (a broker exits on its log directory, a store
    refuses a segment), after the run has already spent its time: the bench names it first."""
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return None
    if free >= min_free:
        return None
    return (f"{free / 2**20:,.0f} MiB free on the file system of {path}, under the bench's "
            f"{min_free / 2**30:g} GiB: free some space, or give --workdir on a larger one")


def unwatch_all() -> None:
    _WATCHED.clear()


def check_watched() -> None:
    for check in list(_WATCHED):
        why = check()
        if why:
            raise BenchError(why)


def flush_watched(p: Producer, timeout_s: float) -> int:
    """``p.flush(timeout_s)`` a second at a time, checking the watched processes in between."""
    deadline = time.monotonic() + timeout_s
    left: int = p.flush(min(1.0, timeout_s))
    while left and time.monotonic() < deadline:
        check_watched()
        left = p.flush(min(1.0, max(0.0, deadline - time.monotonic())))
    return left


def wait_until(what: str, predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.2,
               alive: Callable[[], None] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return
        if alive is not None:
            alive()
        check_watched()
        if time.monotonic() >= deadline:
            raise BenchError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def sleep_until_wall_ms(t_ms: int) -> None:
    while True:
        left = t_ms - wall_ms()
        if left <= 0:
            return
        time.sleep(min(left / 1000, 0.5))


# -- processes ------------------------------------------------------------------------------------

def spawn(cmd: list[str], log_path: Path, env: dict[str, str] | None = None,
          stdin_pipe: bool = False) -> subprocess.Popen[bytes]:
    """``cmd`` started in a session of its own, its output to ``log_path``; ``stdin_pipe``: its
    stdin a pipe the caller writes commands to (``proc.stdin``), else inherited."""
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                start_new_session=True, stdin=subprocess.PIPE if stdin_pipe else None)
    with _PROCS_LOCK:
        _PROCS.append(proc)
    return proc


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """A crash: SIGKILL to ``proc`` and every process under it (a server's workers, a VM's port
    programs), nothing flushed; returns once all are gone."""
    main = psutil.Process(proc.pid)
    procs = [main, *main.children(recursive=True)]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=30)
    proc.wait(30)


def stop_proc(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout_s: float = 60) -> int:
    """Signal one process we started and wait for it (SIGKILL after ``timeout_s``)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(30)
    with _PROCS_LOCK:
        if proc in _PROCS:
            _PROCS.remove(proc)
    return int(proc.returncode)


def stop_all() -> None:
    """Stop every process this bench started and that is still running."""
    with _PROCS_LOCK:
        procs = list(_PROCS)
    for proc in procs:
        stop_proc(proc, signal.SIGTERM, timeout_s=30)


# -- topics and producers -------------------------------------------------------------------------

def create_topics(bootstrap: str, topics: list[str], partitions: int = 1, config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, num_partitions=partitions, replication_factor=1, config=config or {})
                                   for t in topics], operation_timeout=30)
    for f in futures.values():
        f.result(60)


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """Best effort: frees the broker's disk between scenarios. Each name once: confluent-kafka
    (2.16) crashes the process (SIGSEGV in librdkafka's background thread) when a name repeats."""
    topics = list(dict.fromkeys(topics))
    if not topics:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.delete_topics(topics, operation_timeout=30).values():
        with contextlib.suppress(Exception):
            f.result(60)


def producer(bootstrap: str, **extra: Any) -> Producer:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
        "batch.num.messages": 10_000, "queue.buffering.max.messages": 500_000,
        "queue.buffering.max.kbytes": 2_097_152,
    }
    conf.update(extra)
    return Producer(conf)


def value_of(size: int) -> bytes:
    return random.Random(size).randbytes(size)


DelayFn = Callable[[int], int]
KHeaders = list[tuple[str, str | bytes | None]]  # what confluent-kafka's produce() and headers() use


def uniform_delays(lo_ms: int, hi_ms: int, seed: int = 8) -> DelayFn:
    rng = random.Random(seed)
    return lambda _i: rng.randint(lo_ms, hi_ms)


def choice_delays(choices: tuple[int, ...], seed: int = 8) -> DelayFn:
    rng = random.Random(seed)
    return lambda _i: rng.choice(choices)


def cut_delays(levels: tuple[int, ...], wheel: tuple[int, int],
               top: int | None) -> tuple[tuple[int, ...], tuple[int, int]]:
    """A scenario's delays (the level times levels is sent, the wheel's uniform range) cut at
    ``--max-delay`` ``top`` (None: as they are): the levels keep at least the first level, the
    wheel's range starts at 1 s or at the cap and ends at the cap at the latest."""
    if top is None:
        return levels, wheel
    return (tuple(d for d in levels if d <= top) or levels[:1]), (min(wheel[0], top), min(wheel[1], top))


def dwell_s(bench: Bench, default: dict[str, float]) -> float:
    """The seconds of load after each change of the failover and exactly-once scenarios:
    ``--dwell``, else ``default`` of the size."""
    ms = bench.options.get("dwell_ms")
    return default[bench.size] if ms is None else ms / 1000


def ingress_headers(target: str, delay_ms: int) -> KHeaders:
    return [(c.TARGET_TOPIC, target.encode()), (c.DELAY_MS, str(delay_ms).encode())]


@dataclass
class Preloaded:
    topic: str
    n: int
    value_size: int
    seconds: float
    first_ms: int
    last_ms: int
    max_delay_ms: int

    @property
    def all_due_ms(self) -> int:
        """Wall time at which every preloaded record is due."""
        return self.last_ms + self.max_delay_ms


def preload(bootstrap: str, topic: str, n: int, value_size: int, target: str, delays: DelayFn,
            timestamp_ms: int | None = None, key_prefix: str = "k",
            schedule: Callable[[int], KHeaders] | None = None,
            extra: Callable[[int], KHeaders] | None = None) -> Preloaded:
    """Produce ``n`` ingress records as fast as the client goes and wait for every ack.
    ``schedule``: record i's schedule headers in place of its ``delay.ms`` (a recurring one's);
    ``extra``: record i's further headers (``delay.id``, user headers: ``bench.shape``)."""
    p = producer(bootstrap)
    value = value_of(value_size)
    tgt = target.encode()
    failed: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    t0 = time.monotonic()
    first = wall_ms()
    max_delay = 0
    kw: dict[str, Any] = {} if timestamp_ms is None else {"timestamp": timestamp_ms}
    for i in range(n):
        d = delays(i)
        max_delay = max(max_delay, d)
        headers: KHeaders = [(c.TARGET_TOPIC, tgt), *(schedule(i) if schedule else [(c.DELAY_MS, b"%d" % d)])]
        if extra is not None:
            headers += extra(i)
        while True:
            try:
                p.produce(topic, value=value, key=f"{key_prefix}{i}".encode(), headers=headers,
                          on_delivery=on_delivery, **kw)
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    left = flush_watched(p, 300)
    if left or failed:
        raise BenchError(f"preload of {topic}: {left} unacknowledged, {len(failed)} failed ({failed[:1]})")
    last = wall_ms()
    return Preloaded(topic, n, value_size, time.monotonic() - t0, first, last, max_delay)


class PacedProducer(threading.Thread):
    """Produces at ``rate`` records/s (in 5 ms ticks) until :meth:`stop` or ``duration_s``."""

    def __init__(self, bootstrap: str, topic: str, target: str, rate: float, value_size: int, delays: DelayFn,
                 duration_s: float | None = None, key_prefix: str = "p",
                 extra: Callable[[int], KHeaders] | None = None) -> None:
        """``extra``: record i's headers beside the schedule ones (``bench.shape``)."""
        super().__init__(daemon=True)
        # The load generator shares the 2 cores with the broker and the process under test: no
        # delivery report (and no Python call) per record, only for a failure.
        self.p: Any = producer(bootstrap, **{"delivery.report.only.error": True, "on_delivery": self._on_delivery})
        self.topic, self.target, self.rate = topic, target.encode(), rate
        self.value = value_of(value_size)
        self.delays = delays
        self.duration_s = duration_s
        self.key_prefix = key_prefix
        self.extra = extra
        self.sent = 0
        self.failed = 0
        self.started_ms = 0
        self.stopped_ms = 0
        self._stop_evt = threading.Event()

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.failed += 1

    @property
    def accepted(self) -> int:
        """Records the broker took: the ones it refused never reach the process under test."""
        return self.sent - self.failed

    def run(self) -> None:
        target = (c.TARGET_TOPIC, self.target)
        encoded: dict[int, bytes] = {}  # delay -> its header value
        prefix = self.key_prefix.encode()
        t0 = time.monotonic()
        self.started_ms = wall_ms()
        while not self._stop_evt.is_set():
            elapsed = time.monotonic() - t0
            if self.duration_s is not None and elapsed >= self.duration_s:
                break
            want = int(elapsed * self.rate)
            while self.sent < want:
                d = self.delays(self.sent)
                dv = encoded.get(d)
                if dv is None:
                    dv = encoded[d] = str(d).encode()
                headers: KHeaders = [target, (c.DELAY_MS, dv)]
                if self.extra is not None:
                    headers += self.extra(self.sent)
                try:
                    # positional, as the sidecar calls it: keywords cost the client ~1.6 us per
                    # call here (measured), CPU the process under test would not get
                    self.p.produce(self.topic, self.value, b"%s%d" % (prefix, self.sent), -1, None, None, 0, headers)
                except BufferError:
                    self.p.poll(0.01)
                    continue
                self.sent += 1
            self.p.poll(0)
            time.sleep(0.005)
        self.stopped_ms = wall_ms()
        self.p.flush(60)
        # the client goes with its last reference: kept by this object, it would go on reconnecting
        # (and logging) after the bench has stopped the broker
        self.p = None

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(120)


# -- reading what was delivered -------------------------------------------------------------------

class Watermarks:
    """Cheap progress probe: the sum of high watermarks of a topic's partitions."""

    def __init__(self, bootstrap: str) -> None:
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-wm-{uid()}",
                           "enable.auto.commit": False})
        self._parts: dict[str, list[int]] = {}

    def partitions(self, topic: str) -> list[int]:
        if topic not in self._parts:
            md = self.c.list_topics(topic, timeout=30)
            t = md.topics.get(topic)
            if t is None or t.error is not None or not t.partitions:
                raise BenchError(f"topic {topic} has no metadata")
            self._parts[topic] = sorted(t.partitions)
        return self._parts[topic]

    def high(self, topic: str) -> dict[int, int]:
        out = {}
        for p in self.partitions(topic):
            _lo, hi = self.c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
            out[p] = int(hi)
        return out

    def total(self, topic: str) -> int:
        return sum(self.high(topic).values())

    def close(self) -> None:
        self.c.close()


@dataclass
class Delivered:
    """Timestamps (record CreateTime = the publisher's send time) and, when asked for, the
    ``delay.deliver-at`` header of each record in an offset range."""

    ts: list[int] = field(default_factory=list)
    deliver_at: list[int] = field(default_factory=list)
    ids: list[bytes] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)  # the ingress partition (``delay.source``)
    seen_ms: list[int] = field(default_factory=list)  # CommittedReader only: wall ms the bench received it
    positions: list[int] = field(default_factory=list)  # ``position(partition, offset)`` of each, when asked
    missed: list[int] = field(default_factory=list)  # with headers: ``delay.missed`` of each (0 if absent)

    def window_rate(self) -> float | None:
        if len(self.ts) < 2:
            return None
        span = (max(self.ts) - min(self.ts)) / 1000
        return (len(self.ts) - 1) / span if span > 0 else None

    def window(self) -> tuple[int, int] | None:
        """(first, last) delivered timestamp (ms): the span ``window_rate`` is taken over."""
        return (min(self.ts), max(self.ts)) if self.ts else None


def position(partition: int, offset: int) -> int:
    """One int for a record's place in a topic (its partition and offset)."""
    return partition << 48 | offset


def _add_headers(out: Delivered, m: Message) -> None:
    """Append ``m``'s ``delay.deliver-at``, ``delay.id``, ingress partition (``delay.source``) and
    ``delay.missed``."""
    da = src = -1
    missed = 0
    rid = b""
    for k, v in cast(KHeaders, m.headers() or []):
        if k == c.DELIVER_AT and v is not None:
            da = int(v)
        elif k == c.MISSED and v is not None:
            missed = int(v)
        elif k == c.ID and v is not None:
            rid = v.encode() if isinstance(v, str) else bytes(v)
        elif k == c.SOURCE and v is not None:  # <topic>:<partition>:<offset>
            with contextlib.suppress(ValueError, IndexError):
                src = int((v if isinstance(v, bytes) else v.encode()).rsplit(b":", 2)[1])
    out.deliver_at.append(da)
    out.ids.append(rid)
    out.partitions.append(src)
    out.missed.append(missed)


# How the bench reads what was delivered: only committed records (librdkafka's default, said
# here because exactly-once figures depend on it), and an end-of-partition event, because with
# transactions the last offsets of a partition are commit markers, never returned as records.
READ_COMMITTED: dict[str, Any] = {"isolation.level": "read_committed", "enable.partition.eof": True,
                                  "enable.auto.commit": False}


def read_range(bootstrap: str, topic: str, start: dict[int, int], end: dict[int, int], headers: bool = False,
               timeout_s: float = 300, keys: bool = False, positions: bool = False) -> Delivered:
    """Read the committed records of ``[start[p], end[p])`` of every partition ``p``; with
    ``headers`` also each record's ``delay.deliver-at``, ``delay.id`` and the ingress partition
    from ``delay.source``; with ``positions`` each one's :func:`position`. A partition is done at
    its record ``end - 1`` or when the reader reaches ``end`` (past commit markers and aborted
    records, which take offsets too)."""
    out = Delivered()
    todo = {p: (start.get(p, 0), e) for p, e in end.items() if e > start.get(p, 0)}
    if not todo:
        return out
    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-read-{uid()}",
                     "fetch.max.bytes": 52_428_800, **READ_COMMITTED})
    cons.assign([TopicPartition(topic, p, s) for p, (s, _e) in todo.items()])
    left = {p: e for p, (_s, e) in todo.items()}
    deadline = time.monotonic() + timeout_s
    try:
        while left and time.monotonic() < deadline:
            for m in cons.consume(num_messages=10_000, timeout=0.5):
                p = cast(int, m.partition())
                off = cast(int, m.offset())
                e = left.get(p)
                err = m.error()
                if err is not None:
                    if e is not None and err.code() == KafkaError._PARTITION_EOF and off >= e:
                        del left[p]
                    continue
                if e is None or off >= e:
                    continue
                out.ts.append(m.timestamp()[1])
                if keys:
                    out.keys.append(m.key() or b"")
                if headers:
                    _add_headers(out, m)
                if positions:
                    out.positions.append(position(p, off))
                if off >= e - 1:
                    del left[p]
    finally:
        cons.close()
    if left:
        raise BenchError(f"reading {topic}: partitions {sorted(left)} not read to the end within {timeout_s} s")
    return out


class CommittedReader(threading.Thread):
    """A ``read_committed`` consumer of ``topic`` from the offsets ``start`` (every partition),
    running beside a measurement: what a consumer of an exactly-once sidecar's target sees.
    ``count`` is the number of committed records received so far (a high watermark also counts
    commit markers, aborted records and those of an open transaction). With ``collect`` it keeps
    each record's timestamp, headers (as :func:`read_range`), with ``keys`` its key, and the wall-clock ms at which the
    bench received it (``seen_ms``): taken when ``poll`` returns a record, and shared by the
    records already queued behind it, so it is late by the bench's own scheduling only. Fetches
    wait at most 10 ms (``fetch.wait.max.ms``, as the sidecar's ingress consumer).

    With ``stamps`` it keeps only each record's :func:`position` and ``seen_ms``: no headers,
    about 1 µs of Python a record. The headers are read afterwards (:func:`read_range` with
    ``positions``) and joined by position (:meth:`seen_at`). At 39,000 records/s the ``collect``
    reader's Python work per record (a header list built and scanned) made it the slowest leg: it
    fell behind the commits (fetches capped at 10,000 records, 150 ms apart), and its lag was
    counted as the sidecar's."""

    def __init__(self, bootstrap: str, topic: str, start: dict[int, int], collect: bool = False,
                 keys: bool = False, stamps: bool = False) -> None:
        super().__init__(daemon=True)
        self.cons = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-committed-{uid()}",
                              "fetch.wait.max.ms": 10, **READ_COMMITTED, "enable.partition.eof": False})
        self.cons.assign([TopicPartition(topic, p, off) for p, off in start.items()])
        self.collect = collect
        self.stamps = stamps
        self.keys = keys  # with ``collect``: also each record's key, and the set of distinct ones
        self.distinct: set[bytes] = set()
        self.count = 0
        self.got = Delivered()
        self._stop_evt = threading.Event()

    def run(self) -> None:
        try:
            while not self._stop_evt.is_set():
                first = self.cons.poll(0.1)
                if first is None:
                    continue
                now = wall_ms()
                batch = [first, *self.cons.consume(num_messages=10_000, timeout=0)]
                if self.stamps:
                    positions, seen = self.got.positions, self.got.seen_ms
                    for m in batch:
                        if m.error() is None:  # position(), inlined: ~40,000 calls a second
                            positions.append(cast(int, m.partition()) << 48 | cast(int, m.offset()))
                    self.count = len(positions)
                    seen.extend([now] * (len(positions) - len(seen)))
                    continue
                for m in batch:
                    if m.error() is not None:
                        continue
                    self.count += 1
                    if self.collect:
                        self.got.ts.append(m.timestamp()[1])
                        self.got.seen_ms.append(now)
                        _add_headers(self.got, m)
                        if self.keys:
                            key = m.key() or b""
                            self.got.keys.append(key)
                            self.distinct.add(key)
        finally:
            self.cons.close()

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(30)

    def seen_at(self, got: Delivered) -> list[int]:
        """``stamps``: the ``seen_ms`` of each record of ``got`` (read with ``positions``)."""
        seen = dict(zip(self.got.positions, self.got.seen_ms, strict=True))
        missing = sum(1 for pos in got.positions if pos not in seen)
        if missing:
            raise BenchError(f"{missing} committed records the reader never received")
        return [seen[pos] for pos in got.positions]


def percentile(sorted_values: list[int] | list[float], q: float) -> float | None:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, int(-(-q * len(sorted_values) // 100)) - 1))
    return float(sorted_values[k])


def lateness_percentiles(late: list[int]) -> dict[str, float | None]:
    """p50 / p99 / p99.9 / max of lateness values (ms; any order)."""
    late = sorted(late)
    return {"p50": percentile(late, 50), "p99": percentile(late, 99), "p999": percentile(late, 99.9),
            "max": float(late[-1]) if late else None}


# -- memory and disk ------------------------------------------------------------------------------

def memory_of(pid: int, rollup: bool = False) -> dict[str, int]:
    """RSS split from ``/proc/PID/status`` (RssAnon = heap etc., RssFile = file pages, incl. the
    store's mmapped files); with ``rollup`` also USS-like private figures from ``smaps_rollup``."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
        if rollup:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                k, _, v = line.partition(":")
                if k in ("Pss", "Pss_Anon", "Pss_File", "Private_Clean", "Private_Dirty", "Shared_Clean",
                         "Shared_Dirty", "Anonymous"):
                    out[k] = int(v.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def rss_of(pid: int) -> tuple[int, int]:
    """(anonymous RSS, total RSS) of ``pid``, bytes."""
    m = memory_of(pid) or {}
    return m.get("RssAnon", 0), m.get("VmRSS", 0)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads, librdkafka's included)."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)


def schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for a CPU) of a process's main thread, from
    ``/proc/PID/schedstat``. The wait tells how much the machine's other load delayed it."""
    try:
        run_ns, wait_ns, _slices = Path(f"/proc/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(run_ns) / 1e9, int(wait_ns) / 1e9


def written_back() -> float:
    """MB of dirty pages the kernel has written back since boot (``/proc/vmstat nr_written``; 0
    where it cannot be read): the difference over a run is the machine's writeback during it."""
    try:
        vm = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
        return int(vm["nr_written"]) * 4 / 1024
    except (OSError, KeyError, ValueError):
        return 0.0


def quiet_disk() -> float:
    """Write back every dirty page now (``sync``) and return how long it took: a comparison's
    runs start with no writeback of what ran before them pending. The kernel writes a dirty page
    back ~30 s after it was dirtied, so otherwise the preload's and the previous run's hundreds
    of MB are written back during whichever run comes next (0.3-1.3 GB during a 10-s drain,
    measured), on the same two cores."""
    t = time.monotonic()
    os.sync()
    return time.monotonic() - t


class RssSampler(threading.Thread):
    """Samples a process's RSS/RssAnon every ``interval_s`` (cheap: /proc/PID/status)."""

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval_s = pid, interval_s
        self.samples: list[tuple[int, int, int]] = []  # (wall ms, rss, anon)
        self._stop_evt = threading.Event()

    def run(self) -> None:
        while not self._stop_evt.is_set():
            m = memory_of(self.pid)
            if m:
                self.samples.append((wall_ms(), m.get("VmRSS", 0), m.get("RssAnon", 0)))
            self._stop_evt.wait(self.interval_s)

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(5)


# G1's pauses (-Xlog:gc), ZGC's (-Xlog:gc+phases) and its allocation stalls (a thread that
# allocates waits for a collection: that request is answered late)
_GC_PAUSE = re.compile(r"^\[([^\]]+)\]\[[^\]]*\] (?:GC\(\d+\) )?(?:Pause|Allocation Stall) .* ([\d.]+)ms$")


def broker_gc_pauses(bench: Bench, since_ms: int, until_ms: int) -> list[tuple[int, float]]:
    """``(end, ms)`` of each GC pause of the broker the bench started that ended in
    ``[since_ms, until_ms]`` (wall clock), from its GC log (``LocalKafka(gc_log=True)``): while the
    JVM is stopped no fetch and no produce is answered, so every client waits. Empty for an external
    broker."""
    path = getattr(bench.broker, "gc_log_path", None)
    if path is None or not path.is_file():
        return []
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _GC_PAUSE.match(line.rstrip())
            if m is None:
                continue
            with contextlib.suppress(ValueError):
                end = int(datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() * 1000)
                if since_ms <= end <= until_ms:
                    out.append((end, float(m.group(2))))
    return out


def disk_usage(path: Path) -> tuple[int, int]:
    """(allocated bytes, apparent bytes) of a directory tree (preallocated files are sparse)."""
    alloc = apparent = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            alloc += st.st_blocks * 512
            apparent += st.st_size
    return alloc, apparent


# -- the processes under test ---------------------------------------------------------------------

class LogProc:
    """A subprocess writing JSON lines (structlog) to a log file we tail."""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_ms = 0
        self._fh: IO[bytes] | None = None
        self._buf = b""
        self.events: list[dict[str, Any]] = []

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _spawn(self, cmd: list[str], stdin_pipe: bool = False) -> None:
        self._fh = None
        self._buf = b""
        self.events = []
        if self.log_path.exists():
            self.log_path.unlink()
        self.started_ms = wall_ms()
        self.proc = spawn(cmd, self.log_path, stdin_pipe=stdin_pipe)

    def poll_events(self) -> list[dict[str, Any]]:
        """Parse new JSON lines from the log (non-JSON lines are ignored)."""
        if self._fh is None:
            if not self.log_path.exists():
                return self.events
            self._fh = open(self.log_path, "rb")  # noqa: SIM115 - kept open while tailing
        chunk = self._fh.read()
        if chunk:
            data = self._buf + chunk
            lines = data.split(b"\n")
            self._buf = lines.pop()
            for line in lines:
                if line.startswith(b"{"):
                    with contextlib.suppress(orjson.JSONDecodeError):
                        ev = orjson.loads(line)
                        ev["_seen_ms"] = wall_ms()
                        self.events.append(ev)
        return self.events

    def last(self, event: str) -> dict[str, Any] | None:
        for ev in reversed(self.poll_events()):
            if ev.get("event") == event:
                return cast(dict[str, Any], ev)
        return None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
            raise BenchError(f"{self.name} exited with status {self.proc.returncode}:\n{tail}")

    def wait_event(self, event: str, timeout_s: float) -> dict[str, Any]:
        found: list[dict[str, Any]] = []

        def seen() -> bool:
            ev = self.last(event)
            if ev is not None:
                found.append(ev)
            return ev is not None

        wait_until(f"{self.name} to log {event}", seen, timeout_s, 0.05, self.check_alive)
        return found[0]

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> int:
        rc = stop_proc(self.proc, sig, timeout_s) if self.proc is not None else 0
        if self._fh is not None:
            self.poll_events()
            self._fh.close()
            self._fh = None
        return rc


class SidecarProc(LogProc):
    """``python -m sidecar run`` with one scheduler, on its own data dir and (unless ``group`` is
    given: several instances of one group) its own consumer group.

    ``static_id``: ``True`` passes ``--group-instance-id <group>-0``, a string passes that id,
    ``False`` passes none (the sidecar then keeps the one it makes in ``<data-dir>/instance-id``).
    ``session_timeout_ms`` (``None``: the sidecar's default) goes to ``--kafka``. ``config``: a
    YAML file naming tenants (``ingress`` is then the first tenant's topic, for the logs)."""

    def __init__(self, bootstrap: str, workdir: Path, ingress: str, scheduler: str, *, tag: str = "",
                 extra: list[str] | None = None, profile: Path | None = None, group: str | None = None,
                 static_id: bool | str = True, partitions: int = 1, dlq: str | None = None,
                 session_timeout_ms: int | None = 10_000, config: Path | None = None) -> None:
        name = f"sidecar-{scheduler}{'-' + tag if tag else ''}-{uid()}"
        super().__init__(name, workdir / f"{name}.log")
        self.bootstrap = bootstrap
        self.data_dir = workdir / name
        self.ingress = ingress
        self.dlq = dlq or f"bench.dlq.{uid()}"
        self.group = group or f"bench-{name}"
        self.static_id: str | None = (f"{self.group}-0" if static_id is True else static_id or None)
        self.partitions = partitions
        self.session_timeout_ms = session_timeout_ms
        self.scheduler = scheduler
        self.extra = list(extra or [])
        self.profile = profile
        self.starts = 0
        self.config = config  # a YAML file of tenants: their ingress and DLQ topics in place of the flags

    def start(self, wait: bool = True, timeout_s: float = 120) -> None:
        self.starts += 1
        # KDS_BENCH_SIDECAR_PYTHON: a command that runs another checkout's Python (docs/benchmarks.md,
        # "Another commit's sidecar"), so one harness measures two commits' sidecars side by side
        prefix = [os.environ.get(SIDECAR_PYTHON_ENV) or sys.executable]
        if self.profile is not None:
            self.profile.parent.mkdir(parents=True, exist_ok=True)
            prefix += ["-m", "cProfile", "-o", str(self.profile.with_suffix(f".{self.starts}.prof"))]
        cmd = [
            *prefix, "-m", "sidecar", "run", "--bootstrap-servers", self.bootstrap,
            *(["--ingress-topic", self.ingress, "--dlq-topic", self.dlq] if self.config is None else
              ["--config", str(self.config)]),
            "--data-dir", str(self.data_dir),
            "--scheduler", self.scheduler, "--group-id", self.group,
            *(["--group-instance-id", self.static_id] if self.static_id else []),
            "--ingress-partitions", str(self.partitions), "--stats-interval", "250ms", "--log-level", "info",
            *(["--kafka", f"session.timeout.ms={self.session_timeout_ms}"] if self.session_timeout_ms else []),
            *self.extra,
        ]
        self._spawn(cmd)
        if wait:
            self.wait_event("partitions.assigned", timeout_s)

    def wipe(self) -> None:
        """Delete the data directory (a node lost with its disk); the process must not run."""
        assert self.proc is None or self.proc.poll() is not None, "wipe() of a running sidecar"
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def stats(self) -> dict[str, Any] | None:
        return self.last("stats")

    def counter(self, key: str) -> int:
        st = self.stats()
        return int(st.get(key, 0)) if st else 0

    def wait_counter(self, key: str, at_least: int, timeout_s: float) -> None:
        wait_until(f"{self.name} {key} >= {at_least}", lambda: self.counter(key) >= at_least, timeout_s, 0.1,
                   self.check_alive)


class ScriptProc(LogProc):
    """A bench helper module (``python -m bench.<module>``) that prints JSON events."""

    def __init__(self, module: str, workdir: Path, args: list[str], tag: str = "",
                 cmd: list[str] | None = None) -> None:
        name = f"{module.rsplit('.', 1)[-1]}{'-' + tag if tag else ''}-{uid()}"
        super().__init__(name, workdir / f"{name}.log")
        self.cmd = cmd or [sys.executable, "-m", module, *args]

    def start(self) -> None:
        self._spawn(self.cmd)

    def result(self, timeout_s: float) -> dict[str, Any]:
        """Wait for the final ``done`` event (the process then exits by itself)."""
        ev = self.wait_event("done", timeout_s)
        assert self.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        self.stop()
        return ev


def rdkafka_value(v: Any) -> str:
    """A client setting as librdkafka's C API takes it (a string): Python's bools as ``true`` /
    ``false``, which confluent_kafka converts on its own but a C caller must be given."""
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def passthrough_cmd(args: list[str]) -> list[str] | None:
    """The passthrough's command when ``KDS_BENCH_PASSTHROUGH`` names another one (``native-forward``,
    the loop in C, or ``python -m bench.passthrough --native-produce``; docs/benchmarks.md): it
    takes the same ``args`` plus the passthrough's client settings as ``-P`` / ``-C``
    ``key=value``; None: ``bench.passthrough`` as it is."""
    native = os.environ.get(PASSTHROUGH_ENV)
    if not native:
        return None

    def kv(flag: str, conf: dict[str, Any]) -> list[str]:
        return [a for k, v in conf.items() for a in (flag, f"{k}={rdkafka_value(v)}")]

    return [*shlex.split(native), *args, *kv("-P", DELIVERY_PRODUCER), *kv("-C", INGRESS_CONSUMER)]


def kafka_ready(bootstrap: str, timeout_s: float = 30) -> None:
    try:
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=timeout_s)
    except KafkaException as e:
        raise BenchError(f"no broker answers at {bootstrap}: {e}") from None


# -- the bench context ------------------------------------------------------------------------------

@dataclass
class Bench:
    """What every scenario gets: where the broker is, where to write, how big, which schedulers,
    which changelog modes ``throughput`` and ``lateness`` measure (``on``: the sidecar's default;
    ``off``: ``--changelog off``) and which delivery modes (``at-least-once``: the sidecar's
    default, in each changelog mode; ``exactly-once``: ``--delivery exactly-once``, changelog on),
    and the results of scenarios that already ran in this
    invocation (later ones reuse them, e.g. lateness runs at 50 % of the throughput scenario's
    measured maximum)."""

    bootstrap: str
    workdir: Path
    size: str
    schedulers: list[str]
    profile_dir: Path | None = None
    changelog_modes: list[str] = field(default_factory=lambda: ["on"])
    delivery_modes: list[str] = field(default_factory=lambda: ["at-least-once"])
    results: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # scenario flags (``scale_pending``, ``scale_rate``)
    broker: Any = None  # the devkafka.local.LocalKafka the bench started (None: an external broker)
    transaction_interval_ms: int = TRANSACTION_INTERVAL_MS  # exactly-once sidecars' --transaction-interval
    _wm: Watermarks | None = None
    _topics: list[str] = field(default_factory=list)

    @property
    def full(self) -> bool:
        return self.size == "full"

    @property
    def wm(self) -> Watermarks:
        if self._wm is None:
            self._wm = Watermarks(self.bootstrap)
        return self._wm

    def topics(self, *names: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        create_topics(self.bootstrap, list(names), partitions, config)
        self._topics.extend(names)

    @property
    def other_changelog(self) -> str:
        """The changelog mode of the scenarios that do not measure both (pending-memory, restart,
        mass-expiry, redis-zset): ``off`` when ``--changelog off`` alone was asked for (the
        single-instance figures, comparable with runs from before the changelog existed), else
        the sidecar's default, ``on``. ``failover`` and ``restore`` always run with it on."""
        return "off" if self.changelog_modes == ["off"] else "on"

    @property
    def other_delivery(self) -> str:
        """The delivery mode of ``recurring``, which measures one: ``exactly-once`` when
        ``--delivery exactly-once`` alone was asked for, else ``at-least-once``."""
        return "exactly-once" if self.delivery_modes == ["exactly-once"] else "at-least-once"

    def sidecar(self, ingress: str, scheduler: str, tag: str = "", extra: list[str] | None = None,
                changelog: str = "on", changelog_topic: str | None = None, delivery: str = "at-least-once",
                **kw: Any) -> SidecarProc:
        """A sidecar process (not started). ``changelog``: ``on`` (default flags; with
        ``changelog_topic`` its own changelog topic, for sidecars that read an ingress topic
        another one read before) or ``off``. ``delivery``: ``at-least-once`` (the default) or
        ``exactly-once`` (``--delivery exactly-once``, which needs the changelog on). Its DLQ and
        changelog topics are deleted by :meth:`cleanup_topics`."""
        prof = None
        if self.profile_dir is not None:
            prof = self.profile_dir / f"{tag or 'sidecar'}-{scheduler}.prof"
        extra = list(extra or [])
        if changelog == "off":
            extra += ["--changelog", "off"]
        elif changelog_topic is not None:
            extra += ["--changelog-topic", changelog_topic]
        if delivery != "at-least-once":
            extra += ["--delivery", delivery, "--transaction-interval", f"{self.transaction_interval_ms}ms"]
        sc = SidecarProc(self.bootstrap, self.workdir, ingress, scheduler, tag=tag, extra=extra, profile=prof, **kw)
        self._topics.append(sc.dlq)
        if changelog == "on":
            self._topics.append(changelog_topic or f"{ingress}.changelog")
        return sc

    def warm_up(self, seconds: float, rate: float = 20_000) -> dict[str, Any]:
        """Push 100 B records through a scratch topic for ``seconds`` at ``rate`` records/s
        (produced and consumed at once) before any scenario. A fresh JVM interprets the broker's
        code until its JIT compilers have compiled the hot paths, and those compilers take most of
        a core for the first minute of traffic: a lateness run on a cold broker had all its seconds
        with records over 50 ms late in its first 34 s, none after. Every scenario, and every
        baseline in it, then meets the same warm broker. Paced, not as fast as possible: an
        unpaced warm-up wrote 13.5M records (1.4 GB) whose deletion and writeback then fell into
        the first scenario."""
        topic = f"bench.warmup.{uid()}"
        create_topics(self.bootstrap, [topic])
        prod = PacedProducer(self.bootstrap, topic, topic, rate, 100, lambda _i: 0, duration_s=seconds)
        cons = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"bench-warmup-{uid()}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10})
        cons.assign([TopicPartition(topic, 0, 0)])
        consumed = 0
        prod.start()
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                consumed += len(cons.consume(num_messages=1000, timeout=0.1))
        finally:
            prod.stop()
            cons.close()
            delete_topics(self.bootstrap, [topic])
        return {"seconds": seconds, "rate": rate, "produced": prod.sent, "consumed": consumed}

    def topics_to_delete(self, *names: str) -> None:
        """Topics a sidecar creates itself (a tenant's DLQ, changelog), deleted by :meth:`cleanup_topics`."""
        self._topics.extend(names)

    def cleanup_topics(self) -> None:
        """Delete the topics created so far (frees broker disk between scenarios)."""
        topics, self._topics = self._topics, []
        delete_topics(self.bootstrap, topics)

    def close(self) -> None:
        if self._wm is not None:
            self._wm.close()
            self._wm = None
