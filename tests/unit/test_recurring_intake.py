"""Recurring records through the C intake (``_native.ingest_run``) against the reference path.

The common recurring record (``delay.every`` with a ``delay.id``, an optional ``delay.start``,
nothing else of a schedule) is stored by the C run, as store/firings.py ``arm`` stores it; any
other (a cron, a zone, an end, a count, a misfire policy, a replace, bad input) is handed back at
that record. Random batches mixing them with one-shot requests and cancels are fed to the real
``Ingress`` with the fast path on and off (test_ingest_fast.py's ``run``: the same stores, index
growth, hand-outs, settles and checkpoints), and every file, every plain field, the counters and
the history events must come out identical. Then a stored record fires as the reference says.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from sidecar import contract as c
from sidecar.engine.stores import store_key
from sidecar.headers import MAX_EPOCH_MS
from sidecar.store import codec
from sidecar.store import partition as partition_mod
from sidecar.store.firings import armed
from tests.infra import needs_native
from tests.unit import test_ingest_fast as fast_test
from tests.unit.helpers.intake import TOPIC, Msg, ingest_store

pytestmark = needs_native

T0 = fast_test.T0
one_shot_batches = fast_test.batches  # (the test below puts recurring_batches in its place)


def schedule_headers(rng: random.Random, now: int, rid: bytes) -> list[tuple[str, bytes | None]]:
    """A recurring record's headers: mostly the common case, else each way out of it."""
    h: list[tuple[str, bytes | None]] = [(c.TARGET_TOPIC, b"out"), (c.ID, rid)]
    every = str(rng.choice((1000, 5000, 60_000, 3_600_000))).encode()
    r = rng.random()
    if r < 0.55:
        h.append((c.EVERY, every))
        if rng.random() < 0.7:
            h.append((c.START, str(now + rng.choice((-90_000, -5, 0, 700, 30_000, 2 * 3_600_000))).encode()))
    elif r < 0.65:
        h.append((c.CRON, rng.choice((b"* * * * *", b"*/5 * * * * *", b"0 7 * * *"))))
        if rng.random() < 0.5:
            h.append((c.TZ, b"Europe/Paris"))
    elif r < 0.8:  # the common case plus one header it leaves to the reference path
        h += [(c.EVERY, every), rng.choice(((c.END, b"%d" % (now + 86_400_000)), (c.MAX_COUNT, b"3"),
                                            (c.MISFIRE, b"skip"), (c.REPLACE, b"true"), (c.TZ, b"UTC")))]
    else:  # bad input, each to the DLQ with its reason (or a one-shot delay beside the schedule)
        h += rng.choice((
            [(c.EVERY, b"999")], [(c.EVERY, b"1e3")], [(c.EVERY, b"")], [(c.EVERY, b"5000"), (c.DELAY_MS, b"5")],
            [(c.EVERY, b"5000"), (c.START, b"%d" % (MAX_EPOCH_MS + 1))], [(c.START, b"%d" % now)],
            [(c.EVERY, b"5000"), (c.START, b"%d" % (now + 500 * 86_400_000))],  # beyond the maximum delay
            [(c.EVERY, b"5000"), (c.START, b"-5")], [(c.EVERY, b"5000"), (c.CRON, b"* * * * *")],
        ))
        if rng.random() < 0.2:
            h.remove((c.ID, rid))  # a schedule needs an id
    if rng.random() < 0.3:
        h.insert(rng.randint(0, len(h)), ("app", b"x" * rng.randint(0, 30)))
    rng.shuffle(h)
    return h


def recurring_batches(seed: int, n_batches: int, topics: tuple[str, ...] = (TOPIC,)) -> list[tuple[int, list[Any]]]:
    """test_ingest_fast's batches with about half their records made recurring (partition 0 and 1)."""
    rng = random.Random(seed + 7)
    out = []
    for now, msgs in one_shot_batches(seed, n_batches, topics):
        mixed: list[Any] = []
        for m in msgs:
            if m.error() is None and m.partition() in (0, 1) and rng.random() < 0.5:
                rid = b"sched-%d" % rng.randint(0, 400)  # some ids reused: duplicates, ids pending or done
                ts = m.timestamp()
                mixed.append(Msg(m.partition(), m.offset(), ts, m.key(), m.value(), schedule_headers(rng, now, rid),
                                 topic=m.topic()))
            else:
                mixed.append(m)
        out.append((now, mixed))
    return out


@pytest.mark.parametrize("scheduler", ["wheel", "levels"])
@pytest.mark.parametrize("seed", range(2))
def test_recurring_fast_intake_matches_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheduler: str, seed: int
) -> None:
    taken: list[int] = []
    real = partition_mod.PartitionStore.ingest_many

    def counting(self: partition_mod.PartitionStore, msgs: list[Any], start: int, now_ms: int,
                 topic: str | None, direct: Any = None) -> int:
        end = real(self, msgs, start, now_ms, topic, direct)
        taken.extend(i for i in range(start, end) if c.EVERY in dict(msgs[i].headers() or ()))
        return end

    monkeypatch.setattr(fast_test, "batches", recurring_batches)
    monkeypatch.setattr(partition_mod.PartitionStore, "ingest_many", counting)
    ref = fast_test.run(tmp_path / "ref", scheduler, seed, False, monkeypatch)
    assert not taken
    fast = fast_test.run(tmp_path / "fast", scheduler, seed, True, monkeypatch)
    assert len(taken) > 40  # the C run stored a good part of the recurring records
    ref_states, ref_final, ref_counters, ref_files, ref_history = ref
    fast_states, fast_final, fast_counters, fast_files, fast_history = fast
    assert ref_counters["dlq"][c.BAD_SCHEDULE] > 0 and ref_counters["dlq"][c.BAD_HEADER] > 0
    assert (fast_counters, fast_history) == (ref_counters, ref_history)
    differ = [n for n, (a, b) in enumerate(zip(fast_states, ref_states, strict=True)) if a != b]
    assert not differ, f"the state after batches {differ[:5]} differs"
    assert fast_final == ref_final
    files_differ = sorted(n for n in fast_files.keys() | ref_files.keys() if fast_files.get(n) != ref_files.get(n))
    assert not files_differ, files_differ


@pytest.mark.parametrize("start", [None, T0 + 30_000])
def test_a_schedule_stored_by_the_c_run_is_armed_at_its_start(tmp_path: Path, start: int | None) -> None:
    """The C run stores the RECURRING record ``arm`` would: due at the start (the record's timestamp
    without ``delay.start``), the user's headers then the schedule's, which read back as the schedule."""
    sc, st = ingest_store(tmp_path, "wheel")
    st.rules.checked_targets.add("out")
    sc.stores[store_key(st)] = st
    h: list[tuple[str, bytes | None]] = [
        ("app", b"1"), (c.TARGET_TOPIC, b"out"), (c.ID, b"s1"), (c.EVERY, b"60000"),
        *([] if start is None else [(c.START, b"%d" % start)]),
    ]
    # the timer log's first entry: the Python path opens its file (then the C run appends)
    sc.ingress.ingest([Msg(0, 0, (1, T0), b"k", b"v", [(c.TARGET_TOPIC, b"out"), (c.DELAY_MS, b"20")])])
    assert st.ingest_many([Msg(0, 1, (1, T0 + 5), b"k", b"v", h)], 0, T0, TOPIC) == 1
    [rec] = [r for _ref, r in st.sched.due(T0 + 10 * 60_000, 10) if r.id == b"s1"]
    assert rec.rtype == codec.RECURRING
    assert rec.due_ms == (T0 + 5 if start is None else start)
    a = armed(rec)
    assert a.user == (("app", b"1"),)
    assert a.schedule.every_ms == 60_000 and a.schedule.start_ms == rec.due_ms and a.last_ms is None
    assert a.spec == ((c.EVERY, b"60000"), *([] if start is None else [(c.START, b"%d" % start)]))
    st.close()
