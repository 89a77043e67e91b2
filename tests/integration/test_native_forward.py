"""The passthroughs with librdkafka driven from C (scripts/setup.d/80-native-forward.sh builds
them) on the session's broker, started as the bench starts them (``bench.workload.passthrough_cmd``
under ``KDS_BENCH_PASSTHROUGH``): ``native-forward`` (bench/micro/native_forward.c, the whole loop)
and ``python -m bench.passthrough --native-produce`` (bench/micro/hybrid_forward.c, the produce
side). Every record is copied once, in order, with its key, value (null ones too) and headers,
``-a N`` adds N headers after them, and the ``done`` event counts what was acknowledged.
Correctness only, never speed. Skipped without the builds, failed under ``CI=true``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import orjson
import pytest

from bench.passthrough import hybrid_dir
from bench.workload import PASSTHROUGH_ENV, passthrough_cmd
from tests.infra import needs
from tests.integration.harness import consume_until, create_topics, producer

BINARY = shutil.which("native-forward")
HYBRID = f"{sys.executable} -m bench.passthrough --native-produce"
pytestmark = [pytest.mark.integration,
              needs(BINARY is not None and any(hybrid_dir().glob("hybrid_forward*.so")),
                    "native-forward and hybrid_forward (scripts/setup.d/80-native-forward.sh)")]

N = 3_000


def _source(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]:
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]] = [
        (None if i % 7 == 0 else b"k%d" % i,
         None if i % 11 == 0 else b"v%d" % i * 3,
         [] if i % 5 == 0 else [("trace", b"%d" % i), ("delay.ms", b"0")])
        for i in range(N)]
    p = producer(bootstrap)
    for k, v, h in records:
        p.produce(topic, value=v, key=k, headers=h)
    assert p.flush(30) == 0
    return records


@pytest.mark.parametrize(("which", "added"), [("native", 0), ("native", 4), ("hybrid", 0)])
def test_every_record_copied_once_in_order(kafka_bootstrap: str, unique: str, which: str, added: int,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    source, target = f"nf-in-{unique}", f"nf-out-{unique}"
    create_topics(kafka_bootstrap, [source, target])
    records = _source(kafka_bootstrap, source)
    monkeypatch.setenv(PASSTHROUGH_ENV, f"{BINARY} -a {added}" if which == "native" else HYBRID)
    args = ["--bootstrap", kafka_bootstrap, "--source", source, "--target", target, "--count", str(N),
            "--group", f"nf-{unique}", "--timeout", "60"]
    cmd = passthrough_cmd(args)
    assert cmd is not None and cmd[0] == (BINARY if which == "native" else sys.executable)
    out = subprocess.run(cmd, capture_output=True, timeout=90)
    assert out.returncode == 0, out.stderr.decode()
    events = [orjson.loads(line) for line in out.stdout.splitlines()]
    assert [e["event"] for e in events] == ["ready", "done"]
    done = events[-1]
    assert (done["consumed"], done["acked"], done["failed"]) == (N, N, 0)
    assert done["cpu_s"] > 0
    got = consume_until(kafka_bootstrap, [target], N, timeout_s=30, settle_s=0.5)
    assert len(got) == N
    extra = [(f"delay.{'abcd'[j]}", b"1733500000000") for j in range(added)]
    for r, (k, v, h) in zip(got, records, strict=True):
        assert (r.key, r.value) == (k, v)
        assert r.header_list == [*h, *extra]


def test_a_bad_flag_is_named(unique: str) -> None:
    assert BINARY is not None
    out = subprocess.run([BINARY, "--bootstrap", "127.0.0.1:9", "--sauce", "x"], capture_output=True, timeout=30)
    assert out.returncode == 2
    assert b"--sauce" in out.stderr and b"accepted: --bootstrap" in out.stderr
