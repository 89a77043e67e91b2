"""What librdkafka reports, sorted into causes an operator can act on.

librdkafka says what went wrong in three places: the ``KafkaError`` of an exception or a delivery
report, the errors it hands to ``error_cb``, and its log lines. The exception a caller sees is
often the least telling of them: a wrong password, a firewall and a wrong address all end a
metadata request in ``_TRANSPORT "Failed to get metadata: Local: Broker transport failure"``,
while ``error_cb`` got ``_AUTHENTICATION "SASL authentication error: ... invalid credentials"``
a moment before. So :func:`most_telling` looks at every error seen and keeps the one that says
the most (an authentication, TLS or configuration error before a missing permission, before an
unreachable broker), and :func:`classify` maps one error, by its code name and its text, to a
:class:`Cause`:

``bad-config``
    A librdkafka property the client refuses (unknown property, invalid value, an unsupported
    SASL mechanism, a CA file it cannot read). Fixed only by changing the setting: exits.
``auth-failed``
    SASL authentication refused: wrong user name or password (``sasl.username`` /
    ``sasl.password``), or a mechanism the broker does not enable for the user
    (``sasl.mechanism``: SCRAM-SHA-256 for a SCRAM-SHA-512 user). Fixed by a configuration
    change: exits at start; while running (credentials revoked) it is retried.
``tls-failed``
    The TLS handshake failed: a broker certificate signed by a CA not in ``ssl.ca.location``
    (``unknown-ca``), a certificate that does not name the address connected to
    (``hostname-mismatch``: ``bootstrap.servers``), an expired certificate (``expired``: renew
    the broker's certificate), or a listener that does not speak TLS at all, or speaks only TLS
    (``security.protocol``). Exits at start, except an expired broker certificate: renewing it
    heals the sidecar without a restart.
``not-authorized``
    An ACL is missing: the broker refused an operation on a resource (a topic, the group, the
    transactional id, the cluster). An ACL can be added while the sidecar waits: retried.
``broker-unreachable``
    No broker answered: connection refused, a time-out, a name that does not resolve
    (``bootstrap.servers``). The broker may be starting, or a network may be healing: retried.

Each cause carries the setting to change and :attr:`Cause.heals`: True means keep retrying with
back-off and answer ``/readyz`` with 503 and the code (Kubernetes' convention for what can heal),
False means exit at start with :attr:`Cause.exit_status` (what only a configuration change fixes).
The TLS verify reasons come from OpenSSL's own words when librdkafka passes them on; it often
does not (``certificate verify failed`` alone), which is why :mod:`sidecar.connectivity` asks
the broker's certificate again with Python's ``ssl`` to name the reason.

Pure: names and strings in, a value out; no client, no clock. ``docs/operations.md``
("When Kafka refuses the sidecar") has the table of causes, messages and exit statuses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

# Exit statuses of ``delay-sidecar run`` for what cannot heal (docs/operations.md). 2 is the
# status of every bad setting (a flag, a config key, a librdkafka property), as before.
EXIT_BAD_CONFIG = 2
EXIT_AUTH_FAILED = 3
EXIT_TLS_FAILED = 4

BAD_CONFIG = "bad-config"
AUTH_FAILED = "auth-failed"
TLS_FAILED = "tls-failed"
NOT_AUTHORIZED = "not-authorized"
UNREACHABLE = "broker-unreachable"

# the order in which an error explains a failure better than another (most_telling)
_RANK = {BAD_CONFIG: 0, AUTH_FAILED: 1, TLS_FAILED: 2, NOT_AUTHORIZED: 3, UNREACHABLE: 4}
_EXIT = {BAD_CONFIG: EXIT_BAD_CONFIG, AUTH_FAILED: EXIT_AUTH_FAILED, TLS_FAILED: EXIT_TLS_FAILED}

_RESOURCE_OF = {
    "TOPIC_AUTHORIZATION_FAILED": "topic",
    "GROUP_AUTHORIZATION_FAILED": "group",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": "transactional-id",
    "CLUSTER_AUTHORIZATION_FAILED": "cluster",
}
_TRANSPORT_CODES = frozenset({
    "_TRANSPORT", "_ALL_BROKERS_DOWN", "_RESOLVE", "_TIMED_OUT", "_TIMED_OUT_QUEUE", "_MSG_TIMED_OUT",
    "NETWORK_EXCEPTION", "REQUEST_TIMED_OUT", "BROKER_NOT_AVAILABLE", "_WAIT_COORD", "COORDINATOR_NOT_AVAILABLE",
})
_AUTH_CODES = frozenset({
    "_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "ILLEGAL_SASL_STATE", "UNSUPPORTED_SASL_MECHANISM",
})
_PROPERTY = re.compile(r'property:? "?([a-z][a-z0-9._]*)"?')
# librdkafka's prefix ("127.0.0.1:1/bootstrap: ", "sasl_ssl://localhost:9093/1: ") and suffixes
_PREFIX = re.compile(r"^(?:Failed to create \w+(?: \w+)?: )?(?:\w+://)?(?:\S+/(?:bootstrap|\d+): )?")
_SUFFIX = re.compile(r" \((?:after \d+ms in state \w+|\d+ identical error\(s\) suppressed)\)")


class ErrorLike(Protocol):
    """The part of ``confluent_kafka.KafkaError`` read here."""

    def name(self) -> str: ...
    def str(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Cause:
    """Why Kafka cannot be used, and what to change (see the module docstring)."""

    code: str  # bad-config, auth-failed, tls-failed, not-authorized, broker-unreachable
    setting: str  # what to change: a librdkafka property, or an ACL
    heals: bool  # True: retry with back-off (/readyz 503); False: exit at start
    detail: str  # librdkafka's (or OpenSSL's) words, without its broker prefix
    reason: str = ""  # a finer cause: unknown-ca, hostname-mismatch, expired, wrong-mechanism, ...
    operation: str = ""  # not-authorized: the refused operation (Describe, Read, Write, ...)
    resource: str = ""  # not-authorized: what it was refused on ("topic delay.ingress", "cluster")
    error: str = ""  # librdkafka's error name (_AUTHENTICATION, TOPIC_AUTHORIZATION_FAILED, ...)
    principal: str = ""  # not-authorized: who lacks the ACL (User:NAME), when the caller knows

    @property
    def exit_status(self) -> int:
        """The exit status of ``delay-sidecar run`` when this cause stops it at start."""
        return _EXIT.get(self.code, 1)

    def message(self) -> str:
        """One line: the cause, the fix and librdkafka's words."""
        what = {
            BAD_CONFIG: "a Kafka client property is invalid",
            AUTH_FAILED: "Kafka refused the SASL credentials",
            TLS_FAILED: "the TLS handshake with Kafka failed",
            NOT_AUTHORIZED: "Kafka refused an operation (a missing ACL)",
            UNREACHABLE: "no Kafka broker answered",
        }.get(self.code, "Kafka failed")
        if self.code == NOT_AUTHORIZED:
            op = self.operation or "an operation"
            what = f"Kafka refused {op} on {self.resource or 'a resource'} (a missing ACL)"
        reason = f" ({self.reason})" if self.reason else ""
        return f"{self.code}{reason}: {what}; check {self.setting}: {self.detail}"

    def as_dict(self) -> dict[str, str]:
        """The fields of ``/readyz``'s ``kafka`` and of the structured log events."""
        out = {"code": self.code, "setting": self.setting, "detail": self.detail}
        for key in ("reason", "operation", "resource", "principal", "error"):
            value = getattr(self, key)
            if value:
                out[key] = value
        return out

    def about(self, operation: str, resource: str, principal: str = "") -> Cause:
        """This cause (a not-authorized one) naming what was refused on what (and to whom), when
        the caller knows."""
        if self.code != NOT_AUTHORIZED:
            return self
        return replace(self, operation=operation, resource=resource, principal=principal,
                       setting=_acl_setting(operation, resource, principal))


def clean(text: str) -> str:
    """librdkafka's text without the broker prefix and the state / repeat suffixes."""
    return _SUFFIX.sub("", _PREFIX.sub("", text.strip()))


def principal_of(conf: Mapping[str, object]) -> str:
    """The Kafka principal of SASL client properties (``User:<sasl.username>``), or "" when the
    principal is not in them (no SASL, or a TLS client certificate's name)."""
    protocol = str(conf.get("security.protocol", "")).upper()
    user = conf.get("sasl.username")
    return f"User:{user}" if protocol.startswith("SASL_") and user else ""


def _acl_setting(operation: str, resource: str, principal: str = "") -> str:
    if operation and resource:
        who = principal or "the sidecar's principal"
        return f"the ACLs of {who}: allow {operation} on {resource}"
    return "the ACLs of the sidecar's principal (docs/operations.md lists the ones it needs)"


def _tls(detail: str) -> Cause | None:
    """A TLS failure named by the text, or None."""
    low = detail.lower()
    if "plaintext broker listener" in low or "wrong version number" in low or "packet length too long" in low:
        return Cause(TLS_FAILED, "security.protocol (the listener does not speak TLS: PLAINTEXT or SASL_PLAINTEXT?)",
                     False, detail, "not-tls")
    if "connecting to a ssl listener" in low or "connecting to a sasl_ssl listener" in low:
        return Cause(TLS_FAILED, "security.protocol (the listener expects TLS: SSL or SASL_SSL)", False, detail,
                     "tls-expected")
    if "expired" in low:
        return Cause(TLS_FAILED, "the broker's certificate (it has expired: renew it)", True, detail, "expired")
    if "hostname mismatch" in low or "ip address mismatch" in low or "does not match" in low:
        return Cause(TLS_FAILED, "bootstrap.servers (use a name the broker's certificate holds) or "
                                 "ssl.endpoint.identification.algorithm", False, detail, "hostname-mismatch")
    if ("certificate verify failed" in low or "unable to get local issuer" in low or "self-signed" in low
            or "self signed" in low or "unknown ca" in low or "could not be verified" in low):
        return Cause(TLS_FAILED, "ssl.ca.location (the CA that signed the broker's certificate)", False, detail,
                     "unknown-ca")
    if "ssl handshake failed" in low or "ssl" in low.split(":")[0]:
        return Cause(TLS_FAILED, "ssl.ca.location, ssl.certificate.location, ssl.key.location", False, detail)
    return None


def _auth(detail: str) -> Cause:
    low = detail.lower()
    if "mechanism" in low and ("not supported" in low or "unsupported" in low or "supported mechanisms" in low
                               or "not enabled" in low or "handshake failed" in low):
        return Cause(AUTH_FAILED, "sasl.mechanism (the broker does not enable it)", False, detail, "wrong-mechanism")
    return Cause(AUTH_FAILED, "sasl.username and sasl.password (and sasl.mechanism: a SCRAM user exists for one "
                              "mechanism only)", False, detail, "wrong-credentials")


def _bad_config(detail: str) -> Cause:
    low = detail.lower()
    found = _PROPERTY.search(detail)
    if "sasl mechanism" in low or "hash function" in low:  # "Unsupported hash function: SCRAM-SHA-1024"
        setting = "sasl.mechanism"
    elif "sasl.username and sasl.password" in low:
        setting = "sasl.username and sasl.password"
    elif found is not None:
        setting = found.group(1)
    else:
        setting = next((w.rstrip(":") for w in detail.split() if re.fullmatch(r"[a-z]+(\.[a-z]+)+:?", w)),
                       "the --kafka / kafka: properties")
    return Cause(BAD_CONFIG, setting, False, detail)


def classify(name: str, text: str) -> Cause | None:
    """The cause of one librdkafka error (``KafkaError.name()`` and ``.str()``), or None for an
    error that is none of the causes above (a record too large, a leader moving)."""
    detail = clean(text)
    low = detail.lower()
    if name in _RESOURCE_OF:
        kind = _RESOURCE_OF[name]
        return Cause(NOT_AUTHORIZED, _acl_setting("", ""), True, detail, error=name,
                     resource="cluster" if kind == "cluster" else "")
    if name in ("_INVALID_ARG", "_INVALID_TYPE", "_NOT_CONFIGURED"):
        return replace(_bad_config(detail), error=name)
    if name in _AUTH_CODES or "sasl authentication" in low or "sasl handshake" in low:
        return replace(_auth(detail), error=name)
    tls = _tls(detail) if (name == "_SSL" or "ssl" in low or "tls" in low or "certificate" in low
                           or "listener" in low) else None
    if tls is not None:
        return replace(tls, error=name)
    if name == "_RESOLVE" or "failed to resolve" in low:
        return Cause(UNREACHABLE, "bootstrap.servers (a host name that does not resolve)", True, detail,
                     "unresolved", error=name)
    if name in _TRANSPORT_CODES:
        return Cause(UNREACHABLE, "bootstrap.servers, and the network between the sidecar and the brokers", True,
                     detail, error=name)
    return None


def most_telling(errors: Iterable[tuple[str, str]]) -> Cause | None:
    """The cause that explains a failure best among ``(name, text)`` errors (see the module
    docstring); None when none of them is a known cause."""
    best: Cause | None = None
    for name, text in errors:
        cause = classify(name, text)
        if cause is not None and (best is None or _RANK[cause.code] < _RANK[best.code]
                                  or (cause.code == best.code and len(cause.reason) > len(best.reason))):
            best = cause
    return best


def from_log(lines: Iterable[str], repeats: int = 3) -> Cause | None:
    """A cause only librdkafka's log shows: a plaintext client whose every connection the broker
    closes while it asks for the API versions (``Disconnected ... in state APIVERSION_QUERY``):
    the listener expects TLS. ``error_cb`` gets only ``_ALL_BROKERS_DOWN`` then. A single such
    disconnect can be a broker going down; ``repeats`` of them are not."""
    closed = [line for line in lines if "Disconnected" in line and "in state APIVERSION_QUERY" in line]
    if len(closed) < repeats:
        return None
    detail = (f"{clean(closed[-1])}, {len(closed)} times: every connection closed before the API versions "
              "(connecting to an SSL or SASL_SSL listener?)")
    return Cause(TLS_FAILED, "security.protocol (the listener expects TLS: SSL or SASL_SSL)", False, detail,
                 "tls-expected", error="_TRANSPORT")


def of(errors: Iterable[ErrorLike]) -> Cause | None:
    """:func:`most_telling` of ``KafkaError`` objects."""
    return most_telling((e.name(), e.str()) for e in errors)


def with_verify_reason(cause: Cause, verify_message: str) -> Cause:
    """A TLS cause made precise by OpenSSL's verify message (``unable to get local issuer
    certificate``, ``Hostname mismatch, ...``, ``certificate has expired``), as Python's ``ssl``
    reports it."""
    finer = _tls(verify_message)
    if cause.code != TLS_FAILED or finer is None or finer.reason in ("", "not-tls", "tls-expected"):
        return cause
    return replace(finer, detail=f"{cause.detail} ({verify_message})", error=cause.error)
