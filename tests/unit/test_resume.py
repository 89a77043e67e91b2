"""store/resume.py against a model of a partition's history: each ingress offset stored before
the checkpoint, published from the intake (acknowledged or not by the crash), stored after it, or
storing nothing (a duplicate id). Whatever the history, ingress resumes at or before every
offset the store does not hold, and of what it consumes again it drops exactly what it holds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.store.resume import Resume

# what became of an ingress offset: before the checkpoint (its snapshot at ``below``) or after
STORED, DIRECT_ACKED, DIRECT_UNACKED, NOTHING = "stored", "direct-acked", "direct-unacked", "nothing"


@st.composite
def histories(draw: st.DrawFn) -> tuple[int, list[str]]:
    fates = draw(st.lists(st.sampled_from([STORED, DIRECT_ACKED, DIRECT_UNACKED, NOTHING]), max_size=40))
    below = draw(st.integers(0, len(fates)))
    return below, fates


@given(histories())
def test_resume_consumes_again_what_the_store_lacks_and_drops_what_it_holds(h: tuple[int, list[str]]) -> None:
    below, fates = h
    # the checkpoint names the records published from the intake and unreported at its snapshot;
    # an unacknowledged one before it was unreported then too; an acknowledged one may have been
    direct = [o for o, f in enumerate(fates[:below]) if f == DIRECT_UNACKED]
    stored_after = {o for o, f in enumerate(fates) if o >= below and f == STORED}
    r = Resume.of(below, direct, stored_after)
    start = r.offset()
    assert start is not None
    for o, fate in enumerate(fates):
        held = fate == STORED or (o < below and fate != DIRECT_UNACKED)
        if not held:
            # the store lacks it (or its publish may be unacknowledged): consumed again and kept
            if fate == DIRECT_UNACKED or o >= below:
                assert start <= o and not r.drops(o), (o, fate)
        elif o >= start:
            assert r.drops(o), (o, fate)  # held: consumed again, dropped
    assert r.held_to() is not None and r.held_to() >= below
    assert all(not r.drops(o) for o in range(r.end, r.end + 5))
    assert r.needed(start) or not any(r.drops(o) for o in range(start, r.end))  # no skip kept: none dropped


@given(st.sets(st.integers(0, 60)), st.integers(0, 60) | st.none())
def test_a_checkpoint_without_a_direct_list_resumes_after_the_log(stored: set[int], below: int | None) -> None:
    """Nothing was published from the intake after it: the store holds every offset up to its
    log's last record (the rule before records were published from the intake)."""
    r = Resume.after(below, stored)
    if below is None and not stored:
        assert r.offset() is None
        return
    expect = max(below or 0, max(stored, default=-1) + 1)
    assert r.offset() == expect == r.held_to()
    assert all(r.drops(o) for o in range(expect)) and not r.drops(expect)


def test_the_changelog_raises_what_is_held_but_never_past_a_direct_one() -> None:
    r = Resume.of(10, [4], {10, 11, 13}).raised(20)
    assert r.below == 20 and r.drops(5) and r.drops(12) and not r.drops(4) and not r.drops(20)
    assert r.raised(15) is r and Resume.of(None, None, set()).raised(None).offset() is None
    # a store that holds nothing (a restore's, before any): from the group's offset, nothing dropped
    none = Resume.none()
    assert none.offset() is None and not none.needed(None) and not none.drops(0)
    assert none.raised(20).offset() == 20 and none.raised(20).drops(19)
