"""The etf1/kafka-message-scheduler drop-in on the real broker, with a plain confluent-kafka client
producing what etf1's clients produce, in both delivery modes with ``etf1-tombstones: on``.

Each rule quotes etf1's code (github.com/etf1/kafka-message-scheduler):

- the delivered record keeps every header of the schedule record and appends etf1's three
  (runner/kafka/handler.go, ``produceTargetMessage``)::

        if len(msg.Headers) != 0 {
            headers = append(headers, msg.Headers...)
        }
        headers = append(
            headers,
            confluent.Header{Key: OriginalTimestamp, ...}, confluent.Header{Key: OriginalKey, Value: msg.Key},
            confluent.Header{Key: OriginalTopic, Value: []byte(*msg.TopicPartition.Topic)},

- a repeated header counts by its first occurrence (schedule/kafka/schedule.go)::

        func (s Schedule) getHeaderValue(key string) []byte {
            for i := 0; i < len(s.Headers); i++ {
                if s.Headers[i].Key == key {
                    return s.Headers[i].Value

- once the delivery is confirmed, a tombstone goes back to the schedules topic under the schedule's
  key, with the delivered record's headers (handler.go, ``produceTombstoneMessageForOriginalSchedule``,
  called from the producer's delivery report)::

        tombstoneMsg := confluent.Message{
            TopicPartition: confluent.TopicPartition{Topic: &originalTopic, Partition: confluent.PartitionAny},
            Key:            []byte(originalKey),
            // tombstone is message with nil or empty value
            Value:   nil,
            Headers: headers,

  The sidecar writes it to the schedule's own partition (compaction is per partition) and without
  its ``delay.*`` delivery headers; under exactly-once, in the delivery's transaction.
- a delete is clientlib.DeleteSchedule's tombstone: ``Key: []byte(scheduleID)``, ``Value: nil``,
  no headers; no tombstone is written back for a deleted schedule (nothing was delivered).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import Received, SidecarProcess, consume_until, create_topics, producer

pytestmark = pytest.mark.integration

Headers = list[tuple[str, bytes | None]]


@pytest.fixture(params=["at-least-once", "exactly-once"])
def sidecar(
    request: pytest.FixtureRequest, kafka_bootstrap: str, tmp_path: Path, unique: str
) -> Iterator[SidecarProcess]:
    sc = SidecarProcess(
        kafka_bootstrap, tmp_path / "data", f"schedules-{unique}", f"dlq-{unique}",
        extra=["--ingress-partitions", "2", "--etf1-tombstones", "on", "--delivery", request.param],
    )
    yield sc
    sc.stop_quietly()


def _own(r: Received) -> Headers:
    """The headers of a delivered record without the sidecar's delay.* ones (appended last)."""
    return [(k, v) for k, v in r.header_list if not k.startswith("delay.")]


def test_etf1_delivers_all_headers_resolves_repeats_and_writes_tombstones_back(
    sidecar: SidecarProcess, kafka_bootstrap: str, unique: str
) -> None:
    target = f"videos-{unique}"
    create_topics(kafka_bootstrap, [target])
    sidecar.start()
    p = producer(kafka_bootstrap)
    epoch = int(time.time()) + 2
    plain: Headers = [("scheduler-epoch", str(epoch).encode()), ("scheduler-target-topic", target.encode()),
                      ("scheduler-target-key", b"vid1"), ("customer-header", b"dummy")]
    # a retry library re-sent a delivered record: new scheduler-* headers first, the old ones after
    resent: Headers = [("scheduler-epoch", str(epoch).encode()), ("scheduler-target-topic", target.encode()),
                       ("scheduler-target-key", b"k-new"), ("scheduler-epoch", str(epoch + 3600).encode()),
                       ("scheduler-target-topic", f"elsewhere-{unique}".encode()),
                       ("scheduler-target-key", b"k-old"), ("scheduler-timestamp", b"1600000000"),
                       ("scheduler-key", b"retry-0"), ("scheduler-topic", b"schedules")]
    later: Headers = [("scheduler-epoch", str(epoch + 3600).encode()), ("scheduler-target-topic", target.encode())]
    p.produce(sidecar.ingress, key=b"vid1-online", value=b"video 1", headers=plain)
    p.produce(sidecar.ingress, key=b"retry-1", value=b"again", headers=resent)
    p.produce(sidecar.ingress, key=b"vid2", value=b"deleted", headers=later)
    p.produce(sidecar.ingress, key=b"vid2", value=None)  # clientlib.DeleteSchedule
    assert p.flush(30) == 0

    got = {r.key: r for r in consume_until(kafka_bootstrap, [target], want=2, timeout_s=60, settle_s=1)}
    assert set(got) == {b"vid1", b"k-new"}, "the first scheduler-target-key of each; the deleted one never"
    a, b = got[b"vid1"], got[b"k-new"]
    assert _own(a)[:4] == plain and _own(b)[:9] == resent, "every header of the schedule, in order"
    added_a, added_b = _own(a)[4:], _own(b)[9:]
    assert [k for k, _v in added_a] == ["scheduler-timestamp", "scheduler-key", "scheduler-topic"]
    assert added_a[1:] == [("scheduler-key", b"vid1-online"), ("scheduler-topic", sidecar.ingress.encode())]
    assert added_b[1:] == [("scheduler-key", b"retry-1"), ("scheduler-topic", sidecar.ingress.encode())]
    for r in (a, b):
        assert epoch * 1000 <= r.timestamp_ms < (epoch + 60) * 1000, "at the first scheduler-epoch"
        assert r.headers["delay.id"] == (b"vid1-online" if r is a else b"retry-1")

    # the schedules topic: the 4 records sent, then one tombstone per delivered schedule
    ingress = consume_until(kafka_bootstrap, [sidecar.ingress], want=6, timeout_s=30, settle_s=1)
    sent = {r.key: r.partition for r in ingress if r.value is not None}
    tombs = [r for r in ingress if r.value is None and r.header_list]
    assert len(ingress) == 6 and len(tombs) == 2, [(r.key, r.value, r.header_list) for r in ingress]
    for t in tombs:
        delivered = a if t.key == b"vid1-online" else b
        assert t.header_list == _own(delivered), "the delivered record's headers, as etf1 writes them"
        assert t.partition == sent[t.key], "on the schedule's own partition (compaction is per partition)"

    # A tombstone etf1 wrote back after a delivery (it carries scheduler-key) that lands after a
    # newer schedule under the same key deletes nothing: the newer one is delivered.
    newer: Headers = [("scheduler-epoch", str(int(time.time()) + 2).encode()),
                      ("scheduler-target-topic", target.encode()), ("scheduler-target-key", b"vid1-again")]
    p.produce(sidecar.ingress, key=b"vid1-online", value=b"video 1, again", headers=newer)
    p.produce(sidecar.ingress, key=b"vid1-online", value=None, headers=_own(a))
    assert p.flush(30) == 0
    again = consume_until(kafka_bootstrap, [target], want=3, timeout_s=60, settle_s=1)
    assert sorted(r.key or b"" for r in again) == [b"k-new", b"vid1", b"vid1-again"]
    tombs = [r for r in consume_until(kafka_bootstrap, [sidecar.ingress], want=9, timeout_s=30, settle_s=1)
             if r.value is None and r.header_list]
    assert len(tombs) == 4  # the two above, the one sent by hand, and the newer schedule's own
