"""Quotas at intake: a tenant's ``max-pending`` and ``max-disk-bytes`` (``sidecar/tenants.py``).

A consumed request that would add a pending record to a tenant that is at either limit is not
scheduled: it goes to the tenant's DLQ with reason ``quota-exceeded`` (``Intake.schedule``), as
any record intake cannot take does. Nothing stalls (the partition keeps being consumed, the
offsets keep being committed) and nothing is lost (the dead letter is as durable as a delivery).

**What is counted.** The tenant's stores *this process owns*: the limits are per process, over
the tenant's partitions assigned to it, not across the group (a process knows only its own
stores). ``max-pending`` is compared with the scheduler's pending entries (the
``pending_records`` gauge: a cancelled record's entry counts until its due time passes);
``max-disk-bytes`` with the tenant's commit-log segments (whole segments, as they are
allocated: ``CommitLog.disk_bytes``). The other store files (scheduler, id index) grow with the
same records and stay under the deployment's ``disk-max-bytes``.

**What is refused.** Only what would grow the pending count: a request under an id nothing is
pending under. A replace of a pending id, a duplicate, a cancel (and an etf1 delete) are taken
whatever the quota, and so are the dead letters of bad input: they add nothing that waits. A
refused record's dead letter still passes through the commit log, due at once, and its space is
freed once the DLQ has it: the share bounds what waits, and the deployment's ``disk-max-bytes``
pause stays the volume's backstop.

**Bounds.** The check is made before each record, so no new record is taken once the count is at
``max-pending`` (a replace's new entry and a dead letter's may take it beyond). The disk share
may be exceeded by the segment the last admitted record opened (one per store): a record is
refused only once the segments reach the share (``tenants.check`` wants a share of at least two
segments).

**The C intake** (``Intake.ingest_many``) takes only requests under new ids, each one more
pending record: it is handed at most ``headroom`` records, none at the disk share (it never opens
a segment), so that the reference path decides every record the quota concerns.

**Cost.** The other stores' counts are summed once per consumed batch and store (``now_ms`` is the
batch's clock reading): within a run of one store's records only that store's count changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sidecar.store.partition import PartitionStore

PENDING, DISK = "max-pending", "max-disk-bytes"  # the quota_rejections_total reasons
_UNLIMITED = 1 << 62


def _pending(store: PartitionStore) -> int:
    return sum(store.sched.pending().values())


def _bytes(store: PartitionStore) -> int:
    return store.log.disk_bytes()


class Quota:
    """One tenant's limits over its stores (``stores()``: the ones this process owns)."""

    __slots__ = ("_at", "_others", "_store", "max_disk_bytes", "max_pending", "rejected", "stores", "tenant")

    def __init__(
        self, tenant: str, max_pending: int | None, max_disk_bytes: int | None,
        stores: Callable[[], Iterable[PartitionStore]],
    ) -> None:
        self.tenant = tenant
        self.max_pending = max_pending
        self.max_disk_bytes = max_disk_bytes
        self.stores = stores
        self.rejected = {PENDING: 0, DISK: 0}  # records refused, by limit
        self._at = -1  # the batch (its clock reading) and store the other stores' sums are of
        self._store: PartitionStore | None = None
        self._others = (0, 0)  # (pending, commit-log bytes) of the tenant's other stores

    def _other(self, store: PartitionStore, now_ms: int) -> tuple[int, int]:
        if now_ms != self._at or store is not self._store:
            others = [s for s in self.stores() if s is not store]
            self._others = (sum(map(_pending, others)) if self.max_pending is not None else 0,
                            sum(map(_bytes, others)) if self.max_disk_bytes is not None else 0)
            self._at, self._store = now_ms, store
        return self._others

    def refusal(self, store: PartitionStore, now_ms: int) -> str | None:
        """Why one more pending record in ``store`` is refused (the dead letter's error), counted;
        None: it is taken."""
        pending, used = self._other(store, now_ms)
        if self.max_pending is not None and (n := pending + _pending(store)) >= self.max_pending:
            return self._refused(PENDING, f"{n} records pending in this process's partitions", self.max_pending)
        if self.max_disk_bytes is not None and (n := used + _bytes(store)) >= self.max_disk_bytes:
            return self._refused(DISK, f"its commit logs in this process hold {n} bytes", self.max_disk_bytes)
        return None

    def _refused(self, limit: str, what: str, value: int) -> str:
        self.rejected[limit] += 1
        return f"tenant {self.tenant!r}: {what}, its {limit} is {value}"

    def headroom(self, store: PartitionStore, now_ms: int) -> int:
        """How many new pending records ``store`` may take before a check is due (the C intake's
        run length): 0 at the disk share."""
        pending, used = self._other(store, now_ms)
        if self.max_disk_bytes is not None and used + _bytes(store) >= self.max_disk_bytes:
            return 0
        if self.max_pending is None:
            return _UNLIMITED
        return self.max_pending - pending - _pending(store)


def tenant_quota(tenant: Any, stores: Mapping[Any, PartitionStore]) -> Quota | None:
    """The quota of ``tenant`` (a ``tenants.Tenant``) over the stores of its ingress topic in
    ``stores`` (the loop's map, read at each check); None without limits."""
    if tenant.max_pending is None and tenant.max_disk_bytes is None:
        return None
    topic = tenant.ingress_topic
    return Quota(tenant.name, tenant.max_pending, tenant.max_disk_bytes,
                 lambda: [s for s in stores.values() if s.topic == topic])
