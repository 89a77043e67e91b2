"""The bench byte-compiles the sidecar before it starts any (an installed wheel's modules are)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import sidecar
from bench.cli import byte_compile


def test_byte_compile_leaves_a_current_pyc_beside_every_sidecar_module() -> None:
    byte_compile()
    root = Path(sidecar.__file__).parent
    sources = sorted(root.rglob("*.py"))
    assert len(sources) > 100
    stale = []
    for src in sources:
        pyc = Path(importlib.util.cache_from_source(str(src)))
        if not pyc.exists() or pyc.stat().st_mtime < src.stat().st_mtime:
            stale.append(src.relative_to(root))
    assert stale == []
