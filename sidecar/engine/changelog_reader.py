"""The changelog's restore consumer: reading a store's changelog back (``changelog.py``'s
restores, ``standbys.py``'s lag) through one consumer with no group, its partitions assigned by
hand.

One consumer reads every tenant's changelog topic; a record's store is named by the ingress
topic its changelog topic belongs to (``key``). Offsets are asked with :func:`asked_again`: a
just-created changelog partition has no leader yet and a leader moves, and these questions are
asked in the assign callback, where an exception would leave ``consume`` and stop the sidecar.
The watermarks of many partitions at once go through the admin client (two requests, not a round
trip per partition), falling back to the consumer's own query while the admin client's view
lags a broker restart.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, IsolationLevel, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

from sidecar import contract as c
from sidecar import logs
from sidecar.config import Settings
from sidecar.engine.client_conf import FETCH_QUEUE_BACKOFF_MS
from sidecar.engine.stores import StoreKey

log = logs.get("sidecar")

# broker answers that a moment later are different (leadership moving or not yet elected)
TRANSIENT = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION, KafkaError.BROKER_NOT_AVAILABLE,
    KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._TIMED_OUT_QUEUE, KafkaError._ALL_BROKERS_DOWN,
})


def asked_again(ask: Callable[[], Any], what: str, should_warn: Callable[[str], bool], timeout: float = 30) -> Any:
    """``ask()``, asked again while the broker's answer is transient (no leader yet for a
    just-created partition, a leader moving: NOT_LEADER_FOR_PARTITION), up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ask()
        except KafkaException as e:
            err: Any = e.args[0] if e.args else None
            transient = err is not None and (err.code() in TRANSIENT or err.retriable())
            if not transient or time.monotonic() >= deadline:
                raise
            if should_warn(f"asked_again:{what}"):
                log.info("kafka.asked_again", what=what, error=err.str())
            time.sleep(0.1)


class ChangelogReader:
    """The restore consumer, made when first needed: ``common()`` is the clients' base
    configuration, ``make(conf)`` the consumer factory, ``admin()`` the deployment's admin client."""

    def __init__(self, settings: Settings, changelogs: dict[str, str], common: Callable[[], dict[str, Any]],
                 make: Callable[[dict[str, Any]], Any], admin: Callable[[], Any],
                 should_warn: Callable[[str], bool]) -> None:
        self.s = settings
        self.changelogs = changelogs  # ingress topic -> its changelog topic
        self._ingress_of = {cl: topic for topic, cl in changelogs.items()}
        self._common = common
        self._make = make
        self._admin = admin
        self._should_warn = should_warn
        self._consumer: Any = None

    def _restorer(self) -> Any:
        if self._consumer is None:
            conf = self._common()
            conf.update({
                "group.id": c.restore_group(self.s.group_id),  # never joined: partitions are assigned by hand
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "fetch.max.bytes": 64 * 1024 * 1024,
                # a restore polls without waiting: the broker must not hold a fetch 500 ms (the
                # default) for data that is not there, nor keep a watermark query behind it
                "fetch.wait.max.ms": 10,
                "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
            })
            conf.update(self.s.kafka)
            self._consumer = self._make(conf)
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _cl(self, key: StoreKey, offset: int | None = None) -> TopicPartition:
        """The changelog partition of the store under ``key``."""
        if offset is None:
            return TopicPartition(self.changelogs[key.topic], key.partition)
        return TopicPartition(self.changelogs[key.topic], key.partition, offset)

    def key(self, msg: Any) -> StoreKey:
        """The store a changelog record belongs to."""
        return StoreKey(self._ingress_of[msg.topic()], msg.partition())

    def watermarks(self, partition: StoreKey) -> tuple[int, int]:
        """The changelog partition's (low, high) offsets."""
        def ask() -> tuple[int, int]:
            low, high = self._restorer().get_watermark_offsets(self._cl(partition), timeout=30, cached=False)
            return int(low), int(high)

        result: tuple[int, int] = asked_again(ask, "changelog_watermarks", self._should_warn)
        return result

    def watermarks_many(self, partitions: list[StoreKey]) -> dict[StoreKey, tuple[int, int]]:
        """``watermarks`` of several partitions in two requests (earliest and latest offsets of
        all of them), not a round trip per partition one after the other: an assignment of many
        partitions waited for each in its callback."""
        if not partitions:
            return {}
        tps = {p: self._cl(p) for p in partitions}
        admin = self._admin()
        # read_committed, as the restore consumer reads (its isolation.level default)
        kw = {"isolation_level": IsolationLevel.READ_COMMITTED, "request_timeout": 30}
        earliest, latest = OffsetSpec.earliest(), OffsetSpec.latest()  # type: ignore[no-untyped-call]

        def ask() -> dict[StoreKey, tuple[int, int]]:
            lows = admin.list_offsets(dict.fromkeys(tps.values(), earliest), **kw)
            highs = admin.list_offsets(dict.fromkeys(tps.values(), latest), **kw)
            return {p: (int(lows[tp].result().offset), int(highs[tp].result().offset)) for p, tp in tps.items()}

        try:
            result: dict[StoreKey, tuple[int, int]] = asked_again(ask, "changelog_watermarks", self._should_warn,
                                                                  timeout=10)
        except KafkaException as e:
            # the admin client's view can lag a broker restart (FENCED_LEADER_EPOCH seen for a
            # while after one): the restore consumer's own query, one partition at a time
            log.info("changelog.watermarks_fallback", partitions=len(partitions), error=str(e))
            result = {p: self.watermarks(p) for p in partitions}
        return result

    def end(self, partition: StoreKey) -> int | None:
        """The changelog partition's end offset as the restore consumer last saw it (no request)."""
        try:
            _low, high = self._restorer().get_watermark_offsets(self._cl(partition), cached=True)
        except KafkaException:
            return None
        return int(high) if high >= 0 else None

    def assign(self, partition: StoreKey, offset: int | None) -> None:
        at = OFFSET_BEGINNING if offset is None else offset
        self._restorer().incremental_assign([self._cl(partition, at)])

    def unassign(self, partition: StoreKey) -> None:
        self._restorer().incremental_unassign([self._cl(partition)])

    def positions(self, partitions: list[StoreKey]) -> dict[StoreKey, int]:
        """The restore consumer's fetch positions (local: no request). Past the last record it
        returned when a transaction marker follows (a transactional changelog: exactly-once)."""
        tps = self._restorer().position([self._cl(p) for p in partitions])
        return {StoreKey(self._ingress_of[tp.topic], tp.partition): tp.offset for tp in tps if tp.offset >= 0}

    def consume(self, n: int, timeout: float) -> list[Message]:
        msgs: list[Message] = self._restorer().consume(num_messages=n, timeout=timeout)
        return msgs
