"""store/flights.py: what a store keeps of the records it published from the intake, unreported.
The commit stays below the lowest of them (in flight or named by the checkpoint opened and not
consumed again), the checkpoint names them only once the path is enabled, and the path opens only
once such a checkpoint is written."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sidecar.store.flights import Flights


def _fly(f: Flights, *offsets: int) -> None:
    for o in offsets:
        f.deliveries[o * 7919] = SimpleNamespace(offset=o)  # type: ignore[assignment]


def test_the_commit_stays_below_every_unreported_offset() -> None:
    f = Flights()
    assert f.commit_below(None) is None and f.commit_below(50) == 50
    _fly(f, 30, 12)
    assert f.commit_below(50) == 12 and f.commit_below(5) == 5 and f.commit_below(None) is None
    f.reopen([40, 8], 45, set())
    assert f.redo == {40, 8} and f.commit_below(50) == 8
    f.redone(8)
    assert f.commit_below(50) == 12
    f.deliveries.clear()
    assert f.commit_below(50) == 40
    f.redone(40)
    f.redone(40)  # consumed again twice (a second handover): nothing left to name
    assert f.commit_below(50) == 50


def test_the_checkpoint_names_them_only_once_enabled_and_the_path_opens_once_one_is_written() -> None:
    f = Flights()
    _fly(f, 9, 3)
    f.reopen([3, 5], 7, set())
    assert f.checkpoint_fields() == {}
    f.written({"ingress_offset": 10})  # a version 1 checkpoint: recovery would not consume them again
    assert not f.checkpointed
    f.enabled = True
    doc: dict[str, Any] = {"ingress_offset": 10, **f.checkpoint_fields()}
    assert doc["direct"] == [3, 5, 9]  # sorted, each once: in flight and redo alike
    f.written(doc)
    assert f.checkpointed


def test_reopen_takes_the_rule_of_the_checkpoint_version() -> None:
    f = Flights()
    after = f.reopen(None, 10, {10, 11, 14})  # no ``direct`` key: resume after the log's last record
    assert after.offset() == 15 and f.redo == set()
    listed = f.reopen([4, 6], 10, {10, 11, 14})  # resume at the lowest unreported one
    assert listed.offset() == 4 and f.redo == {4, 6} and not listed.drops(6) and listed.drops(5)


def test_close_forgets_what_is_in_flight() -> None:
    f = Flights()
    _fly(f, 1)
    f.port, f.port_mirror = object(), object()  # type: ignore[assignment]
    f.close()
    assert not f.deliveries and f.port is None and f.port_mirror is None
