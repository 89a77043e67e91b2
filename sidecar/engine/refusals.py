"""Kafka's refusals of the running sidecar, tracked: ``/readyz`` names the cause until it heals.

An error the clients report (``error_cb``, a consumed message's error, a failed commit) may name
why Kafka refuses the sidecar: credentials refused, a TLS failure, a missing ACL on the group, the
ingress topic or the transactional id. ``sidecar.kafka_errors`` classifies it (the same causes the
start-up probe, ``sidecar.connectivity``, waits on); an unreachable cluster or a bad setting is
no refusal here (the broker status and the configuration say those). For a refusal:

- a missing ACL is named: the resource (``group <id>``, ``topic <ingress>``, the transactional
  id) and the operation to allow (``Read``, ``Write`` for the transactional id);
- ``/readyz`` answers 503 with the cause (``HealthServer.set_kafka``): refused credentials or TLS
  hold until a broker connection is UP again (``broker_up``: librdkafka suppresses repeats of the
  same error, so a time-out would lapse while it lasts); a missing ACL holds while it is repeated,
  and records consumed again clear it (``consumed``);
- one ``kafka.refused`` warning per cause and resource a minute names the setting to change.

A TLS failure librdkafka names only ``certificate verify failed`` (an expired broker certificate
met at a reconnect reads as an unknown CA) is made precise as at start, by one handshake with
Python's ``ssl`` (``tls_check.tls_reason``); its answer is kept a few seconds, because the
clients report the failure once per connection attempt and the handshake blocks their callback.

The clients keep retrying meanwhile, nothing is committed, and deliveries resume without a restart
once an operator fixes the credentials or the ACL.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sidecar import kafka_errors, logs, tls_check
from sidecar.config import Settings
from sidecar.engine.client_conf import client_conf
from sidecar.engine.transactions import transactional_id
from sidecar.kafka_errors import Cause

log = logs.get("sidecar")

TLS_REASON_KEPT_S = 5.0  # how long one handshake's verify message names later TLS failures


class Refusals:
    def __init__(self, settings: Settings, should_warn: Callable[[str, float], bool]) -> None:
        self.s = settings
        self.should_warn = should_warn  # the Kafka port's rate limit of repeated warnings
        self.health: Any = None  # the HealthServer, for /readyz's kafka cause (set by the loop)
        self.read_refused = False  # a missing ACL was reported: the next records clear it
        self._tls_reason: tuple[float, str] = (float("-inf"), "")  # when asked, the verify message

    def cause(self, err: Any) -> Cause | None:
        """The refusal ``err`` names, its resource named for a missing ACL; None for any other error."""
        cause = kafka_errors.classify(err.name(), err.str())
        if cause is None or cause.code in (kafka_errors.UNREACHABLE, kafka_errors.BAD_CONFIG):
            return None
        if tls_check.vague_tls(cause):
            why = self._verify_message()
            return kafka_errors.with_verify_reason(cause, why) if why else cause
        if cause.code == kafka_errors.NOT_AUTHORIZED:
            resource = {"GROUP_AUTHORIZATION_FAILED": f"group {self.s.group_id}",
                        "TOPIC_AUTHORIZATION_FAILED": f"topic {', '.join(t.ingress_topic for t in self.s.tenants)}",
                        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED":
                            f"transactional id {transactional_id(self.s.group_id, self.s.group_instance_id or '')}",
                        }.get(cause.error, "the cluster")
            cause = cause.about("Read" if cause.error != "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" else "Write",
                                resource, kafka_errors.principal_of(self.s.kafka))
        return cause

    def _verify_message(self) -> str:
        """``tls_check.tls_reason`` for the sidecar's properties, kept a few seconds when it
        named a reason (a broker that is not up yet names none: asked again next time)."""
        asked, why = self._tls_reason
        if not why or time.monotonic() - asked > TLS_REASON_KEPT_S:
            why = tls_check.tls_reason(client_conf(self.s))
            self._tls_reason = (time.monotonic(), why)
        return why

    def report(self, cause: Cause) -> None:
        """``/readyz`` says so, and one warning a minute per cause names the setting to change."""
        if cause.code == kafka_errors.NOT_AUTHORIZED:
            self.read_refused = True
        if self.health is not None:
            # refused credentials or TLS: until a broker is UP again (librdkafka suppresses repeats of
            # the same error, so a time-out would lapse while it lasts); a missing ACL: while repeated
            self.health.set_kafka(cause.as_dict(), hold=cause.code == kafka_errors.NOT_AUTHORIZED)
        if self.should_warn(f"refused:{cause.code}:{cause.resource}", 60.0):
            log.warning("kafka.refused", **cause.as_dict(), message=cause.message(),
                        action="retrying; deliveries resume once fixed")

    def refused(self, err: Any) -> bool:
        """Report the refusal ``err`` names; False for any other error."""
        cause = self.cause(err)
        if cause is None:
            return False
        self.report(cause)
        return True

    def consumed(self, msgs: list[Any]) -> None:
        """Messages consumed after a missing ACL was reported: a record among them clears it."""
        if any(m.error() is None for m in msgs):
            self.read_refused = False  # records again: the ACL is back
            if self.health is not None:
                self.health.set_kafka(None)

    def broker_up(self) -> None:
        """A real broker connection is UP: refused credentials or a TLS failure were fixed."""
        if self.health is None:
            return
        cause = self.health.kafka_cause()
        if cause is not None and cause["code"] != kafka_errors.NOT_AUTHORIZED:
            self.health.set_kafka(None)  # logged in again: the credentials or the certificate were fixed
