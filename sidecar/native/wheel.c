/* sidecar._native, wheel core: the timer wheel's per-entry work over its mmapped files (twins in
 * sidecar/wheel/layout.py, the reference; entry and slot layouts there and in native.h).
 * The intake's own appends to these files are in intake.c. */
#include "native.h"

/* ---------------------------------------------------------------------------------------------
 * Timer wheel (sidecar/wheel/layout.py): the intake's fixed-size writes into the mmapped timer
 * log and slot file, in one call instead of four struct calls. The Python twin, wl_link in
 * layout.py, is the reference. Entry: due i64 | loc i64 | next i64 | 0 u8 | flags u8 |
 * level u16 | tag u32; its state u8 in the file's state array (WL_STATE_OFF in native.h).
 * Slot: time i64 | first i64 | last i64 | count u32 | min_off u16 | 0 u16. */

/* wl_link(tl_buf, slot_buf, a: WlLink) -> int: write entry idx (pending, no next, tagged)
 * into the timer-log file whose first index is f0, and append it to the chain of the slot at
 * slot_off that starts at slot_time. Returns -1 if the slot held no such chain (it now holds idx
 * alone), else the chain's previous tail, whose link was patched here when it lives in the same
 * file (tail >= f0); the caller patches one in an older file, and records what is dirty. */
static PyObject *native_wl_link(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyObject_TypeCheck(args[2], &kds_WlLinkType)) {
        PyErr_SetString(PyExc_TypeError, "wl_link(tl_buf, slot_buf, a: WlLink)");
        return NULL;
    }
    const KdsWlLink *a = (const KdsWlLink *)args[2];
    long long hs = kds_arg(a->hs), first = kds_arg(a->f0), nent = kds_arg(a->nent), idx = kds_arg(a->idx);
    long long due = kds_arg(a->due), loc = kds_arg(a->loc), flags = kds_arg(a->flags), level = kds_arg(a->level);
    long long soff = kds_arg(a->slot_off), stime = kds_arg(a->slot_time);
    if (PyErr_Occurred()) return NULL;
    Py_buffer tv, sv;
    if (PyObject_GetBuffer(args[0], &tv, PyBUF_WRITABLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &sv, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&tv);
        return NULL;
    }
    PyObject *out = NULL;
    long long eoff = hs + (idx - first) * WL_SIZE, moff = due - stime;
    if (nent <= 0 || hs < nent || idx < first || idx >= first + nent || eoff + WL_SIZE > tv.len || soff < 0 || soff + WL_SIZE > sv.len ||
        flags < 0 || flags > 255 || moff < 0 || moff > 0xFFFF || rd32((uint8_t *)sv.buf + soff + 24) == 0xFFFFFFFF) {
        PyErr_SetString(PyExc_ValueError, "wl_link: entry or slot out of range");
        goto done;
    }
    uint8_t *ent = (uint8_t *)tv.buf + eoff, *slot = (uint8_t *)sv.buf + soff;
    wl_entry(ent, due, loc, (int)flags, (int)level, idx);
    ((uint8_t *)tv.buf)[WL_STATE_OFF(hs, nent, first, idx)] = WL_PENDING;
    int64_t t = rd64(slot), last = rd64(slot + 16);
    uint32_t count = rd32(slot + 24);
    uint16_t min_off = rd16(slot + 28);
    if (count && t == stime) {
        if (last >= first && last < idx) wr64((uint8_t *)tv.buf + hs + (last - first) * WL_SIZE + 16, idx);
        wr64(slot + 16, idx);
        wr32(slot + 24, count + 1);
        if (moff < min_off) wr16(slot + 28, (uint16_t)moff);
        wr16(slot + 30, 0);
        out = PyLong_FromLongLong(last);
    } else {
        wr64(slot, stime);
        wr64(slot + 8, idx);
        wr64(slot + 16, idx);
        wr32(slot + 24, 1);
        wr16(slot + 28, (uint16_t)moff);
        wr16(slot + 30, 0);
        out = PyLong_FromLong(-1);
    }
done:
    PyBuffer_Release(&tv);
    PyBuffer_Release(&sv);
    return out;
}

/* ---------------------------------------------------------------------------------------------
 * Timer wheel: the per-entry walks of the reader (wl_send), the done cursor (wl_done), the slot
 * index's build (wl_group) and the batch ack (wl_ack), each over the entries of one timer-log
 * file; the Python twins in layout.py are the reference and say what each returns. A pass is
 * indexed (lst: an int64 buffer of the entries of the pass's offset, read from position i) or a
 * chain walk (lst None: from entry e through last, skipping other offsets and noting in nxt the
 * smallest one above o). why: 0 end of the pass, 1 out of room/budget, 2 next entry in another
 * file, 3 next entry needs the caller. Every function takes hs, the byte offset of the file's first
 * entry (WL_STATE_OFF in native.h). */

typedef struct {
    Py_buffer tv, lv;
    int have_l;
    const int64_t *lst;
    Py_ssize_t n;
    long long hs, f0, nent;
} WalkBufs;

static int walk_open(WalkBufs *w, PyObject *buf, PyObject *lst, int writable) {
    if (w->nent <= 0 || w->hs < w->nent) { /* the state bytes sit between the header and hs */
        PyErr_SetString(PyExc_ValueError, "timer-log walk: bad file geometry");
        return -1;
    }
    w->have_l = 0;
    w->lst = NULL;
    w->n = -1;
    if (PyObject_GetBuffer(buf, &w->tv, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) return -1;
    if (lst != Py_None) {
        if (PyObject_GetBuffer(lst, &w->lv, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&w->tv);
            return -1;
        }
        w->have_l = 1;
        w->lst = (const int64_t *)w->lv.buf;
        w->n = w->lv.len / 8;
    }
    return 0;
}

static void walk_close(WalkBufs *w) {
    PyBuffer_Release(&w->tv);
    if (w->have_l) PyBuffer_Release(&w->lv);
}

/* the byte offset of entry x in the file, or -1 if it does not fit (a damaged link) */
static inline long long walk_off(WalkBufs *w, long long x) {
    long long off = w->hs + (x - w->f0) * WL_SIZE;
    if (off < 0 || off + WL_SIZE > w->tv.len) return -1;
    return off;
}

/* wl_send(buf, lst, pend, a: WlSend) -> why; moves a's i, e, after, nxt, budget, room, lo, hi */
static PyObject *native_wl_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_Check(args[2]) || !PyObject_TypeCheck(args[3], &kds_WlSendType)) {
        PyErr_SetString(PyExc_TypeError, "wl_send(buf, lst, pend, a: WlSend)");
        return NULL;
    }
    KdsWlSend *a = (KdsWlSend *)args[3];
    WalkBufs w;
    w.hs = kds_arg(a->hs);
    w.f0 = kds_arg(a->f0);
    w.nent = kds_arg(a->nent);
    long long i = kds_arg(a->i), e = kds_arg(a->e), last = kds_arg(a->last), base = kds_arg(a->base);
    long long o = kds_arg(a->o), nxt = kds_arg(a->nxt), after = kds_arg(a->after), room = kds_arg(a->room);
    long long budget = kds_arg(a->budget), vlim = kds_arg(a->vlim);
    if (PyErr_Occurred()) return NULL;
    PyObject *pend = args[2];
    if (walk_open(&w, args[0], args[1], 1) < 0) return NULL;
    uint8_t *b = (uint8_t *)w.tv.buf;
    long long lo = -1, hi = -1, end = w.f0 + w.nent;
    int why;
    PyObject *out = NULL;
    for (;;) {
        long long x;
        if (w.have_l) {
            if (i >= w.n) { why = 0; break; }
            x = w.lst[i];
        } else {
            if (e == -1) { why = 0; break; }
            x = e;
        }
        if (room <= 0 || budget <= 0) { why = 1; break; }
        if (x < w.f0 || x >= end) { why = 2; break; }
        long long off = walk_off(&w, x);
        if (off < 0) {
            PyErr_SetString(PyExc_ValueError, "wl_send: entry beyond the file");
            goto fail;
        }
        const uint8_t *p = b + off;
        int64_t due = rd64(p), loc = rd64(p + 8), nx = rd64(p + 16);
        long long soff = WL_STATE_OFF(w.hs, w.nent, w.f0, x);
        int state = b[soff];
        long long eo = (long long)((uint64_t)due - (uint64_t)base);
        if (!w.have_l && o >= 0 && eo != o) {
            if (eo > o && (nxt < 0 || eo < nxt)) nxt = eo;
        } else if (state == WL_PENDING) {
            if (x < vlim || (o < 0 && due > base)) { why = 3; break; }
            PyObject *t = Py_BuildValue("(LL)", x, (long long)loc);
            if (!t) goto fail;
            int rc = PyList_Append(pend, t);
            Py_DECREF(t);
            if (rc < 0) goto fail;
            room--;
        } else if (state == WL_CANCELLED) {
            b[soff] = WL_DONE;
            if (lo < 0 || soff < lo) lo = soff;
            if (soff > hi) hi = soff;
        }
        budget--;
        after = x;
        if (w.have_l) i++;
        else e = x == last ? -1 : nx;
    }
    if (kds_arg_set(&a->i, i) < 0 || kds_arg_set(&a->e, e) < 0 || kds_arg_set(&a->after, after) < 0 ||
        kds_arg_set(&a->nxt, nxt) < 0 || kds_arg_set(&a->budget, budget) < 0 || kds_arg_set(&a->room, room) < 0 ||
        kds_arg_set(&a->lo, lo) < 0 || kds_arg_set(&a->hi, hi) < 0)
        goto fail;
    out = PyLong_FromLong(why);
fail:
    walk_close(&w);
    return out;
}

/* flush a run of releases in one commit-log segment into segs */
int kds_seg_add(PyObject *segs, long long g, long long c) {
    if (c == 0) return 0;
    PyObject *k = PyLong_FromLongLong(g);
    if (!k) return -1;
    PyObject *v = PyDict_GetItemWithError(segs, k);
    long long have = 0;
    if (v) {
        have = PyLong_AsLongLong(v);
        if (have == -1 && PyErr_Occurred()) { Py_DECREF(k); return -1; }
    } else if (PyErr_Occurred()) { Py_DECREF(k); return -1; }
    PyObject *nv = PyLong_FromLongLong(have + c);
    if (!nv) { Py_DECREF(k); return -1; }
    int rc = PyDict_SetItem(segs, k, nv);
    Py_DECREF(k);
    Py_DECREF(nv);
    return rc;
}

/* wl_done(buf, lst, segs, blocs, a: WlDone) -> why; moves a's i, e, after, nxt, budget, passed */
static PyObject *native_wl_done(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyDict_Check(args[2]) || !PyList_Check(args[3]) || !PyObject_TypeCheck(args[4], &kds_WlDoneType)) {
        PyErr_SetString(PyExc_TypeError, "wl_done(buf, lst, segs, blocs, a: WlDone)");
        return NULL;
    }
    KdsWlDone *a = (KdsWlDone *)args[4];
    WalkBufs w;
    w.hs = kds_arg(a->hs);
    w.f0 = kds_arg(a->f0);
    w.nent = kds_arg(a->nent);
    long long i = kds_arg(a->i), e = kds_arg(a->e), last = kds_arg(a->last), base = kds_arg(a->base);
    long long o = kds_arg(a->o), nxt = kds_arg(a->nxt), after = kds_arg(a->after), budget = kds_arg(a->budget);
    long long seg_bytes = kds_arg(a->seg_bytes);
    if (PyErr_Occurred()) return NULL;
    if (seg_bytes <= 0) {
        PyErr_SetString(PyExc_ValueError, "wl_done: segment size must be positive");
        return NULL;
    }
    PyObject *segs = args[2], *blocs = args[3];
    if (walk_open(&w, args[0], args[1], 0) < 0) return NULL;
    const uint8_t *b = (const uint8_t *)w.tv.buf;
    long long end = w.f0 + w.nent, passed = 0, run_g = 0, run_c = 0;
    int why;
    PyObject *out = NULL;
    for (;;) {
        long long x;
        if (w.have_l) {
            if (i >= w.n) { why = 0; break; }
            x = w.lst[i];
        } else {
            if (e == -1) { why = 0; break; }
            x = e;
        }
        if (budget <= 0) { why = 1; break; }
        if (x < w.f0 || x >= end) { why = 2; break; }
        long long off = walk_off(&w, x);
        if (off < 0) {
            PyErr_SetString(PyExc_ValueError, "wl_done: entry beyond the file");
            goto fail;
        }
        const uint8_t *p = b + off;
        int64_t due = rd64(p), loc = rd64(p + 8), nx = rd64(p + 16);
        int state = b[WL_STATE_OFF(w.hs, w.nent, w.f0, x)];
        long long eo = (long long)((uint64_t)due - (uint64_t)base);
        if (!w.have_l && o >= 0 && eo != o) {
            if (eo > o && (nxt < 0 || eo < nxt)) nxt = eo;
        } else {
            if (state < WL_DONE) { why = 3; break; }
            budget--;
            passed++;
            if (state == WL_DROPPED) {
            } else if (loc & WL_BUCKET_BIT) {
                PyObject *v = PyLong_FromLongLong(loc);
                if (!v) goto fail;
                int rc = PyList_Append(blocs, v);
                Py_DECREF(v);
                if (rc < 0) goto fail;
            } else {
                long long g = floordiv64(loc, seg_bytes);
                if (run_c && g != run_g) {
                    if (kds_seg_add(segs, run_g, run_c) < 0) goto fail;
                    run_c = 0;
                }
                run_g = g;
                run_c++;
            }
        }
        after = x;
        if (w.have_l) i++;
        else e = x == last ? -1 : nx;
    }
    if (kds_seg_add(segs, run_g, run_c) < 0) goto fail;
    if (kds_arg_set(&a->i, i) < 0 || kds_arg_set(&a->e, e) < 0 || kds_arg_set(&a->after, after) < 0 ||
        kds_arg_set(&a->nxt, nxt) < 0 || kds_arg_set(&a->budget, budget) < 0 || kds_arg_set(&a->passed, passed) < 0)
        goto fail;
    out = PyLong_FromLong(why);
fail:
    walk_close(&w);
    return out;
}

/* wl_group(buf, hs, f0, nent, e, last, base) -> ({offset: int64 bytes}, e). Offsets are grouped
 * through a run cache (a slot's entries mostly share an offset) and a dict of growable buffers. */
typedef struct {
    long long key;
    int64_t *v;
    Py_ssize_t n, cap;
} WlGroup;

static PyObject *native_wl_group(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "wl_group(buf, hs, f0, nent, e, last, base)");
        return NULL;
    }
    WalkBufs w;
    w.hs = PyLong_AsLongLong(args[1]);
    w.f0 = PyLong_AsLongLong(args[2]);
    w.nent = PyLong_AsLongLong(args[3]);
    long long e = PyLong_AsLongLong(args[4]), last = PyLong_AsLongLong(args[5]), base = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred()) return NULL;
    if (walk_open(&w, args[0], Py_None, 0) < 0) return NULL;
    const uint8_t *b = (const uint8_t *)w.tv.buf;
    long long end = w.f0 + w.nent;
    WlGroup *gs = NULL;
    Py_ssize_t ng = 0, capg = 0, cur = -1;
    PyObject *out = NULL, *d = NULL;
    /* groups are looked up by a linear scan from the last one hit: a slot holds at most
     * `precision` offsets and its entries arrive mostly in runs of one offset */
    while (e != -1 && e >= w.f0 && e < end) {
        long long off = walk_off(&w, e);
        if (off < 0) {
            PyErr_SetString(PyExc_ValueError, "wl_group: entry beyond the file");
            goto fail;
        }
        int64_t due = rd64(b + off), nx = rd64(b + off + 16);
        long long eo = (long long)((uint64_t)due - (uint64_t)base);
        if (cur < 0 || gs[cur].key != eo) {
            cur = -1;
            for (Py_ssize_t j = 0; j < ng; j++)
                if (gs[j].key == eo) { cur = j; break; }
            if (cur < 0) {
                if (ng == capg) {
                    Py_ssize_t nc = capg ? capg * 2 : 8;
                    WlGroup *ngs = PyMem_Realloc(gs, nc * sizeof(WlGroup));
                    if (!ngs) { PyErr_NoMemory(); goto fail; }
                    gs = ngs;
                    capg = nc;
                }
                gs[ng].key = eo;
                gs[ng].v = NULL;
                gs[ng].n = gs[ng].cap = 0;
                cur = ng++;
            }
        }
        WlGroup *g = &gs[cur];
        if (g->n == g->cap) {
            Py_ssize_t nc = g->cap ? g->cap * 2 : 64;
            int64_t *nv = PyMem_Realloc(g->v, nc * sizeof(int64_t));
            if (!nv) { PyErr_NoMemory(); goto fail; }
            g->v = nv;
            g->cap = nc;
        }
        g->v[g->n++] = e;
        e = e == last ? -1 : nx;
    }
    d = PyDict_New();
    if (!d) goto fail;
    for (Py_ssize_t j = 0; j < ng; j++) {
        PyObject *k = PyLong_FromLongLong(gs[j].key);
        PyObject *v = PyBytes_FromStringAndSize((const char *)gs[j].v, gs[j].n * (Py_ssize_t)sizeof(int64_t));
        int rc = (k && v) ? PyDict_SetItem(d, k, v) : -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (rc < 0) goto fail;
    }
    out = Py_BuildValue("(OL)", d, e);
fail:
    Py_XDECREF(d);
    for (Py_ssize_t j = 0; j < ng; j++) PyMem_Free(gs[j].v);
    PyMem_Free(gs);
    walk_close(&w);
    return out;
}

/* wl_ack(buf, refs, a: WlAck) -> wake; moves a's j, lo, hi */
static PyObject *native_wl_ack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[1]) || !PyObject_TypeCheck(args[2], &kds_WlAckType)) {
        PyErr_SetString(PyExc_TypeError, "wl_ack(buf, refs, a: WlAck)");
        return NULL;
    }
    KdsWlAck *a = (KdsWlAck *)args[2];
    long long hs = kds_arg(a->hs), f0 = kds_arg(a->f0), nent = kds_arg(a->nent), head = kds_arg(a->head);
    long long P = kds_arg(a->P), s_k = kds_arg(a->s_k), s_o = kds_arg(a->s_o), s_after = kds_arg(a->s_after);
    long long l_sent = kds_arg(a->l_sent), wa = kds_arg(a->wait_a), wb = kds_arg(a->wait_b);
    Py_ssize_t j = PyLong_AsSsize_t(a->j);
    if (PyErr_Occurred()) return NULL;
    if (P <= 0 || j < 0 || nent <= 0 || hs < nent) {
        PyErr_SetString(PyExc_ValueError, "wl_ack: bad precision, position or file geometry");
        return NULL;
    }
    Py_buffer tv;
    if (PyObject_GetBuffer(args[0], &tv, PyBUF_WRITABLE) < 0) return NULL;
    PyObject *refs = args[1], *out = NULL;
    uint8_t *b = (uint8_t *)tv.buf;
    long long end = f0 + nent < head ? f0 + nent : head, lo = -1, hi = -1;
    int wake = 0;
    while (j < PyList_GET_SIZE(refs)) {
        PyObject *r = PyList_GET_ITEM(refs, j);
        int ovf = 0;
        long long e = PyLong_AsLongLongAndOverflow(r, &ovf);
        if (e == -1 && PyErr_Occurred()) goto done;
        if (ovf || e < f0 || e >= end || e < 0) break;
        j++;
        long long off = hs + (e - f0) * WL_SIZE;
        if (off < 0 || off + WL_SIZE > tv.len) {
            PyErr_SetString(PyExc_ValueError, "wl_ack: entry beyond the file");
            goto done;
        }
        const uint8_t *p = b + off;
        int64_t due = rd64(p), loc = rd64(p + 8);
        long long soff = WL_STATE_OFF(hs, nent, f0, e);
        int state = b[soff], flags = p[25];
        uint32_t tag = rd32(p + 28);
        if (tag != (uint32_t)(e & 0xFFFFFFFF) || state != WL_PENDING || (loc & WL_BUCKET_BIT)) continue;
        if (flags & WL_LATE) {
            if (l_sent == -1 || e > l_sent) continue;
        } else {
            long long k = floordiv64(due, P);
            if (k == s_k) {
                if (s_o < 0) continue;
                long long eo = due - k * P;
                if (eo > s_o || (eo == s_o && (s_after == -1 || e > s_after))) continue;
            } else if (k > s_k) {
                continue;
            }
        }
        b[soff] = WL_DONE;
        if (lo < 0 || soff < lo) lo = soff;
        if (soff > hi) hi = soff;
        if (e == wa || e == wb) wake = 1;
    }
    if (kds_arg_set(&a->j, j) < 0 || kds_arg_set(&a->lo, lo) < 0 || kds_arg_set(&a->hi, hi) < 0) goto done;
    out = Py_NewRef(wake ? Py_True : Py_False);
done:
    PyBuffer_Release(&tv);
    return out;
}

/* wl_read(segments, seg_bytes, pend, i, out) -> i: for pend[i], pend[i + 1], ... (the (entry, loc)
 * pairs wl_send collected), append (entry, record) to out, the record decoded straight from its
 * commit-log segment; stop at the first pair the caller must read itself (a bucket ref, a missing
 * segment, a record that does not decode: CommitLog.read raises for it as it always did) and
 * return its position, or len(pend). */
static PyObject *native_wl_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyDict_Check(args[0]) || !PyList_Check(args[2]) || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "wl_read(segments, seg_bytes, pend, i, out)");
        return NULL;
    }
    long long seg_bytes = PyLong_AsLongLong(args[1]);
    Py_ssize_t i = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (seg_bytes <= 0 || i < 0) {
        PyErr_SetString(PyExc_ValueError, "wl_read: segment size must be positive and i not negative");
        return NULL;
    }
    PyObject *segments = args[0], *pend = args[2], *out = args[4];
    /* Two segments held at once: a due ms's records arrived at scattered times, so the reads
     * alternate between the live segments and one held buffer would be re-fetched at every switch. */
    KdsFile segs2[2] = {{0}, {0}};
    int last_used = 0;
    PyObject *res = NULL;
    for (; i < PyList_GET_SIZE(pend); i++) {
        PyObject *pair = PyList_GET_ITEM(pend, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "wl_read: pend holds (entry, loc) pairs");
            goto fail;
        }
        long long loc = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 1));
        if (loc == -1 && PyErr_Occurred()) goto fail;
        if (loc < 0 || (loc & WL_BUCKET_BIT)) break;
        long long g = (long long)((uint64_t)loc / (uint64_t)seg_bytes);
        int use = (segs2[0].have && segs2[0].first == g) ? 0 : (segs2[1].have && segs2[1].first == g) ? 1 : -1;
        if (use < 0) use = !segs2[0].have ? 0 : !segs2[1].have ? 1 : 1 - last_used; /* replace the older */
        last_used = use;
        PyObject *rec = kds_log_decode_at(&segs2[use], segments, seg_bytes, (uint64_t)loc);
        if (!rec) {
            if (PyErr_Occurred()) goto fail;
            break;
        }
        PyObject *t = PyTuple_Pack(2, PyTuple_GET_ITEM(pair, 0), rec);
        Py_DECREF(rec);
        if (!t) goto fail;
        int rc = PyList_Append(out, t);
        Py_DECREF(t);
        if (rc < 0) goto fail;
    }
    res = PyLong_FromSsize_t(i);
fail:
    kds_file_release(&segs2[0]);
    kds_file_release(&segs2[1]);
    return res;
}


PyMethodDef kds_wheel_methods[] = {
    {"wl_link", (PyCFunction)(void (*)(void))native_wl_link, METH_FASTCALL, NULL},
    {"wl_send", (PyCFunction)(void (*)(void))native_wl_send, METH_FASTCALL, NULL},
    {"wl_read", (PyCFunction)(void (*)(void))native_wl_read, METH_FASTCALL, NULL},
    {"wl_done", (PyCFunction)(void (*)(void))native_wl_done, METH_FASTCALL, NULL},
    {"wl_group", (PyCFunction)(void (*)(void))native_wl_group, METH_FASTCALL, NULL},
    {"wl_ack", (PyCFunction)(void (*)(void))native_wl_ack, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}};
