"""Exactly-once: Write on the transactional id revoked while running, waited out in place.

The start-up check (``connectivity.run_probe``) waits for Write on the transactional id
``<group-id>.<instance-id>`` before the sidecar starts. Revoked while it runs, the broker refuses
the id's next transactional request (``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``, at the offsets'
or the commit's request or when a produce adds a partition): a fatal error, so the producer is
dead, and its replacement's ``init_transactions`` is refused too. Instead of exiting:

1. :meth:`TxnRefusal.refused` (``ExactlyOnce`` met the refusal registering a new producer) stops
   producing: while :attr:`TxnRefusal.waiting` the lane publishes and commits nothing and its
   ingress is paused (paused again each turn, should something else resume it). The open transaction is
   abandoned (the coordinator aborts it after ``transaction-timeout``, or the next registration
   fences it) and ``ExactlyOnce.reset`` restores the committed state: nothing it held is lost or
   visible to a ``read_committed`` reader.
2. ``/readyz`` answers 503 ``not-authorized`` naming Write on the transactional id and the
   principal, and ``kafka.refused`` says so once a minute (``refusals.py``); the cause is set
   again every turn so that it does not lapse (``HealthServer.kafka_hold_s``) while waiting.
3. After a back-off (1 s doubling to 30 s, as the start-up check), a probe asks again on a thread
   of its own: a throwaway producer's ``init_transactions`` with the same id, as the start-up
   check asks (:func:`txn_probe`). The loop never blocks on it, and a refused client is
   destroyed there too (that can take long).
4. Once the probe passes, ``ExactlyOnce`` makes a new transactional producer and registers it
   (its ``init_transactions`` fences whatever the dead one left open) and begins a transaction;
   :meth:`TxnRefusal.resumed` clears ``/readyz`` and resumes ingress (unless backpressure holds
   it). Refused or failing again (revoked meanwhile): back to 2, the back-off going on.

Records that fall due meanwhile wait in their stores and are published after the resume, so none
is early; the ingress records not committed are consumed again from the group's offsets.

A tenant with its own principal has its own transactional id (engine/txn_lanes.py) and its own
``TxnRefusal``: the cause names the tenant's id and principal (``about``), the probe asks as the
tenant (:func:`txn_probe` with the tenant). While it waits only that tenant's lane waits: what
the refusal pauses and resumes is the lane's :class:`IngressHold` (``txn_lanes.TopicHold``: the
tenant's ingress topic held, its stores not published, its partitions consumed again from the
committed offsets on resuming); every other tenant's records are consumed and delivered meanwhile.
The deployment's lane holds all of ingress (``WholeIngress``): its producer also writes what
belongs to no lane (history records, etf1 tombstones).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from confluent_kafka import KafkaException

from sidecar import logs
from sidecar.config import Settings
from sidecar.engine.client_conf import client_conf
from sidecar.engine.clock import Clock
from sidecar.engine.kafka_io import KafkaIO
from sidecar.engine.refusals import Refusals
from sidecar.engine.transactions import tenant_transactional_id, transactional_id
from sidecar.kafka_errors import NOT_AUTHORIZED, Cause
from sidecar.tenants import Tenant

log = logs.get("sidecar")

REFUSED = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
PROBE_TIMEOUT_S = 10.0
BACKOFF_FIRST_S = 1.0  # the start-up check's back-off (connectivity.py)
BACKOFF_MAX_S = 30.0
WAIT_S = 0.2  # the loop's longest wait while refused: how soon a probe's answer is taken

Probe = Callable[[], bool]


class IngressHold(Protocol):
    """What a refused lane stops while it waits, and starts again once registered."""

    @property
    def held(self) -> bool: ...
    def hold(self) -> None: ...
    def release(self) -> None: ...


class WholeIngress:
    """The deployment's lane: all of ingress paused, resumed unless backpressure keeps it paused."""

    __slots__ = ("ingress_held", "kafka")

    def __init__(self, kafka: KafkaIO, ingress_held: Callable[[], bool]) -> None:
        self.kafka = kafka
        self.ingress_held = ingress_held  # backpressure keeps ingress paused (it resumes it itself)

    @property
    def held(self) -> bool:
        return bool(self.kafka.paused)

    def hold(self) -> None:
        self.kafka.pause()

    def release(self) -> None:
        if not self.ingress_held():
            self.kafka.resume()


def txn_probe(settings: Settings, tenant: Tenant | None = None) -> Probe:
    """The real probe: may a throwaway producer with the sidecar's transactional id and
    properties (without the loop's callbacks) register it? With ``tenant``: the tenant's id, its
    ``kafka:`` properties over the sidecar's. Any failure is a no for now."""

    def ask() -> bool:
        from confluent_kafka import Producer

        instance = settings.group_instance_id or ""
        txn_id = (transactional_id(settings.group_id, instance) if tenant is None
                  else tenant_transactional_id(settings.group_id, tenant.name, instance))
        producer = Producer(client_conf(settings, tenant.kafka if tenant is not None else {},
                                        {"transactional.id": txn_id}))
        try:
            producer.init_transactions(PROBE_TIMEOUT_S)
        except KafkaException:
            return False
        return True

    return ask


class TxnRefusal:
    def __init__(self, refusals: Refusals, ingress: IngressHold, clock: Clock, probe: Probe,
                 about: Callable[[], tuple[str, str]] | None = None) -> None:
        self.refusals = refusals
        # a tenant's: (its transactional id, its principal) for the cause, asked when refused (the
        # instance id is known once the sidecar has started)
        self.about = about
        self.ingress = ingress  # what waits with the lane: all of ingress, or the tenant's topic
        self.clock = clock
        self.probe = probe
        self.waiting = False
        self.cause: Cause | None = None
        self.refused_count = 0
        self._backoff = BACKOFF_FIRST_S
        self._next_try = 0.0
        self._answer: list[bool] = []  # the running probe's answer, once it has one
        self._probing: threading.Thread | None = None

    def cause_of(self, e: KafkaException) -> Cause | None:
        """The refusal of the transactional id ``e`` names (Write on it, the principal); None
        for any other error."""
        err = e.args[0] if e.args else None
        if err is None or not hasattr(err, "name") or err.name() != REFUSED:
            return None
        cause = self.refusals.cause(err)
        if cause is not None and self.about is not None:
            txn_id, principal = self.about()
            cause = cause.about("Write", f"transactional id {txn_id}", principal)
        return cause

    def refused(self, cause: Cause) -> None:
        """Stop producing and wait (see the module docstring)."""
        if not self.waiting:
            self.refused_count += 1
            log.error("transactions.refused", **cause.as_dict(), message=cause.message(),
                      action="the lane's deliveries stopped and its ingress paused; retrying with back-off, "
                             "resuming once the ACL is granted")
        self.waiting = True
        self.cause = cause
        self.ingress.hold()
        self.refusals.report(cause)
        self._next_try = self.clock.monotonic() + self._backoff
        self._backoff = min(BACKOFF_MAX_S, self._backoff * 2)

    def failed(self, e: KafkaException) -> None:
        """Registering the new producer failed otherwise (the broker unreachable meanwhile):
        waited out like the refusal."""
        log.warning("transactions.register_failed", error=str(e), action="retrying with back-off")
        assert self.cause is not None
        self.refused(self.cause)

    def step(self) -> bool:
        """A turn while waiting: hold the pause and ``/readyz``, start a probe when due; True
        once a probe passed (the caller registers a new producer)."""
        if not self.ingress.held:
            self.ingress.hold()
        if self.cause is not None:
            self.refusals.report(self.cause)
        if self._probing is not None:
            if not self._answer:
                return False
            self._probing = None
            if self._answer.pop():
                return True
            self._next_try = self.clock.monotonic() + self._backoff
            self._backoff = min(BACKOFF_MAX_S, self._backoff * 2)
        elif self.clock.monotonic() >= self._next_try:
            self._probing = threading.Thread(target=self._ask, name="kds-txn-probe", daemon=True)
            self._probing.start()
        return False

    def _ask(self) -> None:
        try:
            self._answer.append(self.probe())
        except Exception as e:  # a probe that failed otherwise is asked again later
            log.warning("transactions.probe_failed", error=str(e))
            self._answer.append(False)

    def resumed(self) -> None:
        """A new transactional producer is registered: ``/readyz`` cleared, ingress resumed."""
        log.info("transactions.resumed", resource=self.cause.resource if self.cause else "",
                 action="delivering again with a new transactional producer")
        self.waiting = False
        self.cause = None
        self._backoff = BACKOFF_FIRST_S
        health = self.refusals.health
        if health is not None:
            current = health.kafka_cause()
            if current is not None and current.get("code") == NOT_AUTHORIZED:
                health.set_kafka(None)
        self.ingress.release()
