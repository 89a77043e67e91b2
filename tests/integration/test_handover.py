"""Partition handover on the real broker: several sidecar processes in one consumer group.

With the changelog on (the default), a partition's pending records follow it to whichever
instance the group gives it to. Each test runs real ``delay-sidecar run`` processes against the
session broker, sends records under load with plain confluent-kafka, moves partitions (scale-out,
scale-in, a killed instance whose volume is gone, a stopped-and-resumed zombie, a crash loop), and
counts what arrived on the target topic: lost (must be 0), early (must be 0) and duplicates
(allowed only for records in flight at a handover; counted and bounded).
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from tests.integration.harness import Received, SidecarProcess, consume_until, create_topics, producer

pytestmark = pytest.mark.integration

PARTITIONS = 6


class Group:
    """Sidecars sharing one ingress topic and one group, each with its own data directory."""

    def __init__(self, bootstrap: str, tmp: Path, unique: str, scheduler: str = "wheel") -> None:
        self.bootstrap = bootstrap
        self.tmp = tmp
        self.ingress = f"ho-in-{unique}"
        self.dlq = f"ho-dlq-{unique}"
        self.target = f"ho-out-{unique}"
        self.scheduler = scheduler
        create_topics(bootstrap, [self.ingress], PARTITIONS)
        create_topics(bootstrap, [self.target], 3)
        self.members: list[SidecarProcess] = []
        self.sent: dict[str, int] = {}  # id -> requested due time
        self._lock = threading.Lock()

    def member(self, name: str, extra: tuple[str, ...] = ()) -> SidecarProcess:
        sc = SidecarProcess(
            self.bootstrap, self.tmp / name, self.ingress, self.dlq, instance=name,
            extra=["--scheduler", self.scheduler, "--ingress-partitions", str(PARTITIONS),
                   "--commit-interval", "200ms", *extra],
        )
        self.members.append(sc)
        return sc

    def send(self, n: int, delay_ms: Callable[[int], int], rate: float, prefix: str) -> None:
        """``n`` records at ``rate``/s (keys spread them over the partitions)."""
        p = producer(self.bootstrap)
        t0 = time.monotonic()
        for i in range(n):
            rid = f"{prefix}-{i}"
            d = delay_ms(i)
            with self._lock:
                self.sent[rid] = int(time.time() * 1000) + d
            p.produce(self.ingress, value=b"v%d" % i, key=rid.encode(), headers=[
                ("delay.target-topic", self.target.encode()), ("delay.ms", str(d).encode()), ("delay.id", rid.encode()),
            ])
            p.poll(0)
            ahead = t0 + (i + 1) / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        assert p.flush(30) == 0

    def send_in_background(self, *args: object) -> threading.Thread:
        t = threading.Thread(target=self.send, args=args, daemon=True)
        t.start()
        return t

    def received(self, settle_s: float = 5.0, timeout_s: float = 120) -> list[Received]:
        return consume_until(self.bootstrap, [self.target], len(self.sent), timeout_s, settle_s=settle_s)

    def verdict(self, got: list[Received]) -> Counter[str]:
        """Lost and early must be 0; returns the duplicates (id -> extra copies)."""
        ids: Counter[str] = Counter()
        early = []
        for r in got:
            rid = (r.headers["delay.id"] or b"").decode()
            ids[rid] += 1
            if r.lateness_ms < 0:
                early.append((rid, r.lateness_ms))
        lost = sorted(set(self.sent) - set(ids))
        assert not lost, f"{len(lost)} of {len(self.sent)} records never delivered, e.g. {lost[:5]}"
        assert not early, f"delivered early: {early[:5]}"
        assert set(ids) <= set(self.sent)
        return Counter({k: n - 1 for k, n in ids.items() if n > 1})

    def stop(self) -> None:
        for sc in self.members:
            sc.stop_quietly()


@pytest.fixture
def group(kafka_bootstrap: str, tmp_path: Path, unique: str) -> Iterator[Group]:
    g = Group(kafka_bootstrap, tmp_path, unique)
    yield g
    g.stop()


def _restored(sc: SidecarProcess) -> int:
    return sc.log_text().count('"event":"partition.restored"')


def _wait(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_scale_out_then_in_under_load_loses_nothing(group: Group) -> None:
    """1 -> 2 -> 1 instances while records arrive: the moved partitions' pending records are
    restored by their new owner from the changelog, then restored back by the first one."""
    a = group.member("a")
    a.start()
    load = group.send_in_background(2400, lambda i: 6000 + (i % 40) * 100, 200.0, "so")
    time.sleep(3)
    b = group.member("b")
    b.start()
    _wait(lambda: _restored(b) >= 1, 60, "b restoring a moved partition")
    time.sleep(4)
    assert b.terminate() == 0  # scale in: a gets b's partitions back
    _wait(lambda: _restored(a) > PARTITIONS, 60, "a restoring the partitions b gave back")
    load.join(60)
    dup = group.verdict(group.received())
    print(f"scale-out/in: {len(group.sent)} sent, {sum(dup.values())} duplicates")
    # a graceful handover drains in-flight deliveries and commits first: nothing comes twice
    assert sum(dup.values()) == 0, dup.most_common(5)


def test_node_loss_with_the_volume_gone_loses_nothing(kafka_bootstrap: str, tmp_path: Path, unique: str) -> None:
    group = Group(kafka_bootstrap, tmp_path, unique, scheduler="levels")
    try:
        a = group.member("a")
        b = group.member("b")
        a.start()
        b.start()
        _wait(lambda: _restored(b) >= 1 and '"event":"partitions.revoked"' in a.log_text(), 60, "the split")
        group.send(1200, lambda i: 5000 if i % 2 else 10_000, 400.0, "nl")
        time.sleep(2)
        b.kill()
        shutil.rmtree(b.data_dir)  # its volume is gone with it
        # the group gives b's partitions to a once b's session (harness.SESSION_MS) expires
        _wait(lambda: _restored(a) > PARTITIONS, 90, "a taking over b's partitions")
        dup = group.verdict(group.received())
        print(f"node loss: {len(group.sent)} sent, {sum(dup.values())} duplicates")
        # b's deliveries in the last commit interval before the kill may come again from a
        assert sum(dup.values()) <= 600
    finally:
        group.stop()


def test_a_zombie_delivers_nothing_of_the_partitions_it_lost(group: Group) -> None:
    """a is stopped (SIGSTOP) past its session: b takes every partition over. When a resumes,
    the records due meanwhile come from b only; a confirms its membership first and is refused."""
    a = group.member("a")
    a.start()
    group.send(600, lambda i: 10_000, 300.0, "zz")  # due after a's session (harness.SESSION_MS) ran out
    time.sleep(1.5)  # stored and committed by a
    assert a.proc is not None
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        b = group.member("b")
        b.start()
        _wait(lambda: _restored(b) >= PARTITIONS, 90, "b restoring all partitions after a's session expired")
        _wait(lambda: time.time() * 1000 > max(group.sent.values()) + 500, 60, "the records falling due")
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    _wait(lambda: '"event":"partitions.lost"' in a.log_text() or '"event":"consumer.fatal"' in a.log_text(), 60,
          "a hearing it lost its partitions")
    got = group.received(settle_s=3)
    dup = group.verdict(got)
    assert not dup, f"delivered twice after the handover: {dup.most_common(5)}"
    assert '"event":"loop.gap"' in a.log_text()


@pytest.mark.parametrize("kills", [5, pytest.param(10, marks=pytest.mark.soak)])
def test_crash_loop_with_default_flags_keeps_every_record(group: Group, kills: int) -> None:
    """SIGKILL/restarts every 2 s (5; 10 under ``pytest -m soak``) with no group-instance-id given:
    the sidecar keeps its own static member id in the data directory, so each restart gets the
    partitions back at once."""
    a = group.member("a")
    a.instance = None  # no --group-instance-id
    a.start()
    load = group.send_in_background(400 * kills, lambda i: 1000 + (i % 20) * 100, 150.0, "cl")
    for _ in range(kills):
        time.sleep(2)
        a.kill()
        a.start()
    load.join(60)
    got = group.received()
    dup = group.verdict(got)
    late = sorted(r.lateness_ms for r in got)
    print(f"crash loop: {len(group.sent)} sent, {sum(dup.values())} duplicates, "
          f"lateness p99 {late[int(len(late) * 0.99)]} ms")
    assert (a.data_dir / "instance-id").read_text().strip()
    assert a.log_text().count('"event":"partition.recovered"') >= 1


def test_a_changelog_topic_with_other_settings_is_refused_at_start(
    kafka_bootstrap: str, tmp_path: Path, unique: str
) -> None:
    group = Group(kafka_bootstrap, tmp_path, unique)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for f in admin.create_topics([NewTopic(f"{group.ingress}.changelog", num_partitions=PARTITIONS,
                                           replication_factor=1)]).values():
        f.result(30)  # cleanup.policy=delete
    a = group.member("a")
    a.start(wait_assigned=False)
    assert a.proc is not None
    assert a.proc.wait(60) == 2
    assert "cleanup.policy=delete" in a.log_text() and "compact" in a.log_text()


def test_refused_changelog_writes_pause_ingress_and_lose_nothing(group: Group) -> None:
    """The changelog topic refuses the records (max.message.bytes too small): ingress pauses and
    no offset is committed; once the topic accepts them again everything is delivered."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    a = group.member("a")
    a.start()
    admin = AdminClient({"bootstrap.servers": group.bootstrap})
    res = ConfigResource(ResourceType.TOPIC, f"{group.ingress}.changelog", incremental_configs=[
        ConfigEntry("max.message.bytes", "64", incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(30)
    group.send(300, lambda i: 2000, 300.0, "rf")
    _wait(lambda: '"event":"ingress.paused"' in a.log_text(), 30, "ingress paused")
    paused = [line for line in a.log_text().splitlines() if '"event":"ingress.paused"' in line]
    assert "changelog" in paused[0]
    res = ConfigResource(ResourceType.TOPIC, f"{group.ingress}.changelog", incremental_configs=[
        ConfigEntry("max.message.bytes", "1048588", incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(30)
    _wait(lambda: '"event":"ingress.resumed"' in a.log_text(), 60, "ingress resumed")
    dup = group.verdict(group.received())
    assert sum(dup.values()) == 0
