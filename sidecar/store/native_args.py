"""C calls with many arguments take them in a declared struct: its one declaration.

The timer wheel's per-entry walks (``wl_link``, ``wl_send``, ``wl_done``, ``wl_ack``:
sidecar/wheel/layout.py, native/wheel.c) and the delay levels' dequeue walk (``lv_due``:
sidecar/levels/queue.py, native/levels.c) read ten to fourteen integers each and move some of
them; the codec's ``encode`` and ``append`` (sidecar/store/codec.py, native/codec.c) write a
record head of eight; the C runs over a store (``ingest_run``, ``restore_run``, ``rearm_run``:
native/intake.c, native/firing.c) take its state, eight buffers and a few values. Passed
positionally, two of them swapped would type-check and run; so each call takes its records and
list position positionally and the rest in one argument object, whose fields are named.
The classes below are that object's declaration and the Python twins' type: each field is
annotated with its type and what it holds (its member's doc in C); "(moved)" marks the int
fields the call writes back, the rest it only reads. The walks' and the head's fields are ints;
the runs' (``OBJECT_STRUCTS``) are objects of the annotated types, every one required by name
(kw-only dataclasses), so mypy checks each name and type where a run is called.

The C side is generated from them by ``header()`` into ``sidecar/native/native_args.h``
(``python -m sidecar.store.native_args`` writes it, ``--check`` only compares; setup.py writes it
before every build): per class a struct and a type ``sidecar._native.<Name>`` whose attributes
are its members. The members hold the objects themselves (``T_OBJECT_EX``), not int64s:
CPython 3.11 specializes an attribute store or load of an object slot (a few ns, like the
Python class's ``__slots__``) but not of an int64 member (a descriptor call each, ~50 ns), and
the caller sets and reads several per call; C converts each value as it did the positional ones.
The stub (sidecar/_native.pyi) names these classes as the C types' declarations, so mypy checks
every field name at the call sites.
tests/unit/test_native_args.py fails when the committed header differs from ``header()`` or a
built type's members differ from the class's fields.

A caller makes the object once (``make``: the C type where the extension runs, else the class)
and keeps it: per call it sets only the fields that changed, and reads back the moved ones; or,
for a record's head (``codec.head``) and a run, makes one per call with every field named (a
run's object is dropped after the call, so it never keeps a mapping open). Both refuse
positional constructor arguments (a field not named starts at 0 in C), so a positional call
cannot come back.
Like native_layouts, this module imports only the standard library and that module, so setup.py
runs it before anything is built.
"""

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from sidecar.store.native_layouts import write_header

MOVED = "(moved)"


class _Args:
    """What every argument struct shares: every field 0 unless named; no positional values."""

    __slots__ = ()

    def __init__(self, **named: int) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            setattr(self, f.name, named.pop(f.name, 0))
        if named:
            raise TypeError(f"{type(self).__name__}() got unexpected fields: {', '.join(named)}")


@dataclass(slots=True, init=False)
class _File(_Args):
    """The file a walk reads: its geometry."""

    hs: Annotated[int, "byte offset of the file's first entry"] = 0
    f0: Annotated[int, "first entry index of the file"] = 0
    nent: Annotated[int, "entries per file"] = 0


@dataclass(slots=True, init=False)
class WlLink(_File):
    """wl_link: entry ``idx`` written into its timer-log file and linked at its slot's chain tail."""

    idx: Annotated[int, "the entry to write"] = 0
    due: Annotated[int, "its due time, ms"] = 0
    loc: Annotated[int, "its body's place: commit-log position or bucket ref"] = 0
    flags: Annotated[int, "its flags byte"] = 0
    level: Annotated[int, "its level (u16)"] = 0
    slot_off: Annotated[int, "byte offset of its slot in the slot file"] = 0
    slot_time: Annotated[int, "start time of that slot, ms"] = 0


@dataclass(slots=True, init=False)
class _Pass(_File):
    """A cursor's pass over one offset of a slot, or over the late chain (``o`` -1)."""

    i: Annotated[int, "indexed pass: position in the entry list (moved)"] = 0
    e: Annotated[int, "chain walk: the next entry, -1 at the end (moved)"] = 0
    last: Annotated[int, "the pass's last entry"] = 0
    base: Annotated[int, "the slot's start time, ms (wl_send's late chain: now)"] = 0
    o: Annotated[int, "the pass's offset (-1: the late chain)"] = 0
    nxt: Annotated[int, "smallest offset above o seen, -1: none (moved)"] = 0
    after: Annotated[int, "last entry examined (moved)"] = 0
    budget: Annotated[int, "entries still to examine (moved)"] = 0


@dataclass(slots=True, init=False)
class WlSend(_Pass):
    """wl_send: the send cursor's pass over one timer-log file."""

    room: Annotated[int, "entries still to hand out (moved)"] = 0
    vlim: Annotated[int, "entries below it were restored: the caller checks them"] = 0
    lo: Annotated[int, "state bytes flipped: first (moved)"] = 0
    hi: Annotated[int, "state bytes flipped: last, -1: none (moved)"] = 0


@dataclass(slots=True, init=False)
class WlDone(_Pass):
    """wl_done: the done cursor's pass over one timer-log file."""

    seg_bytes: Annotated[int, "commit-log segment size"] = 0
    passed: Annotated[int, "entries crossed by this call (moved)"] = 0


@dataclass(slots=True, init=False)
class WlAck(_File):
    """wl_ack: a run of acked refs of one timer-log file marked done."""

    j: Annotated[int, "position in refs (moved)"] = 0
    head: Annotated[int, "the next timer-log index: refs at or above it are not entries yet"] = 0
    P: Annotated[int, "precision: ms per slot"] = 0
    s_k: Annotated[int, "send cursor: its slot"] = 0
    s_o: Annotated[int, "send cursor: its pass offset (-1: slot not started)"] = 0
    s_after: Annotated[int, "send cursor: last entry examined in its pass (-1: none)"] = 0
    l_sent: Annotated[int, "late chain: last entry examined by send (-1: none)"] = 0
    wait_a: Annotated[int, "an entry the done cursor waits on (-1: none)"] = 0
    wait_b: Annotated[int, "the other entry the done cursor waits on (-1: none)"] = 0
    lo: Annotated[int, "state bytes flipped: first (moved)"] = 0
    hi: Annotated[int, "state bytes flipped: last, -1: none (moved)"] = 0


@dataclass(slots=True, init=False)
class LvDue(_Args):
    """lv_due: the dequeue's walk over one level's queue file."""

    hs: Annotated[int, "byte offset of the queue file's first entry"] = 0
    f0: Annotated[int, "first entry index of the queue file"] = 0
    idx: Annotated[int, "the next entry to read (moved)"] = 0
    stop: Annotated[int, "the walk ends before this entry"] = 0
    now: Annotated[int, "entries due after it stay"] = 0
    restored: Annotated[int, "entries below it were restored: the caller reads them"] = 0
    done: Annotated[int, "the done cursor, moved over the finished entries it meets (moved)"] = 0
    room: Annotated[int, "records still to hand out (moved)"] = 0
    ref_hi: Annotated[int, "the level's bits of a scheduler ref"] = 0
    seg_bytes: Annotated[int, "commit-log segment size"] = 0


@dataclass(slots=True, init=False)
class RecordHead(_Args):
    """encode, append: a commit-log record's integer fields (docs/storage.md 2.2)."""

    rtype: Annotated[int, "record type: MESSAGE, CANCEL, DEAD, RECURRING (u8)"] = 0
    due_ms: Annotated[int, "committed due time, epoch ms"] = 0
    enqueue_ms: Annotated[int, "the ingress record's timestamp, epoch ms"] = 0
    src_offset: Annotated[int, "ingress offset"] = 0
    src_partition: Annotated[int, "ingress partition (i32)"] = 0
    target_partition: Annotated[int, "target partition, -1: the producer's partitioner (i32)"] = 0
    retry_count: Annotated[int, "consumer-retry count (u16)"] = 0
    level: Annotated[int, "delay level, or a CANCEL's outcome (u16)"] = 0


# -- the C runs over a store (native/intake_run.h): objects, each field named and typed ------------


@dataclass(slots=True, kw_only=True)
class RunBufs:
    """rearm_run, and the first fields of ingest_run's and restore_run's: the store's state and
    the buffers a C run writes (kds_in_open). Built per call: it holds the mapped buffers only for
    the call, so a segment or table can be closed after it."""

    seg_buf: Annotated[memoryview | None, "the head segment's mapping; None: not mapped yet, nothing fits"]
    idx_buf: Annotated[Any, "the id index's table or open stage, written"]
    st: Annotated[list[int], "the intake state (sidecar/store/intake_layout.py), moved in place"]
    sched_bufs: Annotated[tuple[Any, ...], "the scheduler's buffers (its intake_begin)"]
    idx_old_buf: Annotated[Any, "a table probed for presence only (the sealed stage, or the table), or None"]
    idx_old2_buf: Annotated[Any, "a second table probed for presence only, or None"]
    idx_jnl_buf: Annotated[Any, "the id index's journal buffer, or None"]
    idx_tags_buf: Annotated[Any, "the tag bytes of the table probed last, or None"]


@dataclass(slots=True, kw_only=True)
class IngestRun(RunBufs):
    """ingest_run: the consumed ingress records of one partition stored in one C call."""

    now: Annotated[int, "the loop's time, epoch ms (a record without a timestamp takes it)"]
    partition: Annotated[int, "the ingress partition: a message of another one stops the run"]
    id_prefix: Annotated[bytes, "the default delay.id's prefix, b'<topic>:<partition>:'"]
    checked_targets: Annotated[set[str], "the target topics known to exist"]
    no_headers: Annotated[bytes, "the stored headers blob of a record without user headers"]
    topic: Annotated[str | None, "the ingress topic: a message of another one stops the run; None: not checked"]
    direct: Annotated[Any, "the store's DirectPort: a request due on arrival is published, not stored; None: none is"]


@dataclass(slots=True, kw_only=True)
class RestoreRun(RunBufs):
    """restore_run: the consumed changelog records of one partition stored in one C call."""

    partition: Annotated[int, "the changelog partition: a message of another one stops the run"]
    end: Annotated[int, "the offset the restore ends before; -1: none (a standby)"]


# every argument struct, in the header's order, with the C function that takes it
STRUCTS: tuple[tuple[type, str], ...] = (
    (WlLink, "wl_link"), (WlSend, "wl_send"), (WlDone, "wl_done"), (WlAck, "wl_ack"), (LvDue, "lv_due"),
    (RecordHead, "encode"), (RunBufs, "rearm_run"), (IngestRun, "ingest_run"), (RestoreRun, "restore_run"),
)
# the structs whose fields are objects of the types annotated (the rest: every field an int)
OBJECT_STRUCTS = (RunBufs, IngestRun, RestoreRun)
HEADER = Path(__file__).resolve().parents[1] / "native" / "native_args.h"


def _notes(cls: type) -> dict[str, Any]:
    return {k: v for c in reversed(cls.__mro__) for k, v in getattr(c, "__annotations__", {}).items()}


def fields(cls: type) -> dict[str, str]:
    """The class's fields (name: what it holds) in declaration order."""
    notes = _notes(cls)
    return {f.name: notes[f.name].__metadata__[0] for f in dataclasses.fields(cls)}


def kinds(cls: type) -> dict[str, str]:
    """The class's fields (name: its type, as the header's comment names it) in declaration order."""
    notes = _notes(cls)

    def name(t: Any) -> str:
        return t.__name__ if isinstance(t, type) else str(t).replace("typing.", "")

    return {f.name: name(notes[f.name].__origin__) for f in dataclasses.fields(cls)}


def moved(cls: type) -> tuple[str, ...]:
    """The fields the call writes back."""
    return tuple(name for name, text in fields(cls).items() if MOVED in text)


def make(cls: type[Any], native: Any) -> Any:
    """A fresh argument object: the extension's type of that name, or the class without it."""
    return (cls if native is None else getattr(native, cls.__name__))()



def header() -> str:
    """The C header's text: per struct a typedef and its type's extern declaration; with
    ``KDS_NATIVE_ARGS_IMPL`` defined (module.c only) the member tables and the types."""
    lines = [
        "/* Generated from sidecar/store/native_args.py (python -m sidecar.store.native_args): do not",
        " * edit. The argument structs of the C calls with many arguments; that module says what each is. */",
        "#ifndef KDS_NATIVE_ARGS_H",
        "#define KDS_NATIVE_ARGS_H",
    ]
    for cls, _fn in STRUCTS:
        name = cls.__name__
        lines += ["", f"/* {(cls.__doc__ or '').strip()} */", "typedef struct {", "    PyObject_HEAD"]
        kind = kinds(cls)
        lines += [f"    PyObject *{f}; /* {kind[f]}: {text} */" for f, text in fields(cls).items()]
        lines += [f"}} Kds{name};", f"extern PyTypeObject kds_{name}Type;"]
    lines += ["", "/* every struct's type, for X-macros (module.c adds them to the module) */"]
    lines.append("#define KDS_NATIVE_ARGS(X) \\")
    names = [cls.__name__ for cls, _fn in STRUCTS]
    lines += [f"    X({n}) \\" for n in names[:-1]] + [f"    X({names[-1]})"]
    lines += [
        "",
        "/* a field's value (-1 with an error set if it is not an int in range, or was deleted) */",
        "static inline long long kds_arg(PyObject *v) { return PyLong_AsLongLong(v); }",
        "/* a moved field written back: 0, or -1 with an error set */",
        "static inline int kds_arg_set(PyObject **field, long long v) {",
        "    PyObject *n = PyLong_FromLongLong(v);",
        "    if (!n) return -1;",
        "    Py_XSETREF(*field, n);",
        "    return 0;",
        "}",
        "",
        "#ifdef KDS_NATIVE_ARGS_IMPL",
        "/* the fields: the object pointers after the head */",
        "#define KDS_ARGS_FIELDS(o) ((PyObject **)((char *)(o) + sizeof(PyObject)))",
        "#define KDS_ARGS_COUNT(t) \\",
        "    (((t)->tp_basicsize - (Py_ssize_t)sizeof(PyObject)) / (Py_ssize_t)sizeof(PyObject *))",
        "/* every field starts at 0 unless named; positional arguments are refused. Called through",
        " * vectorcall (no keyword dict); a name is first tried against the member in its own place,",
        " * as callers name the fields in declaration order. */",
        "static PyObject *kds_args_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,",
        "                                     PyObject *kwnames) {",
        "    PyTypeObject *type = (PyTypeObject *)callable;",
        "    if (PyVectorcall_NARGS(nargsf)) {",
        '        PyErr_Format(PyExc_TypeError, "%s() takes no positional arguments: name its fields", type->tp_name);',
        "        return NULL;",
        "    }",
        "    PyObject *o = type->tp_alloc(type, 0);",
        "    if (!o) return NULL;",
        "    PyObject *zero = PyLong_FromLong(0);",
        "    if (!zero) {",
        "        Py_DECREF(o);",
        "        return NULL;",
        "    }",
        "    Py_ssize_t count = KDS_ARGS_COUNT(type), named = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;",
        "    for (Py_ssize_t k = 0; k < count; k++) KDS_ARGS_FIELDS(o)[k] = Py_NewRef(zero);",
        "    Py_DECREF(zero);",
        "    for (Py_ssize_t i = 0; i < named; i++) {",
        "        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, i));",
        "        if (!name) goto fail;",
        "        Py_ssize_t k = i < count && strcmp(type->tp_members[i].name, name) == 0 ? i : 0;",
        "        while (k < count && strcmp(type->tp_members[k].name, name) != 0) k++;",
        "        if (k == count) {",
        '            PyErr_Format(PyExc_TypeError, "%s() got an unexpected field: %s", type->tp_name, name);',
        "            goto fail;",
        "        }",
        "        Py_XSETREF(KDS_ARGS_FIELDS(o)[k], Py_NewRef(args[i]));",
        "    }",
        "    return o;",
        "fail:",
        "    Py_DECREF(o);",
        "    return NULL;",
        "}",
        "/* the same through tp_new (a subclass, or a call that is not a vectorcall) */",
        "static PyObject *kds_args_new(PyTypeObject *type, PyObject *args, PyObject *kw) {",
        "    Py_ssize_t n = kw ? PyDict_GET_SIZE(kw) : 0, pos = 0, i = 0;",
        "    PyObject *names = PyTuple_New(n), *values[64], *key, *value;",
        "    if (!names) return NULL;",
        "    if (n > 64) {",
        '        PyErr_Format(PyExc_TypeError, "%s() has fewer fields than that", type->tp_name);',
        "        Py_DECREF(names);",
        "        return NULL;",
        "    }",
        "    while (kw && PyDict_Next(kw, &pos, &key, &value)) {",
        "        PyTuple_SET_ITEM(names, i, Py_NewRef(key));",
        "        values[i++] = value;",
        "    }",
        "    size_t nargs = (size_t)PyTuple_GET_SIZE(args);",
        "    PyObject *o = kds_args_vectorcall((PyObject *)type, values, nargs, n ? names : NULL);",
        "    Py_DECREF(names);",
        "    return o;",
        "}",
        "static void kds_args_dealloc(PyObject *o) {",
        "    for (Py_ssize_t k = 0; k < KDS_ARGS_COUNT(Py_TYPE(o)); k++) Py_CLEAR(KDS_ARGS_FIELDS(o)[k]);",
        "    Py_TYPE(o)->tp_free(o);",
        "}",
    ]
    lines += [
        "#define KDS_ARGS_TYPE(name, fn) \\",
        "    PyTypeObject kds_##name##Type = {PyVarObject_HEAD_INIT(NULL, 0).tp_name = \"sidecar._native.\" #name, \\",
        "                                     .tp_basicsize = sizeof(Kds##name), \\",
        "                                     .tp_flags = Py_TPFLAGS_DEFAULT, \\",
        "                                     .tp_doc = #fn \"'s arguments (sidecar/store/native_args.py).\", \\",
        "                                     .tp_new = kds_args_new, \\",
        "                                     .tp_vectorcall = kds_args_vectorcall, \\",
        "                                     .tp_dealloc = kds_args_dealloc, \\",
        "                                     .tp_members = kds_##name##_members};",
    ]
    for cls, fn in STRUCTS:
        name = cls.__name__
        lines += ["", f"static PyMemberDef kds_{name}_members[] = {{"]
        lines += [
            f'    {{"{f}", T_OBJECT_EX, offsetof(Kds{name}, {f}), 0, "{text}"}},' for f, text in fields(cls).items()
        ]
        lines += ["    {NULL, 0, 0, 0, NULL}};", f"KDS_ARGS_TYPE({name}, {fn})"]
    lines += ["#endif", "", "#endif", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Write the header (``--check``: only compare, exit 1 if it differs)."""
    return write_header(argv, HEADER, header(), "sidecar.store.native_args")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
