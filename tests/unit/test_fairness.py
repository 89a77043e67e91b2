"""The turn order between tenants (sidecar/engine/fairness.py) against a reference model: a turn's
budget handed out one record at a time, round-robin over the tenants that still have records due.
Properties: the shares match the reference to within one record (max-min fair), the budget is
spent while records are due (work-conserving), no tenant with records due is starved, a tenant
alone gets the whole budget, and a halted producer ends the turn."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.engine.fairness import FairTurns


class Source:
    """A partition's scheduler, to the policy: ``left`` records due."""

    def __init__(self, tenant: str, index: int, left: int) -> None:
        self.tenant, self.index, self.left = tenant, index, left


class Producer:
    """Hands records out of sources, up to ``room`` in total (then halted), and logs the calls."""

    def __init__(self, room: int | None = None) -> None:
        self.room = room
        self.calls: list[tuple[str, int, int]] = []  # (tenant, source index, asked)
        self.rooms: list[int] = []  # the room left after each call (with a room limit)

    def take(self, src: Source, n: int) -> int:
        assert n > 0
        self.calls.append((src.tenant, src.index, n))
        got = min(n, src.left)
        if self.room is not None:
            got = min(got, self.room)
            self.room -= got
            self.rooms.append(self.room)
        src.left -= got
        return got

    def halted(self) -> bool:
        return self.room is not None and self.room <= 0


def reference(budget: int, demand: dict[str, int]) -> dict[str, int]:
    """One record at a time, round-robin over the tenants with records left."""
    given = dict.fromkeys(demand, 0)
    left = budget
    while left > 0:
        progressed = False
        for t in demand:
            if left > 0 and given[t] < demand[t]:
                given[t] += 1
                left -= 1
                progressed = True
        if not progressed:
            break
    return given


def tenants_of(layout: list[list[int]]) -> dict[str, list[Source]]:
    return {f"t{i}": [Source(f"t{i}", j, n) for j, n in enumerate(srcs)] for i, srcs in enumerate(layout)}


LAYOUTS = st.lists(st.lists(st.integers(0, 3000), min_size=0, max_size=5), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(layout=LAYOUTS, budget=st.integers(1, 12_000))
def test_one_turn_is_max_min_fair_and_work_conserving(layout: list[list[int]], budget: int) -> None:
    tenants = tenants_of(layout)
    demand = {t: sum(s.left for s in srcs) for t, srcs in tenants.items()}
    prod = Producer()
    given_ = FairTurns[Source]().turn(budget, tenants, prod.take, prod.halted)
    ref = reference(budget, demand)
    assert sum(given_.values()) == sum(ref.values()) == min(budget, sum(demand.values()))
    for t in tenants:
        assert 0 <= given_[t] <= demand[t]
        assert abs(given_[t] - ref[t]) <= 1, (t, given_, ref)
        assert given_[t] == demand[t] - sum(s.left for s in tenants[t])  # what it says it handed out
        if given_[t] < demand[t]:  # records left: nobody got more than one record more
            assert all(given_[t] >= g - 1 for g in given_.values())


@settings(max_examples=100, deadline=None)
@given(layout=LAYOUTS, budget=st.integers(1, 12_000), turns=st.integers(1, 6), refill=st.integers(0, 500))
def test_no_tenant_with_records_due_is_starved(layout: list[list[int]], budget: int, turns: int,
                                               refill: int) -> None:
    """Over several turns, with new records falling due in between: every tenant with records
    due at a turn's start gets at least min(its due, budget // tenants with records due)."""
    tenants = tenants_of(layout)
    fair = FairTurns[Source]()
    for _ in range(turns):
        demand = {t: sum(s.left for s in srcs) for t, srcs in tenants.items()}
        busy = sum(1 for d in demand.values() if d > 0)
        prod = Producer()
        given_ = fair.turn(budget, tenants, prod.take, prod.halted)
        for t, d in demand.items():
            if d > 0:
                assert given_[t] >= min(d, budget // busy), (t, given_, demand)
        for srcs in tenants.values():
            if srcs:
                srcs[0].left += refill


@settings(max_examples=200, deadline=None)
@given(sources=st.lists(st.integers(0, 5000), min_size=1, max_size=8), budget=st.integers(1, 12_000),
       turns=st.integers(1, 4))
def test_one_tenant_gets_the_whole_budget_from_rotating_partitions(sources: list[int], budget: int,
                                                                   turns: int) -> None:
    """One tenant: what the loop did before tenants (the whole budget, the starting partition
    rotating each turn, each partition drained in order until the budget is spent)."""
    tenants = tenants_of([sources])
    fair = FairTurns[Source]()
    for turn in range(1, turns + 1):
        srcs = tenants["t0"]
        due = sum(s.left for s in srcs)
        prod = Producer()
        assert fair.turn(budget, tenants, prod.take, prod.halted) == {"t0": min(budget, due)}
        k = turn % len(srcs)
        order = [s.index for s in srcs[k:] + srcs[:k]]
        asked = [i for _t, i, _n in prod.calls]
        assert asked == order[: len(asked)]  # each partition once, from the rotating start


@settings(max_examples=200, deadline=None)
@given(layout=LAYOUTS, budget=st.integers(1, 12_000), room=st.integers(1, 5000))
def test_a_halted_producer_ends_the_turn(layout: list[list[int]], budget: int, room: int) -> None:
    tenants = tenants_of(layout)
    prod = Producer(room)
    given_ = FairTurns[Source]().turn(budget, tenants, prod.take, prod.halted)
    assert sum(given_.values()) <= room
    if prod.halted():
        assert sum(given_.values()) == room
        assert prod.rooms.index(0) == len(prod.rooms) - 1
    else:  # not halted: as without a room limit
        demand = {t: sum(s.left for s in srcs) for t, srcs in tenants.items()}
        assert sum(given_.values()) == min(budget, sum(demand.values()) + sum(given_.values()))


def test_the_lightest_tenant_of_the_previous_turn_goes_first() -> None:
    """A mass expiry of tenant a (many partitions) beside a trickle of tenant b: b's records are
    handed out first in every turn after the first, and all of them; a gets the rest."""
    a = [Source("a", j, 1_000_000) for j in range(6)]
    b = [Source("b", 0, 0)]
    fair = FairTurns[Source]()
    for turn in range(10):
        b[0].left += 3
        prod = Producer()
        given_ = fair.turn(5000, {"a": a, "b": b}, prod.take, prod.halted)
        assert given_ == {"a": 4997, "b": 3}
        if turn > 0:
            assert prod.calls[0][0] == "b"


def test_of_tenants_handed_as_few_the_one_with_less_in_flight_goes_first() -> None:
    """A full window ended the previous turn with nothing handed out (a's mass expiry holds the
    whole window): the next turn, with b's records due too, starts with b, which has nothing in
    flight, whatever the rotation, not with a, whose chunk would first serve a batch of reports."""
    a = [Source("a", 0, 1_000_000)]
    b = [Source("b", 0, 0)]
    fair = FairTurns[Source]()
    fair.handed("a", 20_000)
    for _turn in range(6):
        full = Producer(room=0)
        assert fair.turn(5000, {"a": a}, full.take, full.halted) == {"a": 0}
        b[0].left += 3
        prod = Producer()
        assert fair.turn(5000, {"a": a, "b": b}, prod.take, prod.halted) == {"a": 4997, "b": 3}
        assert prod.calls[0][0] == "b"
        fair.settled("b", 3)


def test_a_tenant_with_many_partitions_gets_one_share() -> None:
    a = [Source("a", j, 10_000) for j in range(16)]
    b = [Source("b", 0, 10_000)]
    prod = Producer()
    assert FairTurns[Source]().turn(5000, {"a": a, "b": b}, prod.take, prod.halted) == {"a": 2500, "b": 2500}


class Window:
    """The producer's in-flight window: ``size`` records at most, counted per tenant (exactly:
    the test settles what it delivers)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.by: dict[str, int] = {}

    @property
    def total(self) -> int:
        return sum(self.by.values())

    def take(self, src: Source, n: int) -> int:
        got = min(n, src.left, self.size - self.total)
        src.left -= got
        self.by[src.tenant] = self.by.get(src.tenant, 0) + got
        return got

    def halted(self) -> bool:
        return self.total >= self.size


@settings(max_examples=150, deadline=None)
@given(tenants=st.integers(2, 5), size=st.integers(50, 5000), budget=st.integers(1, 5000),
       turns=st.lists(st.tuples(st.lists(st.integers(0, 6000), min_size=5, max_size=5),
                                st.lists(st.floats(0, 1), min_size=5, max_size=5)), min_size=1, max_size=8))
def test_every_present_tenant_finds_its_reserved_room_in_the_window(
        tenants: int, size: int, budget: int, turns: list[tuple[list[int], list[float]]]) -> None:
    """Tenants with records pending share ``max-in-flight``: whatever the others hold or have due,
    each finds at least the least of its reserves (window // 32, at most its guarantee
    window // (2 * tenants)) minus what it has in flight, within its part of the budget; the
    window is never overrun. (Its reserve's growth with its flow: the test after the next.)"""
    names = [f"t{i}" for i in range(tenants)]
    srcs = {t: [Source(t, 0, 0)] for t in names}
    win = Window(size)
    fair = FairTurns[Source](size)
    guarantee = size // (2 * tenants)

    def reserve(_used: int) -> int:
        return min(guarantee, size // 32)
    for arrivals, delivered in turns:
        for i, t in enumerate(names):
            srcs[t][0].left += arrivals[i]
        due = {t: srcs[t][0].left for t in names}
        held = dict(win.by)
        busy = sum(1 for d in due.values() if d > 0)
        given_ = fair.turn(budget, srcs, win.take, win.halted, set(names), lambda: win.total)
        assert win.total <= size
        for t in names:
            if due[t] > 0:
                floor = min(due[t], max(0, reserve(held.get(t, 0)) - held.get(t, 0)), budget // busy)
                assert given_[t] >= floor, (t, given_, due, held, guarantee)
        for i, t in enumerate(names):  # some of each tenant's records are delivered
            n = int(win.by.get(t, 0) * delivered[i])
            win.by[t] = win.by.get(t, 0) - n
            fair.settled(t, n)


def test_a_mass_expiry_leaves_a_present_neighbour_its_room() -> None:
    """Tenant a's mass expiry with b present but nothing due: a fills the window but b's
    reserve; b's records falling due next turn find it, before a's reports come back."""
    win = Window(20_000)
    fair = FairTurns[Source](20_000)
    a, b = [Source("a", 0, 1_000_000)], [Source("b", 0, 0)]
    for _ in range(5):
        fair.turn(5000, {"a": a, "b": b}, win.take, win.halted, {"a", "b"}, lambda: win.total)
    assert win.by["a"] == 20_000 - 625  # b's reserve with nothing in flight: 20,000 // 32
    b[0].left = 40
    assert fair.turn(5000, {"a": a, "b": b}, win.take, win.halted, {"a", "b"}, lambda: win.total)["b"] == 40


def test_a_neighbours_reserve_follows_what_it_has_in_flight() -> None:
    """b's reserve is twice its records in flight, up to its guarantee (20,000 // 4): a's mass
    expiry leaves it room to double its flow each turn, and no more than that."""
    win = Window(20_000)
    fair = FairTurns[Source](20_000)
    a, b = [Source("a", 0, 1_000_000)], [Source("b", 0, 400)]
    fair.turn(5000, {"b": b}, win.take, win.halted, {"b"}, lambda: win.total)  # b alone: 400 in flight
    for _ in range(5):
        fair.turn(5000, {"a": a, "b": b}, win.take, win.halted, {"a", "b"}, lambda: win.total)
    assert win.by == {"b": 400, "a": 20_000 - 800}  # b's reserve: 800, 400 of it free
    b[0].left = 3000
    assert fair.turn(5000, {"a": a, "b": b}, win.take, win.halted, {"a", "b"}, lambda: win.total)["b"] == 400
    win.by["a"] -= 10_000  # a's reports come back: b, the lighter, is offered the room first
    fair.settled("a", 10_000)
    assert fair.turn(10_000, {"a": a, "b": b}, win.take, win.halted, {"a", "b"}, lambda: win.total)["b"] == 2600


def test_a_tenant_alone_fills_the_whole_window() -> None:
    win = Window(20_000)
    fair = FairTurns[Source](20_000)
    a, b = [Source("a", 0, 1_000_000)], [Source("b", 0, 0)]
    for _ in range(5):
        fair.turn(5000, {"a": a, "b": b}, win.take, win.halted, {"a"}, lambda: win.total)
    assert win.total == 20_000
