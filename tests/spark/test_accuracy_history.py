"""The batch accuracy job reading the sidecar's history topic instead of the ingress topic: a real
sidecar (``--history-topic``) delivers records on the real broker, some cancelled, one bad; the
job run both ways must agree on what was sent, delivered, lost, early and duplicated."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from spark.accuracy import run_accuracy
from tests.integration.harness import SidecarProcess, consume_until, create_topics, producer

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_history_and_ingress_give_the_same_accuracy(
    spark: Any, kafka_bootstrap: str, tmp_path: Path, unique: str
) -> None:
    target, history = f"acc-h-{unique}", f"history-{unique}"
    create_topics(kafka_bootstrap, [target])
    sc = SidecarProcess(kafka_bootstrap, tmp_path / "data", f"ingress-{unique}", f"dlq-{unique}",
                        extra=["--ingress-partitions", "2", "--history-topic", history])
    sc.start()
    n = 200
    try:
        since = int(time.time() * 1000) - 1000
        p = producer(kafka_bootstrap)
        for i in range(n):
            headers = [("delay.target-topic", target.encode()), ("delay.ms", b"%d" % (300 + i * 5)),
                       ("delay.id", b"h-%d" % i)]
            p.produce(sc.ingress, key=b"%d" % i, value=b"secret-%d" % i, headers=headers)
        p.produce(sc.ingress, key=b"c", value=b"secret-c", headers=[
            ("delay.target-topic", target.encode()), ("delay.ms", b"5000"), ("delay.id", b"cancel-me")])
        p.produce(sc.ingress, key=b"c", value=None, headers=[("delay.cancel", b"cancel-me")])
        p.produce(sc.ingress, key=b"b", value=b"secret-b", headers=[
            ("delay.target-topic", target.encode()), ("delay.ms", b"soon")])
        assert p.flush(30) == 0
        assert len(consume_until(kafka_bootstrap, [target], want=n, timeout_s=60, settle_s=1)) == n
        # accepted + delivered per record, accepted + cancelled, dead-lettered
        hist = consume_until(kafka_bootstrap, [history], want=2 * n + 3, timeout_s=60, settle_s=1)
    finally:
        sc.stop_quietly()
    docs = [json.loads(r.value or b"{}") for r in hist]
    assert len(docs) == 2 * n + 3 and all(d["v"] == 1 for d in docs)
    assert not any(b"secret" in (r.value or b"") for r in hist), "no payload without history-payload"
    assert all(r.key == d["id"].encode() for r, d in zip(hist, docs, strict=True))
    until = int(time.time() * 1000)
    common: dict[str, Any] = {"exclude_topics": (sc.dlq,), "chart": False, "details": False}
    by_ingress = run_accuracy(spark, kafka_bootstrap, sc.ingress, target, since, until, tmp_path / "i", **common)
    by_history = run_accuracy(spark, kafka_bootstrap, sc.ingress, target, since, until, tmp_path / "h",
                              history_topic=history, **common)
    keys = ("sent", "delivered", "lost", "early", "duplicates", "unmatched")
    ti, th = by_ingress["totals"], by_history["totals"]
    assert {k: th[k] for k in keys} == {k: ti[k] for k in keys} == {
        "sent": n, "delivered": n, "lost": 0, "early": 0, "duplicates": 0, "unmatched": 0}
    assert ti["lateness_ms"] == th["lateness_ms"]  # the same deliver-at headers of the same copies
    assert (th["ignored"]["cancelled"], th["ignored"]["invalid"]) == (ti["ignored"]["cancelled"],
                                                                       ti["ignored"]["invalid"]) == (1, 1)
    assert (ti["ignored"]["commands"], th["ignored"]["commands"]) == (1, 0)  # no commands in the history
    assert by_history["source"] == {"history": history} and by_ingress["source"] == {"ingress": sc.ingress}
