"""The ``rabbit-ttl`` benchmark peer (bench/rabbit_queues.py, bench/rabbit_bridge.py) on a real
RabbitMQ node and the session's broker: correctness only, never speed. Records due now, and records
whose delays round up to two short TTL levels, are published with confirms; two bridges, started
while the longer level still expires, move what the dead-letter exchange hands them to Kafka. Every
record is delivered once, none before its due time (the level's), with its key, value and headers,
and every queue is empty afterwards. For both queue types. Needs ``rabbitmq-server``
(scripts/setup.d/60-rabbitmq.sh): skipped without it, failed under ``CI=true``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from bench import rabbit_server
from bench.rabbit_queues import DUE_QUEUE, QUEUE_TYPES, ConfirmingPublisher, Record, declare, level_queue, queue_depth
from bench.rabbit_server import RabbitServer
from tests.infra import needs
from tests.integration.harness import consume_until, create_topics

pytestmark = [pytest.mark.integration,
              needs(rabbit_server.installed(), "rabbitmq-server (scripts/setup.d/60-rabbitmq.sh)")]

LEVELS = (300, 2_500)  # the longer one still expires while the bridges run


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitServer]:
    srv = RabbitServer(tmp_path_factory.mktemp("rabbit"))  # one node for the module: it takes seconds to boot
    try:
        yield srv
    finally:
        srv.stop()


def bridges(srv: RabbitServer, bootstrap: str, n: int, until_ms: int) -> list[subprocess.Popen[bytes]]:
    # a small prefetch, so that the two bridges share the queue and settle many windows
    return [subprocess.Popen([sys.executable, "-m", "bench.rabbit_bridge", "--port", str(srv.port), "--bootstrap",
                              bootstrap, "--until-ms", str(until_ms), "--prefetch", "50", "--timeout", "60",
                              *(a for ms in LEVELS for a in ("--wait-queue", level_queue(ms)))],
                             stdout=subprocess.PIPE) for _ in range(n)]


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
def test_every_record_delivered_once_and_never_early(rabbit: RabbitServer, kafka_bootstrap: str, unique: str,
                                                     queue_type: str) -> None:
    target = f"rabbit-ttl-out-{unique}"
    create_topics(kafka_bootstrap, [target], partitions=3)
    with rabbit.connect() as conn:
        ch = conn.channel()
        for q in (DUE_QUEUE, *map(level_queue, LEVELS)):
            ch.queue_delete(q)
        declare(ch, queue_type, LEVELS)
    # due now (straight to the due queue), 1-300 ms (the 300 ms level), 301-2500 ms (the 2.5 s level)
    records = [Record(f"id-{i}", target, b"k%d" % i, b"v%d" % i, (0, 150, 700)[i % 3], (("trace", b"%d" % i),))
               for i in range(1_200)]
    records.append(Record("id-nokey", target, None, b"", 2_500))
    due: dict[str, int] = {}
    pub = ConfirmingPublisher(rabbit.params, LEVELS, window=200,
                              on_publish=lambda rec, at: due.__setitem__(rec.id, at))
    sent_at = int(time.time() * 1000)
    assert pub.run(iter([records[i:i + 100] for i in range(0, len(records), 100)])) == len(records)
    # started once everything is published (a bridge stops when every queue is empty): the TTL
    # queues still expire into the due queue while they run
    procs = bridges(rabbit, kafka_bootstrap, 2, 0)
    outs = [p.communicate(timeout=90)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    got = consume_until(kafka_bootstrap, [target], len(records), timeout_s=30, settle_s=1.0)
    ids = sorted((r.headers["delay.id"] or b"").decode() for r in got)
    assert ids == sorted(r.id for r in records)  # each once, none lost
    early = [r.headers["delay.id"] for r in got if r.timestamp_ms < due[(r.headers["delay.id"] or b"").decode()]]
    assert early == []
    by_id = {r.id: r for r in records}
    for r in got:
        rec = by_id[(r.headers["delay.id"] or b"").decode()]
        assert int(r.headers["delay.deliver-at"] or b"0") == due[rec.id]
        assert r.key == rec.key and (r.value or b"") == rec.value
        if rec.headers:
            assert r.headers["trace"] == rec.headers[0][1]
        # the level's TTL, not the requested delay: 150 ms waits 300 ms, 700 ms waits 2.5 s
        level = {0: 0, 150: 300, 700: 2_500, 2_500: 2_500}[rec.delay_ms]
        assert sent_at + level <= due[rec.id] <= sent_at + level + 30_000
    with rabbit.connect() as conn:
        ch = conn.channel()
        assert [queue_depth(ch, q) for q in (DUE_QUEUE, *map(level_queue, LEVELS))] == [0, 0, 0]
