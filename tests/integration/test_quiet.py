"""Quiet when healthy: a healthy run logs no warning and no error, and nothing but JSON lines.

The issue's findings: librdkafka's ``%3|...|FAIL|... Connection refused`` lines on stderr after
the demo's success line and after ``sidecar.stopped`` (the producer was never closed and kept
reconnecting to the broker that stopped after it), ``store.slow_file_create`` warnings at every
start. Both runs here are the real thing: the sidecar as a subprocess against the session broker,
and ``delay-sidecar demo`` with its own broker, which stops after the sidecar.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import SidecarProcess, consume_until, create_topics, producer

pytestmark = pytest.mark.integration


def starved(doc: dict[str, Any]) -> bool:
    """A ``loop.slow_turn`` in which the loop thread used under half the turn's time on a CPU: it
    waited for one (preemptions) or for the disk, on a machine loaded by others (a CI host running
    several test processes). That warning is right for an operator; it says nothing about the
    sidecar's own health, which is what this test checks."""
    if doc.get("event") != "loop.slow_turn":
        return False
    return float(doc.get("user_ms", 0)) + float(doc.get("system_ms", 0)) < float(doc.get("turn_ms", 0)) / 2


def noise(text: str) -> tuple[list[str], list[dict[str, Any]]]:
    """(lines that are not JSON log events, events at warning level or above, but for the slow
    turns of a starved loop thread)."""
    stray, loud = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            stray.append(line)
            continue
        if isinstance(doc, dict) and doc.get("level") in ("warning", "error", "critical") and not starved(doc):
            loud.append(doc)
    return stray, loud


def test_a_healthy_run_and_stop_log_nothing_loud(kafka_bootstrap: str, tmp_path: Path, unique: str) -> None:
    sc = SidecarProcess(kafka_bootstrap, tmp_path / "data", f"ingress-quiet-{unique}", f"dlq-quiet-{unique}",
                        extra=["--ingress-partitions", "3"])
    target = f"quiet-target-{unique}"
    create_topics(kafka_bootstrap, [target])
    try:
        sc.start()
        p = producer(kafka_bootstrap)
        for i in range(300):
            p.produce(sc.ingress, key=str(i).encode(), value=b"v", headers=[
                ("delay.target-topic", target.encode()), ("delay.ms", str((i % 4) * 300).encode())])
        assert p.flush(30) == 0
        assert len(consume_until(kafka_bootstrap, [target], want=300, timeout_s=60)) >= 300
        assert sc.terminate() == 0
        time.sleep(0.5)
    finally:
        sc.stop_quietly()
    text = sc.log_text()
    stray, loud = noise(text)
    assert '"event":"sidecar.stopped"' in text
    assert stray == [], "every line is a JSON event (librdkafka's log goes through structlog)"
    assert loud == [], f"a healthy run warned: {loud}"


def test_the_demo_is_quiet(tmp_path: Path) -> None:
    """``delay-sidecar demo``: its own broker, a sidecar, six records (one cancelled). The output is
    the demo's lines and nothing else: no librdkafka lines, no warnings."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sidecar", "demo"], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "5 of 5 expected records arrived; the cancelled one did not." in proc.stdout
    lines = [line for line in out.splitlines() if line.strip()]
    stray = [line for line in lines if not line.startswith(("starting a local Kafka", "broker up at", "sent 6",
                                                             "  arrived:", "5 of 5 expected"))]
    print(f"\ndemo: {len(lines)} lines in {time.monotonic() - t0:.1f} s")
    assert stray == [], "\n".join(stray)


def test_only_a_starved_slow_turn_is_forgiven() -> None:
    """The filter above lets through only what the machine caused: the CI run's starved turn (164.8
    ms, 44.7 ms of CPU, 28 preemptions) passes, the same turn spent working on a CPU does not."""
    turn = {"event": "loop.slow_turn", "level": "warning", "turn_ms": 164.8, "user_ms": 5.1, "system_ms": 39.6}
    assert starved(turn)
    assert not starved({**turn, "user_ms": 120.0})
    assert not starved({**turn, "event": "store.slow_file_create"})
    _stray, loud = noise(json.dumps({**turn, "user_ms": 120.0}))
    assert len(loud) == 1
