"""The argument structs of the schedulers' C walks are declared once (sidecar/store/native_args.py):
the C header is generated from the classes and committed, the built extension's types have
exactly the classes' fields, and neither side takes positional values. Each test here fails when
one side moves without the other."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.store import native_args
from sidecar.store.codec import native
from tests.infra import needs_native

ROOT = Path(__file__).resolve().parents[2]


def test_committed_header_is_generated_from_the_declaration() -> None:
    committed = (ROOT / "sidecar" / "native" / "native_args.h").read_text()
    assert committed == native_args.header(), "run: python -m sidecar.store.native_args"
    check = subprocess.run(
        [sys.executable, "-m", "sidecar.store.native_args", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout


@needs_native
@pytest.mark.parametrize("cls", [cls for cls, _fn in native_args.STRUCTS], ids=lambda c: c.__name__)
def test_the_built_type_has_the_declared_fields(cls: type) -> None:
    """A field added, renamed or removed in the declaration after the last build shows here
    (rebuild: scripts/setup.sh): the C type's members are the class's fields, in order, each
    starting at 0."""
    assert native is not None
    c_type = getattr(native, cls.__name__)
    members = [k for k, v in vars(c_type).items() if type(v).__name__ == "member_descriptor"]
    assert members == list(native_args.fields(cls))
    a = c_type()
    b = c_type() if cls in native_args.OBJECT_STRUCTS else cls()  # a run's class: every field required
    for name in native_args.fields(cls):
        assert getattr(a, name) == getattr(b, name) == 0
        setattr(a, name, -(1 << 63))
        assert getattr(a, name) == -(1 << 63)


@needs_native
def test_a_field_out_of_range_is_refused_by_the_call() -> None:
    """C reads each field as a signed 64-bit int, as it read the positional values: a wider one
    is an OverflowError before anything is written."""
    assert native is not None
    a = native.WlLink()
    a.hs, a.nent, a.idx, a.slot_time, a.due = 64 + 8, 8, 1 << 63, 1000, 1000
    tl, sl = bytearray(64 + 8 + 8 * 32), bytearray(64 + 32)
    with pytest.raises(OverflowError):
        native.wl_link(memoryview(tl), memoryview(sl), a)
    assert not any(tl) and not any(sl)


@pytest.mark.parametrize("cls", [cls for cls, _fn in native_args.STRUCTS], ids=lambda c: c.__name__)
def test_fields_are_set_by_name_only(cls: type) -> None:
    """Neither the class nor the C type takes positional values: a positional call would bring
    back what the struct replaced. Named fields are set, the rest start at 0; a misspelt field is
    refused, at construction and later (both have fixed slots)."""
    types = [cls] + ([getattr(native, cls.__name__)] if native is not None else [])
    first, *rest = native_args.fields(cls)
    if cls in native_args.OBJECT_STRUCTS:  # the class requires every field by name: mypy sees a missing one
        with pytest.raises(TypeError):
            cls(**{first: 7})
        types = types[1:]
    for t in types:
        with pytest.raises(TypeError):
            t(1)
        with pytest.raises(TypeError):
            t(not_a_field=1)
        a = t(**{first: 7})
        assert getattr(a, first) == 7 and all(getattr(a, name) == 0 for name in rest)
        with pytest.raises(AttributeError):
            t().not_a_field = 1


def test_each_struct_names_its_function_and_its_moved_fields() -> None:
    fns = [fn for _cls, fn in native_args.STRUCTS]
    assert fns == ["wl_link", "wl_send", "wl_done", "wl_ack", "lv_due", "encode", "rearm_run", "ingest_run",
                   "restore_run"]
    assert native_args.moved(native_args.WlSend) == ("i", "e", "nxt", "after", "budget", "room", "lo", "hi")
    assert native_args.moved(native_args.LvDue) == ("idx", "done", "room")
    assert native_args.moved(native_args.WlLink) == ()
    header = native_args.header()
    for cls, fn in native_args.STRUCTS:
        assert f"}} Kds{cls.__name__};" in header and f"KDS_ARGS_TYPE({cls.__name__}, {fn})" in header
        kinds = native_args.kinds(cls)
        for name, text in native_args.fields(cls).items():
            assert f"    PyObject *{name}; /* {kinds[name]}: {text} */" in header
            assert (kinds[name] == "int") == (cls not in native_args.OBJECT_STRUCTS or name in ("now", "partition",
                                                                                                "end"))


@needs_native
@pytest.mark.parametrize("call", ["ingest_run", "restore_run", "rearm_run"])
def test_a_run_takes_its_own_argument_object_only(call: str) -> None:
    """A run takes (records, start, its argument object): positional buffers, another run's
    object, or its object with a field left at 0 (where a buffer or the state belongs) are a
    TypeError or ValueError naming the call, never a crash or a write."""
    assert native is not None
    import sidecar.store.firings  # noqa: F401  # its import sets up the C firing (rearm_run needs it)

    fn = getattr(native, call)
    own = {"ingest_run": native.IngestRun, "restore_run": native.RestoreRun, "rearm_run": native.RunBufs}[call]
    other = native.RunBufs if own is not native.RunBufs else native.IngestRun
    st = [0] * 8
    with pytest.raises(TypeError, match=call):
        fn([], 0, None, memoryview(bytearray(64)), st, ())
    with pytest.raises(TypeError, match=call):
        fn([], 0, other())
    with pytest.raises((TypeError, ValueError)):
        fn([object()], 0, own())
    assert st == [0] * 8
