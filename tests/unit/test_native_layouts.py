"""The file layouts C and Python share are declared once (sidecar/store/native_layouts.py): the
C header is generated from it and committed, the built extension must have been compiled from
that header, and the Python modules that read the files take their values from it. Each test here
fails when one side moves without the other. Both declarations' generators (this one and
intake_layout's) share ``write_header``, tested here for each."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sidecar.levels import queue
from sidecar.store import buckets, codec, idslot, intake_layout
from sidecar.store import native_layouts as layouts
from sidecar.store.codec import native
from sidecar.wheel import layout as wheel
from sidecar.wheel import scheduler as wheel_scheduler
from tests.infra import needs_native

ROOT = Path(__file__).resolve().parents[2]
NATIVE_DIR = ROOT / "sidecar" / "native"
U64 = (1 << 64) - 1


def test_committed_header_is_generated_from_the_declaration() -> None:
    committed = (NATIVE_DIR / "layouts.h").read_text()
    assert committed == layouts.header(), "run: python -m sidecar.store.native_layouts"


@needs_native
def test_extension_was_compiled_from_the_declaration() -> None:
    """LAYOUTS holds the header's macros as the extension saw them at compile time (as signed
    64-bit values): a declaration changed after the last build shows here (rebuild: scripts/setup.sh)."""
    assert native is not None
    compiled = {name: value & U64 for name, value in native.LAYOUTS.items()}
    assert compiled == {name: value & U64 for name, value in layouts.c_names().items()}


def test_the_c_sources_define_none_of_the_declared_names() -> None:
    """A macro of the header written again by hand in a C file would shadow or contradict it."""
    names = set(layouts.c_names())
    for path in NATIVE_DIR.glob("*.[ch]"):
        if path.name == "layouts.h":
            continue
        defined = set(re.findall(r"^\s*#\s*define\s+(\w+)", path.read_text(), re.M))
        assert not defined & names, f"{path.name} defines {sorted(defined & names)}: declare them in native_layouts.py"


def test_the_python_twins_read_the_declaration() -> None:
    assert codec.HEAD is layouts.RECORD_HEAD and codec.HEAD_SIZE == 72
    assert (codec.ALIGN, codec.VERSION) == (layouts.RECORD_ALIGN, layouts.RECORD_VERSION)
    assert wheel.ENTRY is layouts.WHEEL_ENTRY and wheel.SLOT is layouts.WHEEL_SLOT
    assert (wheel.PENDING, wheel.CANCELLED, wheel.DONE, wheel.DROPPED, wheel.LATE) == (0, 1, 2, 3, 1)
    assert buckets.BUCKET_BIT == layouts.BUCKET_BIT == 1 << 62
    assert (wheel_scheduler.MIN_DUE_MS, wheel_scheduler.MAX_DUE_MS) == (-(1 << 62), (1 << 62) - 1)
    assert queue.ENTRY is layouts.LEVEL_ENTRY and queue.ENTRY_SIZE == 24
    assert (queue.PENDING, queue.DELIVERED, queue.CANCELLED, queue.DROPPED, queue.IDX_BITS) == (0, 1, 2, 3, 48)
    assert idslot.SLOT is layouts.ID_SLOT and (idslot.EMPTY, idslot.TOMB, idslot.PRECANCEL) == (0, 1, 1 << 63)


def test_literals_keep_64_bit_values() -> None:
    header = layouts.header()
    assert "#define WL_BUCKET_BIT (4611686018427387904LL)" in header
    assert "#define WL_MIN_DUE (-4611686018427387904LL)" in header
    assert "#define IDX_PRECANCEL 9223372036854775808ULL" in header


@pytest.mark.parametrize(("module", "edit"), [
    (layouts, ("#define HEAD_SIZE 72", "#define HEAD_SIZE 80")),
    (intake_layout, ("#define IN_HEAD 1", "#define IN_HEAD 2")),
], ids=["native_layouts", "intake_layout"])
def test_the_generators_check_and_write(
    module: Any, edit: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = module.__name__
    ok = subprocess.run([sys.executable, "-m", name, "--check"], cwd=ROOT, capture_output=True, text=True,
                        check=False)
    assert ok.returncode == 0, ok.stdout
    target = tmp_path / "layout.h"
    monkeypatch.setattr(module, "HEADER", target)
    assert module.main([name, "--check"]) == 1  # missing
    assert module.main([name]) == 0 and target.read_text() == module.header()
    assert module.main([name, "--check"]) == 0
    target.write_text(target.read_text().replace(*edit))
    assert module.main([name, "--check"]) == 1
    assert module.main([name, "--bogus"]) == 2
