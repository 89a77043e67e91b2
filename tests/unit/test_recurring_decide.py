"""The cheap firing path equals the reference functions it stands for, on random inputs:

- ``decide`` == ``misfire.catch_up`` plus ``timeline.next_fire`` after the latest due time (with the
  firings made counted as the firing path counts them), for ``delay.every`` (its arithmetic path)
  and cron expressions in zones with DST, with start, end, max-count, both misfire policies and
  any last firing, count and clock;
- ``spec.stored_schedule`` (a cached shape plus the times) == ``parse_schedule`` for random stored
  specs, valid or not (bad times, bad shapes, duplicates), asked repeatedly so the cache answers.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar import contract as c
from sidecar.headers import MAX_EPOCH_MS
from sidecar.recurring import cronexpr
from sidecar.recurring.decide import Decision, decide
from sidecar.recurring.misfire import catch_up
from sidecar.recurring.spec import Schedule, parse_schedule, stored_schedule
from sidecar.recurring.timeline import next_fire

T0 = 1_729_983_600_000  # 2024-10-26T23:00Z, two hours before Paris falls back
H = 3_600_000


def reference(s: Schedule, last: int | None, fired: int, now: int, grace: int) -> Decision | None:
    cu = catch_up(s, last, fired, now, grace)
    if cu is None:
        return None
    made = fired + 1 if cu.fire_ms is not None else fired
    return Decision(cu.fire_ms, cu.latest_ms, cu.due, cu.missed, next_fire(s, cu.latest_ms, made))


schedules = st.builds(
    lambda kind, every, tz, start, length, max_count, misfire: Schedule(
        None if kind == "every" else cronexpr.parse(kind), every if kind == "every" else None,
        "UTC" if kind == "every" else tz, start, None if length is None else start + length, max_count, misfire),
    st.sampled_from(["every", "every", "*/7 * * * * *", "*/5 * * * *", "30 2 * * *", "0 */2 * * *"]),
    st.one_of(st.integers(1000, 10_000), st.integers(1000, 3 * H)),
    st.sampled_from(["UTC", "Europe/Paris", "America/New_York"]),
    st.integers(T0 - 2 * H, T0 + 2 * H),
    st.one_of(st.none(), st.integers(0, 6 * H)),
    st.one_of(st.none(), st.integers(1, 6)),
    st.sampled_from(["fire-once", "skip"]),
)


@settings(max_examples=400, deadline=None)
@given(schedules, st.one_of(st.none(), st.integers(-3 * H, 6 * H)), st.integers(0, 7), st.integers(-H, 8 * H),
       st.sampled_from([0, 1000, 60_000]))
def test_decide_equals_catch_up_and_next_fire(s: Schedule, last: int | None, fired: int, now: int, grace: int) -> None:
    last_ms = None if last is None else T0 + last
    assert decide(s, last_ms, fired, T0 + now, grace) == reference(s, last_ms, fired, T0 + now, grace)


def test_decide_at_the_edges_of_time() -> None:
    """The last representable firing and an end on a firing: no next, as the reference says."""
    for s in (Schedule(None, 1000, "UTC", MAX_EPOCH_MS - 2500, None, None, "fire-once"),
              Schedule(None, 1000, "UTC", T0, T0 + 5000, None, "skip"),
              Schedule(None, 1000, "UTC", T0, None, 3, "fire-once")):
        for last in (None, s.start_ms, s.start_ms + 1000, s.start_ms + 2000):
            for fired in (0, 1, 2, 3):
                for now in (s.start_ms, s.start_ms + 1999, s.start_ms + 2000, s.start_ms + 10_000, MAX_EPOCH_MS):
                    assert decide(s, last, fired, now) == reference(s, last, fired, now, 1000)


times = st.one_of(
    st.integers(0, MAX_EPOCH_MS + 5).map(lambda v: b"%d" % v),
    st.sampled_from([b"", b"-5", b"+5", b" 5", b"05", b"0", b"1" * 19, b"12a", b"\xff"]),
    st.none(),
)
shapes = st.sampled_from([
    ((c.EVERY, b"60000"),), ((c.EVERY, b"1000"), (c.MISFIRE, b"skip")), ((c.CRON, b"* * * * *"),),
    ((c.CRON, b"0 7 * * *"), (c.TZ, b"Europe/Paris"), (c.MISFIRE, b"fire-once")), ((c.CRON, b"@daily"),),
])
extras = st.lists(st.one_of(  # faults beside a valid shape, now and then
    st.tuples(st.just(c.EVERY), st.sampled_from([b"60000", b"999", b"x"])),
    st.tuples(st.just(c.CRON), st.sampled_from([b"61 * * * *", b"*/5 * * * *"])),
    st.tuples(st.just(c.TZ), st.sampled_from([b"UTC", b"Nowhere/Else"])),
    st.tuples(st.just(c.MISFIRE), st.sampled_from([b"skip", b"later"])),
), max_size=1)
stamps = st.lists(st.tuples(st.sampled_from([c.START, c.END, c.MAX_COUNT]), times), max_size=4)
specs = st.builds(lambda shape, extra, ts, order: tuple(sorted([*shape, *extra, *ts], key=lambda h: order.index(h[0]))),
                  shapes, extras, stamps, st.permutations(list(c.RECURRING_HEADERS)))


@settings(max_examples=600, deadline=None)
@given(specs, st.integers(-1, 2 * 10**12))
def test_stored_schedule_equals_parse_schedule(spec: tuple[tuple[str, bytes | None], ...], ts: int) -> None:
    want = parse_schedule({**dict(spec), c.ID: b"sched-1"}, ts)
    for _ in range(2):  # the second answer comes from the shape cache
        assert stored_schedule(spec, ts) == want
