"""``devkafka.jvm``: how the dev broker's child process lives and dies, with a stand-in for the JVM.

A shell stands in for ``java`` (the class does not care what it runs): it writes the file a JVM
would dump its class-data archive to, then waits. What is checked is what a broker relies on: an
archive is adopted only after a graceful stop, never after a kill; the output lands in
``broker.out``; and the child dies when its owner is SIGKILLed (the parent-death signal).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from devkafka.jvm import JvmProcess, log_tail


def _stand_in(cds: list[str]) -> list[str]:
    """A "JVM" that writes its ``-XX:ArchiveClassesAtExit`` file and its banner, then waits."""
    dump = next(o.split("=", 1)[1] for o in cds if o.startswith("-XX:ArchiveClassesAtExit="))
    return ["sh", "-c", f"printf archive > '{dump}'; echo stand-in broker up; exec sleep 60"]


def _wait_dumped(jars: Path, timeout_s: float = 10.0) -> None:
    """Until the stand-in wrote its archive (as a JVM does only at its exit; here at once)."""
    deadline = time.monotonic() + timeout_s
    while not any(p.stat().st_size > 0 for p in _dumped(jars)):
        assert time.monotonic() < deadline, f"no archive dumped in {jars}"
        time.sleep(0.02)


def _archives(jars: Path) -> list[str]:
    return sorted(p.name for p in jars.iterdir() if p.name.endswith(".jsa"))


def _dumped(jars: Path) -> list[Path]:
    return [p for p in jars.iterdir() if p.name.endswith(".tmp")]


@pytest.fixture
def jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("KDS_KAFKA_CDS", raising=False)
    d = tmp_path / "jars"
    d.mkdir()
    return d


def test_a_graceful_stop_adopts_the_archive_and_the_next_start_maps_it(jars: Path, tmp_path: Path) -> None:
    jvm = JvmProcess()
    cds = jvm.cds_opts(jars, dump=True)
    proc = jvm.launch(_stand_in(cds), tmp_path)
    _wait_dumped(jars)
    assert jvm.pid == proc.pid and jvm.poll() is None
    assert jvm.terminate(timeout=10) is True
    assert jvm.proc is None and jvm.pid is None
    archives = _archives(jars)
    assert len(archives) == 1 and not _dumped(jars)
    assert (jars / archives[0]).read_text() == "archive"
    assert jvm.cds_opts(jars, dump=True)[-1] == f"-XX:SharedArchiveFile={jars / archives[0]}"
    assert "stand-in broker up" in log_tail(tmp_path)


def test_a_killed_jvm_leaves_no_archive_behind(jars: Path, tmp_path: Path) -> None:
    jvm = JvmProcess()
    cds = jvm.cds_opts(jars, dump=True)
    jvm.launch(_stand_in(cds), tmp_path)
    _wait_dumped(jars)
    jvm.kill()
    assert jvm.proc is None
    assert _archives(jars) == [] and _dumped(jars) == []
    assert jvm.cds_opts(jars, dump=False) == [], "no archive yet, and no dump asked for"


def test_cds_is_off_when_asked(jars: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KDS_KAFKA_CDS", "0")
    assert JvmProcess().cds_opts(jars, dump=True) == []


def test_poll_reports_a_child_that_ended_by_itself(tmp_path: Path) -> None:
    jvm = JvmProcess()
    jvm.launch(["sh", "-c", "echo failing; exit 3"], tmp_path)
    deadline = time.monotonic() + 10
    while jvm.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert jvm.poll() == 3 and jvm.pid is None
    jvm.reap()
    assert jvm.poll() is None
    tail = log_tail(tmp_path, lines=2)
    assert f"--- {tmp_path / 'broker.out'} (last 2 lines) ---" in tail and tail.endswith("failing")


def test_log_tail_of_a_directory_without_logs_is_empty(tmp_path: Path) -> None:
    assert log_tail(tmp_path) == ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_child_dies_with_an_owner_killed_by_sigkill(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from pathlib import Path
                from devkafka.jvm import JvmProcess
                proc = JvmProcess().launch(["sleep", "120"], Path({str(tmp_path)!r}))
                print(proc.pid, flush=True)
                time.sleep(120)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert owner.stdout is not None
        child = int(owner.stdout.readline())
        # Popen returns once setpriv runs; the parent-death signal is armed only when setpriv
        # has called prctl, which it does before it execs the command. Kill the owner earlier
        # and nothing was armed yet (the race a loaded CI machine hit).
        deadline = time.monotonic() + 10
        while _comm(child) != "sleep":
            assert time.monotonic() < deadline, f"pid {child} never became sleep: {_comm(child)!r}"
            time.sleep(0.01)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}").exists() and "Z" not in _state(child):
            assert time.monotonic() < deadline, f"pid {child} outlived its SIGKILLed owner"
            time.sleep(0.05)
    finally:
        owner.kill()
        owner.wait(timeout=10)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"
