"""Records a store published from the intake whose delivery is not reported yet.

A record due when it is consumed is produced by the C intake itself and never stored
(engine/direct.py; docs/design.md 5.1). Until its delivery report the store holds nothing of it
but its report callable, so the durability order a stored record gets from the commit log (its
ingress offset is committed only once the store holds it) has to come from what is kept here:

- ``deliveries``: id hash -> the ``DirectDelivery`` in flight. The C run files each one here (the
  store's ``DirectPort`` holds the same dict) and its report takes it out; an id found here stops
  the C run, so the reference path decides a second record under it (store/lookup.py
  ``in_flight``).
- ``redo``: the ``direct`` offsets of the checkpoint the store was opened from, not consumed again
  yet: unreported at that checkpoint's snapshot, so for all the store knows never delivered; until
  ingress consumes them again (``Handover.skip_restored``) they stand as the ones in flight do.
- the offset commit stays below the lowest offset of both (``commit_below``): committed past one,
  a crash would lose it.
- the checkpoint's ``direct`` list (``checkpoint_fields``): the same offsets, so that a recovery
  resumes at the lowest and consumes them again (``reopen``, store/resume.py). The key is written
  only once this store is to publish from the intake (``enabled``): a checkpoint without it
  (version 1) says nothing was published after it, and recovery resumes after the log's last
  record. So nothing is published from the intake until a checkpoint with the key is on disk
  (``checkpointed``).
- ``port``: the store's ``DirectPort``, made by engine/direct.py for the store's first C run that
  publishes, and again when its changelog (``port_mirror``, the one it was made for) changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sidecar.store.resume import Resume

if TYPE_CHECKING:
    from sidecar._native import DirectDelivery, DirectPort
    from sidecar.store.mirroring import Mirror


class Flights:
    """A store's records published from the intake and not reported (the module docstring)."""

    __slots__ = ("checkpointed", "deliveries", "enabled", "port", "port_mirror", "redo")

    def __init__(self) -> None:
        self.deliveries: dict[int, DirectDelivery] = {}
        self.redo: set[int] = set()
        # ``enabled``: the store's checkpoints name the ``direct`` offsets (engine/direct.py asks
        # for it, and Handover when the deployment publishes from the intake); ``checkpointed``:
        # one that does is on disk, so recovery would consume again what is published from now on
        self.enabled = False
        self.checkpointed = False
        self.port: DirectPort | None = None  # the module docstring
        self.port_mirror: Mirror | None = None

    def reopen(self, direct: list[int] | None, below: int | None, stored: set[int]) -> Resume:
        """Where the store opened from a checkpoint resumes (store/resume.py): ``direct`` is the
        checkpoint's list (None: no key), ``below`` its ingress offset, ``stored`` the ingress
        offsets of the records replayed after it. Its ``direct`` offsets are ``redo`` from now on."""
        # no ``direct`` key: no record was published from the intake after this checkpoint
        resume = Resume.after(below, stored) if direct is None else Resume.of(below, direct, stored)
        self.redo = set(resume.direct)
        return resume

    def redone(self, offset: int) -> None:
        """Ingress consumed ``redo``'s ``offset`` again: no longer the checkpoint's to name."""
        self.redo.discard(offset)

    def commit_below(self, nxt: int | None) -> int | None:
        """The ingress offset a commit may name, given ``nxt`` (the store's next offset): below the
        lowest offset published from the intake and not reported, in flight or ``redo``."""
        if nxt is not None and self.deliveries:
            nxt = min(nxt, min(d.offset for d in self.deliveries.values()))
        return nxt if nxt is None or not self.redo else min(nxt, min(self.redo))

    def checkpoint_fields(self) -> dict[str, list[int]]:
        """What a checkpoint snapshot adds: the ``direct`` list, or nothing until ``enabled``."""
        if not self.enabled:
            return {}
        return {"direct": sorted({d.offset for d in self.deliveries.values()} | self.redo)}

    def written(self, doc: dict[str, Any]) -> None:
        """The checkpoint ``doc`` is on disk: with a ``direct`` list, engine/direct.py may publish
        from the intake from now on."""
        if "direct" in doc:
            self.checkpointed = True

    def close(self) -> None:
        """The store closes: a report after this finds its store gone (engine/direct.py)."""
        self.deliveries.clear()
        self.port = self.port_mirror = None
