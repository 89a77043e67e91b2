"""The RabbitMQ TTL peer's pure parts: a delay's routing to its level queue (rounded up, as the
sidecar's levels scheduler does) and the bridge's acknowledgement order (a multiple-ack only over
the prefix of delivery tags that Kafka settled; nacked tags are skipped, never acked)."""

from __future__ import annotations

import pytest

from bench.rabbit_bridge import Settler
from bench.rabbit_queues import DUE_QUEUE, LEVELS_MS, level_queue, route, type_args


def test_a_delay_goes_to_the_smallest_level_not_shorter() -> None:
    assert route(LEVELS_MS, 0) == (DUE_QUEUE, 0)
    assert route(LEVELS_MS, -5) == (DUE_QUEUE, 0)
    assert route(LEVELS_MS, 1) == (level_queue(1_000), 1_000)
    assert route(LEVELS_MS, 1_000) == (level_queue(1_000), 1_000)
    assert route(LEVELS_MS, 61_000) == (level_queue(120_000), 120_000)  # a 61 s delay waits 2 min
    assert route(LEVELS_MS, LEVELS_MS[-1]) == (level_queue(LEVELS_MS[-1]), LEVELS_MS[-1])
    with pytest.raises(ValueError, match="beyond the last level"):
        route(LEVELS_MS, LEVELS_MS[-1] + 1)


def test_queue_types_name_their_durability_arguments() -> None:
    assert type_args("quorum")["x-dead-letter-strategy"] == "at-least-once"
    assert type_args("quorum")["x-overflow"] == "reject-publish"
    assert type_args("classic")["x-queue-type"] == "classic"
    with pytest.raises(ValueError, match="quorum, classic"):
        type_args("stream")


class Recorder:
    """Records the acknowledgements a bridge sends (the channel's two calls it uses)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, bool]] = []

    def basic_ack(self, tag: int, multiple: bool) -> None:
        self.calls.append(("ack", tag, multiple))

    def basic_nack(self, tag: int, multiple: bool, requeue: bool) -> None:
        assert requeue
        self.calls.append(("nack", tag, multiple))


def test_acks_cover_only_the_settled_prefix() -> None:
    ch = Recorder()
    s = Settler(ch)
    s.in_flight = 5
    s.done(2, failed=False)
    s.done(3, failed=False)
    s.flush()
    assert ch.calls == []  # tag 1 is still waiting for Kafka
    s.done(1, failed=False)
    s.flush()
    assert ch.calls == [("ack", 3, True)]
    s.done(5, failed=False)
    s.done(4, failed=True)  # requeued at once, then skipped by the next multiple-ack
    s.flush()
    assert ch.calls == [("ack", 3, True), ("nack", 4, False), ("ack", 5, True)]
    assert s.in_flight == 0 and s.redelivered == 1


def test_a_prefix_ending_in_a_nack_acks_up_to_the_last_success() -> None:
    ch = Recorder()
    s = Settler(ch)
    s.in_flight = 2
    s.done(1, failed=False)
    s.done(2, failed=True)
    s.flush()
    assert ch.calls == [("nack", 2, False), ("ack", 1, True)]
    assert s.next == 3
