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
(:meth:`ExactlyOnce.refused_step`); the loop publishes nothing meanwhile (:attr:`producing`).
"""

from __future__ import annotations

from confluent_kafka import KafkaException

from sidecar import logs
from sidecar.engine.changelog import StoreMirror
from sidecar.engine.handover import Handover
from sidecar.engine.kafka_io import KafkaIO
from sidecar.engine.page_waits import PageWaits
from sidecar.engine.publishing import Publishing
from sidecar.engine.stores import StoreKey, Stores, named, tp_key
from sidecar.engine.transactions import TransactionFailed, Transactions
from sidecar.engine.txn_refusal import WAIT_S, TxnRefusal

log = logs.get("sidecar")


class ExactlyOnce:
    def __init__(
        self, txn: Transactions, stores: Stores, kafka: KafkaIO, pub: Publishing, handover: Handover,
        page_waits: PageWaits, refusal: TxnRefusal,
    ) -> None:
        self.txn = txn
        self.stores = stores
        self.kafka = kafka
        self.pub = pub
        self.handover = handover
        self.page_waits = page_waits
        self.refusal = refusal  # Write on the transactional id refused: waited out in place
        self.reset_wanted = ""  # why the committed state must be restored (at the next turn)

    @property
    def producing(self) -> bool:
        """False while the transactional id is refused: nothing may be published."""
        return not self.refusal.waiting

    def new_producer(self, reason: str) -> None:
        """Replace the transactional producer (dead or fenced) and register the new one; while
        the transactional id is refused, the dead one stays until the ACL is back."""
        if not self.refusal.waiting:
            self._register(reason)

    def producer_died(self, reason: str) -> None:
        """A delivery report said the producer is dead: a new one, and the committed state
        restored; while the transactional id is refused, the dead one's reports are expected."""
        self.pub.producer_fatal = ""
        if self.refusal.waiting:
            return
        self.new_producer(reason)
        self.reset(f"producer replaced: {reason}", aborted=True)

    def refused_step(self) -> None:
        """A turn while the transactional id is refused: once the probe passes, a new producer
        is made and registered, and the loop produces again (``txn_refusal.py``)."""
        if self.refusal.step() and self._register("the transactional id is authorized again", healing=True):
            self.refusal.resumed()

    def _register(self, reason: str, healing: bool = False) -> bool:
        """A new producer made and registered (``init_transactions``, begin); False when the
        broker refused the transactional id (waited out), or, ``healing``, failed otherwise."""
        self.kafka.replace_producer(reason, quiet=healing)
        self.pub.producer = self.kafka.producer
        try:
            self.txn.start()
        except KafkaException as e:
            cause = self.refusal.cause_of(e)
            if cause is not None:
                self.refusal.refused(cause)
            elif healing:
                self.refusal.failed(e)
            else:
                raise
            return False
        return True

    def wait_s(self, mono: float, timeout: float, restoring: bool) -> float:
        """The loop's wait for records (``timeout``: to the next due record) capped at the next
        commit; while refused, a short one (the probe's answer): records due meanwhile must not
        make it spin, a restore still runs at full speed."""
        if self.refusal.waiting:
            return 0.0 if restoring else WAIT_S
        return min(timeout, self.txn.wait_s(mono))

    # -- a turn -----------------------------------------------------------------------------------
    def must_reset(self) -> bool:
        """Restore the committed state now if the open transaction cannot commit (a failed
        delivery or changelog write, a lost partition, an abort in a rebalance callback)."""
        why = self.reset_wanted or self.pub.doomed
        if not why:
            failed = sum(s.mirror.failed for s in self.stores.values() if isinstance(s.mirror, StoreMirror))
            why = f"{failed} changelog writes failed" if failed else ""
        if not why:
            return False
        self.reset(why, aborted=False)
        return True

    def commit_due(self, mono: float) -> None:
        """Commit the open transaction if ``transaction-interval`` has passed; reset if it aborts."""
        if self.txn.due(mono):
            why = self.commit()
            if why:
                self.reset(why, aborted=True)

    def commit(self, begin: bool = True) -> str:
        """Commit the open transaction with the owned partitions' ingress offsets; "" when it
        committed, else why it aborted (a dead producer replaced and registered again)."""
        if self.pub.doomed:
            return self.pub.doomed
        for store in self.stores.values():  # the puts held back (StoreMirror.held), before the offsets
            if isinstance(store.mirror, StoreMirror):
                store.mirror.flush_held()
        offsets = self.kafka.offsets_of(list(self.stores.values()))
        try:
            self.txn.commit(offsets, self.kafka.group_metadata() if offsets else None, begin)
        except TransactionFailed as e:
            if e.fatal:
                self.new_producer(e.reason)
            return e.reason
        for tp in offsets:
            self.kafka.committed[tp_key(tp)] = tp.offset
        self.pub.poll(0)  # settle what the commit's flush reported
        return ""

    def _commit_open(self, begin: bool = True) -> str:
        return self.commit(begin) if self.txn.open else "no transaction open"

    def _abort(self) -> None:
        if self.refusal.waiting:  # the producer is dead: the broker aborts its transaction
            return
        try:
            self.txn.abort()
        except TransactionFailed as e:
            self.new_producer(e.reason)

    def reset(self, why: str, aborted: bool) -> None:
        """The open transaction cannot commit (``aborted``: it was aborted already): see the
        module docstring."""
        handover = self.handover
        self.reset_wanted = ""
        partitions = sorted(set(self.stores) | handover.held())
        log.error("transaction.aborted", reason=why, partitions=named(partitions),
                  action="restoring the partitions' committed state from the changelog")
        handover.drop_restoring(list(handover.held()))
        self.page_waits.clear()  # consumed again from the committed offsets (rewind, below)
        for key in list(self.stores):
            handover.skip.pop(key, None)
            handover.discard(self.stores.pop(key))
        self.pub.forget()
        if not aborted:  # (a failed commit aborted, or registered a new producer, and began anew)
            self._abort()
        self.pub.poll(0)  # the purged records' reports: their stores are gone, only counted down
        if partitions:
            handover.assigned(partitions)
            self.kafka.rewind(partitions)

    # -- the group's callbacks --------------------------------------------------------------------
    def revoked(self, partitions: list[StoreKey]) -> None:
        """Commit the transaction (it holds the revoked partitions' last deliveries and offsets),
        then close their stores clean; if it aborts, they close dirty (their next owner restores
        the committed state) and the rest are restored next turn."""
        why = self.handover.revoked(partitions, self._commit_open)
        if why and self.stores:
            self.reset_wanted = why

    def lost(self) -> None:
        """Partitions were lost: the open transaction holds records of partitions no longer ours,
        so it cannot commit. That holds when every partition was lost too: committing it later, for
        partitions assigned again, would publish the lost ones' deliveries beside their new owner's."""
        if self.stores or self.txn.open:
            self.reset_wanted = "partitions lost"

    def fenced(self) -> None:
        """The consumer was replaced: the open transaction holds deliveries of partitions this
        member may not own now."""
        self.pub.forget()
        if self.txn.open:
            self._abort()

    def close_all(self) -> None:
        """Shutdown: the last transaction, then every store closed clean (or dirty, if it aborted)."""
        why = self._commit_open(begin=False)
        for store in self.stores.values():
            if why:
                self.handover.discard(store)
            else:
                self.handover.close_clean(store)
        self.stores.clear()
