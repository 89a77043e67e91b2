"""sidecar.kafka_errors: librdkafka's errors (names and texts as librdkafka 2.x words them) sorted
into causes, each with the setting to change and whether it heals."""

from __future__ import annotations

import pytest

from sidecar import kafka_errors as ke
from sidecar.connectivity import KafkaUnusable, wait_until_usable

CASES = [
    # (error name, librdkafka's text, cause code, reason, a word of the setting, heals)
    ("_INVALID_ARG", "Failed to create admin client: Unsupported SASL mechanism: FOO",
     ke.BAD_CONFIG, "", "sasl.mechanism", False),
    ("_INVALID_ARG", "Failed to create admin client: Unsupported hash function: SCRAM-SHA-1024 (try SCRAM-SHA-512)",
     ke.BAD_CONFIG, "", "sasl.mechanism", False),
    ("_INVALID_ARG", 'No such configuration property: "bogus.prop"', ke.BAD_CONFIG, "", "bogus.prop", False),
    ("_INVALID_ARG", 'Invalid value "SASL_TLS" for configuration property "security.protocol"',
     ke.BAD_CONFIG, "", "security.protocol", False),
    ("_INVALID_ARG", "Failed to create producer: sasl.username and sasl.password must be set",
     ke.BAD_CONFIG, "", "sasl.username", False),
    ("_INVALID_ARG", "Failed to create admin client: ssl.ca.location failed: error:05880020:x509 certificate "
     "routines::BIO lib", ke.BAD_CONFIG, "", "ssl.ca.location", False),
    ("_AUTHENTICATION", "sasl_ssl://localhost:9093/bootstrap: SASL authentication error: Authentication failed "
     "during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 12ms in state "
     "AUTH_REQ)", ke.AUTH_FAILED, "wrong-credentials", "sasl.password", False),
    ("_AUTHENTICATION", "sasl_ssl://localhost:9093/bootstrap: SASL SCRAM-SHA-256 mechanism handshake failed: "
     "Broker: Request not valid in current SASL state: broker's supported mechanisms: SCRAM-SHA-512",
     ke.AUTH_FAILED, "wrong-mechanism", "sasl.mechanism", False),
    ("_SSL", "ssl://localhost:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate "
     "verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly "
     "configured or root CA certificates are installed (install ca-certificates package) (after 5ms in state "
     "SSL_HANDSHAKE)", ke.TLS_FAILED, "unknown-ca", "ssl.ca.location", False),
    ("_TRANSPORT", "sasl_ssl://127.0.0.1:9092/bootstrap: SSL handshake failed: Disconnected: connecting to a "
     "PLAINTEXT broker listener? (after 3ms in state SSL_HANDSHAKE)", ke.TLS_FAILED, "not-tls",
     "security.protocol", False),
    ("_TRANSPORT", "127.0.0.1:9093/bootstrap: Disconnected while requesting ApiVersion: might be caused by "
     "incorrect security.protocol configuration (connecting to a SSL listener?) or broker version is < 0.10",
     ke.TLS_FAILED, "tls-expected", "security.protocol", False),
    ("TOPIC_AUTHORIZATION_FAILED", "Broker: Topic authorization failed", ke.NOT_AUTHORIZED, "", "ACL", True),
    ("GROUP_AUTHORIZATION_FAILED", "Broker: Group authorization failed", ke.NOT_AUTHORIZED, "", "ACL", True),
    ("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "Broker: Transactional Id authorization failed",
     ke.NOT_AUTHORIZED, "", "ACL", True),
    ("CLUSTER_AUTHORIZATION_FAILED", "Broker: Cluster authorization failed", ke.NOT_AUTHORIZED, "", "ACL", True),
    ("_RESOLVE", "nonexistent.invalid:9092/bootstrap: Failed to resolve 'nonexistent.invalid:9092': Name or "
     "service not known (after 1ms in state CONNECT)", ke.UNREACHABLE, "unresolved", "bootstrap.servers", True),
    ("_TRANSPORT", "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in "
     "state CONNECT)", ke.UNREACHABLE, "", "bootstrap.servers", True),
    ("_ALL_BROKERS_DOWN", "1/1 brokers are down", ke.UNREACHABLE, "", "bootstrap.servers", True),
]


@pytest.mark.parametrize(("name", "text", "code", "reason", "setting", "heals"), CASES)
def test_classify(name: str, text: str, code: str, reason: str, setting: str, heals: bool) -> None:
    cause = ke.classify(name, text)
    assert cause is not None
    assert (cause.code, cause.reason, cause.heals) == (code, reason, heals)
    assert setting in cause.setting
    line = cause.message()
    assert line.startswith(code) and "\n" not in line and setting in line
    assert "after 0ms" not in cause.detail and "/bootstrap:" not in cause.detail
    assert cause.exit_status == {ke.BAD_CONFIG: 2, ke.AUTH_FAILED: 3, ke.TLS_FAILED: 4}.get(code, 1)


@pytest.mark.parametrize("name", ["MSG_SIZE_TOO_LARGE", "NOT_LEADER_FOR_PARTITION", "_PARTITION_EOF"])
def test_other_errors_are_no_cause(name: str) -> None:
    assert ke.classify(name, "Broker: something else") is None


def test_most_telling_prefers_the_error_that_names_the_cause() -> None:
    errors = [
        ("_TRANSPORT", "localhost:9093/bootstrap: Connect to ipv4#127.0.0.1:9093 failed: Connection refused"),
        ("_AUTHENTICATION", "localhost:9093/bootstrap: SASL authentication error: Authentication failed during "
                            "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"),
        ("_ALL_BROKERS_DOWN", "1/1 brokers are down"),
        ("_TRANSPORT", "Failed to get metadata: Local: Broker transport failure"),
    ]
    cause = ke.most_telling(errors)
    assert cause is not None and cause.code == ke.AUTH_FAILED
    assert ke.most_telling([("_PARTITION_EOF", "eof")]) is None


def test_not_authorized_names_operation_and_resource() -> None:
    cause = ke.classify("TOPIC_AUTHORIZATION_FAILED", "Broker: Topic authorization failed")
    assert cause is not None
    named = cause.about("Describe", "topic delay.ingress")
    assert named.as_dict()["operation"] == "Describe" and named.resource == "topic delay.ingress"
    assert "allow Describe on topic delay.ingress" in named.message()
    other = ke.classify("_RESOLVE", "Failed to resolve 'x:1'")
    assert other is not None and other.about("Read", "group g") is other


def test_a_refusal_names_the_sasl_principal() -> None:
    conf = {"security.protocol": "SASL_SSL", "sasl.username": "svc", "sasl.password": "p"}
    assert ke.principal_of(conf) == "User:svc"
    assert ke.principal_of({**conf, "security.protocol": "SSL"}) == ""  # a certificate's name: not known here
    assert ke.principal_of({"security.protocol": "sasl_plaintext"}) == ""
    cause = ke.classify("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "Transactional Id authorization failed")
    assert cause is not None
    named = cause.about("Write", "transactional-id g.i-1", "User:svc")
    assert named.as_dict()["principal"] == "User:svc"
    assert "the ACLs of User:svc: allow Write on transactional-id g.i-1" in named.message()


@pytest.mark.parametrize(("verify", "reason", "heals"), [
    ("unable to get local issuer certificate", "unknown-ca", False),
    ("self-signed certificate in certificate chain", "unknown-ca", False),
    ("Hostname mismatch, certificate is not valid for '127.0.0.1'.", "hostname-mismatch", False),
    ("IP address mismatch, certificate is not valid for '127.0.0.1'.", "hostname-mismatch", False),
    ("certificate has expired", "expired", True),
])
def test_tls_verify_reason(verify: str, reason: str, heals: bool) -> None:
    base = ke.classify("_SSL", "SSL handshake failed: error:0A000086:SSL routines::certificate verify failed")
    assert base is not None and base.reason == "unknown-ca"
    finer = ke.with_verify_reason(base, verify)
    assert (finer.code, finer.reason, finer.heals) == (ke.TLS_FAILED, reason, heals)
    assert verify in finer.detail
    unreachable = ke.classify("_TRANSPORT", "Connection refused")
    assert unreachable is not None and ke.with_verify_reason(unreachable, verify) is unreachable


def test_wait_until_usable_retries_what_heals_and_raises_what_cannot() -> None:
    unreachable = ke.classify("_TRANSPORT", "Connection refused")
    denied = ke.classify("GROUP_AUTHORIZATION_FAILED", "Broker: Group authorization failed")
    answers = [unreachable, unreachable, denied, None]
    reported: list[object] = []
    warned: list[tuple[str, float]] = []
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    ok = wait_until_usable(lambda: answers.pop(0), reported.append,
                           lambda c, s: warned.append((c.code, s)), lambda: False, sleep, lambda: now[0])
    assert ok and reported == [unreachable, unreachable, denied, None]
    # the first of each cause is logged (the same cause again within a minute is not)
    assert warned == [(ke.UNREACHABLE, 1.0), (ke.NOT_AUTHORIZED, 4.0)]
    assert now[0] == pytest.approx(7.0)  # back-off 1 + 2 + 4 s

    bad = ke.classify("_AUTHENTICATION", "SASL authentication error: Authentication failed")
    with pytest.raises(KafkaUnusable) as e:
        wait_until_usable(lambda: bad, lambda c: None, lambda c, s: None, lambda: False, sleep, lambda: now[0])
    assert e.value.cause is bad and e.value.cause.exit_status == 3
    assert not wait_until_usable(lambda: unreachable, lambda c: None, lambda c, s: None, lambda: True)


def test_a_listener_expecting_tls_shows_only_in_the_log() -> None:
    line = ("127.0.0.1:9093/bootstrap: Disconnected: connection closed by peer: receive 0 after POLLIN "
            "(after 3ms in state APIVERSION_QUERY)")
    assert ke.from_log([line, line]) is None  # a broker going down closes a connection or two
    cause = ke.from_log([line] * 3 + ["127.0.0.1:9093/bootstrap: Connect to ipv4#127.0.0.1:9093 failed"])
    assert cause is not None and (cause.code, cause.reason, cause.exit_status) == (ke.TLS_FAILED, "tls-expected", 4)
    assert cause.setting.startswith("security.protocol") and "3 times" in cause.detail


class _Events:
    def __init__(self) -> None:
        self.status: list[tuple[bool, str]] = []

    def broker_status(self, up: bool, source: str) -> None:
        self.status.append((up, source))

    def statistics(self, stats_json: str) -> None:
        pass


class _Health:
    def __init__(self) -> None:
        self.cause: dict[str, str] | None = None

    def set_kafka(self, cause: dict[str, str] | None, hold: bool = True) -> None:
        self.cause = cause

    def kafka_cause(self) -> dict[str, str] | None:
        return self.cause


def test_run_time_refusals_reach_readyz_and_one_warning() -> None:
    """Credentials refused at a reconnect: the broker counts as down, /readyz names auth-failed,
    one kafka.refused warning however often librdkafka repeats it; the broker UP again clears it.
    A missing group ACL names the group; the next records clear it."""
    from confluent_kafka import KafkaError
    from structlog.testing import capture_logs

    from sidecar.config import load_settings
    from sidecar.engine.kafka_io import KafkaIO

    events, health = _Events(), _Health()
    io = KafkaIO(load_settings({"group-id": "g1"}, environ={}), clients=None, events=events)  # type: ignore[arg-type]
    io.refusals.health = health
    auth = KafkaError(KafkaError._AUTHENTICATION, "sasl_ssl://b:9093/1: SASL authentication error: Authentication "
                                                  "failed during authentication due to invalid credentials")
    with capture_logs() as logged:
        for _ in range(5):
            io._on_error(auth)
    assert events.status[-1] == (False, "auth-failed")
    assert health.cause is not None and health.cause["code"] == "auth-failed"
    assert [e["event"] for e in logged] == ["kafka.refused"]
    io._on_stats('{"brokers": {"b:9093/1": {"nodeid": 1, "state": "UP"}}}')
    assert events.status[-1] == (True, "statistics") and health.cause is None

    with capture_logs() as logged:
        io.consume_error(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "Broker: Group authorization failed"))
    assert health.cause is not None and health.cause["resource"] == "group g1"
    assert "allow Read on group g1" in logged[0]["message"]

    class Msg:
        def error(self) -> None:
            return None

    class Consumer:
        def consume(self, num_messages: int, timeout: float) -> list[Msg]:
            return [Msg()]

    io.consumer = Consumer()
    io.consume(1, 0)
    assert health.cause is None
