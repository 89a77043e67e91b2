"""``engine/rejoin.py``: the watch over a consumer that lost its partitions, on plain numbers.

The loop's side (a twin consumer that never rejoins is replaced; one that rejoins is left alone)
is in tests/unit/test_rejoin_twin.py.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.engine.rejoin import DEFAULT_SESSION_MS, REJOIN_MIN_S, RejoinWatch, rejoin_limit_s

LIMIT = 20.0


class Cluster:
    """Counts the questions; answers each with the next of ``answers`` (True when they run out)."""

    def __init__(self, *answers: bool) -> None:
        self.answers = list(answers)
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.answers.pop(0) if self.answers else True


def run(w: RejoinWatch, ask: Cluster, t0: float, t1: float, every: float = 1.0) -> tuple[str, float]:
    """Step the watch once a second from ``t0`` to ``t1``; the first reason and when it came."""
    t = t0
    while t <= t1:
        why = w.step(t, ask)
        if why:
            return why, t
        t += every
    return "", t1


def test_the_limit_follows_the_session_timeout() -> None:
    assert rejoin_limit_s({}) == 2 * DEFAULT_SESSION_MS / 1000
    assert rejoin_limit_s({"session.timeout.ms": "60000"}) == 120.0
    assert rejoin_limit_s({"session.timeout.ms": "6000"}) == REJOIN_MIN_S
    assert rejoin_limit_s({"session.timeout.ms": "six"}) == 2 * DEFAULT_SESSION_MS / 1000


def test_a_consumer_never_told_of_a_loss_is_never_asked_about() -> None:
    w, ask = RejoinWatch(LIMIT), Cluster()
    assert run(w, ask, 0, 1000) == ("", 1000)
    assert ask.asked == 0


def test_a_rejoin_within_the_limit_asks_nothing() -> None:
    w, ask = RejoinWatch(LIMIT), Cluster()
    w.lost(100.0)
    assert run(w, ask, 100, 100 + LIMIT - 1) == ("", 100 + LIMIT - 1)
    w.assigned()
    assert run(w, ask, 120, 1000) == ("", 1000)
    assert ask.asked == 0


def test_two_answers_a_limit_apart_declare_the_consumer_stuck() -> None:
    w, ask = RejoinWatch(LIMIT), Cluster()
    w.lost(100.0)
    why, at = run(w, ask, 100, 1000)
    assert "librdkafka issue 3437" in why and "20 s apart" in why
    assert ask.asked == 2 and at == 100 + 2 * LIMIT  # asked at 120 and at 140
    assert run(w, ask, at + 1, 1000) == ("", 1000), "disarmed once it said so"
    assert ask.asked == 2


def test_an_assignment_between_the_answers_disarms_it() -> None:
    w, ask = RejoinWatch(LIMIT), Cluster()
    w.lost(0.0)
    assert run(w, ask, 0, 30) == ("", 30)
    assert ask.asked == 1
    w.assigned()
    assert run(w, ask, 31, 500) == ("", 500)
    assert ask.asked == 1


def test_an_unreachable_cluster_starts_the_wait_again() -> None:
    """In an outage the consumer cannot rejoin: each unanswered question restarts the wait, and
    the consumer is declared stuck only two limits after the last one."""
    w, ask = RejoinWatch(LIMIT), Cluster(*[False] * 5)
    w.lost(0.0)
    why, at = run(w, ask, 0, 1000)
    assert why and ask.asked == 7
    assert at == 7 * LIMIT


def test_a_new_loss_restarts_the_count() -> None:
    w, ask = RejoinWatch(LIMIT), Cluster()
    w.lost(0.0)
    assert run(w, ask, 0, 25) == ("", 25)  # one answer so far
    w.lost(26.0)
    why, at = run(w, ask, 26, 1000)
    assert why and at == 26 + 2 * LIMIT


# -- property: against a reference of what must hold ------------------------------------------

EVENTS = st.lists(
    st.tuples(st.sampled_from(["lost", "assigned", "step"]), st.floats(0.0, 15.0), st.booleans()),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_it_fires_only_after_two_limits_of_an_answering_cluster(events: list[tuple[str, float, bool]]) -> None:
    """Whatever the order of losses, assignments and answers: a reason comes only while armed, at
    least two limits after the last loss and after the last unanswered question, only when the
    last two questions were answered, and then never again until the next loss."""
    w = RejoinWatch(LIMIT)
    now = 0.0
    lost_at: float | None = None  # the reference: armed since, or None
    unanswered_at = -1e9
    answered: list[bool] = []  # each question's answer since the last loss

    for kind, dt, ok in events:
        now += dt
        if kind == "lost":
            w.lost(now)
            lost_at, answered = now, []
        elif kind == "assigned":
            w.assigned()
            lost_at = None
        else:
            asked = len(answered)

            def answer(ok: bool = ok, out: list[bool] = answered) -> bool:
                out.append(ok)
                return ok

            why = w.step(now, answer)
            if len(answered) > asked and not answered[-1]:
                unanswered_at = now
            if why:
                assert lost_at is not None, "a reason while no loss was outstanding"
                assert now - lost_at >= 2 * LIMIT and now - unanswered_at >= 2 * LIMIT
                assert answered[-2:] == [True, True]
                lost_at = None
        assert w.armed == (lost_at is not None)
