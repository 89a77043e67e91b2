"""``delay-sidecar list`` against a real broker and two sidecar processes in one group: each
answers ``GET /pending`` for the partitions it owns, the command merges their pages in due order
and pages through the range with the cursor."""

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
from confluent_kafka.admin import AdminClient

from sidecar import listing_client, status
from sidecar.store.listing import Query
from tests.integration.harness import SidecarProcess, create_topics, free_port, producer

pytestmark = pytest.mark.integration


def run_list(bootstrap: str, ingress: str, *args: str) -> tuple[int, dict[str, Any], str]:
    r = subprocess.run(
        [sys.executable, "-m", "sidecar", "list", "--bootstrap-servers", bootstrap, "--group", f"sc-{ingress}",
         "--ingress-topic", ingress, "--json", *args],
        capture_output=True, text=True, timeout=60,
    )
    doc = json.loads(r.stdout) if r.stdout.strip() else {}
    return r.returncode, doc, r.stderr


def test_list_merges_two_owners_in_due_order_and_pages(kafka_bootstrap: str, tmp_path: Path, unique: str) -> None:
    target, other = f"t-{unique}", f"o-{unique}"
    create_topics(kafka_bootstrap, [target, other])
    ingress = f"ingress-{unique}"
    ports = [free_port(), free_port()]
    scs = [SidecarProcess(kafka_bootstrap, tmp_path / f"data{i}", ingress, f"dlq-{unique}", instance=str(i),
                          extra=["--ingress-partitions", "4", "--http-port", str(ports[i]), "--http-host",
                                 "127.0.0.1", "--changelog", "off", "--commit-interval", "200ms"])
           for i in range(2)]
    try:
        scs[0].start()
        scs[1].start()
        now = int(time.time() * 1000)
        base = now + 3_600_000  # beyond the wheel's 1 h window: in buckets, read without the store lock
        p = producer(kafka_bootstrap)
        for i in range(40):  # due in reverse order of sending, spread over the 4 partitions by key
            p.produce(ingress, value=b"v", key=b"k%d" % i, headers=[
                ("delay.target-topic", (other if i % 5 == 0 else target).encode()),
                ("delay.deliver-at", str(base + (40 - i) * 1000).encode()), ("delay.id", b"r%02d" % i)])
        assert p.flush(30) == 0
        after, before = str(base), str(base + 100_000)
        deadline = time.monotonic() + 60
        while True:  # until both members own partitions and every record is stored
            rc, doc, err = run_list(kafka_bootstrap, ingress, "--due-after", after, "--due-before", before,
                                    "--limit", "100")
            members = {e["member"] for e in doc.get("entries", [])}
            if (rc == 0 and len(doc["entries"]) == 40 and len(members) == 2) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert rc == 0 and len(doc["entries"]) == 40, (rc, doc, err)
        assert members == {f"127.0.0.1:{port}" for port in ports}, "both owners answered"
        everything = doc["entries"]
        assert [e["id"] for e in everything] == [f"r{i:02d}" for i in range(39, -1, -1)], "merged in due order"
        assert "next" not in doc
        e0 = everything[0]
        assert e0["due_ms"] == base + 1000 and e0["kind"] == "message" and e0["target_topic"] == target
        assert e0["source"].startswith(f"{ingress}:") and e0["due"].endswith("Z")

        # paging and the filters through the command's path in-process (the same calls, no
        # interpreter start per page)
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        owners = status.group_members(admin, f"sc-{ingress}", ingress, 10)
        assert len(owners) == 2

        def page(**kw: Any) -> dict[str, Any]:
            return listing_client.list_across(owners, Query(base, base + 100_000, **kw), 10)

        pages: list[str] = []
        cursor = None
        for _ in range(10):  # 15 + 15 + 10
            doc = page(limit=15, cursor=cursor)
            pages += [e["id"] for e in doc["entries"]]
            if "next" not in doc:
                break
            cursor = listing_client.parse_cursor(doc["next"])
        assert pages == [e["id"] for e in everything]
        doc = page(target=other, id_prefix=b"r1")
        assert [e["id"] for e in doc["entries"]] == ["r15", "r10"]
        doc = listing_client.list_across(owners, Query(base + 1000, base + 3000), 10)
        assert [e["id"] for e in doc["entries"]] == ["r39", "r38"]

        # the endpoint itself: a bad parameter is named
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/pending?after=5&before=x", timeout=10)
        assert e.value.code == 400 and "before" in json.loads(e.value.read())["error"]

        first_key = f"{everything[0]['due_ms']}.{everything[0]['partition']}.{everything[0]['ref']}"
        # text output, a page after a cursor; and a group with no sidecar: exit status 1 naming --group
        r = subprocess.run([sys.executable, "-m", "sidecar", "list", "--bootstrap-servers", kafka_bootstrap,
                            "--group", f"sc-{ingress}", "--ingress-topic", ingress, "--due-after", after,
                            "--due-before", before, "--limit", "2", "--cursor", first_key],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.count("\n") == 2, r
        assert r.stdout.split()[1:2] == ["id=r38"] and " id=r37 " in r.stdout, r.stdout
        assert "2 pending; next page: --cursor " in r.stderr
        r = subprocess.run([sys.executable, "-m", "sidecar", "list", "--bootstrap-servers", kafka_bootstrap,
                            "--group", f"none-{unique}", "--ingress-topic", ingress, "--due-after", after,
                            "--due-before", before], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "--group" in r.stderr, r.stderr
    finally:
        for sc in scs:
            sc.stop_quietly()
