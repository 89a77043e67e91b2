"""``delay-sidecar status`` against a real broker and a real sidecar process: the CLI finds the
member owning the id's partition through the consumer group (the HTTP address the sidecar
advertises in its client.id) and asks its ``/ids/<id>`` endpoint."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from sidecar.status import crc32_partition
from tests.integration.harness import SidecarProcess, consume_until, create_topics, free_port, producer

pytestmark = pytest.mark.integration


def status(bootstrap: str, sc: SidecarProcess, rid: str, *args: str) -> tuple[int, dict[str, Any], str]:
    r = subprocess.run(
        [sys.executable, "-m", "sidecar", "status", rid, "--bootstrap-servers", bootstrap, "--group",
         f"sc-{sc.ingress}", "--ingress-topic", sc.ingress, "--json", *args],
        capture_output=True, text=True, timeout=60,
    )
    doc = json.loads(r.stdout) if r.stdout.strip() else {}
    return r.returncode, doc, r.stderr


def test_status_pending_delivered_cancelled(kafka_bootstrap: str, tmp_path: Path, unique: str) -> None:
    target = f"t-{unique}"
    create_topics(kafka_bootstrap, [target])
    port = free_port()
    sc = SidecarProcess(kafka_bootstrap, tmp_path / "data", f"ingress-{unique}", f"dlq-{unique}",
                        extra=["--ingress-partitions", "3", "--http-port", str(port), "--http-host", "127.0.0.1",
                               "--changelog", "off"])
    sc.start()
    try:
        p = producer(kafka_bootstrap)
        partitions: dict[str, int] = {}
        reports: list[tuple[Any, Any]] = []
        for rid, key, delay in (("later-1", b"alpha", b"3600000"), ("now-1", b"beta", b"0"),
                                ("drop-1", b"gamma", b"3600000")):
            p.produce(sc.ingress, value=b"v", key=key, on_delivery=lambda e, m: reports.append((e, m)), headers=[
                ("delay.target-topic", target.encode()), ("delay.ms", delay), ("delay.id", rid.encode())])
            p.flush(30)
            err, msg = reports[-1]
            assert err is None, err
            partitions[rid] = msg.partition()
        p.produce(sc.ingress, value=None, key=b"gamma", headers=[("delay.cancel", b"drop-1")])
        p.flush(30)
        assert len(consume_until(kafka_bootstrap, [target], 1, 60)) == 1

        rc, doc, err = status(kafka_bootstrap, sc, "later-1", "--key", "alpha")
        assert rc == 0, err
        assert doc["state"] == "pending" and doc["target_topic"] == target and doc["target_partition"] is None
        assert doc["partition"] == partitions["later-1"], "the crc32 partitioner is librdkafka's"
        assert {rid: crc32_partition(k, 3) for rid, k in (("later-1", b"alpha"), ("now-1", b"beta"),
                                                          ("drop-1", b"gamma"))} == partitions
        assert 3_500_000 < doc["due_ms"] - time.time() * 1000 <= 3_600_000
        assert doc["member"] == f"127.0.0.1:{port}"

        deadline = time.monotonic() + 30
        while True:  # the delivery report settles within a loop turn of the record arriving
            rc, doc, err = status(kafka_bootstrap, sc, "now-1")  # no key: every member is asked
            if doc.get("state") == "delivered" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert rc == 0 and doc["state"] == "delivered" and doc["partition"] == partitions["now-1"], (doc, err)

        rc, doc, err = status(kafka_bootstrap, sc, "drop-1", "--partition", str(partitions["drop-1"]))
        assert rc == 0 and doc["state"] == "cancelled", (doc, err)

        rc, doc, err = status(kafka_bootstrap, sc, "never-sent")
        assert rc == 3 and doc["state"] == "unknown", (doc, err)

        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/ids/never%2Fsent", timeout=10)
        assert e.value.code == 404
        body = json.loads(e.value.read())
        assert body["id"] == "never/sent" and body["state"] == "unknown"

        r = subprocess.run(
            [sys.executable, "-m", "sidecar", "status", "later-1", "--bootstrap-servers", kafka_bootstrap,
             "--group", f"no-such-group-{unique}", "--ingress-topic", sc.ingress, "--timeout", "5s"],
            capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "--group" in r.stderr, r.stderr

        # offline, on the data directory the sidecar is writing: the pending id, read-only
        r = subprocess.run([sys.executable, "-m", "sidecar", "inspect", str(sc.data_dir), "--id", "later-1", "--json"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        (found,) = json.loads(r.stdout)["found"]
        assert found["state"] == "pending" and found["partition"] == partitions["later-1"]
        r = subprocess.run([sys.executable, "-m", "sidecar", "inspect", str(sc.data_dir), "--id", "now-1"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 3 and "unknown" in r.stdout  # delivered: known to the running sidecar only
    finally:
        sc.stop_quietly()


def test_status_finds_a_static_member_restarted_on_another_port(kafka_bootstrap: str, tmp_path: Path,
                                                                 unique: str) -> None:
    """A static member restarted within its session timeout replaces its old self, and the broker
    keeps the client id it joined with: the address in it is the old one (seen in the lookup bench:
    every answer failed). The owner's address in its commits' metadata is current."""
    target = f"t-{unique}"
    create_topics(kafka_bootstrap, [target])
    first, second = free_port(), free_port()

    def sidecar(port: int) -> SidecarProcess:
        return SidecarProcess(kafka_bootstrap, tmp_path / "data", f"ingress-{unique}", f"dlq-{unique}",
                              extra=["--ingress-partitions", "1", "--http-port", str(port), "--http-host", "127.0.0.1",
                                     "--changelog", "off", "--commit-interval", "200ms"])

    sc = sidecar(first)
    sc.start()
    try:
        p = producer(kafka_bootstrap)
        p.produce(sc.ingress, value=b"v", key=b"k", headers=[
            ("delay.target-topic", target.encode()), ("delay.ms", b"3600000"), ("delay.id", b"later-2")])
        assert p.flush(30) == 0
        deadline = time.monotonic() + 30
        while True:
            rc, doc, err = status(kafka_bootstrap, sc, "later-2", "--partition", "0")
            if rc == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert rc == 0 and doc["member"] == f"127.0.0.1:{first}", (doc, err)
        assert sc.terminate() == 0
        sc = sidecar(second)  # the same data directory and static id, at once
        sc.start()
        deadline = time.monotonic() + 30
        while True:  # its first checkpoint's commit names the new address
            rc, doc, err = status(kafka_bootstrap, sc, "later-2", "--partition", "0")
            if rc == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert rc == 0 and doc["state"] == "pending" and doc["member"] == f"127.0.0.1:{second}", (doc, err)
    finally:
        sc.stop_quietly()
