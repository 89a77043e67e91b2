"""Property: a replace or cancel stored before a record's due time always wins.

Random sequences of schedule / replace / cancel / advance-time / checkpoint / crash-and-reopen /
graceful restart run against one PartitionStore (the ``Sim`` of test_partition_store.py: virtual
time, the crash as SIGKILL leaves it) under both schedulers, and against a reference model of the
contract: one pending version per id; a plain record under a pending id is a dropped duplicate;
a replace supersedes the pending version; a cancel removes it, or (nothing pending) drops every
later record of the id within the cancel horizon (here: the whole run); a version fires at the
first step at or after its due time.

The model also knows recovery's contract: versions pending at the checkpoint stay, and the log
after it is replayed in order (at-least-once: a version delivered since the checkpoint is pending
again, unless a later record or cancel of its id in the log supersedes it), and ingress records
after the last logged one are consumed again and judged anew.

Checked at every step: what the store hands out is exactly what the model fires at that step;
nothing superseded (replaced or cancelled) is ever handed out; a version is handed out again only
after a crash; never early. At the end, everything the model fired was handed out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar import contract as c
from sidecar.store.partition import IngressRecord
from tests.unit.helpers.store_sim import TOPIC, Sim

IDS = ["a", "b", "c"]
DELAYS = [0, 1000, 5000, 10_000]  # levels of the Sim's table: both schedulers commit the same due time

_op = st.one_of(
    st.tuples(st.just("send"), st.sampled_from(IDS), st.sampled_from(DELAYS), st.booleans()),
    st.tuples(st.just("cancel"), st.sampled_from(IDS)),
    st.tuples(st.just("advance"), st.sampled_from([100, 500, 900, 1000, 3000])),
    st.tuples(st.just("crash")),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("restart")),
)


@dataclass
class Model:
    now: int
    pending: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (version, due)
    precancelled: set[str] = field(default_factory=set)
    superseded: set[int] = field(default_factory=set)
    fired: set[int] = field(default_factory=set)
    # what the commit log holds after the last checkpoint, in order: (id, version, due); a cancel
    # has version -1. Recovery replays it over what the checkpoint restored.
    logged: list[tuple[str, int, int]] = field(default_factory=list)
    checkpointed: int = 0  # the ingress offset the last checkpoint names

    def send(self, rid: str, version: int, due: int, replace: bool) -> None:
        if rid in self.precancelled:
            return
        if rid in self.pending:
            if not replace:
                return  # a duplicate: dropped, not logged
            self.superseded.add(self.pending[rid][0])
        self.pending[rid] = (version, due)
        self.logged.append((rid, version, due))

    def cancel(self, rid: str) -> None:
        if rid in self.pending:
            self.superseded.add(self.pending.pop(rid)[0])
        else:
            self.precancelled.add(rid)
        self.logged.append((rid, -1, 0))

    def checkpoint(self, offset: int) -> None:
        self.logged, self.checkpointed = [], offset

    def crash(self) -> None:
        """Recovery: the versions pending from before the checkpoint stay; the log after it is
        replayed in order (at-least-once: a version delivered since the checkpoint is pending
        again); a record under a pending id takes its place, a cancel removes it."""
        pending = {rid: vd for rid, vd in self.pending.items() if vd[0] < self.checkpointed}
        for rid, version, due in self.logged:
            if version < 0:
                pending.pop(rid, None)
            else:
                pending[rid] = (version, due)
        self.pending = pending

    def advance(self) -> set[int]:
        due = {rid for rid, (_v, d) in self.pending.items() if d <= self.now}
        out = {self.pending.pop(rid)[0] for rid in due}
        self.fired |= out
        return out


def _check(scheduler: str, ops: list[tuple[object, ...]]) -> None:
    with TemporaryDirectory() as tmp:
        sim = Sim(Path(tmp), scheduler=scheduler, horizon_ms=10**12)
        model = Model(sim.now)
        handed: dict[int, int] = {}  # version (its ingress offset) -> times handed out
        crashed_after: set[int] = set()  # versions handed out before a crash: may come again
        sent: list[tuple[str, int, bool] | None] = []  # per ingress offset: (id, due, replace); None: a cancel

        def step() -> None:
            got: set[int] = set()
            for ref, rec in sim.st.sched.due(sim.now, 1_000_000):
                assert rec.due_ms <= sim.now, "never early"
                v = rec.src_offset
                assert v not in model.superseded, f"stale version {v} ({bytes(rec.value or b'')!r}) fired"
                assert v not in handed or v in crashed_after, f"version {v} handed out twice without a crash"
                got.add(v)
                handed[v] = handed.get(v, 0) + 1
                sim.in_flight.append((ref, bytes(rec.id)))
            sim.ack_all()
            assert got == model.advance(), "what fires is what the model fires"

        for op in ops:
            kind = op[0]
            if kind == "send":
                _, rid, delay, replace = op
                headers: list[tuple[str, bytes | None]] = [
                    (c.TARGET_TOPIC, b"target"), (c.DELAY_MS, str(delay).encode()), (c.ID, str(rid).encode()),
                ]
                if replace:
                    headers.append((c.REPLACE, b"true"))
                off = len(sim.ingress)
                sim.ingress.append(IngressRecord(TOPIC, 0, off, sim.now, b"k", b"v%d" % off, headers))
                sim.consume()
                model.send(str(rid), off, sim.now + int(str(delay)), bool(replace))
                sent.append((str(rid), sim.now + int(str(delay)), bool(replace)))
            elif kind == "cancel":
                sim.send(cancel=str(op[1]))
                sim.consume()
                model.cancel(str(op[1]))
                sent.append(None)
            elif kind == "advance":
                sim.now += int(str(op[1]))
                model.now = sim.now
                sim.consume()
                step()
            elif kind == "checkpoint":
                sim.st.checkpoint()
                model.checkpoint(sim.position)
            elif kind == "crash":
                sim.crash()
                model.crash()
                # Consumed again: the records after the checkpoint and after the last one the log
                # holds (dropped duplicates or pre-cancelled records), judged again as at first.
                assert all(s is not None for s in sent[sim.position :]), "a cancel is always in the log"
                for off in range(sim.position, len(sent)):
                    rid_, due_, replace_ = sent[off]  # type: ignore[misc]
                    model.send(rid_, off, due_, replace_)
                sim.consume()
                crashed_after |= set(handed)
            else:
                sim.restart()
                model.checkpoint(sim.position)
        for _ in range(12):  # past every due time
            sim.now += 1000
            model.now = sim.now
            sim.consume()
            step()
        assert not model.pending
        assert set(handed) == model.fired
        sim.st.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, max_size=40))
def test_replace_and_cancel_win_levels(ops: list[tuple[object, ...]]) -> None:
    _check("levels", ops)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, max_size=40))
def test_replace_and_cancel_win_wheel(ops: list[tuple[object, ...]]) -> None:
    _check("wheel", ops)
