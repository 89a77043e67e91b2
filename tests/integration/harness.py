"""Test harness: the sidecar as a real subprocess (``SidecarProcess``; ``TenantSidecar`` with a
config file of tenants), plain confluent-kafka helpers, ``free_port`` and ``scrape`` (its
``/metrics`` as a dict).

Integration tests run ``python -m sidecar run ...`` exactly as an operator would (so SIGTERM and
SIGKILL hit a real process), against the session's real broker, and talk to it only through
Kafka with plain confluent-kafka clients — none of the sidecar's own code on the client side,
so the wire contract itself is what is tested.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def create_topics(bootstrap: str, topics: Iterable[str], partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics])
    for f in futures.values():
        f.result(30)


def producer(bootstrap: str, **extra: Any) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, **extra})


@dataclass
class Received:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes | None]  # the last one of a repeated name
    timestamp_ms: int
    header_list: list[tuple[str, bytes | None]] = field(default_factory=list)  # all of them, in order

    @property
    def lateness_ms(self) -> int:
        return self.timestamp_ms - int(self.headers["delay.deliver-at"] or b"0")


def consume_until(
    bootstrap: str, topics: list[str], want: int, timeout_s: float, settle_s: float = 0.0,
    conf: dict[str, str] | None = None,
) -> list[Received]:
    """Read ``topics`` from the beginning until ``want`` records arrived (then ``settle_s`` more
    seconds, to catch extras such as duplicates) or the timeout. ``conf``: more client properties
    (a secured broker's)."""
    c = Consumer({
        **(conf or {}), "bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
    })
    c.subscribe(topics)
    out: list[Received] = []
    deadline = time.monotonic() + timeout_s
    settle_until: float | None = None
    try:
        while time.monotonic() < deadline:
            if settle_until is not None and time.monotonic() >= settle_until:
                break
            msgs = c.consume(num_messages=1000, timeout=0.2)
            for m in msgs:
                if m.error():
                    continue
                out.append(_received(m))
            if len(out) >= want and settle_until is None:
                settle_until = time.monotonic() + settle_s
    finally:
        c.close()
    return out


def _received(m: Message) -> Received:
    listed = [(k, v if isinstance(v, bytes) or v is None else str(v).encode()) for k, v in m.headers() or []]
    return Received(
        str(m.topic()), int(m.partition() or 0), int(m.offset() or 0), m.key(), m.value(), dict(listed),  # type: ignore[arg-type]
        m.timestamp()[1], listed,
    )


# The sidecars' session timeout: the broker's smallest (group.min.session.timeout.ms, 6 s, as the
# bench's small runs use). A node loss or a zombie (SIGSTOP) is noticed when it runs out, so the
# tests of those wait this long; a static member restarted within it keeps its partitions.
SESSION_MS = 6_000


@dataclass
class SidecarProcess:
    bootstrap: str
    data_dir: Path
    ingress: str
    dlq: str
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    starts: int = 0
    instance: str | None = "0"  # the static member id's suffix; None: the sidecar's own (kept in data_dir)

    def start(self, wait_assigned: bool = True, timeout_s: float = 60) -> None:
        self.starts += 1
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-run{self.starts}.log"
        cmd = [
            sys.executable, "-m", "sidecar", "run", "--bootstrap-servers", self.bootstrap,
            "--ingress-topic", self.ingress, "--dlq-topic", self.dlq, "--data-dir", str(self.data_dir),
            "--group-id", f"sc-{self.ingress}",
            *([] if self.instance is None else ["--group-instance-id", f"sc-{self.ingress}-{self.instance}"]),
            "--stats-interval", "1s", "--kafka", f"session.timeout.ms={SESSION_MS}", *self.extra,
        ]
        env = {**os.environ, **self.env}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        if wait_assigned:
            self.wait_for("partitions.assigned", timeout_s)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def wait_for(self, event: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if f'"event":"{event}"' in self.log_text():
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"sidecar exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")
            time.sleep(0.1)
        raise AssertionError(f"sidecar did not log {event} within {timeout_s}s:\n{self.log_text()[-4000:]}")

    def terminate(self, timeout_s: float = 60) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout_s)
        return rc

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop_quietly(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

class TenantSidecar(SidecarProcess):
    """A sidecar started with a config file of tenants (no top-level ingress topic); ``extra``
    flags and ``env`` as the harness's."""

    config: Path | None = None

    def start(self, wait_assigned: bool = True, timeout_s: float = 60) -> None:
        assert self.config is not None
        self.starts += 1
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-run{self.starts}.log"
        cmd = [
            sys.executable, "-m", "sidecar", "run", "--config", str(self.config),
            "--bootstrap-servers", self.bootstrap, "--data-dir", str(self.data_dir),
            "--group-id", f"sc-{self.ingress}", "--group-instance-id", f"sc-{self.ingress}-{self.instance}",
            "--stats-interval", "1s", "--commit-interval", "200ms", "--kafka", f"session.timeout.ms={SESSION_MS}",
            *self.extra,
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env})
        if wait_assigned:
            self.wait_for("partitions.assigned", timeout_s)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the sidecar's ``/metrics`` on ``port``: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        body = r.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out
