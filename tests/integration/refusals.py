"""Running ``delay-sidecar`` against a Kafka that refuses it, for the rows of docs/operations.md
"When Kafka refuses the sidecar": a ``run`` subprocess (its exit status, its log events, its
``/readyz``) and the one-line failure of the other commands, called in-process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from sidecar import cli
from tests.integration.harness import free_port as free_port  # the refusal tests take it from here

ROOT = Path(__file__).resolve().parents[2]
# librdkafka time-outs low: a probe that cannot connect gives up within seconds
FAST = ["--kafka", "socket.connection.setup.timeout.ms=2000", "--kafka", "reconnect.backoff.max.ms=500"]


def kafka_flags(conf: dict[str, str]) -> list[str]:
    out = ["--bootstrap-servers", conf["bootstrap.servers"]]
    for k, v in conf.items():
        if k != "bootstrap.servers":
            out += ["--kafka", f"{k}={v}"]
    return out


class Run:
    """``delay-sidecar run`` in a subprocess, its output kept."""

    def __init__(self, tmp: Path, flags: list[str], http: bool = True) -> None:
        self.port = free_port() if http else 0
        args = [sys.executable, "-m", "sidecar", "run", "--data-dir", str(tmp / "data"), "--http-port",
                str(self.port), "--group-id", f"g-{tmp.name}", "--ingress-topic", f"in-{tmp.name}",
                "--dlq-topic", f"dlq-{tmp.name}", "--changelog", "off", "--ingress-partitions", "1", *FAST, *flags]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
        self.out: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.out.append(line.decode(errors="replace"))

    def wait(self, timeout_s: float) -> int:
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"run did not exit within {timeout_s} s:\n{''.join(self.out[-20:])}") from None
        self._reader.join(5)
        return rc

    def stop(self, timeout_s: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout_s)

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace")

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in list(self.out):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if doc.get("event") == name:
                found.append(doc)
        return found

    def readyz(self) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
        except OSError:
            return 0, {}

    def wait_readyz(self, timeout_s: float, code: str | None) -> dict[str, Any]:
        """/readyz once it names ``code`` as its kafka cause (None: once it answers 200)."""
        deadline = time.monotonic() + timeout_s
        got: tuple[int, dict[str, Any]] = (0, {})
        while time.monotonic() < deadline:
            got = self.readyz()
            if (code is None and got[0] == 200) or (
                    code is not None and got[0] == 503 and got[1].get("kafka", {}).get("code") == code):
                return got[1]
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"/readyz stayed {got}; log:\n{''.join(self.out[-20:])}")


def exits_with(tmp: Path, flags: list[str], status: int, code: str, reason: str = "") -> dict[str, Any]:
    """``run`` exits with ``status`` after ONE ``kafka.unusable`` event naming ``code``, no traceback."""
    run = Run(tmp, flags, http=False)
    rc = run.wait(30)
    err = run.stderr()
    events = run.events("kafka.unusable")
    assert rc == status, (rc, run.out[-10:], err)
    assert "Traceback" not in err and "Traceback" not in "".join(run.out)
    assert len(events) == 1 and events[0]["code"] == code, events
    if reason:
        assert events[0].get("reason") == reason, events[0]
    assert events[0]["level"] == "error" and events[0]["setting"]
    return events[0]


def cli_fails(capsys: pytest.CaptureFixture[str], argv: list[str], status: int, code: str) -> str:
    """A command fails with ``status`` and one line on stderr naming ``code``."""
    rc = cli.main([*argv, "--timeout", "1s"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == status, err
    assert len(lines) == 1 and f"{code}" in lines[0] and "Traceback" not in err, err
    return lines[0]


def refused_everywhere(tmp: Path, capsys: pytest.CaptureFixture[str], conf: dict[str, str], status: int,
                       code: str, reason: str, setting: str, commands: list[list[str]] | None = None) -> None:
    """``run`` exits with ``status`` naming ``code`` (``reason``) and a setting that starts with
    ``setting``; each of ``commands`` (default: ``status``) fails with one line naming both."""
    flags = kafka_flags(conf)
    ev = exits_with(tmp, flags, status, code, reason)
    assert ev["setting"].startswith(setting), ev
    for argv in commands or [["status", "some-id"]]:
        line = cli_fails(capsys, [*argv, *flags], 1, code)
        assert f"({reason})" in line and setting in line, line


COMMANDS = [
    ["send", "--topic", "t", "--value", "v", "--delay", "1s"],
    ["cancel", "some-id", "--key", "k"],
    ["status", "some-id"],
    ["dlq", "list"],
]
