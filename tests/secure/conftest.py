"""One secured broker per session (SASL_SSL, SCRAM-SHA-512, StandardAuthorizer), started lazily.

``secure_kafka`` (session, :class:`SecureCluster`): a :class:`devkafka.local.LocalKafka` with
``secure=`` (devkafka/secure.py), started the first time a test asks for it, so a session that
runs none of these tests never pays its start. Like the plain broker (tests/conftest.py): if it
cannot start the tests *fail* under ``CI=true`` and are skipped elsewhere. Tests isolate
themselves with a principal of their own (:meth:`SecureCluster.new_user`) and unique topic and
group names; the ACLs they grant name only their own resources.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devkafka.local import LocalKafka
from devkafka.secure import SecureBroker
from tests.conftest import _announce, start_or_unavailable
from tests.secure.cluster import SecureCluster


@pytest.fixture(scope="session")
def secure_kafka(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    """The session's secured broker (a super user ``admin``; users made per test)."""
    kafka = LocalKafka(data_dir=tmp_path_factory.mktemp("secure-kafka"), prefer_docker=False, secure=SecureBroker())
    bootstrap, seconds = start_or_unavailable(kafka, "the secured local broker")
    _announce(request.config, f"\nsecure kafka: {kafka.describe()} (SASL_SSL); started in {seconds:.1f}s")
    cluster = SecureCluster(kafka, bootstrap)
    try:
        yield cluster
    finally:
        cluster.close()
        kafka.close()
