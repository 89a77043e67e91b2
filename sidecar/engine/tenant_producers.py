"""Tenant producers: each tenant with ``kafka:`` overrides publishes through a producer of its own.

A tenant's ``kafka:`` properties (``sidecar/tenants.py``; typically its own ``sasl.username`` and
``sasl.password``) are applied over the deployment producer's configuration
(``KafkaIO.producer_conf``: idempotent, ``acks=all``, the deployment's ``kafka:``), and that
producer publishes the tenant's deliveries and dead letters: the broker, not the sidecar, decides
which targets the tenant may write (Kafka Connect's ``producer.override.*`` is the model). A
tenant without overrides, and every other write (at-least-once: the changelog and the offset
commits; history, etf1 tombstones), stays on the deployment's clients.

How the engine uses it:

* ``of(topic, deployment)``: the producer of the store of ingress topic ``topic`` (a dict look-up
  per batch; the deployment's producer when the tenant has none). ``Publishing`` hands it to the C
  fast path (``publish_due``) and to ``_produce``.
* ``poll``: every tenant producer's delivery reports are served each time the deployment's are
  (``Publishing.poll``), so a tenant's reports never wait on another's.
* a fatal error of a tenant's producer (a fatal delivery report, or ``poll`` raising it) replaces
  that producer only, at the next poll; its in-flight records come back purged and are retried on
  the new one. The deployment's producer and the other tenants' are untouched.
* exactly-once (``delivery: exactly-once``): each tenant producer is transactional, with the
  tenant's own transactional id ``<group-id>.<tenant>:<instance-id>``
  (``transactions.tenant_transactional_id``); its transactions also hold the changelog writes and
  the ingress offsets of the tenant's partitions (engine/txn_lanes.py). A fatal error is not
  replaced here but by ``ExactlyOnce``, which registers the new producer and restores the tenant's
  committed state (``replace``). Each tenant's target checks are asked as the tenant
  (``admin``, engine/eos_targets.py).
* ``refusal``: a delivery report refused for authorization (:data:`AUTHORIZATION_CODES`) becomes
  a DLQ error text naming the topic and the principal (``User:<sasl.username>``); ``Publishing``
  dead-letters the record as ``not-authorized`` once the failure policy gives up on it
  (``delivery-attempts``), in the tenant's DLQ. Other tenants' records are never held up: each
  record's retries are its own (the retry heap), and nothing waits for them.

A tenant producer's client errors (``error_cb``) are logged as ``tenant.kafka_error`` with the
tenant's name, rate-limited; they do not mark the deployment's broker connection down (a tenant's
wrong password is the tenant's problem, not a reason for ``/readyz`` to fail). Property values are
never logged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from sidecar import logs
from sidecar.config import Settings
from sidecar.engine.client_conf import client_conf
from sidecar.engine.kafka_io import retire_producer
from sidecar.engine.transactions import tenant_transactional_id
from sidecar.retry import KafkaErrorLike, describe
from sidecar.retry.codes import CODES
from sidecar.tenants import Tenant

log = logs.get("sidecar")

# delivery report codes meaning "this principal may not write that topic"
AUTHORIZATION_CODES = frozenset(CODES[n] for n in ("TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED")
                                if n in CODES)


def over(base: Mapping[str, Any], t: Tenant) -> dict[str, Any]:
    """The configuration of ``t``'s producer: ``base`` (the deployment producer's) with the tenant's
    ``kafka:`` properties over it. The sidecar's tenant producers and the commands that write for
    a tenant (``--tenant``, ``sidecar/tenant_option.py``) both build theirs here."""
    conf = dict(base)
    conf.update(t.kafka)
    return conf


class TenantProducers:
    """The producers of the tenants that have ``kafka:`` overrides, by ingress topic."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.tenant_of: dict[str, Tenant] = {t.ingress_topic: t for t in settings.tenants}
        self.own: dict[str, Any] = {}  # ingress topic -> its tenant's producer
        self.fatal: dict[str, str] = {}  # ingress topic -> why its producer must be replaced
        self._make: Callable[[dict[str, Any]], Any] | None = None
        self._base: Callable[[], dict[str, Any]] | None = None
        self._should_warn: Callable[[str], bool] = lambda key: True
        self._admins: dict[str, Any] = {}  # ingress topic -> an admin client as its tenant (exactly-once)
        self.transactional = settings.exactly_once  # replaced by ExactlyOnce, not at the next poll

    def start(self, make: Callable[[dict[str, Any]], Any], base_conf: Callable[[], dict[str, Any]],
              should_warn: Callable[[str], bool]) -> None:
        """Make each tenant's producer: ``make`` (the clients' factory) from ``base_conf()`` (the
        deployment producer's configuration) with the tenant's properties over it."""
        self._make, self._base, self._should_warn = make, base_conf, should_warn
        for topic, t in self.tenant_of.items():
            if t.kafka:
                self.own[topic] = make(self.conf_for(t))
                log.info("tenant.producer", tenant=t.name, principal=self.principal(topic),
                         properties=sorted(k for k, _v in t.kafka))

    def conf_for(self, t: Tenant) -> dict[str, Any]:
        assert self._base is not None
        conf = over(self._base(), t)
        conf["error_cb"] = lambda err: self._on_error(t.name, err)
        if self.transactional:
            conf["transactional.id"] = self.transactional_id(t)
        return conf

    def transactional_id(self, t: Tenant) -> str:
        return tenant_transactional_id(self.s.group_id, t.name, self.s.group_instance_id or "")

    def admin(self, topic: str, make: Callable[[dict[str, Any]], Any]) -> Any:
        """An admin client authenticated as the tenant of ingress topic ``topic`` (made by
        ``make`` when first needed): exactly-once asks it which targets the tenant may write."""
        found = self._admins.get(topic)
        if found is None:
            t = self.tenant_of[topic]
            conf = client_conf(self.s, t.kafka, {"error_cb": lambda err: self._on_error(t.name, err)})
            found = self._admins[topic] = make(conf)
        return found

    def of(self, topic: str, deployment: Any) -> Any:
        """The producer that publishes the records of ingress topic ``topic``."""
        return self.own.get(topic, deployment)

    def principal(self, topic: str) -> str:
        """Who the broker sees publishing the records of ingress topic ``topic``."""
        t = self.tenant_of.get(topic)
        if t is None:
            user = self.s.kafka.get("sasl.username")
            return f"User:{user}" if user else "the sidecar's principal"
        return t.principal(self.s.kafka)

    def refusal(self, err: KafkaErrorLike, target: str, topic: str) -> str | None:
        """The DLQ error text when ``err`` refuses the write of ``target`` for authorization (the
        record came from ingress topic ``topic``), else None."""
        if err.code() not in AUTHORIZATION_CODES:
            return None
        return f"{describe(err)}: {self.principal(topic)} may not write topic {target!r}"

    def died(self, topic: str, why: str) -> bool:
        """A fatal error of the producer of ``topic``'s tenant: True when that is a tenant
        producer (replaced at the next ``poll``), False for the deployment's."""
        if topic not in self.own:
            return False
        self.fatal.setdefault(topic, why)
        return True

    def poll(self) -> None:
        """Serve every tenant producer's delivery reports; replace the dead ones."""
        for topic, producer in self.own.items():
            try:
                producer.poll(0)
            except KafkaException as e:
                err = e.args[0] if e.args else None
                if err is None or not hasattr(err, "fatal") or not err.fatal():
                    raise
                self.fatal.setdefault(topic, describe(err))
        if self.fatal and not self.transactional:
            for topic, why in list(self.fatal.items()):
                self.replace(topic, why)

    def replace(self, topic: str, why: str, quiet: bool = False) -> None:
        """A new producer for the tenant of ``topic`` (its records in flight are purged: retried
        on it, or, exactly-once, restored by the caller); ``quiet``: reported already."""
        assert self._make is not None
        self.fatal.pop(topic, None)
        t = self.tenant_of[topic]
        if not quiet:
            log.error("producer.fatal", tenant=t.name, error=why,
                      action="continuing with a new producer for the tenant")
        old = self.own[topic]
        self.own[topic] = self._make(self.conf_for(t))
        retire_producer(old)

    def flush(self, timeout: float) -> None:
        for producer in self.own.values():
            producer.flush(timeout)

    def close(self) -> None:
        """Drop what is unacknowledged (delivered again after a restart) and close them."""
        for producer in self.own.values():
            if len(producer):
                producer.purge()
                producer.poll(0)
            close = getattr(producer, "close", None)
            if close is not None:
                close()
        self.own.clear()

    def _on_error(self, tenant: str, err: KafkaError) -> None:
        if self._should_warn(f"tenant.kafka_error:{tenant}:{err.code()}"):
            log.warning("tenant.kafka_error", tenant=tenant, code=err.name(), error=err.str())
