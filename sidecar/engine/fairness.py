"""Fair turns between tenants: how one loop turn's publish budget is shared between the tenants
whose records are due, so that one tenant's mass expiry or backlog cannot make another's late.

A tenant (its ingress topic: sidecar/tenants.py) publishes from its *sources*, the stores of its
ingress partitions that have a record due (the publisher leaves out the others: with ten tenants
and records arriving for one at a time, nine empty ``due`` calls per turn otherwise).
``take(source, n)`` hands out up to ``n`` of a source's due records and says how many it did;
fewer than asked means the source has nothing more due (or the producer cannot take more:
``halted``). :meth:`FairTurns.turn` shares a turn's budget between the tenants by
**progressive filling** (max-min fairness, round-robin with equal quanta):

1. every tenant still taking is offered an equal part of what is left of the budget (at least 1);
2. a tenant hands out what it has, up to its part, from its sources in order (the starting source
   rotates every turn, so no partition of a tenant starves its others); one that hands out less
   than offered has nothing more due and drops out for the rest of the turn;
3. what the dropped tenants left is offered again to the rest, until the budget is spent, no
   tenant has anything due, or ``halted()`` (``max-in-flight`` reached, the producer queue full).

So one tenant alone gets the whole budget (a single tenant publishes as before tenants existed);
a tenant with records due gets at least ``budget // n`` of them handed out per turn, ``n`` the
tenants with records due, whatever its neighbours have due (none is starved); no tenant that
still has records due gets more than one record fewer than another (max-min fair); and the budget
is never left unused while records are due (work-conserving). A tenant with many partitions gets
one share, not one per partition.

**Order**: the tenant handed the fewest records in the previous turn goes first; of those handed
as few, the one with fewer records in flight (ties rotate). A round that a full window ended hands
out nothing to anyone, so without the second key a neighbour at the whole window went first as
often as a paced stream, and its chunk's poll (a whole produce batch's reports, 10,000, 25-30 ms
on two busy cores) came before the stream's records.
The order does not change how many each gets, only when: a light tenant (a paced stream of a few
records per turn) has its records handed out at the start of the turn's publishing, before a heavy
neighbour's share, and finds the in-flight room the delivery reports freed since the last turn.
A neighbour's mass expiry then adds about one turn to its lateness, not the neighbour's drain.

**In-flight room** (``max-in-flight``) is shared too. Lateness is counted until a record is handed
to the producer, so a tenant must find room when its records fall due, not only a place in the
turn: a mass expiry fills the whole window within a turn or two, and the room the reports free
would then always go to whoever asks first. While ``n`` > 1 tenants are *present* (records
pending in their stores, or in flight), each has a *reserve* of the window: no tenant may take
room that another present tenant's reserve still needs (its reserve minus what it has in
flight). The reserve follows what the tenant uses: twice its records in flight at the turn's
start, at least ``max-in-flight // 32`` and at most its guarantee ``max-in-flight // (2n)``
(the least of them always kept free for its tenant; the grown ones count only in a turn that
starts with room enough for all of them). So a tenant whose flow grows finds the room to double
it every turn where the window allows (besides the room the reports free, which the
lightest tenant is offered first), and a light neighbour, a paced stream of a few records in
flight, keeps a few hundred records of the window free, not a share of it: with a fixed
``max-in-flight // (2n)`` for it, tenant a's 1M-record mass expiry beside tenant b's 1,000
records/s drained at 0.73-0.78 of a single tenant's rate (the window a quarter smaller), 1.03
with the window made 100,000. A tenant alone, or the only present one, may fill the whole
window, so one tenant publishes exactly as before. ``in_flight`` per tenant is counted
here from what the publisher says was handed out (``handed``) and settled (``settled``): an
estimate, since a record handed out and then parked, dead-lettered or dropped with a revoked
partition is never settled as a success. It is kept within the producer's exact total and reset
when that is 0, so a drift only weakens a guarantee; it never blocks a tenant beyond the window.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar

S = TypeVar("S")  # a source: a store of an ingress partition (anything, to the tests)
RESERVE_FLOOR = 32  # a present tenant's reserve is at least max-in-flight // RESERVE_FLOOR


class _Cursor(Generic[S]):
    """One tenant's sources for one turn, from a rotating start; a source that hands out less
    than asked is done for the turn (asking it again would cost an empty ``due`` call)."""

    __slots__ = ("i", "sources")

    def __init__(self, sources: Sequence[S], start: int) -> None:
        n = len(sources)
        k = start % n if n else 0
        self.sources = [*sources[k:], *sources[:k]]
        self.i = 0

    def take(self, want: int, take: Callable[[S, int], int], halted: Callable[[], bool]) -> int:
        given = 0
        sources = self.sources
        while given < want and self.i < len(sources):
            ask = want - given
            got = take(sources[self.i], ask)
            given += got
            if halted():
                break
            if got < ask:
                self.i += 1
        return given


class FairTurns(Generic[S]):
    """The turn order between tenants (see the module docstring); keeps only what the previous
    turn handed out per tenant and a rotation counter."""

    __slots__ = ("_last", "_turns", "in_flight", "window")

    def __init__(self, window: int | None = None) -> None:
        """``window``: ``max-in-flight`` (None: no in-flight sharing, the budget only)."""
        self._last: dict[str, int] = {}
        self._turns = 0
        self.window = window
        self.in_flight: dict[str, int] = {}  # tenant -> records handed out and not settled (an estimate)

    def handed(self, tenant: str, n: int) -> None:
        """``n`` of ``tenant``'s records went to the producer (``turn`` counts its own)."""
        if n > 0:
            self.in_flight[tenant] = self.in_flight.get(tenant, 0) + n

    def settled(self, tenant: str, n: int) -> None:
        """``n`` of ``tenant``'s records were delivered (their reports settled)."""
        left = self.in_flight.get(tenant, 0) - n
        if left > 0:
            self.in_flight[tenant] = left
        else:
            self.in_flight.pop(tenant, None)

    def _allowance(self, present: set[str], total_in_flight: Callable[[], int]) -> Callable[[str], int] | None:
        """What a tenant may take of the in-flight window now (see the module docstring), or None
        when there is nothing to share: one present tenant, or no window."""
        window = self.window
        if window is None:
            return None
        flight = self.in_flight
        total = total_in_flight()
        if total <= 0:
            flight.clear()
        else:
            for t, n in flight.items():
                if n > total:
                    flight[t] = total
        tenants = present | flight.keys()
        if len(tenants) <= 1:
            return None
        guarantee = window // (2 * len(tenants))
        floor = min(guarantee, window // RESERVE_FLOOR)
        # fixed for the turn: a reserve that grew with what its tenant took in this turn would eat
        # into the room the others' reserves keep
        reserve = {t: min(guarantee, max(floor, 2 * flight.get(t, 0))) for t in tenants}
        if sum(max(0, r - flight.get(t, 0)) for t, r in reserve.items()) > window - total:
            # the grown reserves are not all free now (others took the room meanwhile): the least
            # ones only, which always are (no turn lets a tenant take them)
            reserve = dict.fromkeys(tenants, floor)

        def allowance(tenant: str) -> int:
            held = sum(max(0, r - flight.get(t, 0)) for t, r in reserve.items() if t != tenant)
            return window - total_in_flight() - held

        return allowance

    def turn(self, budget: int, tenants: Mapping[str, Sequence[S]], take: Callable[[S, int], int],
             halted: Callable[[], bool], present: set[str] | None = None,
             total_in_flight: Callable[[], int] | None = None) -> dict[str, int]:
        """Share ``budget`` between ``tenants`` (name -> its sources, in a stable order); returns
        what each tenant handed out. ``present``: the tenants with records pending;
        ``total_in_flight``: the producer's exact count (both for the window's sharing)."""
        self._turns += 1
        turns = self._turns
        names = list(tenants)
        allowance = None
        if present is not None and total_in_flight is not None:
            allowance = self._allowance(present, total_in_flight)
        if len(names) == 1 and allowance is None:  # one tenant: the whole budget, nothing to share
            name = names[0]
            got = _Cursor(tenants[name], turns).take(budget, take, halted)
            self.handed(name, got)
            self._last = {name: got}
            return self._last
        last = self._last
        n = len(names)
        flight = self.in_flight
        order = sorted(range(n), key=lambda j: (last.get(names[j], 0), flight.get(names[j], 0), (j - turns) % n))
        cursors = {names[j]: _Cursor(tenants[names[j]], turns) for j in order}
        given = dict.fromkeys(cursors, 0)
        active = list(cursors)
        left = budget
        while left > 0 and active:
            share = max(1, left // len(active))
            still = []
            for name in active:
                ask = full = min(share, left)
                if ask <= 0:
                    still.append(name)  # the budget ran out before its part: it still has records
                    continue
                if allowance is not None:
                    ask = min(ask, allowance(name))  # what the others' guarantees leave it
                    if ask <= 0:
                        continue  # at its share of the window: done for this turn
                got = cursors[name].take(ask, take, halted)
                self.handed(name, got)
                given[name] += got
                left -= got
                if halted():
                    self._last = given
                    return given
                if got >= full:
                    still.append(name)
            active = still
        self._last = given
        return given


def due_sources(groups: Mapping[str, Sequence[S]], now: int, next_due: Callable[[S], int | None]) -> tuple[
        dict[str, list[S]], set[str]]:
    """Of each tenant's sources, those with a record due at ``now`` (``next_due``: the earliest
    pending record's due time, None for none): a turn's sources; and the tenants with records
    pending at all (``present``: their in-flight reserves). With ten tenants and records arriving
    for one at a time, asking the others was nine empty ``due`` calls per turn (10x the calls of
    one tenant for the same records)."""
    due: dict[str, list[S]] = {}
    present: set[str] = set()
    for tenant, group in groups.items():
        for source in group:
            d = next_due(source)
            if d is None:
                continue
            present.add(tenant)
            if d <= now:
                got = due.get(tenant)
                if got is None:
                    due[tenant] = [source]
                else:
                    got.append(source)
    return due, present
