"""Session-wide fixtures: one real Kafka broker per test session, plus small helpers.

Why one broker per session: a KRaft broker takes several seconds to start on a loaded 2-core CI
machine, and tests isolate themselves by topic and group names (the ``unique`` fixture) instead.

* ``kafka_bootstrap`` (session, str): ``KAFKA_BOOTSTRAP_SERVERS`` if set (an existing cluster),
  else a :class:`devkafka.local.LocalKafka` started in a pytest tmp dir (its
  ``broker.log`` stays under pytest's basetemp for post-mortems). If no broker can be started the
  dependent tests are *skipped* on a laptop but *fail* when ``CI=true``: CI must prove a real
  broker ran, never silently skip the integration suite.
* ``local_kafka`` (session, LocalKafka | None): the broker object itself, for outage tests that
  ``stop()``/``start()``/``kill()`` it; None with an external broker. Mark such tests
  ``@pytest.mark.kafka_outage``: they are skipped with an external broker, and after each of them
  the broker is started again if the test left it down (so one failing outage test does not take
  the rest of the session with it).
* ``unique`` (function, str): 8 hex chars for topic/group names.
* ``secure_kafka`` (session, :class:`tests.secure.cluster.SecureCluster`): one secured broker
  (SASL_SSL, SCRAM-SHA-512, StandardAuthorizer), started the first time a test asks for it, so a
  session that runs none of these tests never pays its start; it fails or is skipped like the
  plain broker. Here rather than in tests/secure/ because tests/spark/ (the accuracy job under
  its ACLs) uses it too. Tests isolate themselves with a principal of their own
  (``SecureCluster.new_user``) and unique topic and group names; the ACLs they grant name only
  their own resources.
* the ``needs`` marker: any test that needs something of the machine (redis-server, the C
  extension, a Linux feature) is skipped without it, and fails under ``CI=true`` like the broker
  tests (``tests/infra.py``).

The broker address and how it was started are printed when it starts and again in the summary.
Per-area fixtures belong in ``tests/<area>/conftest.py`` or the test files, not here.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from devkafka.local import LocalKafka
from tests.infra import check_needs, unavailable

if TYPE_CHECKING:
    from tests.secure.cluster import SecureCluster

START_TIMEOUT_S = float(os.environ.get("KDS_KAFKA_START_TIMEOUT", "240"))


@dataclass
class _Broker:
    bootstrap: str
    local: LocalKafka | None
    description: str


_session_broker: _Broker | None = None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kafka_outage: stops/starts the session's local broker (skipped with an external broker)",
    )
    config.addinivalue_line(
        "markers",
        "needs(available, what): skipped without ``what``, failed under CI=true (tests/infra.py)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    check_needs(item)


def _unavailable(reason: str) -> None:
    unavailable("Kafka broker", reason)


def start_or_unavailable(kafka: LocalKafka, what: str) -> tuple[str, float]:
    """Start ``kafka``: its bootstrap and the seconds it took; else close it and fail (CI) or skip."""
    t0 = time.monotonic()
    try:
        return kafka.start(timeout=START_TIMEOUT_S), time.monotonic() - t0
    except Exception as exc:
        kafka.close()
        _unavailable(f"could not start {what}: {type(exc).__name__}: {exc}")
        raise  # not reached: _unavailable fails or skips


def _announce(config: pytest.Config, line: str) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)
    else:
        print(line)


@pytest.fixture(scope="session")
def _kafka_broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Broker]:
    global _session_broker
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if external:
        from confluent_kafka.admin import AdminClient

        try:
            md = AdminClient({"bootstrap.servers": external}).list_topics(timeout=30)
        except Exception as exc:
            _unavailable(f"KAFKA_BOOTSTRAP_SERVERS={external} does not answer: {exc}")
        broker = _Broker(
            external, None, f"external broker KAFKA_BOOTSTRAP_SERVERS={external} ({len(md.brokers)} brokers)"
        )
        _session_broker = broker
        _announce(request.config, f"kafka: {broker.description}")
        yield broker
        return

    kafka = LocalKafka(data_dir=tmp_path_factory.mktemp("kafka"))
    bootstrap, seconds = start_or_unavailable(kafka, "a local broker")
    broker = _Broker(bootstrap, kafka, f"local {kafka.describe()}; started in {seconds:.1f}s")
    _session_broker = broker
    _announce(request.config, f"\nkafka: {broker.description}")
    try:
        yield broker
    finally:
        kafka.close()


@pytest.fixture(scope="session")
def kafka_bootstrap(_kafka_broker: _Broker) -> str:
    """Bootstrap servers of the session's broker (``host:port``)."""
    return _kafka_broker.bootstrap


@pytest.fixture(scope="session")
def local_kafka(_kafka_broker: _Broker) -> LocalKafka | None:
    """The session's LocalKafka (to stop/start it in ``kafka_outage`` tests); None if external."""
    return _kafka_broker.local


@pytest.fixture(autouse=True)
def _kafka_outage_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """For ``kafka_outage`` tests: skip with an external broker; bring the broker back afterwards."""
    if request.node.get_closest_marker("kafka_outage") is None:
        yield
        return
    broker: _Broker = request.getfixturevalue("_kafka_broker")
    if broker.local is None:
        pytest.skip("needs the local broker (an external KAFKA_BOOTSTRAP_SERVERS cannot be stopped)")
    yield
    if not broker.local.running:
        broker.local.start(timeout=START_TIMEOUT_S)


@pytest.fixture(scope="session")
def secure_kafka(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    """The session's secured broker (a super user ``admin``; users made per test)."""
    from devkafka.secure import SecureBroker
    from tests.secure.cluster import SecureCluster

    kafka = LocalKafka(data_dir=tmp_path_factory.mktemp("secure-kafka"), prefer_docker=False, secure=SecureBroker())
    bootstrap, seconds = start_or_unavailable(kafka, "the secured local broker")
    _announce(request.config, f"\nsecure kafka: {kafka.describe()} (SASL_SSL); started in {seconds:.1f}s")
    with SecureCluster.serving(kafka, bootstrap) as cluster:
        yield cluster


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topic and group names (8 hex chars)."""
    return uuid.uuid4().hex[:8]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _session_broker is not None:
        terminalreporter.write_line(f"kafka: {_session_broker.description}")
