/* sidecar._native, levels core. Delay levels (sidecar/levels/queue.py): the dequeue's walk over one
 * queue file (lv_due) and the batch ack with the done cursor's advance (lv_ack); the Python twins
 * there are the reference and say what each returns. Queue entry (24 bytes): log_pos u64 | due i64
 * | state u8 | 7 zero bytes. An entry in [done, send) is finished exactly when its state is not
 * PENDING, so the done cursor reads the state bytes; releases are counted per commit-log segment in
 * segs. The intake's own appends to the queue files are in intake.c. */
#include "native.h"

/* run-length count of releases per segment, flushed into segs with kds_seg_add */
typedef struct {
    long long g, c;
} LvRun;

static inline int lv_release(LvRun *r, PyObject *segs, uint64_t pos, long long seg_bytes) {
    if (pos == 0) return 0; /* NO_POS: a dropped entry releases nothing */
    long long g = (long long)(pos / (uint64_t)seg_bytes);
    if (r->c && g != r->g) {
        if (kds_seg_add(segs, r->g, r->c) < 0) return -1;
        r->c = 0;
    }
    r->g = g;
    r->c++;
    return 0;
}

/* lv_due(buf, segments, segs, out, a: LvDue) -> why; moves a's idx, done, room */
static PyObject *native_lv_due(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyDict_Check(args[1]) || !PyDict_Check(args[2]) || !PyList_Check(args[3]) ||
        !PyObject_TypeCheck(args[4], &kds_LvDueType)) {
        PyErr_SetString(PyExc_TypeError, "lv_due(buf, segments, segs, out, a: LvDue)");
        return NULL;
    }
    KdsLvDue *a = (KdsLvDue *)args[4];
    long long hs = kds_arg(a->hs), f0 = kds_arg(a->f0), idx = kds_arg(a->idx), stop = kds_arg(a->stop);
    long long now = kds_arg(a->now), restored = kds_arg(a->restored), done = kds_arg(a->done);
    long long room = kds_arg(a->room), ref_hi = kds_arg(a->ref_hi), seg_bytes = kds_arg(a->seg_bytes);
    if (PyErr_Occurred()) return NULL;
    if (seg_bytes <= 0) {
        PyErr_SetString(PyExc_ValueError, "lv_due: segment size must be positive");
        return NULL;
    }
    PyObject *segments = args[1], *segs = args[2], *out = args[3], *res = NULL;
    Py_buffer qv;
    if (PyObject_GetBuffer(args[0], &qv, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *qb = (const uint8_t *)qv.buf;
    KdsFile seg = {0};
    LvRun run = {0, 0};
    int why = 0;
    while (idx < stop) {
        if (room <= 0) { why = 1; break; }
        long long off = hs + (idx - f0) * LV_SIZE;
        if (idx < f0 || off < 0 || off + LV_SIZE > qv.len) {
            PyErr_SetString(PyExc_ValueError, "lv_due: entry beyond the file");
            goto fail;
        }
        const uint8_t *p = qb + off;
        uint64_t pos = (uint64_t)rd64(p);
        int64_t due = rd64(p + 8);
        int state = p[16];
        if (state == LV_PENDING) {
            if (due > now) { why = 2; break; }
            if (idx < restored) { why = 3; break; }
            PyObject *rec = kds_log_decode_at(&seg, segments, seg_bytes, pos);
            if (!rec) {
                if (PyErr_Occurred()) goto fail;
                why = 3; /* the caller reads it: CommitLog.read raises, as before */
                break;
            }
            PyObject *t = PyTuple_New(2), *r = PyLong_FromLongLong(ref_hi | idx);
            if (!t || !r) {
                Py_XDECREF(t);
                Py_XDECREF(r);
                Py_DECREF(rec);
                goto fail;
            }
            PyTuple_SET_ITEM(t, 0, r);
            PyTuple_SET_ITEM(t, 1, rec);
            int rc = PyList_Append(out, t);
            Py_DECREF(t);
            if (rc < 0) goto fail;
            room--;
        } else if (idx == done) {
            if (lv_release(&run, segs, pos, seg_bytes) < 0) goto fail;
            done++;
        }
        idx++;
    }
    if (kds_seg_add(segs, run.g, run.c) < 0) goto fail;
    run.c = 0;
    if (kds_arg_set(&a->idx, idx) < 0 || kds_arg_set(&a->done, done) < 0 || kds_arg_set(&a->room, room) < 0)
        goto fail;
    res = PyLong_FromLong(why);
fail:
    if (!res && run.c) {
        /* keep what was counted: the caller releases segs even when this raises */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        (void)kds_seg_add(segs, run.g, run.c);
        PyErr_Restore(et, ev, tb);
    }
    kds_file_release(&seg);
    PyBuffer_Release(&qv);
    return res;
}

/* the entry idx of a level: its bytes in f (files: the level's {first: MappedFile}); NULL with an
 * error set if its file is missing (KeyError, as LevelQueue._locate) */
static uint8_t *lv_entry(KdsFile *f, PyObject *files, long long per_file, long long hs, long long idx) {
    long long first = idx - idx % per_file;
    int got = kds_file_get(f, files, first, 1);
    if (got < 0) return NULL;
    if (got == 0) {
        PyErr_Format(PyExc_KeyError, "queue entry %lld is not on disk", idx);
        return NULL;
    }
    long long off = hs + (idx - first) * LV_SIZE;
    if (off + LV_SIZE > f->v.len) {
        PyErr_SetString(PyExc_ValueError, "lv_ack: entry beyond the file");
        return NULL;
    }
    return (uint8_t *)f->v.buf + off;
}

/* lv_ack(refs, files, per_file, hs, cur, seg_bytes, segs) -> None; cur: int64 [done, send,
 * dirty_lo, dirty_hi] per level, updated in place */
static PyObject *native_lv_ack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyDict_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "lv_ack(refs, files, per_file, hs, cur, seg_bytes, segs)");
        return NULL;
    }
    long long per_file = PyLong_AsLongLong(args[2]), hs = PyLong_AsLongLong(args[3]);
    long long seg_bytes = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (seg_bytes <= 0 || per_file <= 0 || hs < 0) {
        PyErr_SetString(PyExc_ValueError, "lv_ack: bad geometry");
        return NULL;
    }
    PyObject *refs = args[0], *files = args[1], *segs = args[6], *res = NULL;
    Py_ssize_t nlv = PyList_GET_SIZE(files);
    for (Py_ssize_t n = 0; n < nlv; n++)
        if (!PyDict_Check(PyList_GET_ITEM(files, n))) {
            PyErr_SetString(PyExc_TypeError, "lv_ack: files must be dicts");
            return NULL;
        }
    Py_buffer cv;
    if (PyObject_GetBuffer(args[4], &cv, PyBUF_WRITABLE | PyBUF_FORMAT) < 0) return NULL;
    if (cv.itemsize != 8 || cv.len < (Py_ssize_t)(4 * 8 * nlv) || !cv.format || strcmp(cv.format, "q") != 0) {
        PyErr_SetString(PyExc_TypeError, "lv_ack: cur must be an int64 array of 4 per level");
        PyBuffer_Release(&cv);
        return NULL;
    }
    int64_t *cur = (int64_t *)cv.buf;
    KdsFile *fs = PyMem_Calloc(nlv ? nlv : 1, sizeof(KdsFile));
    if (!fs) {
        PyBuffer_Release(&cv);
        return PyErr_NoMemory();
    }
    LvRun run = {0, 0};
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(refs); j++) {
        int ovf = 0;
        long long ref = PyLong_AsLongLongAndOverflow(PyList_GET_ITEM(refs, j), &ovf);
        if (ref == -1 && PyErr_Occurred()) goto fail;
        long long n = ref >> LV_IDX_BITS;
        if (ovf || ref < 0 || n >= nlv) {
            PyErr_Format(PyExc_IndexError, "ref %R names no level", PyList_GET_ITEM(refs, j));
            goto fail;
        }
        long long idx = ref & LV_IDX_MASK;
        int64_t *c = cur + 4 * n;
        if (idx < c[0] || idx >= c[1]) continue;
        PyObject *lf = PyList_GET_ITEM(files, n);
        uint8_t *p = lv_entry(&fs[n], lf, per_file, hs, idx);
        if (!p) goto fail;
        p[16] = LV_DELIVERED;
        if (c[2] < 0 || idx < c[2]) c[2] = idx;
        if (idx + 1 > c[3]) c[3] = idx + 1;
        if (idx != c[0]) continue;
        /* the done cursor waited on this entry: cross every finished entry from here */
        long long done = c[0], send = c[1];
        while (done < send) {
            const uint8_t *q = lv_entry(&fs[n], lf, per_file, hs, done);
            if (!q) goto fail; /* done stays where it was, as in the twin */
            if (q[16] == LV_PENDING) break;
            if (lv_release(&run, segs, (uint64_t)rd64(q), seg_bytes) < 0) goto fail;
            done++;
        }
        c[0] = done;
    }
    if (kds_seg_add(segs, run.g, run.c) < 0) goto fail;
    run.c = 0;
    res = Py_NewRef(Py_None);
fail:
    if (!res && run.c) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        (void)kds_seg_add(segs, run.g, run.c);
        PyErr_Restore(et, ev, tb);
    }
    for (Py_ssize_t n = 0; n < nlv; n++) kds_file_release(&fs[n]);
    PyMem_Free(fs);
    PyBuffer_Release(&cv);
    return res;
}

PyMethodDef kds_levels_methods[] = {
    {"lv_due", (PyCFunction)(void (*)(void))native_lv_due, METH_FASTCALL, NULL},
    {"lv_ack", (PyCFunction)(void (*)(void))native_lv_ack, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}};
