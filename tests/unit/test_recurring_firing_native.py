"""The C firing path (sidecar/native/firing.c) against the Python reference (store/firings.py).

Two levels, on random schedules:

- one decision: stored RECURRING records with random schedules (mostly the common ``delay.every``
  with a start, an end, a count, a misfire policy, a state; else each way out of the common case:
  a cron, a zone, a value that is not plain digits, a duplicated header) and random clock
  readings; ``_native.fire_every`` either leaves a record to the reference (None) or answers
  exactly what the reference decides (``armed`` + ``decide`` + ``firing_headers``), and never
  fires what the reference would not fire now; ``_native.rearm_blob`` writes the stored headers
  ``state_blob`` writes;
- the whole loop: the same random schedules fired by the real ``Sidecar`` on the Kafka twin and
  virtual time, with random clock steps (late turns: misfires), a cancel and a replace, once with
  the C path (the publish run's firing, the re-arm run) and once all in Python
  (``Firings.native`` off): the delivered records, the changelog, the counters and every store
  file must come out identical.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from sidecar import contract as c
from sidecar.headers import MAX_EPOCH_MS
from sidecar.recurring.decide import decide
from sidecar.store import codec
from sidecar.store import firings as firings_mod
from sidecar.store.codec import encode_headers
from sidecar.store.firings import Firing, armed, firing_headers, state_blob
from tests.infra import needs_native
from tests.unit.helpers.intake import fields, files, ingest_store
from tests.unit.helpers.world import INGRESS, TARGET, World

pytestmark = needs_native

T0 = 1_800_000_000_000


def spec_headers(rng: random.Random, now: int) -> list[tuple[str, bytes | None]]:
    """A stored schedule's headers (as ``arm`` stores them): mostly the common delay.every."""
    every = rng.choice((1000, 1500, 5000, 60_000))
    start = now + rng.randint(-40_000, 20_000)
    h: list[tuple[str, bytes | None]] = [(c.EVERY, b"%d" % every)]
    if rng.random() < 0.8:
        h.append((c.START, b"%d" % start))
    if rng.random() < 0.3:
        h.append((c.END, b"%d" % (start + rng.randint(0, 30_000))))
    if rng.random() < 0.3:
        h.append((c.MAX_COUNT, b"%d" % rng.randint(1, 12)))
    if rng.random() < 0.3:
        h.append((c.MISFIRE, rng.choice((c.MISFIRE_SKIP, c.MISFIRE_FIRE_ONCE)).encode()))
    if rng.random() < 0.15:  # out of the C path's common case: the reference decides
        h += rng.choice((
            [(c.EVERY, b"2000")], [(c.TZ, b"UTC")], [(c.MISFIRE, b"later")],
            [(c.START, b"+5")], [(c.MAX_COUNT, b"0")], [(c.START, b"%d" % (MAX_EPOCH_MS + 1))],
        ))
    if rng.random() < 0.1:
        h = [(c.CRON, b"*/2 * * * * *"), *([(c.TZ, b"Europe/Paris")] if rng.random() < 0.5 else [])]
    rng.shuffle(h)
    return h


def stored_headers(rng: random.Random, now: int) -> list[tuple[str, bytes | None]]:
    """User headers, the schedule's and, after a first firing, the state, shuffled at times."""
    user = [(rng.choice(("app", "trace", "ü-name", "x")), rng.choice((None, b"", b"v" * rng.randint(1, 20))))
            for _ in range(rng.randint(0, 3))]
    state: list[tuple[str, bytes | None]] = []
    if rng.random() < 0.6:
        last = now + rng.randint(-60_000, 5_000)
        state = [(c.STATE_LAST, b"%d" % last), (c.STATE_FIRED, b"%d" % rng.randint(0, 12))]
        if rng.random() < 0.05:
            state[0] = (c.STATE_LAST, rng.choice((b"", None, b"-5")))
    out = [*user, *spec_headers(rng, now), *state]
    if rng.random() < 0.2:
        rng.shuffle(out)
    return out


@pytest.mark.parametrize("seed", range(3))
def test_one_firing_decided_in_c_is_the_reference_decision(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    _sc, st = ingest_store(tmp_path, "wheel")
    taken = fired = 0
    for i in range(1500):
        now = T0 + rng.randint(-5_000, 60_000)
        blob = encode_headers(stored_headers(rng, T0))
        pos = st.log.append(codec.head(rtype=codec.RECURRING, due_ms=now, enqueue_ms=T0 + rng.randint(-10_000, 10_000),
                                       src_offset=i, src_partition=0, target_partition=-1, retry_count=0, level=0),
                            b"s-%d" % i, b"out", b"k", b"v", blob)
        rec = st.log.read(pos)
        ref = 1000 + i
        try:
            a = armed(rec)
        except codec.CorruptRecord:
            a = None
        d = None if a is None else decide(a.schedule, a.last_ms, a.fired, now)
        fires = d is not None and d.fire_ms is not None
        got = firings_mod.native.fire_every(st, ref, rec, now)
        if a is not None:
            assert firings_mod.native.rearm_blob(blob, 77, 3) == state_blob(a, 77, 3)
            assert firings_mod.native.rearm_blob(blob, None, 0) == state_blob(a, None, 0)
        fired += fires
        if got is None:
            assert ref not in st.firings._handed
            continue
        assert fires and a is not None and d is not None and d.fire_ms is not None, \
            f"C fired what the reference does not fire now: {codec.decode_headers(blob)} at {now}"
        f = Firing(d.fire_ms, a.fired + 1, d.next_ms, d.missed)
        assert got == firing_headers(rec, a, f, st.topic_bytes)
        assert st.firings._handed.pop(ref) == (None, f, False)
        taken += 1
    assert fired > 300 and taken > 0.6 * fired  # the C path takes most of the firings
    st.close()


def run_world(root: Path, seed: int, native: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """Random schedules fired by the real loop on virtual time; what it delivered and left."""
    monkeypatch.setattr(firings_mod, "NATIVE", native)
    rng = random.Random(seed)
    w = World(root, partitions=1)
    w.clock.now_ms = T0
    sc = w.sidecar("a")
    by_c = 0
    real = firings_mod.Firings._settled

    def counting(self: firings_mod.Firings, ref: int) -> Any:
        nonlocal by_c
        got = real(self, ref)
        by_c += got is not None and got[0] is None
        return got

    monkeypatch.setattr(firings_mod.Firings, "_settled", counting)
    for i in range(300):
        user = [("app", b"%d" % i)] if rng.random() < 0.5 else []
        w.cluster.append(INGRESS, 0, b"k%d" % i, b"v%d" % i, [
            (c.TARGET_TOPIC, TARGET.encode()), (c.ID, b"s-%d" % i), *user, *spec_headers(rng, T0 + 3_000)])
    steps = 0
    while w.clock.now_ms < T0 + 90_000:
        if steps == 200:  # a cancel and a replace while firings are in flight
            w.cluster.append(INGRESS, 0, b"c", None, [(c.CANCEL, b"s-1")])
            w.cluster.append(INGRESS, 0, b"r", b"new", [(c.TARGET_TOPIC, TARGET.encode()), (c.ID, b"s-2"),
                                                        (c.REPLACE, b"true"), (c.EVERY, b"3000")])
        sc.turn()
        for _s, _j, fut, _w in list(sc.durability.jobs.values()):
            fut.result()
        w.clock.advance(rng.choice((5, 10, 10, 50, 400, 2_500)))
        steps += 1
    delivered = [(m.key(), m.value(), m.headers(), m.timestamp()) for m in w.delivered()]
    changelog = [(m.key(), m.value()) for m in w.cluster.records(f"{INGRESS}.changelog")]
    counters = fields(sc.counters)
    looked_up = [{k: v for k, v in sc.lookup(b"s-%d" % i)[1].items() if k not in ("instance", "wait_ms", "lookup_ms")}
                 for i in range(300)]
    sc.shutdown()
    # every file but the member's random id and the id index's (its merge passes run on a thread,
    # so its journals are cut wherever a pass happened to end: the look-ups above compare it)
    stored = {name: b for name, b in files(root / "a").items()
              if name != "instance-id" and not Path(name).name.startswith("ids.") and not name.endswith(".json")}
    checkpoints = {name: {k: v for k, v in orjson.loads(b).items() if k != "ids"}
                   for name, b in files(root / "a").items() if name.endswith("checkpoint.json")}
    return delivered, changelog, counters, stored, by_c, looked_up, checkpoints


@pytest.mark.parametrize("seed", range(2))
def test_the_loop_fires_the_same_with_the_c_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    ref = run_world(tmp_path / "ref", seed, False, monkeypatch)
    fast = run_world(tmp_path / "fast", seed, True, monkeypatch)
    assert ref[4] == 0 and fast[4] > 1000  # the C path re-armed most firings
    assert len(fast[0]) > 2000 and fast[0] == ref[0]
    assert fast[1] == ref[1]
    assert fast[2] == ref[2]
    differ = sorted(n for n in fast[3].keys() | ref[3].keys() if fast[3].get(n) != ref[3].get(n))
    assert not differ, differ
    assert fast[5] == ref[5] and fast[6] == ref[6]
