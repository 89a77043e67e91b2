"""The intake state's layout is declared once (sidecar/store/intake_layout.py): the C header is
generated from it and committed, and the built extension must have been compiled from that
header. Each test here fails when one side moves without the other."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sidecar.store import intake_layout as layout
from sidecar.store.codec import native
from tests.infra import needs_native

ROOT = Path(__file__).resolve().parents[2]


def test_committed_header_is_generated_from_the_declaration() -> None:
    committed = (ROOT / "sidecar" / "native" / "intake_layout.h").read_text()
    assert committed == layout.header(), "run: python -m sidecar.store.intake_layout"


@needs_native
def test_extension_was_compiled_from_the_declaration() -> None:
    """INTAKE_LAYOUT holds the header's macros as the extension saw them at compile time: a
    declaration changed after the last build shows here (rebuild: scripts/setup.sh)."""
    assert native is not None
    assert layout.c_names() == native.INTAKE_LAYOUT


def test_every_field_has_a_c_name_and_a_description() -> None:
    names = layout.c_names()
    assert names["IN_HEAD"] == layout.Common.HEAD
    assert names["IN_W_NEW_CHAINS"] == layout.Wheel.NEW_CHAINS
    assert names["IN_LV_DELAY_MS"] == layout.Level.DELAY_MS
    assert names["IN_L_BASE"] == layout.LEVELS_BASE
    total = sum(len(layout.fields(g)) for _p, g in layout.GROUPS) + len(layout.BOUNDS)
    assert len(names) == total  # no two C names collide
    header = layout.header()
    for prefix, group in layout.GROUPS:
        for name, index in layout.fields(group).items():
            assert f"#define {prefix}{name} {index} /* {layout.doc(group, name)} */" in header
            assert layout.doc(group, name)


def test_states_have_the_parts_declared() -> None:
    st = layout.wheel_state()
    assert len(st) == layout.WHEEL_SIZE and st[layout.Common.KIND] == layout.Kind.WHEEL
    st = layout.levels_state(3)
    assert len(st) == layout.level_at(3) == layout.LEVELS_BASE + 3 * layout.LEVEL_STRIDE
    assert st[layout.Common.KIND] == layout.Kind.LEVELS and st[layout.Levels.COUNT] == 3
    st[layout.Levels.PER_FILE] = 7
    assert layout.levels_state(3)[layout.Levels.PER_FILE] == 0  # a copy each time


def test_overlapping_fields_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout, "Wheel", dataclasses.replace(layout.Wheel, GUARD=layout.Wheel.HEAD))
    with pytest.raises(ValueError, match=rf"Wheel\.HEAD and \.GUARD are both {layout.Wheel.HEAD}"):
        layout.check()


def test_fields_outside_their_part_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout, "Common", dataclasses.replace(layout.Common, IDX_TOMBS=layout.SCHED_AT))
    at = layout.SCHED_AT
    with pytest.raises(ValueError, match=rf"Common\.IDX_TOMBS = {at} is outside \[0, {at}\)"):
        layout.check()
    monkeypatch.undo()
    monkeypatch.setattr(layout, "Level", dataclasses.replace(layout.Level, DELAY_MS=layout.LEVEL_STRIDE))
    with pytest.raises(ValueError, match=r"Level\.DELAY_MS = 5 is outside \[0, 5\)"):
        layout.check()
