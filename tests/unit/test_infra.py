"""``tests/infra.py``: a test that needs something of the machine is skipped without it on a
laptop and fails under ``CI=true`` (as the broker, Spark and helm tests do)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import infra

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("ci", ["true", "TRUE", "", "false"])
def test_unavailable_skips_on_a_laptop_and_fails_in_ci(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci.lower() == "true" else pytest.skip.Exception
    with pytest.raises(expected) as e:
        infra.unavailable("redis-server", "not on PATH")
    assert str(e.value) == f"redis-server unavailable{' in CI' if ci.lower() == 'true' else ''}: not on PATH"


class _Item:
    """What ``check_needs`` reads of a test item: its markers."""

    def __init__(self, *marks: pytest.MarkDecorator) -> None:
        self.marks = [m.mark for m in marks]

    def iter_markers(self, name: str) -> list[pytest.Mark]:
        return [m for m in self.marks if m.name == name]


def test_the_needs_marker_stops_a_test_only_when_something_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    infra.check_needs(_Item(infra.needs(True, "present")))  # type: ignore[arg-type]
    with pytest.raises(pytest.fail.Exception, match="missing unavailable in CI"):
        infra.check_needs(_Item(infra.needs(True, "present"), infra.needs(False, "missing")))  # type: ignore[arg-type]
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="missing unavailable"):
        infra.check_needs(_Item(infra.needs(False, "missing")))  # type: ignore[arg-type]


def test_conftest_applies_the_marker(tmp_path: Path) -> None:
    """A test marked with a missing need, run by pytest with ``tests/conftest.py`` as a plugin under
    ``CI=true``: it fails at setup and its body never runs."""
    (tmp_path / "test_marked.py").write_text(
        "from tests.infra import needs\n\n"
        "@needs(False, 'something this machine never has')\n"
        "def test_marked():\n"
        "    raise AssertionError('the body ran')\n"
    )
    env = {**os.environ, "CI": "true", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q",
                          "--rootdir", str(tmp_path), str(tmp_path / "test_marked.py")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "something this machine never has unavailable in CI" in out.stdout
    assert "the body ran" not in out.stdout
