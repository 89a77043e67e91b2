"""Fair turns between tenants: how one loop turn's publish budget is shared between the tenants
whose records are due, so that one tenant's mass expiry or backlog cannot make another's late.

A tenant (its ingress topic: sidecar/tenants.py) publishes from its *sources*, the stores of its
ingress partitions. ``take(source, n)`` hands out up to ``n`` of a source's due records and says
how many it did; fewer than asked means the source has nothing more due (or the producer cannot
take more: ``halted``). :meth:`FairTurns.turn` shares a turn's budget between the tenants by
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

**Order**: the tenant handed the fewest records in the previous turn goes first (ties rotate).
The order does not change how many each gets, only when: a light tenant (a paced stream of a few
records per turn) has its records handed out at the start of the turn's publishing, before a heavy
neighbour's share, and finds the in-flight room the delivery reports freed since the last turn.
A neighbour's mass expiry then adds about one turn to its lateness, not the neighbour's drain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar

S = TypeVar("S")  # a source: a store of an ingress partition (anything, to the tests)


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

    __slots__ = ("_last", "_turns")

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self._turns = 0

    def turn(self, budget: int, tenants: Mapping[str, Sequence[S]], take: Callable[[S, int], int],
             halted: Callable[[], bool]) -> dict[str, int]:
        """Share ``budget`` between ``tenants`` (name -> its sources, in a stable order); returns
        what each tenant handed out."""
        self._turns += 1
        turns = self._turns
        names = list(tenants)
        if len(names) == 1:  # one tenant: the whole budget, nothing to share
            name = names[0]
            self._last = {name: _Cursor(tenants[name], turns).take(budget, take, halted)}
            return self._last
        last = self._last
        n = len(names)
        order = sorted(range(n), key=lambda j: (last.get(names[j], 0), (j - turns) % n))
        cursors = {names[j]: _Cursor(tenants[names[j]], turns) for j in order}
        given = dict.fromkeys(cursors, 0)
        active = list(cursors)
        left = budget
        while left > 0 and active:
            share = max(1, left // len(active))
            still = []
            for name in active:
                ask = min(share, left)
                if ask <= 0:
                    still.append(name)  # the budget ran out before its part: it still has records
                    continue
                got = cursors[name].take(ask, take, halted)
                given[name] += got
                left -= got
                if halted():
                    self._last = given
                    return given
                if got >= ask:
                    still.append(name)
            active = still
        self._last = given
        return given
