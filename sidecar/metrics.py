"""Prometheus metrics of the sidecar, behind a small class with batch-sized methods.

Why a class and not module-level metric objects: each :class:`Metrics` owns its own
``CollectorRegistry``, so tests (and a process that runs several sidecars, e.g. benchmarks)
can create as many as they like without "Duplicated timeseries" errors from the global
registry, and nothing leaks between tests.

Why explicit methods: the event loop handles records in batches of thousands. Every method
here takes a count or a list and touches each Prometheus object once per call
(``ingested(5000)``, not 5000 ``inc()`` calls). The lateness histogram, which gets one value
per delivered record, is a small custom collector that buckets a whole batch (one sort, one
``bisect`` per bound) under one lock acquisition instead of ``Histogram.observe`` per value.

Tenants (``sidecar/tenants.py``): the series that are per tenant carry a ``tenant`` label
(``default`` for the one implicit tenant): delivered records, dead letters by reason, pending
records by tier and delivery lateness. :meth:`Metrics.tenant` returns a tenant's
:class:`TenantMetrics`, its labelled children resolved once, so the once-a-second sync does no
label look-up per tenant and series. The quotas' per-tenant series (quota rejections, pacing lag)
are ``engine/quota_metrics.py``'s; ``sidecar.tenants.tenant_by_topic`` names a store's tenant.

Series (all prefixed ``delay_sidecar_``; base units: seconds, bytes, records):

=================================  =======  ===========================================================
``ingested_records_total``         counter  ingress records accepted into the store
``scheduled_records_total``        counter  ``{scheduler}`` (levels / wheel): records handed to a scheduler
``delivered_records_total``        counter  ``{tenant}``: records acknowledged by the target topic
``cancelled_records_total``        counter  pending records removed by a ``delay.cancel``
``duplicate_records_total``        counter  records dropped because their ``delay.id`` was pending
``replaced_records_total``         counter  pending records replaced by a newer version (``delay.replace``)
``recurring_firings_total``        counter  firings of recurring schedules settled (delivered or dead-lettered)
``recurring_missed_total``         counter  nominal firing times a misfire left out (after downtime or a backlog)
``dlq_records_total``              counter  ``{reason, tenant}``: every reason code of the contract
                                            exists at 0 for every tenant
``publish_retries_total``          counter  publishes re-scheduled after a failed delivery report
``early_deliveries_total``         counter  deliveries before their due time; must stay 0
``pending_records``                gauge    ``{tier, tenant}``: ``level-N`` / ``wheel`` / ``bucket`` /
                                            ``retry``;
                                            a cancelled record's entry counts until its due
                                            time passes (a cancel marks the entry in place)
``delivery_lateness_seconds``      histo.   ``{tenant}``: send time minus due time, 1 ms .. 60 s buckets
``consumer_lag_records``           gauge    ``{partition, tenant}``: ingress lag from librdkafka
                                            statistics, one series per assigned partition of every
                                            tenant's ingress topic
``store_bytes``                    gauge    bytes the store's files hold on disk (allocated blocks)
``store_preallocated_bytes``       gauge    the same files' sizes: preallocated, sparse until written
``ingress_paused``                 gauge    1 while ingress consumption is paused (backpressure)
``ingress_paused_reason``          gauge    ``{reason}``: 1 for the current pause reason, else 0; the
                                            reasons are the codes of ``sidecar.store.space``
                                            (``disk-max-bytes``, ``disk-max-bytes-stalled``,
                                            ``disk-min-free-bytes``, ...)
``changelog_unacked_writes``       gauge    ``{partition}``: changelog writes not yet acknowledged
                                            (an offset commit waits for them)
``changelog_refused_writes``       gauge    ``{partition}``: changelog writes refused by the broker and
                                            being retried (ingress is paused meanwhile)
``restore_remaining_records``      gauge    ``{partition}``: changelog records still to restore before
                                            the partition is consumed (0 once restored)
``restored_records_total``         counter  changelog records applied by restores
``standby_lag_records``            gauge    ``{partition}``: changelog records a standby store has not
                                            applied yet (``standby-replicas``)
``up`` / ``ready``                 gauge    1 while the process runs / while ``/readyz`` is 200
=================================  =======  ===========================================================

Thread safety: the event loop is the only writer; the HTTP thread only reads (``render``).
prometheus_client's own objects lock internally; the histogram here takes its own lock.
"""

from __future__ import annotations

import contextlib
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from sidecar.contract import METRIC_PREFIX as PREFIX
from sidecar.contract import REASONS
from sidecar.tenants import DEFAULT_TENANT

# Delivery lateness buckets, in seconds (1 ms .. 60 s). The same values in ms are used to bucket.
LATENESS_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
)

TIER_WHEEL = "wheel"
TIER_BUCKET = "bucket"
TIER_RETRY = "retry"


def level_tier(level: int) -> str:
    """The ``pending_records`` tier label of delay level ``level`` (1-based): ``level-3``."""
    return f"level-{level}"


class _Buckets:
    """One tenant's lateness histogram, fed in batches of integer milliseconds.

    Observations below 0 (early deliveries) are counted by the caller and recorded as 0 here,
    so the histogram's sum never decreases and ``rate(..._sum)`` stays meaningful.
    """

    def __init__(self, bounds_ms: tuple[int, ...], lock: threading.Lock) -> None:
        self._bounds_ms = bounds_ms
        self.counts = [0] * (len(bounds_ms) + 1)  # last one: above the highest bound
        self.sum_ms = 0
        self._lock = lock

    def observe_ms(self, values: Iterable[int]) -> int:
        """Count a batch into the buckets; return how many values were negative (recorded as 0).

        One C sort of the batch, then one ``bisect_right`` per bound (a bucket's count is how
        many values are <= its bound, less those <= the bound before: Prometheus buckets are
        "le"), instead of a Python step per value."""
        vs = sorted(values)
        if not vs:
            return 0
        neg = bisect_left(vs, 0)
        total = sum(vs) - sum(islice(vs, neg))
        local = []
        prev = 0
        for b in self._bounds_ms:
            k = bisect_right(vs, b)
            local.append(k - prev)
            prev = k
        local.append(len(vs) - prev)
        with self._lock:
            counts = self.counts
            for i, c in enumerate(local):
                if c:
                    counts[i] += c
            self.sum_ms += total
        return neg


class _LatenessHistogram(Collector):
    """A histogram per tenant (``child``), exposed in seconds with a ``tenant`` label."""

    def __init__(self, name: str, documentation: str, buckets_s: Sequence[float]) -> None:
        self._name = name
        self._doc = documentation
        self._bounds_s = tuple(buckets_s)
        self._bounds_ms = tuple(round(b * 1000) for b in buckets_s)
        self._children: dict[str, _Buckets] = {}
        self._lock = threading.Lock()

    def child(self, tenant: str) -> _Buckets:
        with self._lock:
            b = self._children.get(tenant)
            if b is None:
                b = self._children[tenant] = _Buckets(self._bounds_ms, self._lock)
            return b

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self._name, self._doc, labels=["tenant"])]

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            snap = [(t, list(b.counts), b.sum_ms) for t, b in self._children.items()]
        family = HistogramMetricFamily(self._name, self._doc, labels=["tenant"])
        for tenant, counts, sum_ms in snap:
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for bound, c in zip(self._bounds_s, counts, strict=False):
                cumulative += c
                buckets.append((_float_str(bound), cumulative))
            cumulative += counts[-1]
            buckets.append(("+Inf", cumulative))
            family.add_metric([tenant], buckets, sum_ms / 1000)
        yield family


def _float_str(v: float) -> str:
    return repr(float(v))


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _lag(part: dict[str, object]) -> int | None:
    """One partition's lag from its statistics (``Metrics.update_from_stats``), None: no series."""
    desired = part.get("desired")
    if desired is False:
        return None
    lag = _int(part.get("consumer_lag"))
    if lag is not None and lag >= 0:
        return lag
    if desired is not True:
        return None
    hi = _int(part.get("hi_offset"))
    if hi is None or hi < 0:
        return None
    committed = _int(part.get("committed_offset"))
    lo = _int(part.get("lo_offset"))
    base = committed if committed is not None and committed >= 0 else (lo if lo is not None and lo >= 0 else 0)
    return max(0, hi - base)


class Metrics:
    """All sidecar metrics on a private registry. ``render()`` is the ``/metrics`` body."""

    def __init__(
        self,
        ingress_topic: str = "delay.ingress",
        scheduler: str = "levels",
        tiers: Iterable[str] = (),
        tenants: Iterable[str] = (DEFAULT_TENANT,),
        ingress_topics: Mapping[str, str] | None = None,
    ) -> None:
        """``ingress_topics``: each tenant's ingress topic -> its name (``tenants.tenant_by_topic``),
        the topics whose consumer lag is read; None: ``ingress_topic``, of the first tenant."""
        tenants = tuple(tenants)
        self.ingress_topic = ingress_topic
        self.ingress_topics = dict(ingress_topics) if ingress_topics is not None else {
            ingress_topic: tenants[0] if tenants else DEFAULT_TENANT}
        self.scheduler = scheduler
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry

        self._ingested = Counter(PREFIX + "ingested_records", "Ingress records accepted into the store",
                                 registry=r)
        self._scheduled = Counter(PREFIX + "scheduled_records", "Records handed to a scheduler",
                                  ["scheduler"], registry=r)
        self._delivered = Counter(PREFIX + "delivered_records",
                                  "Records acknowledged by their target topic, by tenant", ["tenant"], registry=r)
        self._cancelled = Counter(PREFIX + "cancelled_records",
                                  "Pending records removed by a delay.cancel command", registry=r)
        self._duplicates = Counter(PREFIX + "duplicate_records",
                                   "Records dropped because a record with the same delay.id was pending",
                                   registry=r)
        self._replaced = Counter(PREFIX + "replaced_records",
                                 "Pending records replaced by a newer version (delay.replace)", registry=r)
        self._fired = Counter(PREFIX + "recurring_firings",
                              "Firings of recurring schedules settled (delivered or dead-lettered)", registry=r)
        self._missed = Counter(PREFIX + "recurring_missed",
                               "Nominal firing times of recurring schedules a misfire left out", registry=r)
        self._dlq = Counter(PREFIX + "dlq_records",
                            "Records sent to the dead-letter topic, by reason code and tenant",
                            ["reason", "tenant"], registry=r)
        self._retries = Counter(PREFIX + "publish_retries",
                                "Publishes re-scheduled after a failed delivery report", registry=r)
        self._early = Counter(PREFIX + "early_deliveries",
                              "Records delivered before their due time (must stay 0)", registry=r)
        self._pending = Gauge(PREFIX + "pending_records", "Records waiting for their due time, by tier and tenant",
                              ["tier", "tenant"], registry=r)
        self._lag = Gauge(PREFIX + "consumer_lag_records",
                          "Ingress consumer lag (librdkafka consumer_lag: high watermark - committed offset), "
                          "by partition of each tenant's ingress topic", ["partition", "tenant"], registry=r)
        self._store_bytes = Gauge(PREFIX + "store_bytes",
                                  "Bytes the store's files hold on disk (allocated blocks)", registry=r)
        self._store_prealloc = Gauge(PREFIX + "store_preallocated_bytes",
                                     "Sizes of the store's files (preallocated, sparse until written)", registry=r)
        self._paused = Gauge(PREFIX + "ingress_paused", "1 while ingress consumption is paused", registry=r)
        self._paused_reason = Gauge(PREFIX + "ingress_paused_reason",
                                    "1 for the reason ingress is paused for, 0 for other known reasons",
                                    ["reason"], registry=r)
        self._cl_unacked = Gauge(PREFIX + "changelog_unacked_writes",
                                 "Changelog writes not yet acknowledged, by ingress partition", ["partition"],
                                 registry=r)
        self._cl_refused = Gauge(PREFIX + "changelog_refused_writes",
                                 "Changelog writes refused and being retried, by ingress partition", ["partition"],
                                 registry=r)
        self._restore_left = Gauge(PREFIX + "restore_remaining_records",
                                   "Changelog records still to restore before the partition is consumed",
                                   ["partition"], registry=r)
        self._restored = Counter(PREFIX + "restored_records", "Changelog records applied by restores", registry=r)
        self._history_written = Counter(PREFIX + "history_written", "History records the broker acknowledged",
                                        registry=r)
        self._history_failed = Counter(PREFIX + "history_failed",
                                       "History records dropped (producer queue full) or refused; delivery is "
                                       "not affected", registry=r)
        self._standby_lag = Gauge(PREFIX + "standby_lag_records",
                                  "Changelog records a standby store has not applied yet", ["partition"], registry=r)
        self._transactions = Counter(PREFIX + "transactions",
                                     "Transactions ended (delivery: exactly-once), by outcome: committed, or "
                                     "aborted (the partitions' committed state restored from the changelog)",
                                     ["outcome"], registry=r)
        self._commit_seconds = Histogram(PREFIX + "transaction_commit_seconds",
                                         "Time to commit a transaction (the loop waits for it)",
                                         buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
                                         registry=r)
        self._standby_partitions: set[str] = set()
        self._cl_partitions: set[str] = set()
        self._up = Gauge(PREFIX + "up", "1 while the sidecar process runs", registry=r)
        self._ready = Gauge(PREFIX + "ready", "1 while the sidecar is ready (/readyz answers 200)",
                            registry=r)
        self._lateness = _LatenessHistogram(
            PREFIX + "delivery_lateness_seconds",
            "Send time minus due time of delivered records, by tenant (early deliveries recorded as 0)",
            LATENESS_BUCKETS_S,
        )
        r.register(self._lateness)

        # Series that must exist before the first event, so dashboards and alerts see 0, not "no data".
        self._scheduled.labels(scheduler=scheduler)
        for outcome in ("committed", "aborted"):
            self._transactions.labels(outcome=outcome)
        self._tenants: dict[str, TenantMetrics] = {}
        tiers = tuple(tiers)
        for name in tenants:
            t = self.tenant(name)
            t.set_pending_many(dict.fromkeys(tiers, 0))
        self.default = next(iter(self._tenants.values()), None) or self.tenant(DEFAULT_TENANT)
        self._pause_reasons: set[str] = set()
        self._lag_partitions: set[tuple[str, str]] = set()  # (partition, tenant) of the series
        self._paused.set(0)
        self._up.set(1)
        self._ready.set(0)

    # -- counters (call once per batch) ------------------------------------------------------
    def ingested(self, n: int) -> None:
        if n:
            self._ingested.inc(n)

    def scheduled(self, n: int, scheduler: str | None = None) -> None:
        if n:
            self._scheduled.labels(scheduler=scheduler or self.scheduler).inc(n)

    def tenant(self, name: str) -> TenantMetrics:
        """The series of tenant ``name`` (made at 0 the first time: every reason code's)."""
        t = self._tenants.get(name)
        if t is None:
            t = self._tenants[name] = TenantMetrics(self, name)
        return t

    def delivered(self, n: int) -> None:
        """Of the first tenant (with one, the only one): ``tenant(name).delivered`` for others."""
        self.default.delivered(n)

    def cancelled(self, n: int) -> None:
        if n:
            self._cancelled.inc(n)

    def duplicates(self, n: int) -> None:
        if n:
            self._duplicates.inc(n)

    def replaced(self, n: int) -> None:
        if n:
            self._replaced.inc(n)

    def recurring(self, fired: int, missed: int) -> None:
        if fired:
            self._fired.inc(fired)
        if missed:
            self._missed.inc(missed)

    def dead_lettered(self, reason: str, n: int = 1) -> None:
        """Count ``n`` DLQ records with ``reason`` (a code from ``sidecar.contract.REASONS``) of the
        first tenant."""
        self.default.dead_lettered(reason, n)

    def dead_lettered_by_reason(self, counts: Mapping[str, int]) -> None:
        self.default.dead_lettered_by_reason(counts)

    def publish_retries(self, n: int) -> None:
        if n:
            self._retries.inc(n)

    def observe_lateness_ms(self, values: Sequence[int]) -> None:
        """Record one batch of the first tenant's delivery lateness (``TenantMetrics``)."""
        self.default.observe_lateness_ms(values)

    # -- gauges ------------------------------------------------------------------------------
    def set_pending(self, tier: str, n: int) -> None:
        self.default.set_pending_many({tier: n})

    def set_pending_many(self, by_tier: Mapping[str, int]) -> None:
        self.default.set_pending_many(by_tier)

    def set_store_bytes(self, allocated: int, preallocated: int | None = None) -> None:
        """The store's files: bytes on disk, and (if known) their preallocated sizes."""
        self._store_bytes.set(allocated)
        if preallocated is not None:
            self._store_prealloc.set(preallocated)

    def set_ingress_paused(self, paused: bool, reason: str | None = None) -> None:
        """Pause state of the ingress consumer; ``reason`` when paused: a stable code (the label
        value: e.g. ``disk-max-bytes``), never a message with numbers in it."""
        self._paused.set(1 if paused else 0)
        current = reason if paused else None
        if current is not None:
            self._pause_reasons.add(current)
        for r in self._pause_reasons:
            self._paused_reason.labels(reason=r).set(1 if r == current else 0)

    def set_up(self, up: bool) -> None:
        self._up.set(1 if up else 0)

    def set_ready(self, ready: bool) -> None:
        self._ready.set(1 if ready else 0)

    def set_changelog(self, unacked: Mapping[Any, int], refused: Mapping[Any, int],
                      restoring: Mapping[Any, int]) -> None:
        """The changelog's state per partition (owned: unacknowledged and refused writes;
        restoring: records left). Series of partitions no longer here are removed."""
        keys = {str(p): p for p in (*unacked, *restoring)}  # label -> key (a number, or <topic>-<n>)
        now = set(keys)
        for gone in self._cl_partitions - now:
            for g in (self._cl_unacked, self._cl_refused, self._restore_left):
                with contextlib.suppress(KeyError):
                    g.remove(gone)
        self._cl_partitions = now
        for p, i in keys.items():
            self._cl_unacked.labels(partition=p).set(unacked.get(i, 0))
            self._cl_refused.labels(partition=p).set(refused.get(i, 0))
            self._restore_left.labels(partition=p).set(restoring.get(i, 0))

    def set_standby_lag(self, lag: Mapping[Any, int]) -> None:
        now = {str(p) for p in lag}
        for gone in self._standby_partitions - now:
            with contextlib.suppress(KeyError):
                self._standby_lag.remove(gone)
        self._standby_partitions = now
        for p, n in lag.items():
            self._standby_lag.labels(partition=str(p)).set(n)

    def history(self, written: int, failed: int) -> None:
        if written:
            self._history_written.inc(written)
        if failed:
            self._history_failed.inc(failed)

    def transactions(self, committed: int, aborted: int, commit_seconds: Sequence[float] = ()) -> None:
        if committed:
            self._transactions.labels(outcome="committed").inc(committed)
        if aborted:
            self._transactions.labels(outcome="aborted").inc(aborted)
        for v in commit_seconds:
            self._commit_seconds.observe(v)

    def restored(self, n: int) -> None:
        if n:
            self._restored.inc(n)

    def set_consumer_lag(self, partition: int, lag: int, tenant: str | None = None) -> None:
        """``tenant``: None for the first tenant's topic (``ingress_topic``)."""
        key = (str(partition), tenant or self.ingress_topics.get(self.ingress_topic, DEFAULT_TENANT))
        self._lag_partitions.add(key)
        self._lag.labels(*key).set(lag)

    def update_from_stats(self, stats_json: str | bytes) -> None:
        """Set ``consumer_lag_records`` from a librdkafka statistics document (``stats_cb``).

        Read: ``topics.<ingress topic>.partitions.<p>`` of every tenant's ingress topic (one
        consumer reads them all: one document has them all), the series labelled with the
        topic's tenant (partition numbers repeat across topics). ``consumer_lag`` is librdkafka's
        "difference between (hi_offset or ls_offset) and committed_offset" (``ls_offset`` under
        ``isolation.level=read_committed``). The sidecar commits an ingress offset only once the
        record is durable in the store, so this is "ingress records not yet safely stored".

        librdkafka reports ``consumer_lag`` -1 while a partition has no committed offset — an
        assigned partition that never had a record (the sidecar commits only what it stored),
        which is how partition 0 of a lightly used topic had no series. For a partition the
        consumer wants (``desired``), that lag is ``hi_offset`` minus the committed offset, or
        minus ``lo_offset`` when there is none yet: every retained record is unstored (0 for an
        empty partition). A partition not ``desired`` (revoked, or never assigned) has no series,
        nor has one whose high watermark is not known yet, nor partition ``-1`` (librdkafka's
        internal "unassigned" partition): revoked partitions disappear instead of freezing at
        their last value. Documents without ``desired`` (older librdkafka) fall back to
        ``consumer_lag`` >= 0. Malformed documents are ignored (statistics must never break the
        loop).
        """
        try:
            topics = orjson.loads(stats_json)["topics"]
            items = [(tenant, list(topics[topic]["partitions"].items()))
                     for topic, tenant in self.ingress_topics.items() if topic in topics]
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            return
        if not items:
            return  # none of the ingress topics yet (before the first assignment): as malformed
        seen: dict[tuple[str, str], int] = {}
        for tenant, parts in items:
            for key, part in parts:
                if key == "-1" or not isinstance(part, dict):
                    continue
                lag = _lag(part)
                if lag is not None:
                    seen[(str(key), tenant)] = lag
        for gone in self._lag_partitions - seen.keys():
            self._lag.remove(*gone)
        for labels, lag in seen.items():
            self._lag.labels(*labels).set(lag)
        self._lag_partitions = set(seen)

    # -- exposition --------------------------------------------------------------------------
    def render(self) -> bytes:
        """The Prometheus text exposition (``CONTENT_TYPE_LATEST``) of every series."""
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        """The registry's metric families (for tests and custom exporters)."""
        return iter(self.registry.collect())


class TenantMetrics:
    """One tenant's series (``Metrics.tenant``): the labelled children resolved once."""

    def __init__(self, m: Metrics, name: str) -> None:
        self.name = name
        self._delivered = m._delivered.labels(tenant=name)
        self._dlq_family = m._dlq
        self._dlq = {reason: m._dlq.labels(reason=reason, tenant=name) for reason in REASONS}
        self._pending_family = m._pending
        self._pending: dict[str, Any] = {}  # tier -> its gauge child
        self._lateness = m._lateness.child(name)
        self._early = m._early

    def delivered(self, n: int) -> None:
        if n:
            self._delivered.inc(n)

    def dead_lettered(self, reason: str, n: int = 1) -> None:
        """Count ``n`` DLQ records with ``reason`` (a code from ``sidecar.contract.REASONS``)."""
        if n:
            c = self._dlq.get(reason)
            if c is None:
                c = self._dlq[reason] = self._dlq_family.labels(reason=reason, tenant=self.name)
            c.inc(n)

    def dead_lettered_by_reason(self, counts: Mapping[str, int]) -> None:
        for reason, n in counts.items():
            self.dead_lettered(reason, n)

    def observe_lateness_ms(self, values: Sequence[int]) -> None:
        """Record one batch of delivery lateness values (send time - due time, in ms).

        Negative values are early deliveries: counted in ``early_deliveries_total`` and recorded
        in the histogram as 0."""
        if not values:
            return
        early = self._lateness.observe_ms(values)
        if early:
            self._early.inc(early)

    def set_pending_many(self, by_tier: Mapping[str, int]) -> None:
        for tier, n in by_tier.items():
            g = self._pending.get(tier)
            if g is None:
                g = self._pending[tier] = self._pending_family.labels(tier=tier, tenant=self.name)
            g.set(n)
