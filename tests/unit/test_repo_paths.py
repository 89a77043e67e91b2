"""Files the development packages find by their own location in the repository: a clean clone
with no cache fetches the broker with ``scripts/kafka-pom.xml``, and the bench reads the commit it
measures. Both broke once when ``devkafka`` and ``bench`` moved to the top level (a path one
directory too high), unseen where the jars were already cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import report
from devkafka import jars

REPO = Path(__file__).resolve().parents[2]


def test_the_kafka_pom_is_the_repositorys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KDS_KAFKA_POM", raising=False)
    assert jars._pom_path() == REPO / "scripts" / "kafka-pom.xml"
    assert jars._pom_path().is_file()


def test_the_bench_reports_this_repositorys_commit() -> None:
    facts = report.machine_facts(None)
    assert facts["git_commit"], facts
