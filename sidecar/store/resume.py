"""Where a recovered store's ingress resumes, and which consumed records it already holds.

A store holds every ingress record before its checkpoint's ``ingress_offset`` (its ``next_offset``
at the snapshot) except one kind: a record due when it arrived is published by the intake itself
and never stored (sidecar/engine/direct.py); while its delivery is unreported it is in the
checkpoint's ``direct`` list, and the offset commit stops below it. After the checkpoint, the
log's tail holds what was stored until the crash (replayed by ``open``): the ingress offsets of
those records, ``stored``. Every offset after the checkpoint that is not in ``stored`` may be a
record published from the intake whose report never came, or one that stores nothing (a
duplicate id, a pre-cancelled message): consuming those again is what at-least-once asks of the
first and does nothing new for the second (the same decision is taken again).

So ingress resumes at the lowest of the ``direct`` offsets and the first offset at or after
``below`` that is not in ``stored`` (``offset``), and of what it consumes again it drops what the
store holds (``drops``): below ``below`` everything but ``direct``, above it ``stored``. This is
what the loop's ingress does with ``Handover.skip`` (sidecar/engine/handover.py). The earlier rule
(resume after the last replayed record) would skip a record published from the intake and not yet
acknowledged when a later one was stored: lost. A cancel consumed again would be applied twice
(the second time remembered as a pre-cancel), so a stored record's offset is dropped, not applied.

With the changelog, ``below`` is raised to the changelog's ``changelog_ingress`` (one past the
highest source offset of an acknowledged put; ``raised``): a put is written only after every
held put before it (engine/changelog.py), so a record published from the intake below it has its
put in the changelog or was delivered; a ``direct`` one is still consumed again (its put may have
been written before the checkpoint's changelog offset, which the restore does not read again).

Pure: no I/O, no clock (tests/unit/test_resume.py checks it against a model of the log).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Resume:
    below: int | None  # every ingress offset below is held, except ``direct`` (None: no checkpoint)
    direct: frozenset[int]  # offsets below ``below`` published from the intake, unreported at the checkpoint
    stored: frozenset[int]  # offsets at or above ``below`` stored after the checkpoint

    @classmethod
    def of(cls, below: int | None, direct: list[int] | None, stored: set[int]) -> Resume:
        floor = below if below is not None else min(stored, default=0)
        return cls(below, frozenset(direct or ()), frozenset(o for o in stored if o >= floor))

    @classmethod
    def none(cls) -> Resume:
        """No checkpoint and nothing replayed: the store holds nothing, ingress resumes at the
        group's committed offset and drops nothing."""
        return cls(None, frozenset(), frozenset())

    @classmethod
    def after(cls, below: int | None, stored: set[int]) -> Resume:
        """A checkpoint with no ``direct`` list: nothing was published from the intake after it
        (engine/direct.py publishes only once one with the list is written), so the store holds
        every offset up to its log's last record: resume after it, drop what is below."""
        last = max(stored, default=-1) + 1
        return cls(max(below or 0, last) if below is not None or stored else None, frozenset(), frozenset())

    def held_to(self) -> int | None:
        """The first offset at or after ``below`` the store does not hold: every one before it is
        held but the ``direct`` ones (the store's ``next_offset`` once opened)."""
        if self.below is None:
            return None
        gap = self.below
        while gap in self.stored:
            gap += 1
        return gap

    def offset(self) -> int | None:
        """The offset to resume consuming at; None: the group's committed offset (no checkpoint:
        what the store holds is only ``stored``)."""
        gap = self.held_to()
        return None if gap is None else min(self.direct | {gap})

    def drops(self, offset: int) -> bool:
        """True: the record at ``offset`` is held by the store; consumed again, it is dropped."""
        if self.below is not None and offset < self.below:
            return offset not in self.direct
        return offset in self.stored

    @property
    def end(self) -> int:
        """No offset at or after this one is dropped."""
        return max(self.below or 0, max(self.stored, default=-1) + 1)

    def raised(self, below: int | None) -> Resume:
        """With ``below`` raised to ``below`` (the changelog's ``changelog_ingress``)."""
        if below is None or (self.below is not None and below <= self.below):
            return self
        return Resume(below, self.direct, self.stored)

    def needed(self, start: int | None) -> bool:
        """Whether a record consumed from ``start`` on may be dropped (else no skip is kept);
        ``start`` None: from an offset not known here (the group's committed offset)."""
        if start is None:
            return self.below is not None or bool(self.stored)
        return start < self.end
