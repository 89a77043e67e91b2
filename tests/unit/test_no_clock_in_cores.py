"""The scheduling, retry and recurring cores take time as an argument (Kafka's
``advanceClock(timeMs)`` habit): no module under sidecar/levels, sidecar/wheel, sidecar/retry or
sidecar/recurring may read a clock, sleep, or use the global random generator. Checked on the AST,
so comments and docstrings don't count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "sidecar"
FORBIDDEN_ATTRS = {
    ("time", "time"), ("time", "time_ns"), ("time", "monotonic"), ("time", "monotonic_ns"),
    ("time", "perf_counter"), ("time", "sleep"), ("datetime", "now"), ("datetime", "utcnow"),
    ("date", "today"), ("random", "random"), ("random", "randint"), ("random", "uniform"),
}
FORBIDDEN_IMPORTS = {"time"}


def _modules() -> list[Path]:
    return sorted(p for pkg in ("levels", "wheel", "retry", "recurring") for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_reads_no_clock(path: Path) -> None:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            where = f"{path}:{node.lineno} {node.value.id}.{node.attr}"
            assert (node.value.id, node.attr) not in FORBIDDEN_ATTRS, where
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name not in FORBIDDEN_IMPORTS, f"{path}:{node.lineno} import {alias.name}"
        if isinstance(node, ast.ImportFrom) and node.module in FORBIDDEN_IMPORTS:
            raise AssertionError(f"{path}:{node.lineno} from {node.module} import ...")


def test_there_are_cores_to_check() -> None:
    assert len(_modules()) >= 5
