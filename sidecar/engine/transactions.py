"""Exactly-once delivery (``delivery: exactly-once``): the producer's Kafka transactions.

Kafka's transactions (KIP-98) and consumer-group fencing (KIP-447) make a delivery and the state
change it implies commit or abort together. With ``delivery: exactly-once`` everything the
sidecar produces goes through one transactional producer, and one transaction covers one
``transaction-interval``:

- the delivered records and dead letters (target topics, DLQ), and, written when each is
  *produced*, the changelog tombstone of its ``delay.id`` (not at its delivery report, as
  at-least-once does: the report can come after the commit);
- the changelog puts of the records accepted meanwhile, and the ingress offsets they cover
  (``send_offsets_to_transaction`` with the consumer's group metadata), instead of the
  consumer's own offset commit;
- the history records.

A ``read_committed`` consumer of the target, DLQ and changelog topics sees all of it when the
transaction commits, or none of it. So the changelog's committed records, and the group's
committed offsets, always describe exactly the deliveries that consumers can see.

**Fencing.** The transactional id is ``<group-id>.<group-instance-id>`` (a tenant with its own
principal has a producer and transactions of its own, ``<group-id>.<tenant>:<group-instance-id>``:
engine/txn_lanes.py): a restarted instance
(same data directory, same instance id) fences its previous incarnation and aborts what it left
open (``init_transactions``). A member the group expelled (a zombie: paused past its session) has
an older group generation: its ``send_offsets_to_transaction`` is refused
(``ILLEGAL_GENERATION`` / ``UNKNOWN_MEMBER_ID`` / ``FENCED_INSTANCE_ID``), so its transaction
aborts and nothing it delivered becomes visible. An instance lost for good leaves its open
transaction to the coordinator, which aborts it after ``transaction.timeout.ms``
(``transaction-timeout``); until then ``read_committed`` consumers of the partitions it wrote to
wait (the last stable offset).

**The local store after an abort or a crash.** The store settles a record when its delivery
report arrives, before the transaction commits; an aborted transaction would leave the store
ahead of what Kafka committed. So a store is trusted only if it was closed cleanly right after a
committed transaction: a store opened in this mode is marked ``eos.dirty`` (this module's
:func:`mark_dirty`), and the mark is removed by a clean close (revoke, shutdown) after its last
transaction committed and its checkpoint was written. A store opened with the mark is wiped and
restored from the changelog's committed records (Kafka Streams does the same under EOS). An
aborted transaction (a refused produce, a lost partition, a fenced generation, a broker outage
at the commit) wipes and restores every owned partition in the running process, and the
consumer goes back to the group's committed offsets (:meth:`ExactlyOnce.reset`, engine/exactly_once.py).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import KafkaException, TopicPartition

from sidecar import logs

log = logs.get("sidecar")

DIRTY = "eos.dirty"  # a store's file: opened in exactly-once mode and not closed cleanly since
COMMIT_TIMEOUT_S = 30.0
COMMIT_RETRIES = 3  # a retriable commit error is asked again this many times, then aborted
# send_offsets_to_transaction is one request to the group coordinator (a few ms); given this long
OFFSETS_TIMEOUT_S = 10.0
# a transactional call that has not returned this long after its own timeout is stuck (below)
STUCK_GRACE_S = 5.0

T = TypeVar("T")


def transactional_id(group_id: str, instance_id: str) -> str:
    return f"{group_id}.{instance_id}"


def tenant_transactional_id(group_id: str, tenant: str, instance_id: str) -> str:
    """The transactional id of the producer of a tenant with ``kafka:`` overrides (its own
    principal): ``<group-id>.<tenant>:<instance-id>``. The instance id keeps the fencing of a
    restarted instance per tenant; the tenant's name comes first, ended by ``:`` (which no tenant
    name holds), so that one prefixed ACL ``<group-id>.<tenant>:`` covers every instance of that
    tenant and no other tenant's ids (``payments`` and ``payments.eu`` do not share a prefix)."""
    return f"{group_id}.{tenant}:{instance_id}"


def is_dirty(store_dir: Path) -> bool:
    return (store_dir / DIRTY).exists()


def mark_dirty(store_dir: Path) -> None:
    """Mark a store opened in exactly-once mode (durably: a crash right after must see it)."""
    store_dir.mkdir(parents=True, exist_ok=True)
    path = store_dir / DIRTY
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"opened in exactly-once mode; not closed after a committed transaction\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    _sync_dir(store_dir)


def mark_clean(store_dir: Path) -> None:
    """The store's state is exactly what the committed transactions say (closed cleanly)."""
    try:
        (store_dir / DIRTY).unlink()
    except FileNotFoundError:
        return
    _sync_dir(store_dir)


def wipe(store_dir: Path) -> None:
    """Delete a store's files: it is restored from the changelog's committed records."""
    shutil.rmtree(store_dir, ignore_errors=True)
    store_dir.mkdir(parents=True, exist_ok=True)
    _sync_dir(store_dir.parent)


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TransactionFailed(Exception):
    """The transaction was aborted (``reason``); the caller restores the committed state."""

    def __init__(self, reason: str, fatal: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fatal = fatal  # the producer instance is unusable: a new one is needed


def _describe(e: KafkaException) -> tuple[str, Any]:
    err: Any = e.args[0] if e.args else None
    if err is None or not hasattr(err, "code"):
        return str(e), None
    return f"{err.name()}: {err.str()}", err


def bounded(call: Callable[[], T], what: str, timeout_s: float) -> T:
    """``call()`` (a blocking transactional call given ``timeout_s``), run on a thread of its own
    and waited for ``timeout_s + STUCK_GRACE_S``. librdkafka does not always keep the timeout:
    ``send_offsets_to_transaction`` waits for ever once the group coordinator it cached is gone
    from the metadata, as after a broker restart (librdkafka issues 5456 and 5511, measured here:
    a sidecar stuck in it for minutes after the bench restarted the broker). A call still running
    then raises a fatal :class:`TransactionFailed`: the caller replaces the producer, whose
    successor's ``init_transactions`` fences the stuck one and aborts its transaction. The stuck
    thread keeps the old producer until it returns, if ever (a daemon thread: it does not hold
    up the process's exit)."""
    box: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            box.append((True, call()))
        except BaseException as e:  # handed to the caller as it was raised
            box.append((False, e))

    t = threading.Thread(target=run, name=f"kds-txn-{what}", daemon=True)
    t.start()
    t.join(timeout_s + STUCK_GRACE_S)
    if not box:
        raise TransactionFailed(f"{what} did not return within {timeout_s + STUCK_GRACE_S:.0f} s "
                                f"(its timeout is {timeout_s:.0f} s): the producer is given up", fatal=True)
    ok, value = box[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


class Transactions:
    """The transaction cycle of one transactional producer (made by :class:`KafkaIO`)."""

    def __init__(self, kafka: Any, interval_ms: int, clock: Any, tally: Transactions | None = None) -> None:
        self.kafka = kafka  # KafkaIO (or a tenant's port, engine/txn_lanes.py): its producer may be replaced
        self.interval_s = interval_ms / 1000
        self.clock = clock
        self.open = False
        self.last = 0.0  # monotonic time of the last commit (or begin)
        self.committed = 0
        self.aborted = 0
        self.commit_s: list[float] = []  # durations of the commits since the metrics took them
        self.tally = self if tally is None else tally  # where the counts go: a tenant's, to the deployment's

    def start(self) -> None:
        """Register the transactional id (fencing any earlier producer with it) and begin."""
        self.kafka.producer.init_transactions(COMMIT_TIMEOUT_S)
        self.begin()

    def begin(self) -> None:
        self.kafka.producer.begin_transaction()
        self.open = True
        self.last = self.clock.monotonic()

    def due(self, mono: float) -> bool:
        # the same expression as ``wait_s``: a float rounding between the two left a loop that
        # neither committed nor waited
        return self.open and self.last + self.interval_s - mono <= 0

    def wait_s(self, mono: float) -> float:
        """Seconds until the next commit is due (the loop does not sleep past it)."""
        return max(0.0, self.last + self.interval_s - mono)

    def commit(self, offsets: list[TopicPartition], group_metadata: Any, begin: bool = True) -> None:
        """Commit what was produced since ``begin`` with the ingress ``offsets``, then begin the
        next transaction (``begin``). Raises :class:`TransactionFailed` after aborting (or, for a
        fatal error, without: the producer is dead)."""
        producer = self.kafka.producer
        t0 = time.perf_counter()
        try:
            if offsets:
                bounded(lambda: producer.send_offsets_to_transaction(offsets, group_metadata, OFFSETS_TIMEOUT_S),
                        "send_offsets_to_transaction", OFFSETS_TIMEOUT_S)
            for attempt in range(COMMIT_RETRIES + 1):
                try:
                    bounded(lambda: producer.commit_transaction(COMMIT_TIMEOUT_S), "commit_transaction",
                            COMMIT_TIMEOUT_S)
                    break
                except KafkaException as e:
                    _why, err = _describe(e)
                    if err is None or not err.retriable() or attempt == COMMIT_RETRIES:
                        raise
        except TransactionFailed:  # a call that did not return (bounded): the producer is given up
            self.open = False
            self.tally.aborted += 1
            raise
        except KafkaException as e:
            self.open = False
            why, err = _describe(e)
            if err is not None and err.fatal():
                self.tally.aborted += 1
                raise TransactionFailed(why, fatal=True) from e
            self.abort()
            raise TransactionFailed(why) from e
        self.open = False
        self.tally.committed += 1
        if len(self.tally.commit_s) < 10_000:  # taken every second by the metrics, when there are metrics
            self.tally.commit_s.append(time.perf_counter() - t0)
        if begin:
            self.begin()

    def abort(self, begin: bool = True) -> None:
        """Abort the open transaction (what it produced is never visible to ``read_committed``)
        and begin the next (``begin``). The records it purged report failures at the next poll."""
        self.tally.aborted += 1
        self.open = False
        producer = self.kafka.producer
        for attempt in range(COMMIT_RETRIES + 1):
            try:
                bounded(lambda: producer.abort_transaction(COMMIT_TIMEOUT_S), "abort_transaction", COMMIT_TIMEOUT_S)
                break
            except KafkaException as e:
                why, err = _describe(e)
                # retriable (the coordinator unreachable): asked again; then, or if fatal, the
                # producer is given up (the caller makes a new one, whose registration aborts it)
                if err is None or err.fatal() or not err.retriable() or attempt == COMMIT_RETRIES:
                    raise TransactionFailed(why, fatal=True) from e
        if begin:
            self.begin()
