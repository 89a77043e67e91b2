"""engine/wake.py: how long the loop may wait in ``consume`` (pure functions, no clock inside)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sidecar.engine.pacing import Pacing
from sidecar.engine.wake import MAX_WAIT_S, next_due, wait_s

NOW = 1_700_000_000_000


def _never() -> int | None:
    raise AssertionError("next_due asked although the queues already said 'now'")


def test_a_backlog_or_a_due_retry_means_no_wait_without_asking_the_stores() -> None:
    assert wait_s(NOW, _never, [object()], []) == 0.0
    assert wait_s(NOW, _never, [], [(NOW, 0, 1, None, None)]) == 0.0
    assert wait_s(NOW, _never, [], [(NOW - 5, 0, 1, None, None)]) == 0.0


def test_the_wait_runs_to_the_earliest_of_the_next_due_time_and_the_retry_heap_capped() -> None:
    assert wait_s(NOW, lambda: None, [], []) == MAX_WAIT_S
    assert wait_s(NOW, lambda: NOW + 30, [], []) == 0.03
    assert wait_s(NOW, lambda: NOW - 10, [], []) == 0.0  # overdue: no wait
    assert wait_s(NOW, lambda: NOW + 5_000, [], []) == MAX_WAIT_S
    assert wait_s(NOW, lambda: NOW + 30, [], [(NOW + 20, 0, 1, None, None)]) == 0.02
    assert wait_s(NOW, lambda: None, [], [(NOW + 40, 0, 1, None, None)]) == 0.04


def _store(topic: str, due: int | None) -> Any:
    return SimpleNamespace(topic=topic, sched=SimpleNamespace(next_due_ms=lambda: due))


def test_next_due_is_the_earliest_store_but_those_held() -> None:
    stores = [_store("a", NOW + 50), _store("b", NOW + 10), _store("c", None)]
    pacing = Pacing([], NOW)
    assert next_due(stores, set(), pacing, NOW) == NOW + 10
    assert next_due(stores, {"b"}, pacing, NOW) == NOW + 50  # b's lane waits for its transactional id
    assert next_due(stores, {"a", "b"}, pacing, NOW) is None
