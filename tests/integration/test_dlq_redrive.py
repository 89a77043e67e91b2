"""``delay-sidecar dlq redrive`` / ``dlq list`` on the real broker, run as an operator runs them.

Dead letters come from a real sidecar (failed publishes to a missing target, bad headers, a
record targeting the DLQ) except in the kill test, which needs thousands of them quickly and
writes them in the sidecar's dead-letter format (``dlq_headers``) straight into the DLQ.
Targets are read with ``isolation.level=read_committed`` (librdkafka's default), as the
redrive's exactly-once guarantee requires.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from sidecar import contract as c
from sidecar.store.outcomes import dlq_headers
from tests.integration.harness import Received, SidecarProcess, consume_until, create_topics, producer

pytestmark = pytest.mark.integration


def _cli(bootstrap: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sidecar", "dlq", *args, "--bootstrap-servers", bootstrap,
                           "--json", "--timeout", "20s"], capture_output=True, text=True, timeout=timeout_s,
                          check=False)


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return out


def _ends(bootstrap: str, topic: str, partitions: int = 1) -> int:
    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex[:8]}"})
    try:
        return sum(cons.get_watermark_offsets(TopicPartition(topic, p), timeout=20)[1] for p in range(partitions))
    finally:
        cons.close()


def _read_all(bootstrap: str, topic: str, partitions: int, isolation: str = "read_committed") -> list[Received]:
    """Every record of ``topic`` up to its end (EOF on every partition)."""
    from tests.integration.harness import _received

    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex[:8]}",
                     "enable.partition.eof": True, "isolation.level": isolation})
    cons.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[Received] = []
    eof: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while len(eof) < partitions and time.monotonic() < deadline:
            for m in cons.consume(num_messages=1000, timeout=0.5):
                if m.error() is not None:
                    eof.add(m.partition() or 0)
                else:
                    out.append(_received(m))
    finally:
        cons.close()
    assert len(eof) == partitions, f"no end of {topic} within 60 s"
    return out


@pytest.fixture
def sidecar(kafka_bootstrap: str, tmp_path: Path, unique: str) -> Iterator[SidecarProcess]:
    sc = SidecarProcess(kafka_bootstrap, tmp_path / "data", f"ingress-{unique}", f"dlq-{unique}",
                        extra=["--ingress-partitions", "2", "--delivery-grace", "1s", "--changelog", "off"])
    yield sc
    sc.stop_quietly()


def test_redrive_to_target_and_to_ingress_each_once(sidecar: SidecarProcess, kafka_bootstrap: str,
                                                   unique: str) -> None:
    missing, fixed = f"late-{unique}", f"fixed-{unique}"
    create_topics(kafka_bootstrap, [fixed])
    sidecar.start()
    p = producer(kafka_bootstrap)
    for i in range(20):  # their target does not exist yet: delivery-failed after --delivery-grace
        p.produce(sidecar.ingress, key=b"f%d" % i, value=b"failed-%d" % i,
                  headers=[(c.TARGET_TOPIC, missing.encode()), (c.DELAY_MS, b"10"), (c.ID, b"f-%d" % i),
                           ("app", b"kept")])
    for i in range(10):  # bad-header: a delay of "soon"
        p.produce(sidecar.ingress, key=b"b%d" % i, value=b"bad-%d" % i,
                  headers=[(c.TARGET_TOPIC, fixed.encode()), (c.DELAY_MS, b"soon"), ("app", b"b")])
    # the sidecar refuses the DLQ as a target (target-is-internal): the redrive must refuse it too
    p.produce(sidecar.ingress, key=b"x", value=b"into-dlq", headers=[(c.TARGET_TOPIC, sidecar.dlq.encode())])
    assert p.flush(30) == 0
    letters = consume_until(kafka_bootstrap, [sidecar.dlq], want=31, timeout_s=90, settle_s=1)
    reasons = Counter((r.headers[c.DLQ_REASON] or b"").decode() for r in letters)
    assert reasons == {c.DELIVERY_FAILED: 20, c.BAD_HEADER: 10, c.TARGET_IS_INTERNAL: 1}
    failed = next(r for r in letters if r.headers[c.DLQ_REASON] == c.DELIVERY_FAILED.encode())
    assert int(failed.headers[c.DELIVER_AT] or b"0") <= int(failed.headers[c.ENQUEUED_AT] or b"0") + 10 + 1000
    create_topics(kafka_bootstrap, [missing])
    dlq_end = _ends(kafka_bootstrap, sidecar.dlq)
    common = ["--dlq-topic", sidecar.dlq, "--ingress-topic", sidecar.ingress]

    # --dry-run: counts, sends nothing, writes no marker
    dry = _json(_cli(kafka_bootstrap, "redrive", *common, "--reason", c.DELIVERY_FAILED, "--to", "target",
                     "--dry-run"))
    assert dry["dry_run"] and dry["sent"] == 20 and dry["transactions"] == 0
    assert _ends(kafka_bootstrap, missing) == 0

    # to the target, twice: 20 records, each once
    first = _json(_cli(kafka_bootstrap, "redrive", *common, "--reason", c.DELIVERY_FAILED, "--to", "target"))
    second = _json(_cli(kafka_bootstrap, "redrive", *common, "--reason", c.DELIVERY_FAILED, "--to", "target"))
    assert (first["sent"], first["already_redriven"]) == (20, 0)
    assert (second["sent"], second["already_redriven"]) == (0, 20)
    got = _read_all(kafka_bootstrap, missing, 1)
    assert sorted(r.value or b"" for r in got) == sorted(b"failed-%d" % i for i in range(20))
    for r in got:
        assert not any(k.startswith(c.DLQ_PREFIX) for k in r.headers), r.headers
        assert r.headers["app"] == b"kept" and r.headers[c.ID] == b"f-" + (r.value or b"")[7:]
        assert r.headers[c.REDRIVE_ID] is not None and r.headers[c.REDRIVE_ID].startswith(sidecar.dlq.encode())
        assert c.DELIVER_AT in r.headers and c.TARGET_TOPIC not in r.headers and r.key == b"f" + (r.value or b"")[7:]
    assert len({r.headers[c.REDRIVE_ID] for r in got}) == 20

    # the record whose target is the DLQ is refused, and the DLQ gets nothing
    refused = _json(_cli(kafka_bootstrap, "redrive", *common, "--reason", c.TARGET_IS_INTERNAL, "--to", "target"))
    assert refused["sent"] == 0 and refused["refused"] == 1 and refused["why"] == {"target is the DLQ topic": 1}

    # bad headers back through the sidecar with a new delay: delivered again, once, across two runs
    again = _json(_cli(kafka_bootstrap, "redrive", *common, "--reason", c.BAD_HEADER, "--to", "ingress",
                       "--delay", "500ms"))
    assert again["sent"] == 10
    assert _json(_cli(kafka_bootstrap, "redrive", *common, "--reason", c.BAD_HEADER, "--to", "ingress"))["sent"] == 0
    delivered = consume_until(kafka_bootstrap, [fixed], want=10, timeout_s=60, settle_s=3)
    assert sorted(r.value or b"" for r in delivered) == sorted(b"bad-%d" % i for i in range(10))
    for r in delivered:  # delivered by the sidecar: its delivery headers, the redrive id passed through
        assert r.headers["app"] == b"b" and r.headers[c.REDRIVE_ID] and c.DELIVER_AT in r.headers
        assert not any(k.startswith(c.DLQ_PREFIX) for k in r.headers)
    assert _ends(kafka_bootstrap, sidecar.dlq) == dlq_end, "nothing went back to the DLQ"

    listed = _json(_cli(kafka_bootstrap, "list", "--dlq-topic", sidecar.dlq))
    assert listed["by_reason"] == {c.DELIVERY_FAILED: 20, c.BAD_HEADER: 10, c.TARGET_IS_INTERNAL: 1}
    assert listed["redriven"] == {c.DELIVERY_FAILED: 20, c.BAD_HEADER: 10}
    assert sum(sum(b["counts"].values()) for b in listed["buckets"]) == 31


def test_redrive_into_the_dlq_is_refused(kafka_bootstrap: str, unique: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sidecar", "dlq", "redrive", "--bootstrap-servers", kafka_bootstrap, "--reason",
         c.BAD_HEADER, "--to", "ingress", "--ingress-topic", f"d-{unique}", "--dlq-topic", f"d-{unique}"],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "refusing to redrive into the DLQ itself" in proc.stderr and "--ingress-topic" in proc.stderr


def test_a_killed_redrive_and_its_rerun_send_each_dead_letter_once(kafka_bootstrap: str, unique: str) -> None:
    n, parts = 3000, 2
    dlq, target, ingress = f"dlq-{unique}", f"out-{unique}", f"in-{unique}"
    create_topics(kafka_bootstrap, [dlq, target], partitions=parts)
    p = producer(kafka_bootstrap)
    for i in range(n):
        headers = dlq_headers([(c.ID, b"id-%d" % i), (c.TARGET_TOPIC, target.encode())], c.DELIVERY_FAILED,
                              "gone", ingress, 0, i, 5)
        p.produce(dlq, value=b"v%d" % i, key=b"k%d" % i, partition=i % parts, headers=headers)  # type: ignore[arg-type]
    assert p.flush(30) == 0
    args = ["redrive", "--dlq-topic", dlq, "--ingress-topic", ingress, "--reason", c.DELIVERY_FAILED, "--to", "target"]
    cmd = [sys.executable, "-m", "sidecar", "dlq", *args, "--bootstrap-servers", kafka_bootstrap, "--batch", "100",
           "--rate", "1000", "--progress"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as slow:
        deadline = time.monotonic() + 60
        while _ends(kafka_bootstrap, target, parts) < 800 and time.monotonic() < deadline:
            assert slow.poll() is None, slow.stderr.read() if slow.stderr else ""
            time.sleep(0.1)
        assert slow.poll() is None, "the run finished before it could be killed"
        slow.send_signal(signal.SIGKILL)
        slow.wait(30)
    written = _ends(kafka_bootstrap, target, parts)
    committed = len(_read_all(kafka_bootstrap, target, parts))
    assert 0 < committed < n and written > 0
    rerun = _json(_cli(kafka_bootstrap, *args))
    assert rerun["sent"] + rerun["already_redriven"] == n
    assert rerun["already_redriven"] == committed  # what the killed run committed, no more, no less
    got = _read_all(kafka_bootstrap, target, parts)
    ids = Counter(r.headers[c.REDRIVE_ID] for r in got)
    assert len(got) == n and len(ids) == n and max(ids.values()) == 1
    assert {r.value for r in got} == {b"v%d" % i for i in range(n)}
    assert _json(_cli(kafka_bootstrap, *args))["sent"] == 0
