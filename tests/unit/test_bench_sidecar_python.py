"""KDS_BENCH_SIDECAR_PYTHON: the harness starts its sidecars with another checkout's Python."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from bench.workload import SIDECAR_PYTHON_ENV, SidecarProc


def _recorder(tmp_path: Path) -> Path:
    """A stand-in for another checkout's Python: prints its argv as one JSON line and exits."""
    script = tmp_path / "other-python"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        "print(json.dumps({'event': 'argv', 'argv': sys.argv[1:]}), flush=True)\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _argv(proc: SidecarProc) -> list[str]:
    assert proc.proc is not None
    assert proc.proc.wait(timeout=30) == 0
    argv: list[str] = next(e for e in proc.poll_events() if e.get("event") == "argv")["argv"]
    return argv


def test_the_sidecar_runs_under_the_named_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SIDECAR_PYTHON_ENV, str(_recorder(tmp_path)))
    proc = SidecarProc("127.0.0.1:9", tmp_path, "in", "levels", extra=["--changelog", "off"])
    proc.start(wait=False)
    argv = _argv(proc)
    assert argv[:3] == ["-m", "sidecar", "run"]
    assert argv[argv.index("--scheduler") + 1] == "levels"
    assert argv[-2:] == ["--changelog", "off"]


def test_unset_or_empty_it_is_the_bench_s_own_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SIDECAR_PYTHON_ENV, "")
    proc = SidecarProc("127.0.0.1:9", tmp_path, "in", "levels")
    spawned: list[list[str]] = []
    monkeypatch.setattr(proc, "_spawn", lambda cmd, stdin_pipe=False: spawned.append(cmd))
    proc.start(wait=False)
    monkeypatch.delenv(SIDECAR_PYTHON_ENV)
    proc.start(wait=False)
    assert [cmd[:4] for cmd in spawned] == [[sys.executable, "-m", "sidecar", "run"]] * 2
