"""The publish state is declared twice, as a C type (``_native.PublishState``) and as its Python
twin (``sidecar.engine.publish_state``), and both must be the same object to the loop: the same
fields, starting alike, and the C one is what the loop gets when the extension is built."""

from __future__ import annotations

import types
from typing import Any

import pytest

from sidecar.engine import publish_state
from sidecar.engine.publish_state import PublishState, PyPublishState
from sidecar.store.codec import native
from sidecar.store.partition import Counters
from tests.infra import needs_native


def members(cls: type) -> set[str]:
    return {k for k, v in vars(cls).items() if isinstance(v, types.MemberDescriptorType)}


def test_the_twin_declares_its_fields_as_slots() -> None:
    assert set(PyPublishState.__slots__) == members(PyPublishState) == set(PyPublishState.__annotations__)
    assert not hasattr(PyPublishState({}, Counters()), "__dict__")


@needs_native
def test_the_c_type_has_the_twins_fields() -> None:
    assert native is not None
    assert members(native.PublishState) == set(PyPublishState.__slots__)


@needs_native
def test_both_start_alike() -> None:
    assert native is not None
    counters = Counters()
    stores: dict[int, Any] = {}
    c, py = native.PublishState(stores, counters), PyPublishState(stores, counters)
    for name in PyPublishState.__slots__:
        assert getattr(c, name) == getattr(py, name), name
    assert c.counters is counters and c.stores is stores and type(c.broker_up) is bool and type(c.in_flight) is int
    assert native.PublishState(counters=counters, stores=stores).counters is counters


def test_the_loop_gets_the_c_type_when_built() -> None:
    assert publish_state.PublishState is PublishState is (PyPublishState if native is None else native.PublishState)


@needs_native
def test_the_c_fields_are_typed() -> None:
    """in_flight is a C integer and broker_up a C bool: Python cannot put anything else there."""
    assert native is not None
    ps = native.PublishState({}, Counters())
    ps.in_flight += 5
    assert ps.in_flight == 5
    with pytest.raises(TypeError):
        ps.in_flight = "5"  # type: ignore[assignment]
    with pytest.raises(TypeError):
        ps.broker_up = 1  # type: ignore[assignment]
    with pytest.raises(AttributeError):
        ps.other = 1  # type: ignore[attr-defined]


@needs_native
def test_the_publisher_takes_the_state_object() -> None:
    assert native is not None
    ps = native.PublishState({}, Counters())
    pub = native.Publisher(ps, lambda *a: None, (BufferError,))
    pub.sync()
    with pytest.raises(TypeError):
        native.Publisher({"in_flight": 0}, lambda *a: None, (BufferError,))  # type: ignore[arg-type]
