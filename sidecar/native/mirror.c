/* sidecar._native, mirror core: the changelog writes' fast path at-least-once (the reference is
 * sidecar/engine/changelog.py, StoreMirror: _send, _on_delivery, _acked, which take every case that
 * is not plain).
 *
 * A store's writes are produced with the client's bound produce, vectorcalled, as publish_due does:
 * mirror_puts walks a run of records the C intake appended (back to back in one commit-log segment,
 * as store/mirroring.py's _mirror_run walks it) and produces a put of each (key: its id, value: its
 * commit-log bytes); mirror_tombstones produces the tombstones (key: the id, value null) of a
 * settled batch ((ref, Record) pairs, store/outcomes.py). Each stops at the first produce that
 * raises one of `refused` (BufferError, KafkaException) and hands it back: the caller writes that
 * record through the reference path (StoreMirror.put / remove: a full queue is polled until there is
 * room, a refusing producer counts a failed write kept for resend) and calls again for the rest.
 * Both add what they produced to the mirror's `produced` before they return, so Python reads the
 * exact count outside them (the durability order reads it at a checkpoint: durability.py).
 *
 * `fresh` (StoreMirror.fresh, a set; None exactly-once): the ids of held puts that are their
 * store's only version, the records of a C intake run (it takes only an id with no entry in the
 * id index, so nothing under the id is pending and any earlier version was tombstoned). Such a
 * record settled while its put is still held needs no tombstone either: nothing under its id is
 * in the changelog (StoreMirror.remove). mirror_puts adds the ids it holds, mirror_tombstones
 * drops them and writes nothing for them.
 *
 * Every write, of either path, gets the store's one MirrorReport as its delivery-report callable
 * (one object per mirror, not one per write): a success does _acked's work here (acked += 1, the
 * store's changelog_offset past the write's offset, and for a put its changelog_ingress past the
 * record's source offset: PartitionStore.covered); an error goes to StoreMirror._on_delivery. */
#include "native.h"

#define SRC_OFFSET_AT 32 /* a record's source offset (store/codec.py, RECORD_HEAD; changelog.py _SRC_AT) */
#define ID_LEN_AT 52     /* a record's id length (store/mirroring.py _ID_LEN_AT) */
#define DUE_AT 16        /* a record's due time, epoch ms (store/mirroring.py _DUE_AT) */

static PyObject *S_acked, *S_produced, *S_changelog_offset, *S_changelog_ingress, *S_topic, *S_partition, *S_store,
    *S_on_delivery;

typedef struct {
    PyObject_HEAD PyObject *mirror; /* the StoreMirror */
    PyObject *store;                /* its store (a mirror's store never changes) */
    PyObject *fallback;             /* mirror._on_delivery: every report that is not a success */
    vectorcallfunc vectorcall;
} MirrorReportObject;

static int MirrorReport_traverse(MirrorReportObject *r, visitproc visit, void *arg) {
    Py_VISIT(r->mirror);
    Py_VISIT(r->store);
    Py_VISIT(r->fallback);
    return 0;
}

static int MirrorReport_clear(MirrorReportObject *r) {
    Py_CLEAR(r->mirror);
    Py_CLEAR(r->store);
    Py_CLEAR(r->fallback);
    return 0;
}

static void MirrorReport_dealloc(MirrorReportObject *r) {
    PyObject_GC_UnTrack(r);
    MirrorReport_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *MirrorReport_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);

/* MirrorReport(mirror): the report of mirror's writes (mirror.store, mirror._on_delivery read once). */
static PyObject *MirrorReport_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *mirror;
    if (!PyArg_ParseTuple(args, "O:MirrorReport", &mirror)) return NULL;
    PyObject *store = PyObject_GetAttr(mirror, S_store);
    PyObject *fallback = store ? PyObject_GetAttr(mirror, S_on_delivery) : NULL;
    MirrorReportObject *r = fallback ? (MirrorReportObject *)type->tp_alloc(type, 0) : NULL;
    if (!r) {
        Py_XDECREF(store);
        Py_XDECREF(fallback);
        return NULL;
    }
    r->mirror = Py_NewRef(mirror);
    r->store = store;
    r->fallback = fallback;
    r->vectorcall = MirrorReport_vectorcall;
    return (PyObject *)r;
}

static PyTypeObject MirrorReportType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sidecar._native.MirrorReport",
    .tp_doc = "MirrorReport(mirror): the delivery-report callable of a StoreMirror's changelog writes.",
    .tp_basicsize = sizeof(MirrorReportObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = MirrorReport_new,
    .tp_dealloc = (destructor)MirrorReport_dealloc,
    .tp_traverse = (traverseproc)MirrorReport_traverse,
    .tp_clear = (inquiry)MirrorReport_clear,
    .tp_vectorcall_offset = offsetof(MirrorReportObject, vectorcall),
    .tp_call = PyVectorcall_Call,
};

/* o.name += d (an int attribute) */
static int attr_add(PyObject *o, PyObject *name, long long d) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v) return -1;
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    PyObject *nv = PyLong_FromLongLong(x + d);
    if (!nv) return -1;
    int rc = PyObject_SetAttr(o, name, nv);
    Py_DECREF(nv);
    return rc;
}

/* o.name = v + 1 when o.name is None or v >= o.name: one past the highest offset seen */
static int attr_past(PyObject *o, PyObject *name, long long v) {
    PyObject *cur = PyObject_GetAttr(o, name);
    if (!cur) return -1;
    int set = cur == Py_None;
    if (!set) {
        long long c = PyLong_AsLongLong(cur);
        if (c == -1 && PyErr_Occurred()) {
            Py_DECREF(cur);
            return -1;
        }
        set = v >= c;
    }
    Py_DECREF(cur);
    if (!set) return 0;
    PyObject *nv = PyLong_FromLongLong(v + 1);
    if (!nv) return -1;
    int rc = PyObject_SetAttr(o, name, nv);
    Py_DECREF(nv);
    return rc;
}

/* A success as StoreMirror._acked does it: acked, the changelog's offset, and for a put (value not
 * NULL) its record's source offset. 0, or -1 with an error set. */
static int mirror_acked(MirrorReportObject *r, long long off, const char *value, Py_ssize_t len) {
    if (attr_add(r->mirror, S_acked, 1) < 0) return -1;
    if (attr_past(r->store, S_changelog_offset, off) < 0) return -1;
    if (!value) return 0; /* a tombstone */
    if (len < SRC_OFFSET_AT + 8) {
        PyErr_SetString(PyExc_ValueError, "MirrorReport: a put's value is not a commit-log record");
        return -1;
    }
    int64_t src;
    memcpy(&src, value + SRC_OFFSET_AT, 8); /* little-endian host (module.c) */
    return attr_past(r->store, S_changelog_ingress, src);
}

/* The delivery report: a success as StoreMirror._acked does it, anything else through _on_delivery. */
static PyObject *MirrorReport_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    MirrorReportObject *r = (MirrorReportObject *)self;
    if (PyVectorcall_NARGS(nargsf) != 2 || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "MirrorReport(err, msg)");
        return NULL;
    }
    if (args[0] != Py_None) return PyObject_Vectorcall(r->fallback, args, 2, NULL);
    PyObject *msg = args[1];
    PyObject *o = kds_msg_call(msg, M_OFFSET);
    if (!o) return NULL;
    long long off = PyLong_AsLongLong(o);
    Py_DECREF(o);
    if (off == -1 && PyErr_Occurred()) return NULL;
    PyObject *value = kds_msg_call(msg, M_VALUE);
    if (!value) return NULL;
    if (value != Py_None && !PyBytes_Check(value)) {
        Py_DECREF(value);
        PyErr_SetString(PyExc_ValueError, "MirrorReport: a put's value is not a commit-log record");
        return NULL;
    }
    int rc = value == Py_None ? mirror_acked(r, off, NULL, 0)
                              : mirror_acked(r, off, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value));
    Py_DECREF(value);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

int kds_is_mirror_report(PyObject *o) { return Py_IS_TYPE(o, &MirrorReportType); }

int kds_mirror_ok(PyObject *cb, const kds_report_t *rep) {
    return mirror_acked((MirrorReportObject *)cb, rep->offset, rep->value, (Py_ssize_t)rep->value_len) < 0 ? -1 : 1;
}

/* What a produce loop holds: the mirror's topic and partition, read once per call. */
typedef struct {
    PyObject *topic, *partition;
} Target;

static int target_get(MirrorReportObject *r, Target *t) {
    t->topic = PyObject_GetAttr(r->mirror, S_topic);
    t->partition = t->topic ? PyObject_GetAttr(r->mirror, S_partition) : NULL;
    if (!t->partition) {
        Py_XDECREF(t->topic);
        return -1;
    }
    return 0;
}

/* produce(topic, value, key, partition, report), positional as StoreMirror._send calls it: 0 done,
 * 1 refused (*refused: the exception, normalized), -1 error */
static int produce_one(MirrorReportObject *r, PyObject *produce, Target *t, PyObject *value, PyObject *key,
                       PyObject *refused_types, PyObject **refused) {
    PyObject *np = kds_native_producer(produce); /* its C entry: no call through Python */
    if (np) {
        long long part = PyLong_AsLongLong(t->partition);
        if (part == -1 && PyErr_Occurred()) return -1;
        if (kds_np_send(np, t->topic, value, key, part, (PyObject *)r, NULL, NULL) == 0) return 0;
    } else {
        PyObject *a[5] = {t->topic, value, key, t->partition, (PyObject *)r};
        PyObject *res = PyObject_Vectorcall(produce, a, 5, NULL);
        if (res) {
            Py_DECREF(res);
            return 0;
        }
    }
    if (!PyErr_ExceptionMatches(refused_types)) return -1;
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (tb && exc) PyException_SetTraceback(exc, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    *refused = exc;
    return 1;
}

/* The end of a produce loop: the mirror's produced += n, the target let go; NULL on an error
 * (set before, or by the count) */
static PyObject *loop_end(MirrorReportObject *r, Target *t, long long n, int failed, PyObject *out) {
    Py_DECREF(t->topic);
    Py_DECREF(t->partition);
    if (n && attr_add(r->mirror, S_produced, n) < 0) failed = 1;
    if (failed) {
        Py_XDECREF(out);
        return NULL;
    }
    return out;
}

static int args_check(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *usage) {
    if (nargs != want || !PyObject_TypeCheck(args[0], &MirrorReportType)) {
        PyErr_Format(PyExc_TypeError, "%s", usage);
        return -1;
    }
    return 0;
}

/* mirror_puts(report, produce, buf, off, count, refused, held, now, fresh) -> (done, off, refused)
 *
 * The puts of the `count` records back to back in buf from off: done of them written, off the next
 * one's offset; refused the exception that record's produce raised (None otherwise). With `held` a
 * dict (StoreMirror.held), a record due at `now` is held there (id -> bytes) instead of produced
 * (its id also added to `fresh` when that is a set), and the walk stops before a record due later
 * while held is not empty (StoreMirror.put decides what to write first). */
static PyObject *native_mirror_puts(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *usage = "mirror_puts(report: MirrorReport, produce, buf, off, count, refused, held, now, fresh)";
    if (args_check(args, nargs, 9, usage) < 0) return NULL;
    MirrorReportObject *r = (MirrorReportObject *)args[0];
    PyObject *held = args[6] == Py_None ? NULL : args[6];
    PyObject *fresh = args[8] == Py_None ? NULL : args[8];
    if ((held && !PyDict_Check(held)) || (fresh && !PySet_Check(fresh))) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    Py_ssize_t off = PyLong_AsSsize_t(args[3]), count = PyLong_AsSsize_t(args[4]);
    long long now = PyLong_AsLongLong(args[7]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer v;
    if (PyObject_GetBuffer(args[2], &v, PyBUF_SIMPLE) < 0) return NULL;
    Target t;
    if (target_get(r, &t) < 0) {
        PyBuffer_Release(&v);
        return NULL;
    }
    const uint8_t *base = (const uint8_t *)v.buf;
    PyObject *refused = NULL;
    Py_ssize_t done = 0, sent = 0;
    int failed = 0;
    for (; done < count; done++) {
        if (off < 0 || off + HEAD_SIZE > v.len) goto bad;
        const uint8_t *p = base + off;
        uint32_t length = rd32(p);
        uint16_t id_len = rd16(p + ID_LEN_AT);
        if (length < HEAD_SIZE + (uint32_t)id_len || off + (Py_ssize_t)length > v.len) goto bad;
        int hold = held && (long long)rd64(p + DUE_AT) <= now;
        if (held && !hold && PyDict_GET_SIZE(held)) break;
        PyObject *key = PyBytes_FromStringAndSize((const char *)p + HEAD_SIZE, id_len);
        PyObject *value = key ? PyBytes_FromStringAndSize((const char *)p, length) : NULL;
        int rc = !value ? -1
                 : hold ? (PyDict_SetItem(held, key, value) < 0 || (fresh && PySet_Add(fresh, key) < 0) ? -1 : 0)
                        : produce_one(r, args[1], &t, value, key, args[5], &refused);
        sent += rc == 0 && !hold;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (rc < 0) {
            failed = 1;
            break;
        }
        if (rc) break;
        off += length;
    }
    PyBuffer_Release(&v);
    return loop_end(r, &t, sent, failed,
                    failed ? NULL : Py_BuildValue("(nnN)", done, off, refused ? refused : Py_NewRef(Py_None)));
bad:
    PyBuffer_Release(&v);
    PyErr_Format(PyExc_ValueError, "mirror_puts: no record of the run at offset %zd", off);
    return loop_end(r, &t, sent, 1, NULL);
}

/* mirror_tombstones(report, produce, acked, i, refused, held, fresh) -> (j, refused)
 *
 * The tombstones of the records of acked[i:] ((ref, Record) pairs), each id's held put dropped
 * first (StoreMirror.remove: a put held back must never be written after its tombstone), none for
 * an id in `fresh` (dropped from it): j the first not taken (len(acked) when all went), refused the
 * exception its produce raised (None when all went). mirror_writes(report, produce, writes, i,
 * refused, None, None) -> (j, refused): the same for a list of (key, value) pairs, each written as
 * it is (StoreMirror.flush_held's). */
static PyObject *mirror_list(PyObject *const *args, Py_ssize_t nargs, int tombstones) {
    const char *usage = tombstones
                            ? "mirror_tombstones(report: MirrorReport, produce, acked: list, i, refused, held, fresh)"
                            : "mirror_writes(report: MirrorReport, produce, writes: list, i, refused, None, None)";
    if (args_check(args, nargs, 7, usage) < 0) return NULL;
    PyObject *held = args[5] == Py_None ? NULL : args[5];
    PyObject *fresh = args[6] == Py_None ? NULL : args[6];
    if (!PyList_Check(args[2]) || (held && !PyDict_Check(held)) || (fresh && !PySet_Check(fresh))) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    MirrorReportObject *r = (MirrorReportObject *)args[0];
    PyObject *acked = args[2];
    Py_ssize_t i = PyLong_AsSsize_t(args[3]);
    if (i == -1 && PyErr_Occurred()) return NULL;
    Target t;
    if (target_get(r, &t) < 0) return NULL;
    PyObject *refused = NULL;
    int failed = 0;
    Py_ssize_t sent = 0;
    for (; i < PyList_GET_SIZE(acked); i++) {
        PyObject *pair = PyList_GET_ITEM(acked, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, usage);
            failed = 1;
            break;
        }
        PyObject *rec = PyTuple_GET_ITEM(pair, 1), *rid, *value = Py_None;
        if (!tombstones) {
            rid = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
            value = rec;
        } else {
            rid = PyObject_TypeCheck(rec, &kds_RecordType) ? Py_NewRef(((RecordObject *)rec)->id)
                                                           : PyObject_GetAttrString(rec, "id");
        }
        int rc = rid ? 0 : -1, skip = 0;
        if (rid && held && PyDict_GET_SIZE(held)) {
            int has = PyDict_Contains(held, rid);
            rc = has < 0 ? -1 : has ? PyDict_DelItem(held, rid) : 0;
            if (rc == 0 && has && fresh && PySet_GET_SIZE(fresh)) { /* its store's only version, never written */
                skip = PySet_Discard(fresh, rid);
                rc = skip < 0 ? -1 : 0;
            }
        }
        if (rc == 0 && !skip) {
            rc = produce_one(r, args[1], &t, value, rid, args[4], &refused);
            sent += rc == 0;
        }
        Py_XDECREF(rid);
        if (rc < 0) {
            failed = 1;
            break;
        }
        if (rc) break;
    }
    return loop_end(r, &t, sent, failed,
                    failed ? NULL : Py_BuildValue("(nN)", i, refused ? refused : Py_NewRef(Py_None)));
}

static PyObject *native_mirror_tombstones(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return mirror_list(args, nargs, 1);
}

static PyObject *native_mirror_writes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return mirror_list(args, nargs, 0);
}

int kds_mirror_init(PyObject *m) {
    static const char *names[] = {"acked", "produced", "changelog_offset", "changelog_ingress",
                                  "topic", "partition", "store", "_on_delivery"};
    PyObject **slots[] = {&S_acked, &S_produced, &S_changelog_offset, &S_changelog_ingress,
                          &S_topic, &S_partition, &S_store, &S_on_delivery};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (!(*slots[k] = PyUnicode_InternFromString(names[k]))) return -1;
    if (PyType_Ready(&MirrorReportType) < 0) return -1;
    Py_INCREF(&MirrorReportType);
    if (PyModule_AddObject(m, "MirrorReport", (PyObject *)&MirrorReportType) < 0) {
        Py_DECREF(&MirrorReportType);
        return -1;
    }
    return 0;
}

PyMethodDef kds_mirror_methods[] = {
    {"mirror_puts", (PyCFunction)(void (*)(void))native_mirror_puts, METH_FASTCALL, NULL},
    {"mirror_tombstones", (PyCFunction)(void (*)(void))native_mirror_tombstones, METH_FASTCALL, NULL},
    {"mirror_writes", (PyCFunction)(void (*)(void))native_mirror_writes, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}};
