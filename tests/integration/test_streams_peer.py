"""The ``streams-punctuator`` benchmark peer (the Kafka Streams application in bench/streams-peer/)
on the session's broker: correctness only, never speed. Every scheduled record is delivered once to
the target its ``delay.target-topic`` names, none before its due time, with its key, value, user
headers, ``delay.id`` and ``delay.deliver-at``; a cancel by ``delay.id`` removes its record; a
second pending record with the same id is dropped, a ``delay.replace`` moves it. Needs the built
application (scripts/setup.d/70-kafka-streams.sh): skipped without it, failed under ``CI=true``.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from bench import streams_peer
from bench.streams_peer import QUICK_START_OPTS, StreamsPeerHost, StreamsPeerProc, new_app_id
from bench.workload import BenchError
from sidecar import contract as c
from tests.infra import needs
from tests.integration.harness import consume_until, create_topics, producer

pytestmark = [pytest.mark.integration,
              needs(streams_peer.installed(), "the Kafka Streams peer (scripts/setup.d/70-kafka-streams.sh)")]


def test_delivered_once_never_early_and_cancelled(tmp_path: Path, kafka_bootstrap: str, unique: str) -> None:
    ingress, target, other = f"sp-in-{unique}", f"sp-out-{unique}", f"sp-out2-{unique}"
    create_topics(kafka_bootstrap, [ingress, target, other])
    p = producer(kafka_bootstrap)
    t0 = int(time.time() * 1000)
    # a backlog already due before the application starts (delay.ms after an old timestamp)
    for i in range(1_000):
        p.produce(ingress, key=b"b%d" % i, value=b"v%d" % i, timestamp=t0 - 5_000 + i,
                  headers=[(c.TARGET_TOPIC, target.encode()), (c.DELAY_MS, b"100"), ("trace", b"%d" % i)])
    p.flush(30)
    proc = StreamsPeerProc(tmp_path, kafka_bootstrap, ingress, punctuate_ms=10, jvm_opts=QUICK_START_OPTS)
    proc.start()
    try:
        proc.wait_event("ready", 60)
        now = int(time.time() * 1000)
        # then records due 0.3-1.3 s later; those with ids of their own are due in 60 s, so that
        # they are surely pending when their duplicate and cancel (right behind them) are read, however
        # far behind a loaded machine's just-started JVM reads: the sync record (due now, after them
        # in the partition) arriving says they were read
        due = {b"b%d" % i: t0 - 5_000 + i + 100 for i in range(1_000)}
        ids = [b"f%d" % i for i in range(0, 500, 10)]
        for i in range(500):
            due[b"f%d" % i] = now + (60_000 if i % 10 == 0 else 300 + 2 * i)
            hdrs = [(c.TARGET_TOPIC, target.encode()), (c.DELIVER_AT, b"%d" % due[b"f%d" % i])]
            if i % 10 == 0:
                hdrs.append((c.ID, b"id-%d" % i))
            p.produce(ingress, key=b"f%d" % i, value=None, headers=hdrs)
        p.produce(ingress, key=b"f0-dup", value=b"x",  # a second pending id-0: dropped
                  headers=[(c.TARGET_TOPIC, target.encode()), (c.DELAY_MS, b"0"), (c.ID, b"id-0")])
        p.produce(ingress, key=b"f10", value=None, headers=[(c.CANCEL, b"id-10")])
        p.produce(ingress, key=b"bad", value=None, headers=[(c.TARGET_TOPIC, target.encode()), ("delay.typo", b"1")])
        p.produce(ingress, key=b"sync", value=None,
                  headers=[(c.TARGET_TOPIC, target.encode()), (c.DELIVER_AT, b"%d" % now)])
        p.flush(30)
        due[b"sync"] = now
        del due[b"f10"]
        first = consume_until(kafka_bootstrap, [target], len(due) - len(ids) + 1, timeout_s=90, settle_s=0.5)
        assert b"sync" in {r.key for r in first}
        assert [r.key for r in first if r.key in ids] == [], "a record with an id delivered 59 s early"
        # every pending id moved to now + 0.2 s by a replace (id-20 to another topic), id-10 is gone
        now = int(time.time() * 1000)
        for k in ids:
            if k != b"f10":
                p.produce(ingress, key=k, value=b"moved",
                          headers=[(c.TARGET_TOPIC, (other if k == b"f20" else target).encode()),
                                   (c.DELIVER_AT, b"%d" % (now + 200)), (c.ID, b"id-" + k[1:]), (c.REPLACE, b"true")])
                due[k] = now + 200
        p.flush(30)
        got = consume_until(kafka_bootstrap, [target, other], len(due), timeout_s=60, settle_s=1.5)
    finally:
        done = proc.finish()
    keys = sorted(r.key or b"" for r in got)
    assert keys == sorted(due), "each scheduled record once, the cancelled and the duplicate none"
    assert [r.key for r in got if r.timestamp_ms < due[r.key or b""]] == []
    for r in got:
        assert int(r.headers[c.DELIVER_AT] or b"0") == due[r.key or b""]
        assert c.TARGET_TOPIC not in r.headers and c.DELAY_MS not in r.headers
        k = r.key or b""
        if k.startswith(b"b"):
            assert r.value == b"v" + k[1:] and r.headers["trace"] == k[1:]
            assert (r.headers[c.ID] or b"").startswith(f"{ingress}:0:".encode())
        elif k in ids:
            assert (r.topic, r.value, r.headers[c.ID]) == (other if k == b"f20" else target, b"moved", b"id-" + k[1:])
        else:
            assert r.topic == target and r.value is None
    assert len({r.headers[c.ID] for r in got}) == len(due)
    assert (done["scheduled"], done["forwarded"], done["cancelled"], done["duplicates"], done["invalid"]) == (
        1_501 + len(ids) - 1, len(due), 1, 1, 1)


def test_a_crash_keeps_the_stores_and_the_restart_delivers_once(tmp_path: Path, kafka_bootstrap: str,
                                                                unique: str) -> None:
    """SIGKILL to the JVM with records stored (some due during the downtime, some much later), then
    the same application (its id, its state directory) started again: at_least_once restores the
    stores, every record due by then is delivered, none early, and the later ones stay pending.
    Some are delivered twice: at_least_once with its default 30 s commit interval reads the ingress
    again from its last commit, and a record forwarded and deleted before its second reading is
    stored and forwarded again (the bench's restart figure counts these)."""
    ingress, target = f"sp-crash-in-{unique}", f"sp-crash-out-{unique}"
    create_topics(kafka_bootstrap, [ingress, target])
    proc = StreamsPeerProc(tmp_path, kafka_bootstrap, ingress, punctuate_ms=10, jvm_opts=QUICK_START_OPTS)
    proc.start()
    p = producer(kafka_bootstrap)
    try:
        proc.wait_event("ready", 60)
        now = int(time.time() * 1000)
        due = {b"s%d" % i: now + 4_000 + i for i in range(200)}
        due |= {b"late%d" % i: now + 600_000 for i in range(50)}
        for k, d in due.items():
            p.produce(ingress, key=k, value=b"v",
                      headers=[(c.TARGET_TOPIC, target.encode()), (c.DELIVER_AT, b"%d" % d)])
        p.flush(30)
        store = f"{proc.app_id}-pending-changelog"
        deadline = time.time() + 60
        while time.time() < deadline and total_records(kafka_bootstrap, store) < len(due):
            time.sleep(0.2)
        assert total_records(kafka_bootstrap, store) >= len(due), "the records were not stored before the kill"
        proc.stop(signal.SIGKILL, 30)
        # what the killed JVM could not remove is in its own directory, not in /tmp
        assert [f.name[:13] for f in proc.tmp_dir.iterdir()] == ["librocksdbjni"]
        proc.start()
        proc.wait_event("ready", 90)
        got = consume_until(kafka_bootstrap, [target], 200, timeout_s=60, settle_s=1.0)
    finally:
        proc.finish()
    assert sorted({r.key or b"" for r in got}) == sorted(k for k in due if k.startswith(b"s"))
    assert [r.key for r in got if r.timestamp_ms < due[r.key or b""]] == []


def test_a_warm_up_runs_first_and_its_counts_are_not_the_measured_ones(tmp_path: Path, kafka_bootstrap: str,
                                                                       unique: str) -> None:
    """``warm_up``: the JVM runs the topology over the warm-up topic as an application of its own
    (every warm-up record forwarded to the warm-up target) before the measured one is RUNNING;
    the ``warmed`` line counts what the warm-up forwarded, the ``done`` line only what the
    measured application did, and each target gets its own records once."""
    warm_in, warm_out, ingress, target = (f"sp-w-in-{unique}", f"sp-w-out-{unique}", f"sp-m-in-{unique}",
                                          f"sp-m-out-{unique}")
    create_topics(kafka_bootstrap, [warm_in, warm_out, ingress, target])
    p = producer(kafka_bootstrap)
    for i in range(300):
        p.produce(warm_in, key=b"w%d" % i, value=b"v", headers=[(c.TARGET_TOPIC, warm_out.encode()),
                                                                 (c.DELAY_MS, b"0")])
    for i in range(120):
        p.produce(ingress, key=b"m%d" % i, value=b"v", headers=[(c.TARGET_TOPIC, target.encode()),
                                                                 (c.DELAY_MS, b"0")])
    p.flush(30)
    proc = StreamsPeerProc(tmp_path, kafka_bootstrap, ingress, punctuate_ms=10, jvm_opts=QUICK_START_OPTS,
                           warm_up=(warm_in, 300))
    proc.start()
    try:
        warmed = proc.wait_event("warmed", 90)
        proc.wait_event("ready", 60)
        got = consume_until(kafka_bootstrap, [target], 120, timeout_s=60, settle_s=1.0)
    finally:
        done = proc.finish()
    assert warmed["records"] == 300
    warm_got = consume_until(kafka_bootstrap, [warm_out], 300, timeout_s=30, settle_s=0.5)
    assert sorted(r.key or b"" for r in warm_got) == sorted(b"w%d" % i for i in range(300))
    assert sorted(r.key or b"" for r in got) == sorted(b"m%d" % i for i in range(120))
    assert (done["ingested"], done["forwarded"]) == (120, 120)


def test_one_jvm_serves_applications_one_after_another(tmp_path: Path, kafka_bootstrap: str, unique: str) -> None:
    """``StreamsPeerHost`` (the throughput rounds' JVM): each application it runs is a fresh one
    (its own group reads its topic from the start), delivers its topic's records once, and its
    ``done`` line counts only its own; a second ``start`` while one runs is refused by the host."""
    topics = [f"sp-h{i}-in-{unique}" for i in range(2)]
    targets = [f"sp-h{i}-out-{unique}" for i in range(2)]
    create_topics(kafka_bootstrap, [*topics, *targets])
    p = producer(kafka_bootstrap)
    for i, (ingress, target) in enumerate(zip(topics, targets, strict=True)):
        for k in range(50 + 30 * i):
            p.produce(ingress, key=b"h%d-%d" % (i, k), value=b"v",
                      headers=[(c.TARGET_TOPIC, target.encode()), (c.DELAY_MS, b"0")])
    p.flush(30)
    host = StreamsPeerHost(tmp_path, kafka_bootstrap, punctuate_ms=10, jvm_opts=QUICK_START_OPTS)
    host.start(90)
    dones = []
    try:
        for i, (ingress, target) in enumerate(zip(topics, targets, strict=True)):
            app = host.run(ingress, 60, new_app_id())
            with pytest.raises(BenchError, match="still runs"):
                host.run(ingress, 60, new_app_id())
            got = consume_until(kafka_bootstrap, [target], 50 + 30 * i, timeout_s=60, settle_s=1.0)
            assert sorted(r.key or b"" for r in got) == sorted(b"h%d-%d" % (i, k) for k in range(50 + 30 * i))
            dones.append(app.finish())
        assert host.proc is not None and host.proc.poll() is None  # the same JVM ran both
    finally:
        rc = host.finish()
    assert [(d["ingested"], d["forwarded"]) for d in dones] == [(50, 50), (80, 80)]
    assert rc == 0


def total_records(bootstrap: str, topic: str) -> int:
    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": f"sp-wm-{topic}"})
    try:
        md = cons.list_topics(topic, timeout=10).topics.get(topic)
        if md is None or md.error is not None:
            return 0
        return sum(cons.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in md.partitions)
    finally:
        cons.close()
