"""Tests that need something of the machine: skipped on a laptop without it, failed under
``CI=true``, where every test must run (a silent skip would let CI pass without the check).

* :func:`unavailable` (in a test or fixture): skip, or fail in CI, naming what is missing.
* :func:`needs` (a marker): ``@needs(shutil.which("redis-server") is not None, "redis-server
  (scripts/setup.d/40-redis.sh)")``; ``tests/conftest.py`` applies it before the test's setup.
* :data:`needs_native`: the C extension ``sidecar._native`` (built by scripts/setup.sh).

Skips that depend on chance (a file system reusing an inode number) or on an optional mode stay
plain ``pytest.skip``: nothing is missing from the machine.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from sidecar.store import codec


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def unavailable(what: str, reason: str = "") -> NoReturn:
    """Skip the running test, or fail it under ``CI=true``: ``what`` is unavailable (``reason``)."""
    said = f"{what} unavailable{' in CI' if in_ci() else ''}" + (f": {reason}" if reason else "")
    if in_ci():
        pytest.fail(said, pytrace=False)
    pytest.skip(said)


def needs(available: bool, what: str) -> pytest.MarkDecorator:
    """A marker: the test needs ``what``, which is ``available`` or not on this machine."""
    return pytest.mark.needs(available, what)


def check_needs(item: pytest.Item) -> None:
    """Apply the ``needs`` markers of a test about to run (``tests/conftest.py``)."""
    for mark in item.iter_markers("needs"):
        available, what = mark.args
        if not available:
            unavailable(what)


needs_native = needs(codec.native is not None, "the C extension sidecar._native (scripts/setup.sh builds it; "
                                               "KDS_PURE_PYTHON=1 turns it off)")

