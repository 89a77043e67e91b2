"""Which pages of a file are in memory: ``resident`` sums the ``Rss`` of this process's mappings
of a file (``/proc/self/smaps``); ``needs_populate`` marks a test that needs the kernel to fault
pages in on request (``MADV_POPULATE_WRITE``, Linux 5.14+, through the C extension).
"""

from __future__ import annotations

import mmap
from pathlib import Path

from sidecar.store import codec
from tests.infra import needs


def resident(path: Path) -> int:
    """Bytes of ``path``'s mappings resident in this process (``Rss`` in /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                inside = len(head) >= 6 and head[5] == str(path)
            elif inside and line.startswith("Rss:"):
                total += int(head[1]) * 1024
    return total


def kernel_populates() -> bool:
    """Whether this kernel takes MADV_POPULATE_WRITE (Linux 5.14+), through the C ``populate``."""
    if codec.native is None:
        return False
    m = mmap.mmap(-1, 1 << 16)
    try:
        return bool(codec.native.populate(m, 0, 1 << 16) == 0)
    finally:
        m.close()


needs_populate = needs(
    kernel_populates() and Path("/proc/self/smaps").exists(),
    "MADV_POPULATE_WRITE through the C extension (Linux 5.14+) and /proc/self/smaps",
)
