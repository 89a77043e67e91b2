"""Fixtures every unit test gets (the session-wide ones are in ``tests/conftest.py``; helpers to
import are in ``tests/unit/helpers/``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    """``Sidecar.start`` sets the loop's collector settings for the whole process (``quiet_gc``):
    each test gets the thresholds it started with back, and nothing left frozen."""
    saved = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*saved)
