"""Id index merge passes that run when the test says (``HandPass``, ``run_pass``) or at the index's
next look (``NextPollPass``), instead of on a worker thread: runs fed the same operations cut and
merge at the same points. Install one with ``monkeypatch.setattr(Growth, "pass_class", ...)``
(sidecar/store/idgrowth.py).
"""

from __future__ import annotations

from sidecar.store.idindex import IdIndex
from sidecar.store.idpass import Pass


class HandPass(Pass):
    """A pass the test runs when it chooses (``run_pass``): until then it is "running"."""

    def start(self) -> None:
        self.done = False

    def is_alive(self) -> bool:
        return not self.done

    def run_now(self) -> None:
        self.merge()
        self.done = True


class NextPollPass(Pass):
    """A pass that runs when the index first looks at it (its next step, or a full stage): at a
    point fixed by the operations alone, not by a thread's timing, so two runs fed the same
    operations cut and merge alike; the records between the cut and that look see a sealed stage."""

    def start(self) -> None:
        self.done = False

    def is_alive(self) -> bool:
        if not self.done:
            self.merge()
            self.done = True
        return False


def run_pass(ix: IdIndex) -> bool:
    p = ix.growth.running
    if isinstance(p, HandPass) and not p.done:
        p.run_now()
        ix.growth.poll()
        return True
    return False
