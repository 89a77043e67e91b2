"""Exactly-once on the loop's side: the owned stores kept to what the transactions committed.

With ``delivery: exactly-once`` (``transactions.Transactions`` makes the transactional calls) the
offset commit of the durability order is replaced by a transaction commit every
``transaction-interval``: :meth:`ExactlyOnce.commit` writes the changelog puts held back for it
(``StoreMirror.held``), then commits the open transaction with the owned partitions' ingress
offsets in it. A store is opened marked dirty (``opening.py``) and closed clean only right after
a committed transaction (a revoke, the shutdown: :meth:`ExactlyOnce.revoked`,
:meth:`ExactlyOnce.close_all`).

When the open transaction cannot commit (a failed delivery or changelog write, a lost partition,
an abort in a rebalance callback, a dead producer), :meth:`ExactlyOnce.reset` aborts it, drops
every owned and restoring store (dirty: wiped when opened again), restores them from the
changelog's committed records and consumes their ingress again from the group's committed
offsets. Nothing the aborted transaction held was visible to a ``read_committed`` reader; all of
it is done again.

A producer the broker fenced or that died is replaced (``new_producer``) and registered again
(``Transactions.start``) before anything else is produced. If the broker refuses the registration
because Write on the transactional id was revoked, the sidecar does not exit: it stops producing
and waits until the ACL is back (``txn_refusal.TxnRefusal``), then registers a new producer
(:meth:`ExactlyOnce.refused_step`); the lane publishes nothing meanwhile (the deployment's lane:
the whole loop, :attr:`producing`; a tenant's: its topic, ``txn_lanes.TopicHold``).

**Lanes** (engine/txn_lanes.py): each tenant with its own principal has its own transactional
producer, whose transactions hold its partitions' deliveries, dead letters, changelog writes and
ingress offsets; every other partition is in the deployment's lane. Each lane commits, aborts,
resets (only its own partitions: :meth:`ExactlyOnce.reset`, the records consumed for the others
are kept: :meth:`ExactlyOnce.kept`), replaces its producer and waits out a refused transactional
id on its own; a lost partition or a fenced consumer concerns every lane.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException

from sidecar import logs
from sidecar.config import Settings
from sidecar.engine.changelog import StoreMirror
from sidecar.engine.clock import Clock
from sidecar.engine.eos_targets import Writable
from sidecar.engine.handover import Handover
from sidecar.engine.kafka_io import KafkaIO
from sidecar.engine.page_waits import PageWaits
from sidecar.engine.publishing import Publishing
from sidecar.engine.stores import StoreKey, Stores, named, record_key, tp_key
from sidecar.engine.target_access import TargetAccess
from sidecar.engine.transactions import TransactionFailed, Transactions
from sidecar.engine.txn_lanes import Lane, TenantPort, TopicHold
from sidecar.engine.txn_refusal import WAIT_S, TxnRefusal, WholeIngress, txn_probe
from sidecar.kafka_errors import principal_of
from sidecar.tenants import Tenant

log = logs.get("sidecar")


def lanes_of(settings: Settings, txn: Transactions, kafka: KafkaIO, pub: Publishing, clock: Clock,
             ingress_held: Callable[[], bool]) -> list[Lane]:
    """The deployment's lane (``txn``, on ``kafka``'s producer), then one per tenant with ``kafka:``
    overrides (its producer: ``pub.tenants``; its target checks asked as the tenant)."""
    own = [t for t in settings.tenants if t.kafka]
    lanes = [Lane("", kafka, txn, TxnRefusal(kafka.refusals, WholeIngress(kafka, ingress_held), clock,
                                             txn_probe(settings)),
                  frozenset(t.ingress_topic for t in own), rest=True)]
    access = TargetAccess(settings, kafka.admin_client, kafka.should_warn)
    pub.targets.default.ask = access.state
    pub.targets.default.principal = principal_of(settings.kafka) or pub.targets.default.principal
    for t in own:
        topic = t.ingress_topic
        port = TenantPort(pub.tenants, topic, kafka)
        principal = t.principal(settings.kafka)

        def about(t: Tenant = t, principal: str = principal) -> tuple[str, str]:
            return pub.tenants.transactional_id(t), principal

        lanes.append(Lane(t.name, port, Transactions(port, settings.transaction_interval_ms, clock, tally=txn),
                          TxnRefusal(kafka.refusals, TopicHold(kafka, topic), clock, txn_probe(settings, t), about),
                          frozenset((topic,))))

        def ask(target: str, topic: str = topic, principal: str = principal) -> str | None:
            return access.state(target, pub.tenants.admin(topic, kafka.clients.admin), principal)

        pub.targets.by_topic[topic] = Writable(ask, principal)
    return lanes


class ExactlyOnce:
    def __init__(
        self, lanes: list[Lane], stores: Stores, kafka: KafkaIO, pub: Publishing, handover: Handover,
        page_waits: PageWaits,
    ) -> None:
        self.lanes = lanes  # the deployment's first
        self.txn = lanes[0].txn
        self.refusal = lanes[0].refusal
        self.stores = stores
        self.kafka = kafka
        self.pub = pub
        self.handover = handover
        self.page_waits = page_waits
        self.reset_wanted = ""  # why every lane's committed state must be restored (at the next turn)
        self.rewound: set[StoreKey] = set()  # the partitions the last reset consumes again

    def start(self) -> None:
        """Register every lane's transactional id and begin (the deployment's as before: a refusal
        stops the start; a tenant's refusal is waited out like one while running)."""
        self.txn.start()
        for lane in self.lanes[1:]:
            self._register(lane, "", start=True)

    def lane_of(self, topic: str) -> Lane:
        for lane in self.lanes[1:]:
            if topic in lane.topics:
                return lane
        return self.lanes[0]

    def port_of(self, topic: str) -> Any:
        """What the changelog writer of a store of ingress topic ``topic`` produces with."""
        return self.lane_of(topic).port

    @property
    def producing(self) -> bool:
        """False while the deployment's transactional id is refused: nothing may be published (a
        tenant lane's refusal holds only that lane: ``txn_lanes.TopicHold``)."""
        return not self.lanes[0].refusal.waiting

    @property
    def waiting(self) -> bool:
        """Some lane's transactional id is refused: :meth:`refused_step` each turn."""
        return any(lane.refusal.waiting for lane in self.lanes)

    def new_producer(self, reason: str, lane: Lane | None = None) -> None:
        """Replace a lane's transactional producer (dead or fenced) and register the new one;
        while its transactional id is refused, the dead one stays until the ACL is back."""
        lane = lane or self.lanes[0]
        if not lane.refusal.waiting:
            self._register(lane, reason)

    def producer_died(self, reason: str) -> None:
        """A delivery report said the deployment's producer is dead: a new one, and its lane's
        committed state restored; while the transactional id is refused, the dead one's reports
        are expected."""
        self.pub.producer_fatal = ""
        lane = self.lanes[0]
        if lane.refusal.waiting:
            return
        self.new_producer(reason, lane)
        self.reset(lane, f"producer replaced: {reason}", aborted=True)

    def _tenant_deaths(self) -> None:
        """A tenant producer's fatal error (``TenantProducers.fatal``): as ``producer_died``, for its lane."""
        for topic, why in list(self.pub.tenants.fatal.items()):
            lane = self.lane_of(topic)
            if lane.refusal.waiting:
                continue
            self.new_producer(why, lane)
            self.reset(lane, f"producer replaced: {why}", aborted=True)

    def refused_step(self) -> None:
        """A turn while a transactional id is refused: once the probe passes, a new producer is
        made and registered, and the loop produces again (``txn_refusal.py``)."""
        for lane in self.lanes:
            if lane.refusal.waiting and lane.refusal.step() and self._register(
                    lane, "the transactional id is authorized again", healing=True):
                lane.refusal.resumed()

    def _replace(self, lane: Lane, reason: str, quiet: bool) -> None:
        if lane.name:
            self.pub.tenants.replace(next(iter(lane.topics)), reason, quiet)
        else:
            self.kafka.replace_producer(reason, quiet=quiet)
            self.pub.producer = self.kafka.producer

    def _register(self, lane: Lane, reason: str, healing: bool = False, start: bool = False) -> bool:
        """A new producer made (not at ``start``: the first is) and registered
        (``init_transactions``, begin); False when the broker refused the transactional id
        (waited out), or, ``healing``, failed otherwise."""
        if not start:
            self._replace(lane, reason, quiet=healing)
        try:
            lane.txn.start()
        except KafkaException as e:
            cause = lane.refusal.cause_of(e)
            if cause is not None:
                lane.refusal.refused(cause)
            elif healing:
                lane.refusal.failed(e)
            else:
                raise
            return False
        return True

    def wait_s(self, mono: float, timeout: float, restoring: bool) -> float:
        """The loop's wait for records (``timeout``: to the next due record) capped at the next
        commit; while refused, a short one (the probe's answer): records due meanwhile must not
        make it spin, a restore still runs at full speed."""
        if not self.producing:
            return 0.0 if restoring else WAIT_S
        waits = [WAIT_S if lane.refusal.waiting else lane.txn.wait_s(mono) for lane in self.lanes]
        return min(timeout, *waits)

    # -- a turn -----------------------------------------------------------------------------------
    def _doomed(self, lane: Lane) -> str:
        return next((why for topic, why in self.pub.doomed.items() if lane.covers(topic)), "")

    def must_reset(self) -> bool:
        """Restore the committed state of each lane whose open transaction cannot commit (a failed
        delivery or changelog write, a lost partition, an abort in a rebalance callback, a dead
        tenant producer); True when some partitions are consumed again (:meth:`kept`)."""
        self.rewound = set()
        if self.pub.tenants.fatal:
            self._tenant_deaths()
        for lane in self.lanes:
            why = self.reset_wanted or lane.reset_wanted or self._doomed(lane)
            if not why:
                failed = sum(s.mirror.failed for s in self.stores.values()
                             if isinstance(s.mirror, StoreMirror) and lane.covers(s.topic))
                why = f"{failed} changelog writes failed" if failed else ""
            if why:
                self.reset(lane, why, aborted=False)
        self.reset_wanted = ""
        return bool(self.rewound)

    def kept(self, msgs: list[Any]) -> list[Any]:
        """The consumed records not consumed again after the last reset (of other lanes' partitions)."""
        rewound = self.rewound
        return [m for m in msgs if m.error() is not None or record_key(m) not in rewound]

    def commit_due(self, mono: float) -> None:
        """Commit each lane's open transaction if ``transaction-interval`` has passed; reset a lane
        whose transaction aborts."""
        for lane in self.lanes:
            if not lane.refusal.waiting and lane.txn.due(mono):
                why = self.commit(begin=True, lane=lane)
                if why:
                    self.reset(lane, why, aborted=True)

    def commit(self, begin: bool = True, lane: Lane | None = None) -> str:
        """Commit a lane's open transaction (the deployment's by default) with its partitions'
        ingress offsets; "" when it committed, else why it aborted (a dead producer replaced and
        registered again)."""
        lane = lane or self.lanes[0]
        if lane.refusal.waiting:  # its producer is dead: nothing of its lane may be written
            return "transactional id refused"
        doomed = self._doomed(lane)
        if doomed:
            return doomed
        stores = [s for s in self.stores.values() if lane.covers(s.topic)]
        for store in stores:  # the puts held back (StoreMirror.held), before the offsets
            if isinstance(store.mirror, StoreMirror):
                store.mirror.flush_held()
        offsets = self.kafka.offsets_of(stores)
        try:
            lane.txn.commit(offsets, self.kafka.group_metadata() if offsets else None, begin)
        except TransactionFailed as e:
            if e.fatal:
                self.new_producer(e.reason, lane)
            return e.reason
        for tp in offsets:
            self.kafka.committed[tp_key(tp)] = tp.offset
        self.pub.poll(0)  # settle what the commit's flush reported
        return ""

    def _commit_open(self, lanes: list[Lane], begin: bool = True) -> str:
        """Commit the open transactions of ``lanes``; "" when all committed, else the first
        reason (a lane that failed is reset next turn)."""
        first = ""
        for lane in lanes:
            why = self.commit(begin, lane) if lane.txn.open else "no transaction open"
            if why:
                lane.reset_wanted = lane.reset_wanted or why
                first = first or why
        return first

    def _abort(self, lane: Lane) -> None:
        if lane.refusal.waiting:  # the producer is dead: the broker aborts its transaction
            return
        try:
            lane.txn.abort()
        except TransactionFailed as e:
            self.new_producer(e.reason, lane)

    def reset(self, lane: Lane, why: str, aborted: bool) -> None:
        """``lane``'s open transaction cannot commit (``aborted``: it was aborted already): see
        the module docstring. Only its partitions are restored and consumed again."""
        handover = self.handover
        lane.reset_wanted = ""
        held = [k for k in handover.held() if lane.covers(k.topic)]
        owned = [k for k in self.stores if lane.covers(k.topic)]
        partitions = sorted(set(owned) | set(held))
        log.error("transaction.aborted", reason=why, partitions=named(partitions), **lane.log_fields(),
                  action="restoring the partitions' committed state from the changelog")
        handover.drop_restoring(held)
        for key in partitions:
            self.page_waits.drop(key)  # consumed again from the committed offsets (rewind, below)
        for key in owned:
            handover.skip.pop(key, None)
            handover.discard(self.stores.pop(key))
        self.pub.forget(lane.covers)
        if not aborted:  # (a failed commit aborted, or registered a new producer, and began anew)
            self._abort(lane)
        self.pub.poll(0)  # the purged records' reports: their stores are gone, only counted down
        if partitions:
            handover.assigned(partitions)
            if not (lane.name and lane.refusal.waiting):
                self.kafka.rewind(partitions)
            # else a tenant's refused id: its abandoned transaction's offsets stay pending until the
            # broker aborts it, and asking for the committed offsets meanwhile blocks (librdkafka
            # retries UNSTABLE_OFFSET_COMMIT: the loop stood 14 s on the secured broker, long enough
            # to time out the other tenants' transactions). Its topic is held; the release rewinds
            # once the new producer's registration has aborted it (txn_lanes.TopicHold).
            self.rewound.update(partitions)

    # -- the group's callbacks --------------------------------------------------------------------
    def revoked(self, partitions: list[StoreKey]) -> None:
        """Commit the transactions holding the revoked partitions' last deliveries and offsets,
        then close their stores clean; if one aborts, they close dirty (their next owner restores
        the committed state) and its lane's other partitions are restored next turn."""
        topics = {k.topic for k in partitions}
        lanes = [lane for lane in self.lanes if any(lane.covers(t) for t in topics)]
        self.handover.revoked(partitions, lambda: self._commit_open(lanes))

    def lost(self) -> None:
        """Partitions were lost: the open transactions hold records of partitions no longer ours,
        so they cannot commit. That holds when every partition was lost too: committing one later,
        for partitions assigned again, would publish the lost ones' deliveries beside their new
        owner's."""
        if self.stores or any(lane.txn.open for lane in self.lanes):
            self.reset_wanted = "partitions lost"

    def fenced(self) -> None:
        """The consumer was replaced: the open transactions hold deliveries of partitions this
        member may not own now."""
        self.pub.forget()
        for lane in self.lanes:
            if lane.txn.open:
                self._abort(lane)

    def close_all(self) -> None:
        """Shutdown: the last transactions, then every store closed clean (or dirty, if its
        lane's aborted)."""
        failed = [lane for lane in self.lanes if self._commit_open([lane], begin=False)]
        for store in self.stores.values():
            if any(lane.covers(store.topic) for lane in failed):
                self.handover.discard(store)
            else:
                self.handover.close_clean(store)
        self.stores.clear()
