"""The intake fast path's state: the one declaration of its layout.

``PartitionStore.ingest_many`` runs ``_native.ingest_run`` (sidecar/native/intake.c), a C loop that
stores and schedules consumed records in place of ``ingest_fields``; ``PartitionStore.restore_many``
runs its twin for changelog records, ``_native.restore_run``, in place of ``restore_put``. The state the Python objects
keep and the loop reads and moves — the commit log's head, the id index's counts, the scheduler's
cursors, files and dirty ranges — travels in one list of ints, ``st``: each object writes its
fields into it before the call (the scheduler's ``intake_begin`` makes it, then
``CommitLog.intake_state``, ``IdIndex.intake_state``) and takes them back after it
(``intake_restore``, the scheduler's ``intake_end``). The C loop copies the list into an int64
array, runs, and writes back the values it changed.

This module is the only place the layout is written. Python indexes the list through the names
below; the C side includes ``sidecar/native/intake_layout.h``, generated from them by ``header()``
(``python -m sidecar.store.intake_layout`` writes it, ``--check`` only compares; setup.py writes
it before every build). tests/unit/test_intake_layout.py fails when the committed header differs
from what this module generates, or when the built extension's ``INTAKE_LAYOUT`` (its macros,
read back) differs from ``c_names()``.

Layout: the common part (``Common``) from 0; the scheduler's part from ``SCHED_AT``, either the
wheel's fields (``Wheel``, up to ``WHEEL_SIZE``) or the levels' header (``Levels``) followed, from
``LEVELS_BASE``, by one block of ``LEVEL_STRIDE`` values per level (``Level``: offsets within the
block; ``level_at(n)`` is the block of level ``n``). ``Kind`` says which part follows. Each field
is an int, its index, annotated with what it holds (the header's comment). The groups are
instances of frozen dataclasses, not classes: on CPython 3.11 an instance attribute read has a
fast path and a class attribute read does not (~4x the instructions), and the intake reads some
fifty of them per call. The module imports only native_layouts (its ``write_header``, the
generators' command line), so setup.py can run it before anything is built or installed.
"""

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from sidecar.store.native_layouts import write_header


@dataclass(frozen=True)
class _Common:
    """Fields every call uses, from index 0."""

    KIND: Annotated[int, "which scheduler part follows: IN_KIND_WHEEL or IN_KIND_LEVELS"] = 0
    HEAD: Annotated[int, "commit-log head, the next append position (moved by the loop)"] = 1
    SEG_BYTES: Annotated[int, "commit-log segment size"] = 2
    HEADER_SIZE: Annotated[int, "mapped-file header size: the first record, slot or entry of every file"] = 3
    NEXT_OFFSET: Annotated[int, "ingress offset after the last record stored (-1 before the first)"] = 4
    MAX_RECORD_BYTES: Annotated[int, "Rules.max_record_bytes"] = 5
    MAX_DELAY_MS: Annotated[int, "Rules.max_delay_ms"] = 6
    IDX_MASK: Annotated[int, "id index: capacity - 1"] = 7
    IDX_LIVE: Annotated[int, "id index: live slots (moved by the loop)"] = 8
    IDX_TOMBS: Annotated[int, "id index: tombstone slots (moved by the loop)"] = 9
    IDX_OLD_MASK: Annotated[int, "id index: a table probed for presence only, capacity - 1 (-1: none)"] = 10
    RESTORED_BYTES: Annotated[int, "restore_run: bytes of the changelog values it stored (moved by the loop)"] = 11
    MAX_SRC_OFFSET: Annotated[int, "restore_run: highest source offset of the records it stored (-1: none)"] = 12
    IDX_OLD2_MASK: Annotated[int, "id index: a second table probed for presence only, capacity - 1 (-1: none)"] = 13
    IDX_JNL_AT: Annotated[int, "id index: bytes of the journal buffer used (moved by the loop; -1: no journal)"] = 14
    IDX_RESIDENT: Annotated[int, "id index: 1: stop at a slot to read whose table page is not in memory"] = 15
    IDX_WAIT: Annotated[int, "id index: the table slot it stopped for, its page not in memory (-1: none)"] = 16


Common = _Common()


@dataclass(frozen=True)
class _Kind:
    """Values of ``Common.KIND``."""

    WHEEL: Annotated[int, "the wheel's part follows"] = 0
    LEVELS: Annotated[int, "the levels' part follows"] = 1


Kind = _Kind()


SCHED_AT: Annotated[int, "first index of the scheduler's part"] = 17


@dataclass(frozen=True)
class _Wheel:
    """The wheel's part (sidecar/wheel/scheduler.py, ``intake_begin`` / ``intake_end``)."""

    P: Annotated[int, "precision: ms per slot"] = 17
    N: Annotated[int, "slots in the ring"] = 18
    LATE_BELOW: Annotated[int, "slot numbers below this are already due: the late chain"] = 19
    S_K: Annotated[int, "reader's slot number"] = 20
    S_O: Annotated[int, "reader's offset within its slot (-1: none)"] = 21
    GUARD: Annotated[int, "ring guard: slot numbers from GUARD + N go to a bucket"] = 22
    HEAD: Annotated[int, "next timer-log entry index (moved by the loop)"] = 23
    PER_FILE: Annotated[int, "timer-log entries per file"] = 24
    F0: Annotated[int, "first entry of the head's timer-log file (-1: not mapped)"] = 25
    APP_LO: Annotated[int, "timer log: appended range start (-1: none; moved by the loop)"] = 26
    APP_HI: Annotated[int, "timer log: appended range end (moved by the loop)"] = 27
    SLOT_DIRTY_LO: Annotated[int, "slot file: dirty byte range start (-1: none; moved by the loop)"] = 28
    SLOT_DIRTY_HI: Annotated[int, "slot file: dirty byte range end (moved by the loop)"] = 29
    MARK_LO: Annotated[int, "timer log: patched old tails, byte range start (-1: none; set by the loop)"] = 30
    MARK_HI: Annotated[int, "timer log: patched old tails, byte range end (set by the loop)"] = 31
    WIDTH: Annotated[int, "bucket width, ms"] = 32
    LATE_HEAD: Annotated[int, "late chain's first entry (-1: empty; moved by the loop)"] = 33
    LATE_TAIL: Annotated[int, "late chain's last entry (-1: empty; moved by the loop)"] = 34
    NEW_CHAINS: Annotated[int, "slot chains the loop started (occ_send flags set): the search memo is stale"] = 35


Wheel = _Wheel()


WHEEL_SIZE: Annotated[int, "length of the array with the wheel's part"] = 36


@dataclass(frozen=True)
class _Levels:
    """The levels' header (sidecar/levels/scheduler.py, ``intake_begin`` / ``intake_end``)."""

    COUNT: Annotated[int, "levels, level 0 (no delay) included"] = 17
    PER_FILE: Annotated[int, "queue entries per file"] = 18


Levels = _Levels()


LEVELS_BASE: Annotated[int, "first index of level 0's block"] = 25


@dataclass(frozen=True)
class _Level:
    """One level's block: offsets from ``level_at(n)``."""

    WRITE: Annotated[int, "next queue index (moved by the loop)"] = 0
    FIRST: Annotated[int, "first index of the queue file holding WRITE (-1: not created yet)"] = 1
    DIRTY_FROM: Annotated[int, "queue dirty range start (-1: none; moved by the loop)"] = 2
    DIRTY_TO: Annotated[int, "queue dirty range end (moved by the loop)"] = 3
    DELAY_MS: Annotated[int, "the level's delay (0 for level 0)"] = 4


Level = _Level()


LEVEL_STRIDE: Annotated[int, "values per level"] = 5


# (C prefix, the fields) of each group, in the header's order
GROUPS: tuple[tuple[str, Any], ...] = (
    ("IN_", Common), ("IN_KIND_", Kind), ("IN_W_", Wheel), ("IN_L_", Levels), ("IN_LV_", Level),
)
# (the group it follows in the header, C name, Python name) of each bound
BOUNDS: tuple[tuple[Any, str, str], ...] = (
    (Common, "IN_SCHED_AT", "SCHED_AT"), (Wheel, "IN_W_SIZE", "WHEEL_SIZE"), (Levels, "IN_L_BASE", "LEVELS_BASE"),
    (Levels, "IN_L_STRIDE", "LEVEL_STRIDE"),
)
HEADER = Path(__file__).resolve().parents[1] / "native" / "intake_layout.h"


def fields(group: Any) -> dict[str, int]:
    """The group's fields (name: index) in declaration order."""
    return {f.name: getattr(group, f.name) for f in dataclasses.fields(group)}


def doc(group: Any, name: str) -> str:
    """What a field holds (``group`` None: a bound of this module)."""
    annotations = globals()["__annotations__"] if group is None else type(group).__annotations__
    text: str = annotations[name].__metadata__[0]
    return text


def level_at(n: int) -> int:
    """Index of level ``n``'s block."""
    return LEVELS_BASE + LEVEL_STRIDE * n


def _template(size: int, kind: int) -> list[int]:
    st = [0] * size
    st[Common.KIND] = kind
    return st


_WHEEL_STATE = _template(WHEEL_SIZE, Kind.WHEEL)
_LEVELS_STATE: dict[int, list[int]] = {}


def wheel_state() -> list[int]:
    """A state with the wheel's part: zeros but ``KIND``."""
    return _WHEEL_STATE.copy()


def levels_state(count: int) -> list[int]:
    """A state with the levels' part for ``count`` levels: zeros but ``KIND`` and ``COUNT``."""
    st = _LEVELS_STATE.get(count)
    if st is None:
        st = _LEVELS_STATE[count] = _template(level_at(count), Kind.LEVELS)
        st[Levels.COUNT] = count
    return st.copy()


def check() -> None:
    """Raise ValueError if two fields share an index or a field is outside its part."""
    parts = (
        (Common, 0, SCHED_AT), (Wheel, SCHED_AT, WHEEL_SIZE), (Levels, SCHED_AT, LEVELS_BASE),
        (Level, 0, LEVEL_STRIDE),
    )
    for group, lo, hi in parts:
        seen: dict[int, str] = {}
        name_of = type(group).__name__.lstrip("_")
        for name, index in fields(group).items():
            if not lo <= index < hi:
                raise ValueError(f"intake layout: {name_of}.{name} = {index} is outside [{lo}, {hi})")
            if index in seen:
                raise ValueError(f"intake layout: {name_of}.{name} and .{seen[index]} are both {index}")
            seen[index] = name


def c_names() -> dict[str, int]:
    """Every macro of the header (but the X-macro list) and its value."""
    out = {prefix + name: index for prefix, group in GROUPS for name, index in fields(group).items()}
    out.update((c_name, globals()[name]) for _group, c_name, name in BOUNDS)
    return out


def header() -> str:
    """The C header's text."""
    lines = [
        "/* Generated from sidecar/store/intake_layout.py (python -m sidecar.store.intake_layout): do not",
        " * edit. The intake state's layout (ingest_run's st, intake.c); that module says what it is. */",
        "#ifndef KDS_INTAKE_LAYOUT_H",
        "#define KDS_INTAKE_LAYOUT_H",
    ]
    for prefix, group in GROUPS:
        lines += ["", f"/* {type(group).__name__.lstrip('_')}. {(type(group).__doc__ or '').strip()} */"]
        for name, index in fields(group).items():
            lines.append(f"#define {prefix}{name} {index} /* {doc(group, name)} */")
        for after, c_name, name in BOUNDS:
            if after is group:
                lines.append(f"#define {c_name} {globals()[name]} /* {doc(None, name)} */")
    names = list(c_names())
    lines += ["", "/* every name above, for X-macros (the module's INTAKE_LAYOUT dict) */"]
    lines.append("#define KDS_INTAKE_LAYOUT(X) \\")
    lines += [f"    X({n}) \\" for n in names[:-1]] + [f"    X({names[-1]})"]
    lines += ["", "#endif", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Write the header (``--check``: only compare, exit 1 if it differs)."""
    return write_header(argv, HEADER, header(), "sidecar.store.intake_layout")


check()

if __name__ == "__main__":
    sys.exit(main(sys.argv))
