/* Generated from sidecar/store/native_args.py (python -m sidecar.store.native_args): do not
 * edit. The argument structs of the C calls with many arguments; that module says what each is. */
#ifndef KDS_NATIVE_ARGS_H
#define KDS_NATIVE_ARGS_H

/* wl_link: entry ``idx`` written into its timer-log file and linked at its slot's chain tail. */
typedef struct {
    PyObject_HEAD
    PyObject *hs; /* int: byte offset of the file's first entry */
    PyObject *f0; /* int: first entry index of the file */
    PyObject *nent; /* int: entries per file */
    PyObject *idx; /* int: the entry to write */
    PyObject *due; /* int: its due time, ms */
    PyObject *loc; /* int: its body's place: commit-log position or bucket ref */
    PyObject *flags; /* int: its flags byte */
    PyObject *level; /* int: its level (u16) */
    PyObject *slot_off; /* int: byte offset of its slot in the slot file */
    PyObject *slot_time; /* int: start time of that slot, ms */
} KdsWlLink;
extern PyTypeObject kds_WlLinkType;

/* wl_send: the send cursor's pass over one timer-log file. */
typedef struct {
    PyObject_HEAD
    PyObject *hs; /* int: byte offset of the file's first entry */
    PyObject *f0; /* int: first entry index of the file */
    PyObject *nent; /* int: entries per file */
    PyObject *i; /* int: indexed pass: position in the entry list (moved) */
    PyObject *e; /* int: chain walk: the next entry, -1 at the end (moved) */
    PyObject *last; /* int: the pass's last entry */
    PyObject *base; /* int: the slot's start time, ms (wl_send's late chain: now) */
    PyObject *o; /* int: the pass's offset (-1: the late chain) */
    PyObject *nxt; /* int: smallest offset above o seen, -1: none (moved) */
    PyObject *after; /* int: last entry examined (moved) */
    PyObject *budget; /* int: entries still to examine (moved) */
    PyObject *room; /* int: entries still to hand out (moved) */
    PyObject *vlim; /* int: entries below it were restored: the caller checks them */
    PyObject *lo; /* int: state bytes flipped: first (moved) */
    PyObject *hi; /* int: state bytes flipped: last, -1: none (moved) */
} KdsWlSend;
extern PyTypeObject kds_WlSendType;

/* wl_done: the done cursor's pass over one timer-log file. */
typedef struct {
    PyObject_HEAD
    PyObject *hs; /* int: byte offset of the file's first entry */
    PyObject *f0; /* int: first entry index of the file */
    PyObject *nent; /* int: entries per file */
    PyObject *i; /* int: indexed pass: position in the entry list (moved) */
    PyObject *e; /* int: chain walk: the next entry, -1 at the end (moved) */
    PyObject *last; /* int: the pass's last entry */
    PyObject *base; /* int: the slot's start time, ms (wl_send's late chain: now) */
    PyObject *o; /* int: the pass's offset (-1: the late chain) */
    PyObject *nxt; /* int: smallest offset above o seen, -1: none (moved) */
    PyObject *after; /* int: last entry examined (moved) */
    PyObject *budget; /* int: entries still to examine (moved) */
    PyObject *seg_bytes; /* int: commit-log segment size */
    PyObject *passed; /* int: entries crossed by this call (moved) */
} KdsWlDone;
extern PyTypeObject kds_WlDoneType;

/* wl_ack: a run of acked refs of one timer-log file marked done. */
typedef struct {
    PyObject_HEAD
    PyObject *hs; /* int: byte offset of the file's first entry */
    PyObject *f0; /* int: first entry index of the file */
    PyObject *nent; /* int: entries per file */
    PyObject *j; /* int: position in refs (moved) */
    PyObject *head; /* int: the next timer-log index: refs at or above it are not entries yet */
    PyObject *P; /* int: precision: ms per slot */
    PyObject *s_k; /* int: send cursor: its slot */
    PyObject *s_o; /* int: send cursor: its pass offset (-1: slot not started) */
    PyObject *s_after; /* int: send cursor: last entry examined in its pass (-1: none) */
    PyObject *l_sent; /* int: late chain: last entry examined by send (-1: none) */
    PyObject *wait_a; /* int: an entry the done cursor waits on (-1: none) */
    PyObject *wait_b; /* int: the other entry the done cursor waits on (-1: none) */
    PyObject *lo; /* int: state bytes flipped: first (moved) */
    PyObject *hi; /* int: state bytes flipped: last, -1: none (moved) */
} KdsWlAck;
extern PyTypeObject kds_WlAckType;

/* lv_due: the dequeue's walk over one level's queue file. */
typedef struct {
    PyObject_HEAD
    PyObject *hs; /* int: byte offset of the queue file's first entry */
    PyObject *f0; /* int: first entry index of the queue file */
    PyObject *idx; /* int: the next entry to read (moved) */
    PyObject *stop; /* int: the walk ends before this entry */
    PyObject *now; /* int: entries due after it stay */
    PyObject *restored; /* int: entries below it were restored: the caller reads them */
    PyObject *done; /* int: the done cursor, moved over the finished entries it meets (moved) */
    PyObject *room; /* int: records still to hand out (moved) */
    PyObject *ref_hi; /* int: the level's bits of a scheduler ref */
    PyObject *seg_bytes; /* int: commit-log segment size */
} KdsLvDue;
extern PyTypeObject kds_LvDueType;

/* encode, append: a commit-log record's integer fields (docs/storage.md 2.2). */
typedef struct {
    PyObject_HEAD
    PyObject *rtype; /* int: record type: MESSAGE, CANCEL, DEAD, RECURRING (u8) */
    PyObject *due_ms; /* int: committed due time, epoch ms */
    PyObject *enqueue_ms; /* int: the ingress record's timestamp, epoch ms */
    PyObject *src_offset; /* int: ingress offset */
    PyObject *src_partition; /* int: ingress partition (i32) */
    PyObject *target_partition; /* int: target partition, -1: the producer's partitioner (i32) */
    PyObject *retry_count; /* int: consumer-retry count (u16) */
    PyObject *level; /* int: delay level, or a CANCEL's outcome (u16) */
} KdsRecordHead;
extern PyTypeObject kds_RecordHeadType;

/* rearm_run, and the first fields of ingest_run's and restore_run's: the store's state and
    the buffers a C run writes (kds_in_open). Built per call: it holds the mapped buffers only for
    the call, so a segment or table can be closed after it. */
typedef struct {
    PyObject_HEAD
    PyObject *seg_buf; /* memoryview | None: the head segment's mapping; None: not mapped yet, nothing fits */
    PyObject *idx_buf; /* Any: the id index's table or open stage, written */
    PyObject *st; /* list[int]: the intake state (sidecar/store/intake_layout.py), moved in place */
    PyObject *sched_bufs; /* tuple[Any, ...]: the scheduler's buffers (its intake_begin) */
    PyObject *idx_old_buf; /* Any: a table probed for presence only (the sealed stage, or the table), or None */
    PyObject *idx_old2_buf; /* Any: a second table probed for presence only, or None */
    PyObject *idx_jnl_buf; /* Any: the id index's journal buffer, or None */
    PyObject *idx_tags_buf; /* Any: the tag bytes of the table probed last, or None */
} KdsRunBufs;
extern PyTypeObject kds_RunBufsType;

/* ingest_run: the consumed ingress records of one partition stored in one C call. */
typedef struct {
    PyObject_HEAD
    PyObject *seg_buf; /* memoryview | None: the head segment's mapping; None: not mapped yet, nothing fits */
    PyObject *idx_buf; /* Any: the id index's table or open stage, written */
    PyObject *st; /* list[int]: the intake state (sidecar/store/intake_layout.py), moved in place */
    PyObject *sched_bufs; /* tuple[Any, ...]: the scheduler's buffers (its intake_begin) */
    PyObject *idx_old_buf; /* Any: a table probed for presence only (the sealed stage, or the table), or None */
    PyObject *idx_old2_buf; /* Any: a second table probed for presence only, or None */
    PyObject *idx_jnl_buf; /* Any: the id index's journal buffer, or None */
    PyObject *idx_tags_buf; /* Any: the tag bytes of the table probed last, or None */
    PyObject *now; /* int: the loop's time, epoch ms (a record without a timestamp takes it) */
    PyObject *partition; /* int: the ingress partition: a message of another one stops the run */
    PyObject *id_prefix; /* bytes: the default delay.id's prefix, b'<topic>:<partition>:' */
    PyObject *checked_targets; /* set[str]: the target topics known to exist */
    PyObject *no_headers; /* bytes: the stored headers blob of a record without user headers */
    PyObject *topic; /* str | None: the ingress topic: a message of another one stops the run; None: not checked */
    PyObject *direct; /* Any: the store's DirectPort: a request due on arrival is published, not stored; None: none is */
} KdsIngestRun;
extern PyTypeObject kds_IngestRunType;

/* restore_run: the consumed changelog records of one partition stored in one C call. */
typedef struct {
    PyObject_HEAD
    PyObject *seg_buf; /* memoryview | None: the head segment's mapping; None: not mapped yet, nothing fits */
    PyObject *idx_buf; /* Any: the id index's table or open stage, written */
    PyObject *st; /* list[int]: the intake state (sidecar/store/intake_layout.py), moved in place */
    PyObject *sched_bufs; /* tuple[Any, ...]: the scheduler's buffers (its intake_begin) */
    PyObject *idx_old_buf; /* Any: a table probed for presence only (the sealed stage, or the table), or None */
    PyObject *idx_old2_buf; /* Any: a second table probed for presence only, or None */
    PyObject *idx_jnl_buf; /* Any: the id index's journal buffer, or None */
    PyObject *idx_tags_buf; /* Any: the tag bytes of the table probed last, or None */
    PyObject *partition; /* int: the changelog partition: a message of another one stops the run */
    PyObject *end; /* int: the offset the restore ends before; -1: none (a standby) */
} KdsRestoreRun;
extern PyTypeObject kds_RestoreRunType;

/* every struct's type, for X-macros (module.c adds them to the module) */
#define KDS_NATIVE_ARGS(X) \
    X(WlLink) \
    X(WlSend) \
    X(WlDone) \
    X(WlAck) \
    X(LvDue) \
    X(RecordHead) \
    X(RunBufs) \
    X(IngestRun) \
    X(RestoreRun)

/* a field's value (-1 with an error set if it is not an int in range, or was deleted) */
static inline long long kds_arg(PyObject *v) { return PyLong_AsLongLong(v); }
/* a moved field written back: 0, or -1 with an error set */
static inline int kds_arg_set(PyObject **field, long long v) {
    PyObject *n = PyLong_FromLongLong(v);
    if (!n) return -1;
    Py_XSETREF(*field, n);
    return 0;
}

#ifdef KDS_NATIVE_ARGS_IMPL
/* the fields: the object pointers after the head */
#define KDS_ARGS_FIELDS(o) ((PyObject **)((char *)(o) + sizeof(PyObject)))
#define KDS_ARGS_COUNT(t) \
    (((t)->tp_basicsize - (Py_ssize_t)sizeof(PyObject)) / (Py_ssize_t)sizeof(PyObject *))
/* every field starts at 0 unless named; positional arguments are refused. Called through
 * vectorcall (no keyword dict); a name is first tried against the member in its own place,
 * as callers name the fields in declaration order. */
static PyObject *kds_args_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames) {
    PyTypeObject *type = (PyTypeObject *)callable;
    if (PyVectorcall_NARGS(nargsf)) {
        PyErr_Format(PyExc_TypeError, "%s() takes no positional arguments: name its fields", type->tp_name);
        return NULL;
    }
    PyObject *o = type->tp_alloc(type, 0);
    if (!o) return NULL;
    PyObject *zero = PyLong_FromLong(0);
    if (!zero) {
        Py_DECREF(o);
        return NULL;
    }
    Py_ssize_t count = KDS_ARGS_COUNT(type), named = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < count; k++) KDS_ARGS_FIELDS(o)[k] = Py_NewRef(zero);
    Py_DECREF(zero);
    for (Py_ssize_t i = 0; i < named; i++) {
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, i));
        if (!name) goto fail;
        Py_ssize_t k = i < count && strcmp(type->tp_members[i].name, name) == 0 ? i : 0;
        while (k < count && strcmp(type->tp_members[k].name, name) != 0) k++;
        if (k == count) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected field: %s", type->tp_name, name);
            goto fail;
        }
        Py_XSETREF(KDS_ARGS_FIELDS(o)[k], Py_NewRef(args[i]));
    }
    return o;
fail:
    Py_DECREF(o);
    return NULL;
}
/* the same through tp_new (a subclass, or a call that is not a vectorcall) */
static PyObject *kds_args_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Py_ssize_t n = kw ? PyDict_GET_SIZE(kw) : 0, pos = 0, i = 0;
    PyObject *names = PyTuple_New(n), *values[64], *key, *value;
    if (!names) return NULL;
    if (n > 64) {
        PyErr_Format(PyExc_TypeError, "%s() has fewer fields than that", type->tp_name);
        Py_DECREF(names);
        return NULL;
    }
    while (kw && PyDict_Next(kw, &pos, &key, &value)) {
        PyTuple_SET_ITEM(names, i, Py_NewRef(key));
        values[i++] = value;
    }
    size_t nargs = (size_t)PyTuple_GET_SIZE(args);
    PyObject *o = kds_args_vectorcall((PyObject *)type, values, nargs, n ? names : NULL);
    Py_DECREF(names);
    return o;
}
static void kds_args_dealloc(PyObject *o) {
    for (Py_ssize_t k = 0; k < KDS_ARGS_COUNT(Py_TYPE(o)); k++) Py_CLEAR(KDS_ARGS_FIELDS(o)[k]);
    Py_TYPE(o)->tp_free(o);
}
#define KDS_ARGS_TYPE(name, fn) \
    PyTypeObject kds_##name##Type = {PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sidecar._native." #name, \
                                     .tp_basicsize = sizeof(Kds##name), \
                                     .tp_flags = Py_TPFLAGS_DEFAULT, \
                                     .tp_doc = #fn "'s arguments (sidecar/store/native_args.py).", \
                                     .tp_new = kds_args_new, \
                                     .tp_vectorcall = kds_args_vectorcall, \
                                     .tp_dealloc = kds_args_dealloc, \
                                     .tp_members = kds_##name##_members};

static PyMemberDef kds_WlLink_members[] = {
    {"hs", T_OBJECT_EX, offsetof(KdsWlLink, hs), 0, "byte offset of the file's first entry"},
    {"f0", T_OBJECT_EX, offsetof(KdsWlLink, f0), 0, "first entry index of the file"},
    {"nent", T_OBJECT_EX, offsetof(KdsWlLink, nent), 0, "entries per file"},
    {"idx", T_OBJECT_EX, offsetof(KdsWlLink, idx), 0, "the entry to write"},
    {"due", T_OBJECT_EX, offsetof(KdsWlLink, due), 0, "its due time, ms"},
    {"loc", T_OBJECT_EX, offsetof(KdsWlLink, loc), 0, "its body's place: commit-log position or bucket ref"},
    {"flags", T_OBJECT_EX, offsetof(KdsWlLink, flags), 0, "its flags byte"},
    {"level", T_OBJECT_EX, offsetof(KdsWlLink, level), 0, "its level (u16)"},
    {"slot_off", T_OBJECT_EX, offsetof(KdsWlLink, slot_off), 0, "byte offset of its slot in the slot file"},
    {"slot_time", T_OBJECT_EX, offsetof(KdsWlLink, slot_time), 0, "start time of that slot, ms"},
    {NULL, 0, 0, 0, NULL}};
KDS_ARGS_TYPE(WlLink, wl_link)

static PyMemberDef kds_WlSend_members[] = {
    {"hs", T_OBJECT_EX, offsetof(KdsWlSend, hs), 0, "byte offset of the file's first entry"},
    {"f0", T_OBJECT_EX, offsetof(KdsWlSend, f0), 0, "first entry index of the file"},
    {"nent", T_OBJECT_EX, offsetof(KdsWlSend, nent), 0, "entries per file"},
    {"i", T_OBJECT_EX, offsetof(KdsWlSend, i), 0, "indexed pass: position in the entry list (moved)"},
    {"e", T_OBJECT_EX, offsetof(KdsWlSend, e), 0, "chain walk: the next entry, -1 at the end (moved)"},
    {"last", T_OBJECT_EX, offsetof(KdsWlSend, last), 0, "the pass's last entry"},
    {"base", T_OBJECT_EX, offsetof(KdsWlSend, base), 0, "the slot's start time, ms (wl_send's late chain: now)"},
    {"o", T_OBJECT_EX, offsetof(KdsWlSend, o), 0, "the pass's offset (-1: the late chain)"},
    {"nxt", T_OBJECT_EX, offsetof(KdsWlSend, nxt), 0, "smallest offset above o seen, -1: none (moved)"},
    {"after", T_OBJECT_EX, offsetof(KdsWlSend, after), 0, "last entry examined (moved)"},
    {"budget", T_OBJECT_EX, offsetof(KdsWlSend, budget), 0, "entries still to examine (moved)"},
    {"room", T_OBJECT_EX, offsetof(KdsWlSend, room), 0, "entries still to hand out (moved)"},
    {"vlim", T_OBJECT_EX, offsetof(KdsWlSend, vlim), 0, "entries below it were restored: the caller checks them"},
    {"lo", T_OBJECT_EX, offsetof(KdsWlSend, lo), 0, "state bytes flipped: first (moved)"},
    {"hi", T_OBJECT_EX, offsetof(KdsWlSend, hi), 0, "state bytes flipped: last, -1: none (moved)"},
    {NULL, 0, 0, 0, NULL}};
KDS_ARGS_TYPE(WlSend, wl_send)

static PyMemberDef kds_WlDone_members[] = {
    {"hs", T_OBJECT_EX, offsetof(KdsWlDone, hs), 0, "byte offset of the file's first entry"},
    {"f0", T_OBJECT_EX, offsetof(KdsWlDone, f0), 0, "first entry index of the file"},
    {"nent", T_OBJECT_EX, offsetof(KdsWlDone, nent), 0, "entries per file"},
    {"i", T_OBJECT_EX, offsetof(KdsWlDone, i), 0, "indexed pass: position in the entry list (moved)"},
    {"e", T_OBJECT_EX, offsetof(KdsWlDone, e), 0, "chain walk: the next entry, -1 at the end (moved)"},
    {"last", T_OBJECT_EX, offsetof(KdsWlDone, last), 0, "the pass's last entry"},
    {"base", T_OBJECT_EX, offsetof(KdsWlDone, base), 0, "the slot's start time, ms (wl_send's late chain: now)"},
    {"o", T_OBJECT_EX, offsetof(KdsWlDone, o), 0, "the pass's offset (-1: the late chain)"},
    {"nxt", T_OBJECT_EX, offsetof(KdsWlDone, nxt), 0, "smallest offset above o seen, -1: none (moved)"},
    {"after", T_OBJECT_EX, offsetof(KdsWlDone, after), 0, "last entry examined (moved)"},
    {"budget", T_OBJECT_EX, offsetof(KdsWlDone, budget), 0, "entries still to examine (moved)"},
    {"seg_bytes", T_OBJECT_EX, offsetof(KdsWlDone, seg_bytes), 0, "commit-log segment size"},
    {"passed", T_OBJECT_EX, offsetof(KdsWlDone, passed), 0, "entries crossed by this call (moved)"},
    {NULL, 0, 0, 0, NULL}};
KDS_ARGS_TYPE(WlDone, wl_done)

static PyMemberDef kds_WlAck_members[] = {
    {"hs", T_OBJECT_EX, offsetof(KdsWlAck, hs), 0, "byte offset of the file's first entry"},
    {"f0", T_OBJECT_EX, offsetof(KdsWlAck, f0), 0, "first entry index of the file"},
    {"nent", T_OBJECT_EX, offsetof(KdsWlAck, nent), 0, "entries per file"},
    {"j", T_OBJECT_EX, offsetof(KdsWlAck, j), 0, "position in refs (moved)"},
    {"head", T_OBJECT_EX, offsetof(KdsWlAck, head), 0, "the next timer-log index: refs at or above it are not entries yet"},
    {"P", T_OBJECT_EX, offsetof(KdsWlAck, P), 0, "precision: ms per slot"},
    {"s_k", T_OBJECT_EX, offsetof(KdsWlAck, s_k), 0, "send cursor: its slot"},
    {"s_o", T_OBJECT_EX, offsetof(KdsWlAck, s_o), 0, "send cursor: its pass offset (-1: slot not started)"},
    {"s_after", T_OBJECT_EX, offsetof(KdsWlAck, s_after), 0, "send cursor: last entry examined in its pass (-1: none)"},
    {"l_sent", T_OBJECT_EX, offsetof(KdsWlAck, l_sent), 0, "late chain: last entry examined by send (-1: none)"},
    {"wait_a", T_OBJECT_EX, offsetof(KdsWlAck, wait_a), 0, "an entry the done cursor waits on (-1: none)"},
    {"wait_b", T_OBJECT_EX, offsetof(KdsWlAck, wait_b), 0, "the other entry the done cursor waits on (-1: none)"},
    {"lo", T_OBJECT_EX, offsetof(KdsWlAck, lo), 0, "state bytes flipped: first (moved)"},
    {"hi", T_OBJECT_EX, offsetof(KdsWlAck, hi), 0, "state bytes flipped: last, -1: none (moved)"},
    {NULL, 0, 0, 0, NULL}};
KDS_ARGS_TYPE(WlAck, wl_ack)

static PyMemberDef kds_LvDue_members[] = {
    {"hs", T_OBJECT_EX, offsetof(KdsLvDue, hs), 0, "byte offset of the queue file's first entry"},
    {"f0", T_OBJECT_EX, offsetof(KdsLvDue, f0), 0, "first entry index of the queue file"},
    {"idx", T_OBJECT_EX, offsetof(KdsLvDue, idx), 0, "the next entry to read (moved)"},
    {"stop", T_OBJECT_EX, offsetof(KdsLvDue, stop), 0, "the walk ends before this entry"},
    {"now", T_OBJECT_EX, offsetof(KdsLvDue, now), 0, "entries due after it stay"},
    {"restored", T_OBJECT_EX, offsetof(KdsLvDue, restored), 0, "entries below it were restored: the caller reads them"},
    {"done", T_OBJECT_EX, offsetof(KdsLvDue, done), 0, "the done cursor, moved over the finished entries it meets (moved)"},
    {"room", T_OBJECT_EX, offsetof(KdsLvDue, room), 0, "records still to hand out (moved)"},
    {"ref_hi", T_OBJECT_EX, offsetof(KdsLvDue, ref_hi), 0, "the level's bits of a scheduler ref"},
    {"seg_bytes", T_OBJECT_EX, offsetof(KdsLvDue, seg_bytes), 0, "commit-log segment size"},
    {NULL, 0, 0, 0, NULL}};
KDS_ARGS_TYPE(LvDue, lv_due)

static PyMemberDef kds_RecordHead_members[] = {
    {"rtype", T_OBJECT_EX, offsetof(KdsRecordHead, rtype), 0, "record type: MESSAGE, CANCEL, DEAD, RECURRING (u8)"},
    {"due_ms", T_OBJECT_EX, offsetof(KdsRecordHead, due_ms), 0, "committed due time, epoch ms"},
    {"enqueue_ms", T_OBJECT_EX, offsetof(KdsRecordHead, enqueue_ms), 0, "the ingress record's timestamp, epoch ms"},
    {"src_offset", T_OBJECT_EX, offsetof(KdsRecordHead, src_offset), 0, "ingress offset"},
    {"src_partition", T_OBJECT_EX, offsetof(KdsRecordHead, src_partition), 0, "ingress partition (i32)"},
    {"target_partition", T_OBJECT_EX, offsetof(KdsRecordHead, target_partition), 0, "target partition, -1: the producer's partitioner (i32)"},
    {"retry_count", T_OBJECT_EX, offsetof(KdsRecordHead, retry_count), 0, "consumer-retry count (u16)"},
    {"level", T_OBJECT_EX, offsetof(KdsRecordHead, level), 0, "delay level, or a CANCEL's outcome (u16)"},
    {NULL, 0, 0, 0, NULL}};
KDS_ARGS_TYPE(RecordHead, encode)

static PyMemberDef kds_RunBufs_members[] = {
    {"seg_buf", T_OBJECT_EX, offsetof(KdsRunBufs, seg_buf), 0, "the head segment's mapping; None: not mapped yet, nothing fits"},
    {"idx_buf", T_OBJECT_EX, offsetof(KdsRunBufs, idx_buf), 0, "the id index's table or open stage, written"},
    {"st", T_OBJECT_EX, offsetof(KdsRunBufs, st), 0, "the intake state (sidecar/store/intake_layout.py), moved in place"},
    {"sched_bufs", T_OBJECT_EX, offsetof(KdsRunBufs, sched_bufs), 0, "the scheduler's buffers (its intake_begin)"},
    {"idx_old_buf", T_OBJECT_EX, offsetof(KdsRunBufs, idx_old_buf), 0, "a table probed for presence only (the sealed stage, or the table), or None"},
    {"idx_old2_buf", T_OBJECT_EX, offsetof(KdsRunBufs, idx_old2_buf), 0, "a second table probed for presence only, or None"},
    {"idx_jnl_buf", T_OBJECT_EX, offsetof(KdsRunBufs, idx_jnl_buf), 0, "the id index's journal buffer, or None"},
    {"idx_tags_buf", T_OBJECT_EX, offsetof(KdsRunBufs, idx_tags_buf), 0, "the tag bytes of the table probed last, or None"},
    {NULL, 0, 0, 0, NULL}};
KDS_ARGS_TYPE(RunBufs, rearm_run)

static PyMemberDef kds_IngestRun_members[] = {
    {"seg_buf", T_OBJECT_EX, offsetof(KdsIngestRun, seg_buf), 0, "the head segment's mapping; None: not mapped yet, nothing fits"},
    {"idx_buf", T_OBJECT_EX, offsetof(KdsIngestRun, idx_buf), 0, "the id index's table or open stage, written"},
    {"st", T_OBJECT_EX, offsetof(KdsIngestRun, st), 0, "the intake state (sidecar/store/intake_layout.py), moved in place"},
    {"sched_bufs", T_OBJECT_EX, offsetof(KdsIngestRun, sched_bufs), 0, "the scheduler's buffers (its intake_begin)"},
    {"idx_old_buf", T_OBJECT_EX, offsetof(KdsIngestRun, idx_old_buf), 0, "a table probed for presence only (the sealed stage, or the table), or None"},
    {"idx_old2_buf", T_OBJECT_EX, offsetof(KdsIngestRun, idx_old2_buf), 0, "a second table probed for presence only, or None"},
    {"idx_jnl_buf", T_OBJECT_EX, offsetof(KdsIngestRun, idx_jnl_buf), 0, "the id index's journal buffer, or None"},
    {"idx_tags_buf", T_OBJECT_EX, offsetof(KdsIngestRun, idx_tags_buf), 0, "the tag bytes of the table probed last, or None"},
    {"now", T_OBJECT_EX, offsetof(KdsIngestRun, now), 0, "the loop's time, epoch ms (a record without a timestamp takes it)"},
    {"partition", T_OBJECT_EX, offsetof(KdsIngestRun, partition), 0, "the ingress partition: a message of another one stops the run"},
    {"id_prefix", T_OBJECT_EX, offsetof(KdsIngestRun, id_prefix), 0, "the default delay.id's prefix, b'<topic>:<partition>:'"},
    {"checked_targets", T_OBJECT_EX, offsetof(KdsIngestRun, checked_targets), 0, "the target topics known to exist"},
    {"no_headers", T_OBJECT_EX, offsetof(KdsIngestRun, no_headers), 0, "the stored headers blob of a record without user headers"},
    {"topic", T_OBJECT_EX, offsetof(KdsIngestRun, topic), 0, "the ingress topic: a message of another one stops the run; None: not checked"},
    {"direct", T_OBJECT_EX, offsetof(KdsIngestRun, direct), 0, "the store's DirectPort: a request due on arrival is published, not stored; None: none is"},
    {NULL, 0, 0, 0, NULL}};
KDS_ARGS_TYPE(IngestRun, ingest_run)

static PyMemberDef kds_RestoreRun_members[] = {
    {"seg_buf", T_OBJECT_EX, offsetof(KdsRestoreRun, seg_buf), 0, "the head segment's mapping; None: not mapped yet, nothing fits"},
    {"idx_buf", T_OBJECT_EX, offsetof(KdsRestoreRun, idx_buf), 0, "the id index's table or open stage, written"},
    {"st", T_OBJECT_EX, offsetof(KdsRestoreRun, st), 0, "the intake state (sidecar/store/intake_layout.py), moved in place"},
    {"sched_bufs", T_OBJECT_EX, offsetof(KdsRestoreRun, sched_bufs), 0, "the scheduler's buffers (its intake_begin)"},
    {"idx_old_buf", T_OBJECT_EX, offsetof(KdsRestoreRun, idx_old_buf), 0, "a table probed for presence only (the sealed stage, or the table), or None"},
    {"idx_old2_buf", T_OBJECT_EX, offsetof(KdsRestoreRun, idx_old2_buf), 0, "a second table probed for presence only, or None"},
    {"idx_jnl_buf", T_OBJECT_EX, offsetof(KdsRestoreRun, idx_jnl_buf), 0, "the id index's journal buffer, or None"},
    {"idx_tags_buf", T_OBJECT_EX, offsetof(KdsRestoreRun, idx_tags_buf), 0, "the tag bytes of the table probed last, or None"},
    {"partition", T_OBJECT_EX, offsetof(KdsRestoreRun, partition), 0, "the changelog partition: a message of another one stops the run"},
    {"end", T_OBJECT_EX, offsetof(KdsRestoreRun, end), 0, "the offset the restore ends before; -1: none (a standby)"},
    {NULL, 0, 0, 0, NULL}};
KDS_ARGS_TYPE(RestoreRun, restore_run)
#endif

#endif
