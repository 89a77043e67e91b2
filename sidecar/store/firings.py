"""Firings: a recurring schedule in the store, from its first firing to its last.

A recurring record (``delay.cron`` / ``delay.every``: the rules are sidecar/recurring/'s) is stored
as a RECURRING record: a MESSAGE whose stored headers carry, after the user's own, the schedule's
headers as they were given and its state (``contract.STATE_LAST``, ``STATE_FIRED``: the nominal
time of the last firing made and how many were made; both absent before the first). Its due time
is the committed due time of its next firing. At any moment one record per schedule is pending,
under the schedule's id, so look-ups, cancels, replaces, the changelog and the handover treat a
schedule as they treat any record.

- ``arm`` (intake): the schedule parsed (a ``Rejection`` goes to the DLQ with its reason), its
  first firing found (none at all between start and end: ``bad-schedule``), and the record stored
  as any request is (``Intake.schedule``: replace, duplicate and pre-cancel rules alike). The
  schedule's shape is parsed once per distinct shape (``spec.stored_schedule``, as at a firing).
  The common record (``delay.every`` with an id and at most a ``delay.start``) skips all of this:
  the intake's C run stores it the same way (``_native.ingest_run``; a test compares the bytes),
  at ~1/5 of this path's CPU.
- ``fire`` (publishing, at hand-out, with the publish call's clock reading ``now``):
  ``decide`` (``misfire.catch_up``'s rules) says what fires: one firing stamped with its nominal
  time (after a misfire, the latest due one and how many it stands for) and the headers it is
  delivered with; or, with ``skip`` after a misfire, nothing: the record is re-armed at once
  without a publish.
  The decision is kept per handed-out ref until its settle.
- ``settle`` (the batch's settle, after the delivery reports): each delivered firing is replaced
  by its next one, appended and scheduled under the same id and written to the changelog in place
  of the id's tombstone; after the last firing the id is finished like any delivered record.

Never two firings of one nominal time: the next firing is searched strictly after the nominal
time just fired (``next_fire``), and a firing's record stays pending until its delivery is
reported, so a crash re-delivers only a firing in flight (the log's replay keeps the newest record
of an id: a re-armed record takes the place of the one it follows, ``Restore.replay``). A firing
replaced (``delay.replace``) or cancelled while it is in flight is not re-armed: its successor is
pending (``store.superseded``) or the schedule has ended (``ended``). A firing whose publishing
fails for good is dead-lettered as a one-shot record (its firing headers, no schedule headers, so
a redrive delivers that firing once) and the schedule goes on.

Per firing the work is kept small, since a fleet of schedules fires thousands of times a second
(docs/benchmarks.md, ``recurring``). The common ``delay.every`` schedule fires in C
(sidecar/native/firing.c): the publish run (``_native.publish_due``) decides it from the stored
headers and produces it with the plain records, keeping the decision here (``_handed``, its
schedule None: read again by ``armed`` in the rare paths that need it), and the settle re-arms a
batch's firings in one C run (``settle_many``, store/rearming.py). This module stays the
reference, and takes everything else: cron schedules (their next occurrence across time zones is
sidecar/recurring/timeline.py's, in Python), zones, a schedule out of the common case, nothing
firing now (a ``skip`` misfire, a re-arm without a publish), exactly-once (the next firing armed
at hand-out), the levels scheduler, a history topic; a test compares both paths on random
schedules (tests/unit/test_recurring_firing_native.py). Here the schedule is rebuilt from its
cached shape (``spec.stored_schedule``: a million schedules sharing a few expressions parse a few
times, and each firing only checks its own times), and ``decide`` answers what fires now and the
firing after it in one pass (arithmetic for ``delay.every``), the next firing kept for the re-arm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from sidecar import contract as c
from sidecar.headers import MAX_EPOCH_MS, Rejection, Request
from sidecar.recurring.decide import decide
from sidecar.recurring.misfire import DEFAULT_GRACE_MS
from sidecar.recurring.spec import Schedule, parse_schedule, stored_schedule
from sidecar.recurring.timeline import next_fire
from sidecar.store import codec, rearming
from sidecar.store.codec import NATIVE, Record, decode_headers, encode_headers, native
from sidecar.store.idindex import id_hash
from sidecar.store.mirroring import HISTORY_DELIVERED, history_record

if TYPE_CHECKING:
    from sidecar.store.partition import PartitionStore

HeaderList = list[tuple[str, bytes | None]]
_SPEC = frozenset(c.RECURRING_HEADERS)
_STATE = frozenset((c.STATE_LAST, c.STATE_FIRED))
_ONE_SHOT = (c.DELAY_MS, c.DELIVER_AT, c.LEVEL)  # beside a recurring header: parse_schedule's conflicting-delay
RUN_AT_LEAST = 4  # settled firings to re-arm for the C run: fewer go one by one (its set-up costs a few)


@dataclass(frozen=True, slots=True)
class Armed:
    """A RECURRING record's schedule and state, read from its stored headers."""

    schedule: Schedule
    last_ms: int | None  # the nominal time of the last firing made; None before the first
    fired: int  # firings made
    user: tuple[tuple[str, bytes | None], ...]  # the user's headers, delivered with each firing
    spec: tuple[tuple[str, bytes | None], ...]  # the schedule's headers, as given


class Firing(NamedTuple):
    """What a handed-out firing is: its nominal time, sequence number, and the next firing (a
    tuple: the C path makes one per firing, at a third of a frozen dataclass's cost)."""

    fire_ms: int
    seq: int
    next_ms: int | None
    missed: int


def armed(rec: Record) -> Armed:
    """The schedule and state of a RECURRING record (stored by ``arm`` or ``_rearm``: valid)."""
    user: HeaderList = []
    spec: HeaderList = []
    last: int | None = None
    fired = 0
    for h in decode_headers(rec.headers):
        name = h[0]
        if name in _SPEC:
            spec.append(h)
        elif name == c.STATE_LAST:
            last = int(h[1] or b"0")
        elif name == c.STATE_FIRED:
            fired = int(h[1] or b"0")
        else:
            user.append(h)
    spec_t = tuple(spec)
    sched = stored_schedule(spec_t, rec.enqueue_ms)
    if not isinstance(sched, Schedule):  # only a record written by hand or a bug gets here
        raise codec.CorruptRecord(f"recurring record {rec.id!r} holds no valid schedule: {sched}")
    return Armed(sched, last, fired, tuple(user), spec_t)


def firing_headers(rec: Record, a: Armed, f: Firing, source_topic: bytes) -> HeaderList:
    """The headers a firing is delivered with: the user's, then those of any delivered record
    (``delay.deliver-at`` is the nominal time), then the firing's own (contract.FIRING_HEADERS)."""
    out: HeaderList = [
        *a.user,
        (c.ID, rec.id),
        (c.DELIVER_AT, b"%d" % f.fire_ms),
        (c.ENQUEUED_AT, b"%d" % rec.enqueue_ms),
        (c.SOURCE, b"%s:%d:%d" % (source_topic, rec.src_partition, rec.src_offset)),
        (c.FIRE_TIME, b"%d" % f.fire_ms),
        (c.FIRE_SEQ, b"%d" % f.seq),
    ]
    if f.next_ms is not None:
        out.append((c.NEXT_AT, b"%d" % f.next_ms))
    if f.missed:
        out.append((c.MISSED, b"%d" % f.missed))
    return out


if NATIVE:  # the firing of a common delay.every schedule in C (sidecar/native/firing.c)
    native.firing_setup(
        Firing, (c.ID, c.DELIVER_AT, c.ENQUEUED_AT, c.SOURCE, c.FIRE_TIME, c.FIRE_SEQ, c.NEXT_AT, c.MISSED),
        tuple(name.encode() for name in (*c.RECURRING_HEADERS, c.STATE_LAST, c.STATE_FIRED)),
        DEFAULT_GRACE_MS, MAX_EPOCH_MS, c.MIN_EVERY_MS,
    )
_fire_every = native.fire_every if NATIVE else None
_rearm_blob = native.rearm_blob if NATIVE else None


def state_blob(a: Armed, last_ms: int | None, fired: int) -> bytes:
    """The stored headers of a re-armed record: the user's, the schedule's, then its state (the
    reference of ``_native.rearm_blob``, which writes them from the stored blob)."""
    state: HeaderList = [(c.STATE_FIRED, b"%d" % fired)]
    if last_ms is not None:
        state.insert(0, (c.STATE_LAST, b"%d" % last_ms))
    return encode_headers([*a.user, *a.spec, *state])


class Firings:
    """A store's recurring schedules (the module docstring): the firings handed out and not yet
    settled, and those whose schedule ended (cancelled) while in flight."""

    __slots__ = ("_handed", "ended", "native", "store")

    def __init__(self, store: PartitionStore) -> None:
        self.store = store
        self.native = NATIVE  # the C firing and re-arm (firing.c) take what they can; False: all here
        # ref -> (its schedule, None when the C path decided it: read again where needed; the
        # decision; armed its next at hand-out)
        self._handed: dict[int, tuple[Armed | None, Firing, bool]] = {}
        self.ended: set[int] = set()  # refs in flight whose schedule a cancel ended: not re-armed

    # -- intake -----------------------------------------------------------------------------------
    def arm(
        self, topic: str, offset: int, ts: int, key: bytes | None, value: bytes | None,
        headers: HeaderList | None, parsed: Request, now_ms: int,
    ) -> None:
        """Store a recurring request (``parsed.mode == "recurring"``) at its first firing."""
        store = self.store
        intake = store.intake
        control = parsed.control
        assert control is not None
        rid = parsed.id
        spec = tuple((name, control[name]) for name in c.RECURRING_HEADERS if name in control)
        # the common record (an id, no one-shot header beside the schedule): its shape parsed once per
        # distinct shape, as at each firing; any fault is parsed in full there, with the same reason
        common = rid is not None and not any(name in control for name in _ONE_SHOT)
        sched = stored_schedule(spec, ts) if common else parse_schedule(control, ts)
        if sched is None or rid is None:  # unreachable: mode "recurring" has a recurring header
            sched = Rejection(c.BAD_SCHEDULE, f"a recurring record needs {c.ID}")
        if isinstance(sched, Schedule):
            first = next_fire(sched, sched.start_ms - 1, 0)
            if first is None:
                sched = Rejection(c.BAD_SCHEDULE, "the schedule has no firing between its start and its end")
            elif first - max(now_ms, ts) > store.rules.max_delay_ms:
                sched = Rejection(c.DELAY_OUT_OF_RANGE, f"the first firing {first} is beyond the maximum delay of "
                                  f"{store.rules.max_delay_ms} ms")
        if not isinstance(sched, Schedule):
            intake.reject(topic, offset, ts, key, value, headers, intake.default_id(topic, offset), sched.reason,
                          sched.error, now_ms)
            return
        assert rid is not None and first is not None
        blob = encode_headers([*parsed.user_headers, *spec])
        intake.schedule(
            topic, offset, ts, key, value, headers, parsed.target_topic, parsed.target_partition, rid, first, "at",
            0, 0, None, parsed.user_headers, now_ms, parsed.replace, recurring_blob=blob,
        )

    # -- publishing -------------------------------------------------------------------------------
    def fire(self, ref: int, rec: Record, now_ms: int) -> HeaderList | None:
        """A due RECURRING record handed out at ``now_ms``: the headers to deliver it with, or None
        when nothing fires now (``skip`` after a misfire: it is re-armed at once, not published).
        A ref handed out again (a publish retry, a full producer queue) fires as decided the
        first time. Under exactly-once the next firing is armed here, so that its changelog write
        is in the firing's transaction (the settle after the commit would be in the next one)."""
        store = self.store
        handed = self._handed.get(ref)
        if handed is not None:
            return firing_headers(rec, handed[0] or armed(rec), handed[1], store.topic_bytes)
        if _fire_every is not None and self.native:  # the common delay.every schedule, decided in C (firing.c)
            headers: HeaderList | None = _fire_every(store, ref, rec, now_ms)
            if headers is not None:
                return headers
        a = armed(rec)
        d = decide(a.schedule, a.last_ms, a.fired, now_ms)
        if d is None or d.fire_ms is None:
            # nothing fires now: the next firing after the latest due one (or, if nothing was due, the
            # same one again: its committed time came before its nominal one, never expected)
            self._finish(ref, rec)
            if d is None:
                after = a.schedule.start_ms - 1 if a.last_ms is None else a.last_ms
                self._rearm(rec, a, a.last_ms, a.fired, next_fire(a.schedule, after, a.fired), now_ms)
            else:
                store.counters.missed += d.missed  # (skipped: none fires)
                self._rearm(rec, a, d.latest_ms, a.fired, d.next_ms, now_ms)
            return None
        f = Firing(d.fire_ms, a.fired + 1, d.next_ms, d.missed)
        in_transaction = store.mirror is not None and not store.mirror.on_settle
        self._handed[ref] = (a, f, in_transaction)
        if in_transaction and f.next_ms is not None:
            self._rearm(rec, a, f.fire_ms, f.seq, f.next_ms, now_ms)
        return firing_headers(rec, a, f, store.topic_bytes)

    def dead_letter_headers(self, ref: int, rec: Record) -> tuple[HeaderList, int]:
        """A firing that failed for good: the headers its dead letter starts from, those of a
        one-shot record (the user's and the firing's own, no schedule headers), and its nominal
        time (``delay.deliver-at`` of the dead letter)."""
        handed = self._handed.get(ref)
        if handed is None:  # (never expected: a firing fails only once handed out)
            return list(armed(rec).user), rec.due_ms
        a, f, _armed = handed
        a = a or armed(rec)
        skip = (c.ID, c.DELIVER_AT, c.ENQUEUED_AT, c.SOURCE)
        return [h for h in firing_headers(rec, a, f, self.store.topic_bytes) if h[0] not in skip], f.fire_ms

    # -- settle -----------------------------------------------------------------------------------
    @property
    def handed(self) -> bool:
        """Is any firing handed out and not settled? (False: a settled batch holds none.)"""
        return bool(self._handed)

    def continues(self, ref: int) -> bool:
        """Does handed-out ``ref``'s schedule go on (its next firing armed, or to be armed by its
        settle), so that no tombstone is due for its id?"""
        handed = self._handed.get(ref)
        return handed is not None and handed[1].next_ms is not None and ref not in self.ended

    def settle(self, ref: int, rec: Record, now_ms: int) -> bool:
        """``ref``, a delivered (or dead-lettered) firing the caller finishes: arm the next one;
        True if it did (the caller then writes no tombstone)."""
        due = self._settled(ref)
        return due is not None and self._rearm(rec, due[0], due[1].fire_ms, due[1].seq, due[1].next_ms, now_ms)

    def settle_many(self, acked: list[tuple[int, Record]], now_ms: int) -> set[int]:
        """``settle`` of each firing (RECURRING record) of a delivered batch; the refs that armed
        their next one. The re-arms go in runs through the C re-arm (``rearming.rearm_run``), each
        record it leaves through ``_rearm``; a few at a time are not worth the run's set-up."""
        due: list[tuple[int, Record, Armed | None, Firing]] = []
        for ref, rec in acked:
            if rec.rtype == codec.RECURRING:
                d = self._settled(ref)
                if d is not None:
                    due.append((ref, rec, d[0], d[1]))
        if len(due) < RUN_AT_LEAST or not self.native or not rearming.runs(self.store):
            return {ref for ref, rec, a, f in due if self._rearm(rec, a, f.fire_ms, f.seq, f.next_ms, now_ms)}
        items: list[tuple[Record, int | None, int, int | None]] = [
            (rec, f.fire_ms, f.seq, f.next_ms) for _r, rec, _a, f in due]
        armed_refs: set[int] = set()
        i = 0
        while i < len(due):
            end = rearming.rearm_run(self.store, items, i, now_ms)
            armed_refs.update(ref for ref, _rec, _a, _f in due[i:end])
            if end < len(due):  # the one the run left: the reference path
                ref, rec, a, f = due[end]
                if self._rearm(rec, a, f.fire_ms, f.seq, f.next_ms, now_ms):
                    armed_refs.add(ref)
                end += 1
            i = end
        return armed_refs

    def _settled(self, ref: int) -> tuple[Armed | None, Firing] | None:
        """``ref``'s firing settled (counted): its schedule and decision if its next firing is to
        be armed now; None if not (none next, armed at hand-out, ended, superseded, never fired)."""
        handed = self._handed.pop(ref, None)
        if ref in self.ended:
            self.ended.discard(ref)
            return None
        if ref in self.store.superseded or handed is None:
            return None  # a replace took its place (its newer version is pending), or it never fired
        a, f, armed_at_fire = handed
        counters = self.store.counters
        counters.fired += 1
        counters.missed += f.missed
        if f.next_ms is None or armed_at_fire:
            return None
        return a, f

    def forget(self, ref: int) -> None:
        """``ref`` left the store without a settle (dropped, superseded while waiting)."""
        self._handed.pop(ref, None)
        self.ended.discard(ref)

    def _finish(self, ref: int, rec: Record) -> None:
        store = self.store
        store.sched.ack(ref)
        store.ids.remove(id_hash(rec.id), ref)
        store.dirty = True

    def _rearm(
        self, rec: Record, a: Armed | None, last_ms: int | None, fired: int, nxt: int | None, now_ms: int,
    ) -> bool:
        """Append and schedule ``nxt``, the firing after ``last_ms`` (``fired`` made), under
        ``rec``'s id; False: there is none (``nxt`` None: the end), and the id's tombstone is
        written. ``a`` None: decided in C, the stored headers rewritten there too."""
        store = self.store
        rid = rec.id
        h = id_hash(rid)
        planned = None if nxt is None else store.sched.plan("at", 0, nxt, now_ms)
        if planned is None:  # the end (or beyond what the scheduler holds): the schedule is over
            if store.mirror is not None:
                store.mirror.remove(rid)
            return False
        level, due = planned
        if a is None:
            assert _rearm_blob is not None
            blob = _rearm_blob(bytes(rec.headers), last_ms, fired)
        else:
            blob = state_blob(a, last_ms, fired)
        pos = store.log.append(
            codec.head(
                rtype=codec.RECURRING, due_ms=due, enqueue_ms=rec.enqueue_ms, src_offset=rec.src_offset,
                src_partition=rec.src_partition, target_partition=rec.target_partition, retry_count=0, level=level,
            ),
            rid, rec.topic, rec.key, rec.value, blob,
        )
        store.ids.put(h, store.sched.add(due, level, pos))
        store.dirty = True
        if store.mirror is not None:
            store.mirror.put(rid, store.log.raw(pos), due <= now_ms)
        return True


def describe(rec: Record) -> dict[str, object]:
    """A pending RECURRING record for ``status``: its schedule, the next firing (nominal), how many
    fired and the last one's nominal time."""
    a = armed(rec)
    s = a.schedule
    after = s.start_ms - 1 if a.last_ms is None else a.last_ms
    out: dict[str, object] = {
        "next_fire_ms": next_fire(s, after, a.fired), "fired": a.fired, "last_fire_ms": a.last_ms,
        "start_ms": s.start_ms, "end_ms": s.end_ms, "max_count": s.max_count, "misfire": s.misfire,
    }
    if s.cron is not None:
        out["cron"] = next((v or b"" for n, v in a.spec if n == c.CRON), b"").decode("utf-8", "replace")
        out["tz"] = s.tz
    else:
        out["every_ms"] = s.every_ms
    return out


def record_history(store: PartitionStore, acked: list[tuple[int, Record]]) -> None:
    """The history's ``delivered`` event of each delivered record (a firing is one)."""
    for _ref, rec in acked:
        if rec.rtype == codec.MESSAGE or rec.rtype == codec.RECURRING:
            history_record(store, HISTORY_DELIVERED, rec)
