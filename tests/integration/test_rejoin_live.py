"""The rejoin watch's question to the real cluster (``engine/rejoin.py``).

The watch declares a consumer stuck outside its group only on two answers of the cluster; in an
outage the question must fail within its timeout, never hang, never crash the process and never
pass for an answer, or a broker outage would be taken for a hang. This runs the watch with the
sidecar's own ``KafkaIO.cluster_answers`` against the session's broker: up, stopped, and started
again. (That a stuck consumer is then replaced and nothing is lost is
tests/unit/test_rejoin_twin.py's, on virtual time: librdkafka's hang cannot be brought about on
purpose.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from devkafka.local import LocalKafka
from sidecar.config import Settings
from sidecar.engine.kafka_io import ConfluentClients, KafkaIO
from sidecar.engine.rejoin import ASK_TIMEOUT_S, RejoinWatch

LIMIT = 1.0


class Asked:
    def __init__(self, kafka: KafkaIO) -> None:
        self.kafka = kafka
        self.answers: list[tuple[bool, float]] = []  # each question's answer, and how long it took

    def __call__(self) -> bool:
        t = time.monotonic()
        ok = self.kafka.cluster_answers(ASK_TIMEOUT_S)
        self.answers.append((ok, time.monotonic() - t))
        return ok


def _run(w: RejoinWatch, ask: Asked, seconds: float) -> tuple[str, float]:
    """Step the watch on wall time, as the loop does (once a second), for up to ``seconds``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        why = w.step(time.monotonic(), ask)
        if why:
            return why, time.monotonic() - t0
        time.sleep(0.2)
    return "", time.monotonic() - t0


@pytest.mark.kafka_outage
def test_the_cluster_answers_and_an_outage_is_no_answer(
    local_kafka: LocalKafka, kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    s = Settings(
        bootstrap_servers=kafka_bootstrap, data_dir=str(tmp_path), ingress_topic=f"in-{unique}", group_id=f"sc-{unique}"
    )
    kafka = KafkaIO(s, ConfluentClients(), events=None)  # type: ignore[arg-type]  # only its admin client is used
    ask = Asked(kafka)
    w = RejoinWatch(LIMIT)
    # up: two answers LIMIT apart
    w.lost(time.monotonic())
    why, took = _run(w, ask, 30)
    assert "librdkafka issue 3437" in why and took >= 2 * LIMIT
    assert [ok for ok, _ in ask.answers] == [True, True]
    # down: every question fails within its timeout, none is taken for an answer
    local_kafka.stop()
    ask.answers.clear()
    try:
        w.lost(time.monotonic())
        why, took = _run(w, ask, 15)
        assert why == "", f"an outage was taken for a hang after {took:.1f} s"
        assert len(ask.answers) >= 3 and not any(ok for ok, _ in ask.answers)
        assert max(t for _, t in ask.answers) < ASK_TIMEOUT_S + 1.0, "a question outlived its timeout"
        assert w.armed
    finally:
        local_kafka.start()
    # back: answered again
    ask.answers.clear()
    why, took = _run(w, ask, 60)
    assert "librdkafka issue 3437" in why, ask.answers
