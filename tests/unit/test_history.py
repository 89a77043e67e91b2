"""The history topic (``history-topic``, engine/history.py) on the loop's twin (virtual time):
one record per state change, keyed by ``delay.id``, no payload unless ``history-payload``, and a
history that cannot be written never stops delivery."""

from __future__ import annotations

import base64
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from sidecar import contract as c
from sidecar.config import ConfigError, load_settings
from tests.unit.helpers.world import INGRESS, TARGET, World

HISTORY = "hist"


def _history(w: World) -> list[tuple[bytes, dict[str, Any]]]:
    return [(m.key(), orjson.loads(m.value())) for m in w.cluster.records(HISTORY)]  # type: ignore[arg-type]


def _scenario(w: World) -> None:
    """4 records, one cancelled, one bad, one to a target it may not write (not-authorized)."""
    w.cluster.refused.add("missing")
    w.send(4, lambda i: 1000)
    w.cluster.append(INGRESS, 1, b"k1", None, [(c.CANCEL, b"r1")])  # r1 went to partition 1: same key order
    w.cluster.append(INGRESS, 2, b"bad", b"x", [(c.TARGET_TOPIC, TARGET.encode()), (c.DELAY_MS, b"soon")])
    w.cluster.append(INGRESS, 3, b"gone", b"y", [(c.TARGET_TOPIC, b"missing"), (c.ID, b"lost")])


def test_every_state_change_is_one_record_keyed_by_id(tmp_path: Path) -> None:
    w = World(tmp_path)
    sc = w.sidecar("a", history_topic=HISTORY, delivery_attempts=1)
    _scenario(w)
    w.run([sc], lambda: len(w.delivered()) >= 3 and len(w.cluster.records(sc.s.dlq_topic)) >= 2, max_turns=2000)
    w.run([sc], lambda: sc.history is not None and sc.history.written >= 11, max_turns=200)
    events: dict[bytes, list[str]] = defaultdict(list)
    for key, doc in _history(w):
        assert doc["v"] == 1 and doc["id"].encode() == key
        assert "key_b64" not in doc and "value_b64" not in doc  # never the payload by default
        events[key].append(doc["event"])
    assert events[b"r0"] == ["accepted", "delivered"] and events[b"r2"] == events[b"r3"] == ["accepted", "delivered"]
    assert events[b"r1"] == ["accepted", "cancelled"]
    assert events[b"lost"] == ["accepted", "dead-lettered"]
    bad = [k for k in events if k.startswith(f"{INGRESS}:2:".encode())]
    assert len(bad) == 1 and events[bad[0]] == ["dead-lettered"]
    docs = {(k, d["event"]): d for k, d in _history(w)}
    acc, done = docs[(b"r0", "accepted")], docs[(b"r0", "delivered")]
    assert acc["target"] == TARGET and acc["due_ms"] == w.sent[b"r0"] and acc["enqueued_ms"] == w.sent[b"r0"] - 1000
    assert acc["source"] == f"{INGRESS}:0:0" and done["at_ms"] >= done["due_ms"]
    dead = docs[(b"lost", "dead-lettered")]
    assert dead["reason"] == c.NOT_AUTHORIZED and dead["target"] == "missing"
    assert docs[(bad[0], "dead-lettered")]["reason"] == c.BAD_HEADER
    assert sc.history is not None and sc.history.failed == 0
    sc.shutdown()


def test_history_payload_adds_key_and_value(tmp_path: Path) -> None:
    w = World(tmp_path)
    sc = w.sidecar("a", history_topic=HISTORY, history_payload=True)
    w.send(2, lambda i: 100)
    w.run([sc], lambda: len(w.delivered()) >= 2)
    w.run([sc], lambda: sc.history is not None and sc.history.written >= 4, max_turns=200)
    for key, doc in _history(w):
        i = int(key[1:])
        assert base64.b64decode(doc["key_b64"]) == b"k%d" % i and base64.b64decode(doc["value_b64"]) == b"v%d" % i
    sc.shutdown()


def test_a_history_that_cannot_be_written_never_stops_delivery(tmp_path: Path, monkeypatch: Any) -> None:
    w = World(tmp_path)
    sc = w.sidecar("a", history_topic=HISTORY)
    assert sc.history is not None
    producer = sc.kafka.producer
    real = producer.produce

    def refuse_history(topic: str, *args: Any, **kw: Any) -> Any:
        if topic == HISTORY:
            raise BufferError("queue full")
        return real(topic, *args, **kw)

    monkeypatch.setattr(producer, "produce", refuse_history)
    w.send(50, lambda i: 200)
    w.run([sc], lambda: len(w.delivered()) >= 50)
    w.check(set(w.sent))
    assert sc.history.failed == 100 and sc.history.written == 0  # 50 accepted + 50 delivered, all dropped
    assert Counter(m.topic() for m in w.cluster.records(HISTORY)) == Counter()
    sc.reporting.sync_metrics()
    assert sc.metrics is not None and b"delay_sidecar_history_failed_total 100.0" in sc.metrics.render()
    sc.shutdown()


def test_history_topic_settings() -> None:
    s = load_settings({"history-topic": "h", "history-payload": "true"}, environ={})
    assert s.history_topic == "h" and s.history_payload is True
    assert load_settings({}, environ={}).history_topic is None
    with pytest.raises(ConfigError, match="history-payload: 'yes' is not true or false"):
        load_settings({"history-payload": "yes"}, environ={})
    with pytest.raises(ConfigError, match=r"--history-topic 'delay\.dlq' must differ"):
        load_settings({"history-topic": "delay.dlq"}, environ={})


def test_a_replace_is_one_replaced_record_and_one_delivery(tmp_path: Path) -> None:
    """``delay.replace``: the new version is reported as ``replaced`` (not ``accepted``), with its
    own due time; only it is delivered."""
    w = World(tmp_path)
    sc = w.sidecar("a", history_topic=HISTORY)
    w.send(1, lambda i: 5000)
    w.cluster.append(INGRESS, 0, b"k0", b"new", [
        (c.TARGET_TOPIC, TARGET.encode()), (c.DELAY_MS, b"1000"), (c.ID, b"r0"), (c.REPLACE, b"true")])
    w.run([sc], lambda: len(w.delivered()) >= 1)
    w.run([sc], lambda: sc.history is not None and sc.history.written >= 3, max_turns=200)
    events = [(d["event"], d["due_ms"]) for k, d in _history(w) if k == b"r0"]
    assert [e for e, _ in events] == ["accepted", "replaced", "delivered"]
    assert events[1][1] < events[0][1] and events[2][1] == events[1][1]
    assert [m.value() for m in w.delivered()] == [b"new"]
    sc.shutdown()
