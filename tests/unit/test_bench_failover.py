"""The ``failover`` bench's attribution of a duplicate's copies to the instance serving their
partition (no broker: the members' log events are given)."""

from __future__ import annotations

from typing import Any

from bench.failover import Member, served_by, serving_spans


def member(label: str, events: list[tuple[int, int, str, dict[str, Any]]]) -> Member:
    m = Member(label, None)  # type: ignore[arg-type]  # no process: its past events only
    m.past = [{"_run": run, "_ms": ms, "event": name, **fields} for run, ms, name, fields in events]
    return m


def test_copies_are_attributed_to_the_serving_instance() -> None:
    a = member("A", [
        (1, 0, "partitions.assigned", {"partitions": [0, 1]}),
        (1, 10, "partition.restored", {"partition": 0}),
        (1, 12, "partition.restored", {"partition": 1}),
        (1, 500, "partitions.revoked", {"partitions": [1]}),
        (1, 2_000, "stats", {}),
    ])
    b = member("B", [
        (1, 480, "partitions.assigned", {"partitions": [1]}),
        (1, 700, "partition.restored", {"partition": 1}),
        (1, 900, "stats", {}),  # then SIGKILLed at 1_000, without a revoke
        (2, 5_000, "partitions.assigned", {"partitions": [1]}),
        (2, 5_100, "partition.restored", {"partition": 1}),
        (2, 6_000, "partitions.revoked", {"partitions": [1]}),
    ])
    spans = serving_spans([a, b], {"B": [1_000]})
    assert served_by(spans, 0, 1_500) == ["A1"]  # never revoked: up to A's last event
    assert served_by(spans, 1, 400) == ["A1"]
    assert served_by(spans, 1, 600) == []  # between A's revoke and B's restore
    assert served_by(spans, 1, 950) == ["B1"]  # after B's last event, before its kill
    assert served_by(spans, 1, 3_000) == []
    assert served_by(spans, 1, 5_500) == ["B2"]


def test_a_sigkill_handover_is_timed_when_the_victim_is_dead(monkeypatch: Any) -> None:
    """The victim delivers until the signal lands; its in-flight records (its last milliseconds of
    deliveries) are delivered again by its successor and must lie inside the handover's window,
    however long the bench takes to read the victim's events and send the signal."""
    import bench.failover as fo

    clock = [1_000]
    monkeypatch.setattr(fo, "wall_ms", lambda: clock[0])
    last_delivery: list[int] = []

    class Victim(Member):
        def serving(self) -> set[int]:
            clock[0] += 30  # reading its log: the bench's own latency
            return {1, 2}

        def end(self, sig: int = 0) -> None:
            clock[0] += 20  # the signal lands; the victim delivered up to here
            last_delivery.append(clock[0])

    h = fo.sigkill(Victim("B", None), "B: SIGKILL")  # type: ignore[arg-type]
    assert h.partitions == {1, 2}
    assert h.at_ms >= last_delivery[0]
    assert h.at_ms - fo.DUP_WINDOW_MS <= last_delivery[0] - 5  # its last 5 ms of deliveries are covered
