/* sidecar._native, firing core: a `delay.every` schedule's firing and its re-arm header blob (the
 * reference is sidecar/store/firings.py, Firings.fire and Firings._rearm, with
 * sidecar/recurring/decide.py's arithmetic; a test compares both on random schedules,
 * tests/unit/test_recurring_firing_native.py).
 *
 * kds_fire, called by publish_due (publish.c) for each due RECURRING record it meets and by
 * Firings.fire through fire_every, reads the record's stored header blob once: the user's
 * headers, the schedule's (contract.RECURRING_HEADERS) and its state (delay.state.*). For the
 * common schedule it decides in place what Firings.fire decides (decide's every-grid arithmetic:
 * the latest due nominal time, how many it stands for, the firing after it), records the decision
 * in the store's Firings (`_handed[ref] = (None, Firing(...), False)`: None, the Armed schedule,
 * read again from the record in the rare paths that need it) and returns the headers the firing is
 * delivered with (firing_headers' list). Anything else answers NULL without an error, and the
 * Python reference decides: a cron schedule (its next occurrence across time zones stays in
 * Python, sidecar/recurring/timeline.py), a `delay.tz`, a value the shape check would not take
 * as it is (not plain digits, out of range, a misfire policy other than the two), a duplicated
 * or unknown-layout header, the store's Firings.native off (the tests' reference runs), a ref
 * already handed out (it fires as decided the first time), nothing
 * firing now (nothing due, or `skip` after a misfire: Python re-arms it at once), exactly-once (the
 * next firing is armed at hand-out, in the firing's transaction: Python does it).
 *
 * rearm_blob(blob, last_ms, fired): the stored headers of the re-armed record, as _rearm encodes
 * them: the user's, then the schedule's, each in the order stored, then delay.state.last-fire
 * (absent before the first firing) and delay.state.fired. */
#include "native.h"
#include "intake_run.h"

/* the header names, from contract.py (firing_setup): the delivered ones as str, the stored ones as
 * bytes to compare with the blob's */
enum { N_ID, N_DELIVER_AT, N_ENQUEUED_AT, N_SOURCE, N_FIRE_TIME, N_FIRE_SEQ, N_NEXT_AT, N_MISSED, N_OUT };
enum { S_CRON, S_EVERY, S_TZ, S_START, S_END, S_MAX_COUNT, S_MISFIRE, S_LAST, S_FIRED, S_KNOWN };
#define F_SPEC_COUNT S_LAST /* the schedule's headers come first in S_* */
static PyObject *out_names[N_OUT];
static PyObject *stored_names[S_KNOWN]; /* bytes */
static PyObject *firing_cls = NULL, *S_firings = NULL, *S_handed = NULL, *S_mirror = NULL, *S_on_settle = NULL,
                *S_native = NULL;
static long long grace_ms = 0, max_epoch_ms = 0, min_every_ms = 0;
static const char FIRE_ONCE[] = "fire-once", SKIP[] = "skip";

#define F_MAX_HEADERS 256 /* more stored headers than this: the reference path */

typedef struct { /* one stored header: name and value (vlen -1: None) within the blob */
    const uint8_t *name, *value;
    Py_ssize_t nlen, vlen;
    int kind; /* S_* or -1: the user's */
} Hdr;

typedef struct { /* a stored RECURRING record's common schedule and state */
    Hdr h[F_MAX_HEADERS];
    int n;
    long long every, start, end, max_count, last, fired; /* end, max_count: -1 when absent */
    int skip, has_last;                                  /* has_last: delay.state.last-fire is there */
} Stored;

/* the blob's headers into s->h; 0, or -1 when it does not decode (the reference raises for it) */
static int split(const uint8_t *b, Py_ssize_t n, Stored *s) {
    s->n = 0;
    if (n == 0) return 0;
    if (n < 2) return -1;
    Py_ssize_t count = rd16(b), pos = 2;
    if (count > F_MAX_HEADERS) return -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (pos + 2 > n) return -1;
        Py_ssize_t nl = rd16(b + pos);
        pos += 2;
        if (pos + nl + 4 > n) return -1;
        Hdr *h = &s->h[s->n++];
        h->name = b + pos, h->nlen = nl;
        pos += nl;
        int32_t vl = (int32_t)rd32(b + pos);
        pos += 4;
        h->value = b + pos, h->vlen = vl < 0 ? -1 : vl;
        if (vl > 0) {
            if (pos + vl > n) return -1;
            pos += vl;
        }
        h->kind = -1;
        for (int k = 0; k < S_KNOWN; k++)
            if (PyBytes_GET_SIZE(stored_names[k]) == nl && !memcmp(PyBytes_AS_STRING(stored_names[k]), h->name, nl)) {
                h->kind = k;
                break;
            }
    }
    return 0;
}

/* plain digits (1 to 18 of them) as *out: 1, else 0 (the reference's rules decide) */
static int digits(const Hdr *h, long long *out) {
    if (h->vlen < 1 || h->vlen > 18) return 0;
    long long v = 0;
    for (Py_ssize_t k = 0; k < h->vlen; k++) {
        uint8_t ch = h->value[k];
        if (ch < '0' || ch > '9') return 0;
        v = v * 10 + (ch - '0');
    }
    *out = v;
    return 1;
}

/* The common schedule of a stored record (armed() and stored_schedule()'s answer, for the case
 * they take without a full parse): 1, or 0 for any other (the reference path). enqueue_ms: the
 * default start. */
static int common(const uint8_t *blob, Py_ssize_t n, long long enqueue_ms, Stored *s) {
    if (split(blob, n, s) < 0) return 0;
    int seen[S_KNOWN] = {0};
    s->every = -1, s->start = enqueue_ms > 0 ? enqueue_ms : 0, s->end = -1, s->max_count = -1, s->last = -1;
    s->fired = 0, s->skip = 0, s->has_last = 0;
    for (int i = 0; i < s->n; i++) {
        const Hdr *h = &s->h[i];
        if (h->kind < 0) continue;
        if (seen[h->kind]++) return 0; /* a duplicate: the reference's dict keeps the last */
        long long v = 0;
        switch (h->kind) {
        case S_CRON:
        case S_TZ:
            return 0;
        case S_EVERY:
            if (!digits(h, &v) || v < min_every_ms) return 0;
            s->every = v;
            break;
        case S_START:
            if (!digits(h, &v)) return 0;
            s->start = v;
            break;
        case S_END:
            if (!digits(h, &v)) return 0;
            s->end = v;
            break;
        case S_MAX_COUNT:
            if (!digits(h, &v) || v < 1) return 0;
            s->max_count = v;
            break;
        case S_MISFIRE:
            if (h->vlen == (Py_ssize_t)strlen(SKIP) && !memcmp(h->value, SKIP, strlen(SKIP)))
                s->skip = 1;
            else if (h->vlen != (Py_ssize_t)strlen(FIRE_ONCE) || memcmp(h->value, FIRE_ONCE, strlen(FIRE_ONCE)))
                return 0;
            break;
        case S_LAST:
            if (h->vlen > 0 && !digits(h, &v)) return 0; /* int(value or b"0") */
            s->last = v, s->has_last = 1;
            break;
        case S_FIRED:
            if (h->vlen > 0 && !digits(h, &v)) return 0;
            s->fired = v;
            break;
        }
    }
    if (s->every < 0 || s->start > max_epoch_ms) return 0;
    if (s->end >= 0 && (s->end < s->start || s->end > max_epoch_ms)) return 0;
    return 1;
}

typedef struct {
    long long fire, seq, next, missed; /* next -1: none (the last firing) */
} Decision;

/* decide() for a schedule that fires now: 1 and *d, or 0 when nothing fires now */
static int decide_every(const Stored *s, long long now, Decision *d) {
    long long every = s->every, start = s->start, end = s->end, mc = s->max_count;
    if (mc >= 0 && s->fired >= mc) return 0;
    long long after = (!s->has_last || s->last < start - 1) ? start - 1 : s->last;
    long long first = start + (floordiv64(after - start, every) + 1) * every;
    if (first > now || first > max_epoch_ms || (end >= 0 && first > end)) return 0;
    long long stop = (end < 0 || now < end) ? now : end;
    long long due = floordiv64(stop - first, every) + 1, latest = first + (due - 1) * every;
    if (s->skip && now - latest > grace_ms) return 0;
    long long made = s->fired + 1, after_latest = latest + every;
    d->fire = latest, d->seq = made, d->missed = due - 1;
    d->next = ((mc >= 0 && made >= mc) || after_latest > max_epoch_ms || (end >= 0 && after_latest > end))
                  ? -1 : after_latest;
    return 1;
}

/* (name, value) as out[at], value's reference taken (NULL: -1, the error set where it was made) */
static int put(PyObject *out, Py_ssize_t at, PyObject *name, PyObject *value) {
    if (!value) return -1;
    PyObject *t = PyTuple_Pack(2, name, value);
    Py_DECREF(value);
    if (!t) return -1;
    PyList_SET_ITEM(out, at, t);
    return 0;
}

static PyObject *num(long long v) {
    char tmp[24];
    int n = kds_fmt_ll(tmp, v);
    return PyBytes_FromStringAndSize(tmp, n);
}

/* firing_headers(rec, armed, firing, source_topic): the user's headers, then delay.id,
 * deliver-at (the nominal time), enqueued-at, source, fire-time, fire-seq, next-at, missed */
static PyObject *headers_of(const Stored *s, const RecordObject *rec, const Decision *d, PyObject *topic_bytes) {
    Py_ssize_t users = 0;
    for (int i = 0; i < s->n; i++) users += s->h[i].kind < 0;
    Py_ssize_t total = users + 6 + (d->next >= 0) + (d->missed > 0), at = 0;
    PyObject *out = PyList_New(total);
    if (!out) return NULL;
    for (int i = 0; i < s->n; i++) {
        const Hdr *h = &s->h[i];
        if (h->kind >= 0) continue;
        PyObject *name = PyUnicode_DecodeUTF8((const char *)h->name, h->nlen, NULL);
        if (!name) goto fail;
        PyObject *value = h->vlen < 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize((const char *)h->value, h->vlen);
        int rc = put(out, at++, name, value);
        Py_DECREF(name);
        if (rc < 0) goto fail;
    }
    /* (put takes its value, or a NULL one: each value is made as its put is reached) */
    if (put(out, at++, out_names[N_ID], Py_NewRef(rec->id)) < 0 ||
        put(out, at++, out_names[N_DELIVER_AT], num(d->fire)) < 0 ||
        put(out, at++, out_names[N_ENQUEUED_AT], num(rec->enqueue_ms)) < 0 ||
        put(out, at++, out_names[N_SOURCE], kds_source(topic_bytes, rec->src_partition, rec->src_offset)) < 0 ||
        put(out, at++, out_names[N_FIRE_TIME], num(d->fire)) < 0 ||
        put(out, at++, out_names[N_FIRE_SEQ], num(d->seq)) < 0)
        goto fail;
    if (d->next >= 0 && put(out, at++, out_names[N_NEXT_AT], num(d->next)) < 0) goto fail;
    if (d->missed > 0 && put(out, at++, out_names[N_MISSED], num(d->missed)) < 0) goto fail;
    return out;
fail: /* the unset items are NULL: list_dealloc skips them */
    Py_DECREF(out);
    return NULL;
}

static int ready(void) {
    if (firing_cls) return 0;
    PyErr_SetString(PyExc_RuntimeError, "sidecar._native.firing_setup() was not called");
    return -1;
}

/* Under exactly-once (the store's changelog writes its puts in the delivery's transaction,
 * mirror.on_settle false) the next firing is armed at hand-out: the reference does it. 1: it is. */
static int in_transaction(PyObject *store) {
    PyObject *mirror = PyObject_GetAttr(store, S_mirror);
    if (!mirror) return -1;
    int rc = 0;
    if (mirror != Py_None) {
        PyObject *on = PyObject_GetAttr(mirror, S_on_settle);
        rc = on ? !PyObject_IsTrue(on) : -1;
        Py_XDECREF(on);
    }
    Py_DECREF(mirror);
    return rc;
}

PyObject *kds_fire(PyObject *store, PyObject *ref, PyObject *recobj, long long now, PyObject *topic_bytes) {
    if (ready() < 0) return NULL;
    if (!PyObject_TypeCheck(recobj, &kds_RecordType) || !PyBytes_Check(topic_bytes)) return NULL;
    RecordObject *rec = (RecordObject *)recobj;
    if (rec->rtype != REC_RECURRING || !PyBytes_Check(rec->headers) || !PyBytes_Check(rec->id)) return NULL;
    Stored s;
    Decision d;
    if (!common((const uint8_t *)PyBytes_AS_STRING(rec->headers), PyBytes_GET_SIZE(rec->headers), rec->enqueue_ms,
                &s) ||
        !decide_every(&s, now, &d))
        return NULL;
    int tx = in_transaction(store);
    if (tx != 0) return NULL; /* (-1: the error stays set) */
    PyObject *firings = PyObject_GetAttr(store, S_firings);
    PyObject *on = firings ? PyObject_GetAttr(firings, S_native) : NULL; /* False: the reference takes all */
    PyObject *handed = on == Py_True ? PyObject_GetAttr(firings, S_handed) : NULL;
    Py_XDECREF(firings);
    Py_XDECREF(on);
    if (!handed) return NULL;
    PyObject *out = NULL, *f = NULL, *entry = NULL;
    int there = PyDict_Check(handed) ? PyDict_Contains(handed, ref) : -1;
    if (there != 0) { /* handed out before: it fires as decided then (-1: not a dict, the reference) */
        if (there < 0) PyErr_Clear();
        goto done;
    }
    PyObject *next = d.next >= 0 ? PyLong_FromLongLong(d.next) : Py_NewRef(Py_None);
    PyObject *a[4] = {PyLong_FromLongLong(d.fire), PyLong_FromLongLong(d.seq), next, PyLong_FromLongLong(d.missed)};
    if (a[0] && a[1] && a[2] && a[3]) f = PyObject_Vectorcall(firing_cls, a, 4, NULL);
    for (int k = 0; k < 4; k++) Py_XDECREF(a[k]);
    if (f) entry = PyTuple_Pack(3, Py_None, f, Py_False);
    if (entry) out = headers_of(&s, rec, &d, topic_bytes);
    if (out && PyDict_SetItem(handed, ref, entry) < 0) Py_CLEAR(out);
done:
    Py_XDECREF(entry);
    Py_XDECREF(f);
    Py_DECREF(handed);
    return out;
}

/* fire_every(store, ref, rec, now) -> list | None: kds_fire for Firings.fire (None: the reference
 * decides) */
static PyObject *native_fire_every(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) return PyErr_Format(PyExc_TypeError, "fire_every(store, ref, rec, now)");
    long long now = PyLong_AsLongLong(args[3]);
    if (now == -1 && PyErr_Occurred()) return NULL;
    PyObject *topic_bytes = PyObject_GetAttrString(args[0], "topic_bytes");
    if (!topic_bytes) return NULL;
    PyObject *out = kds_fire(args[0], args[1], args[2], now, topic_bytes);
    Py_DECREF(topic_bytes);
    if (!out && !PyErr_Occurred()) Py_RETURN_NONE;
    return out;
}

/* one header into the blob at p: its bytes written (p NULL: only counted) */
static Py_ssize_t emit(uint8_t *p, const uint8_t *name, Py_ssize_t nl, const uint8_t *value, Py_ssize_t vl) {
    if (p) {
        wr16(p, (uint16_t)nl);
        memcpy(p + 2, name, nl);
        wr32(p + 2 + nl, (uint32_t)(int32_t)vl);
        if (vl > 0) memcpy(p + 6 + nl, value, vl);
    }
    return 6 + nl + (vl > 0 ? vl : 0);
}

/* the re-armed record's header blob from the stored one (b, n): the user's headers, the
 * schedule's, then the state (has_last 0: no delay.state.last-fire); NULL with an error set */
static PyObject *rearm_bytes(const uint8_t *b, Py_ssize_t n, int has_last, long long last, long long fired) {
    Stored *s = PyMem_Malloc(sizeof *s);
    if (!s) return PyErr_NoMemory();
    PyObject *out = NULL;
    if (split(b, n, s) < 0) {
        PyErr_SetString(PyExc_ValueError, "rearm_blob: the header blob does not decode");
        goto done;
    }
    char lastv[24], firedv[24];
    Py_ssize_t ll = has_last ? kds_fmt_ll(lastv, last) : -2, fl = kds_fmt_ll(firedv, fired);
    const uint8_t *ln = (const uint8_t *)PyBytes_AS_STRING(stored_names[S_LAST]);
    const uint8_t *fn = (const uint8_t *)PyBytes_AS_STRING(stored_names[S_FIRED]);
    Py_ssize_t lnl = PyBytes_GET_SIZE(stored_names[S_LAST]), fnl = PyBytes_GET_SIZE(stored_names[S_FIRED]);
    for (int pass = 0; pass < 2; pass++) { /* 0: the size, 1: the bytes */
        uint8_t *p = pass ? (uint8_t *)PyBytes_AS_STRING(out) : NULL;
        Py_ssize_t size = 2, count = 0;
        for (int round = 0; round < 2; round++) /* the user's headers, then the schedule's */
            for (int i = 0; i < s->n; i++) {
                const Hdr *h = &s->h[i];
                if (round == 0 ? h->kind >= 0 : (h->kind < 0 || h->kind >= F_SPEC_COUNT)) continue;
                size += emit(p ? p + size : NULL, h->name, h->nlen, h->value, h->vlen);
                count++;
            }
        if (ll >= 0) {
            size += emit(p ? p + size : NULL, ln, lnl, (const uint8_t *)lastv, ll);
            count++;
        }
        size += emit(p ? p + size : NULL, fn, fnl, (const uint8_t *)firedv, fl);
        count++;
        if (count > 0xFFFF) {
            PyErr_SetString(PyExc_ValueError, "rearm_blob: too many headers");
            goto done;
        }
        if (p) {
            wr16(p, (uint16_t)count);
        } else if (!(out = PyBytes_FromStringAndSize(NULL, size))) {
            goto done;
        }
    }
done:
    PyMem_Free(s);
    return out;
}

/* rearm_blob(blob, last_ms: int | None, fired) -> bytes (the module comment) */
static PyObject *native_rearm_blob(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "rearm_blob(blob: bytes, last_ms, fired)");
        return NULL;
    }
    if (ready() < 0) return NULL;
    long long last = args[1] == Py_None ? 0 : PyLong_AsLongLong(args[1]), fired = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    return rearm_bytes((const uint8_t *)PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), args[1] != Py_None,
                       last, fired);
}

/* The id-index slot of the open stage (base, mask; live + tombs occupied) the insert of h with a
 * fresh scheduler ref takes, as IdIndex.put's: the first tombstone or the empty slot its probe
 * meets (*tomb set for a tombstone); -1 when the insert would grow the stage (the reference's
 * case). Unlike the intake's, an entry under h is no obstacle: the firing being settled is there,
 * under its own ref, until the settle removes it; and a fresh ref is never staged already. */
static long long stage_slot(const uint8_t *base, uint64_t mask, long long live, long long tombs, uint64_t h,
                            int *tomb) {
    if ((live + tombs + 1) * 2 > (long long)(mask + 1)) return -1;
    long long free_slot = -1;
    uint64_t at = h & mask;
    for (uint64_t probes = 0;; at = (at + 1) & mask, probes++) {
        uint64_t sh;
        if (probes > mask) return -1;
        memcpy(&sh, base + at * IDX_SLOT_SIZE, 8);
        if (sh == IDX_EMPTY) break;
        if (sh == IDX_TOMB && free_slot < 0) free_slot = (long long)at;
    }
    *tomb = free_slot >= 0;
    return free_slot >= 0 ? free_slot : (long long)at;
}

/* rearm_run(items, start, a: RunBufs) -> int
 * Re-arm items[start:], (rec, last_ms, fired, next_ms) each: the RECURRING record due at next_ms
 * in rec's place under its id, as Firings._rearm appends, schedules and indexes it (its stored
 * headers rewritten as rearm_blob does), with the intake's state and buffers (intake_run.h; a's
 * fields are ingest_run's buffers). Only on the wheel (the levels plan a
 * level: the reference does). Returns the index of the first item not re-armed (len(items) if
 * all were): every one before it is stored, scheduled, indexed and journaled, nothing of it. */
static PyObject *native_rearm_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (kds_in_args(args, nargs, &kds_RunBufsType, "rearm_run") < 0) return NULL;
    if (ready() < 0) return NULL;
    KdsRunBufs *a = (KdsRunBufs *)args[2];
    PyObject *items = args[0];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]), n = PyList_GET_SIZE(items);
    if (i == -1 && PyErr_Occurred()) return NULL;
    InRun *r = PyMem_Malloc(sizeof *r);
    if (!r) return PyErr_NoMemory();
    PyObject *result = NULL;
    if (KDS_IN_OPEN(r, a) < 0) goto fail;
    int64_t *st = r->st;
    for (; i < n && r->have_seg && r->kind == IN_KIND_WHEEL; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4 ||
            !PyObject_TypeCheck(PyTuple_GET_ITEM(item, 0), &kds_RecordType))
            break;
        RecordObject *rec = (RecordObject *)PyTuple_GET_ITEM(item, 0);
        PyObject *lo = PyTuple_GET_ITEM(item, 1);
        long long last = lo == Py_None ? 0 : PyLong_AsLongLong(lo);
        long long fired = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 2));
        long long due = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 3));
        if (PyErr_Occurred()) {
            PyErr_Clear();
            break;
        }
        if (due < WL_MIN_DUE || due > WL_MAX_DUE || !PyBytes_Check(rec->id) || !PyBytes_Check(rec->topic) ||
            !PyBytes_Check(rec->headers) || (rec->key != Py_None && !PyBytes_Check(rec->key)) ||
            (rec->value != Py_None && !PyBytes_Check(rec->value)))
            break;
        uint64_t h = kds_id_hash((const uint8_t *)PyBytes_AS_STRING(rec->id), PyBytes_GET_SIZE(rec->id));
        int tomb = 0;
        long long head = st[IN_HEAD];
        long long at = stage_slot(r->ibase, r->mask, st[IN_IDX_LIVE], st[IN_IDX_TOMBS], h, &tomb);
        if (at < 0 || !kds_in_jnl_room(r)) break;
        PyObject *blob = rearm_bytes((const uint8_t *)PyBytes_AS_STRING(rec->headers), PyBytes_GET_SIZE(rec->headers),
                                     lo != Py_None, last, fired);
        if (!blob) {
            PyErr_Clear();
            break;
        }
        Field fs[5];
        memset(fs, 0, sizeof fs);
        PyObject *parts[5] = {rec->id, rec->topic, rec->key, rec->value, blob};
        uint64_t body = (uint64_t)HEAD_SIZE - 8;
        for (int k = 0; k < 5; k++) {
            if (parts[k] == Py_None) {
                fs[k].null = 1;
                continue;
            }
            fs[k].view.buf = PyBytes_AS_STRING(parts[k]), fs[k].view.len = PyBytes_GET_SIZE(parts[k]);
            body += (uint64_t)fs[k].view.len;
        }
        uint64_t length = (8 + body + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
        long long soff = kds_in_room(r, length), ref = soff < 0 ? -1 : kds_in_sched_add(r, due, 0, head);
        if (ref >= 0) {
            kds_write_record((uint8_t *)r->segv.buf + soff, (uint32_t)length, (uint32_t)body, REC_RECURRING, due,
                             rec->enqueue_ms, rec->src_offset, rec->src_partition, rec->target_partition, 0, 0, fs);
            kds_in_stored(r, length, at, tomb, h, ref);
        }
        Py_DECREF(blob);
        if (ref < 0) break;
    }
    if (kds_in_state_out(a->st, r->st, r->st_in, r->nst) == 0) result = PyLong_FromSsize_t(i);
fail:
    kds_in_close(r);
    PyMem_Free(r);
    return result;
}

/* firing_setup(firing_cls, out_names, stored_names, grace_ms, max_epoch_ms, min_every_ms): the
 * Firing class, the header names (N_* as str, S_* as bytes) and the rules' numbers, from
 * firings.py, contract.py, misfire.py and headers.py (one definition each). */
static PyObject *native_firing_setup(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != N_OUT || !PyTuple_Check(args[2]) ||
        PyTuple_GET_SIZE(args[2]) != S_KNOWN) {
        PyErr_Format(PyExc_TypeError, "firing_setup(firing_cls, %d names, %d stored names, grace_ms, max_epoch_ms, "
                     "min_every_ms)", N_OUT, S_KNOWN);
        return NULL;
    }
    for (int k = 0; k < N_OUT; k++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(args[1], k))) return PyErr_Format(PyExc_TypeError, "names are str");
    for (int k = 0; k < S_KNOWN; k++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(args[2], k))) return PyErr_Format(PyExc_TypeError, "stored names are bytes");
    long long g = PyLong_AsLongLong(args[3]), me = PyLong_AsLongLong(args[4]), mv = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (!S_firings) {
        S_firings = PyUnicode_InternFromString("firings");
        S_handed = PyUnicode_InternFromString("_handed");
        S_mirror = PyUnicode_InternFromString("mirror");
        S_on_settle = PyUnicode_InternFromString("on_settle");
        S_native = PyUnicode_InternFromString("native");
        if (!S_firings || !S_handed || !S_mirror || !S_on_settle || !S_native) return NULL;
    }
    for (int k = 0; k < N_OUT; k++) Py_XSETREF(out_names[k], Py_NewRef(PyTuple_GET_ITEM(args[1], k)));
    for (int k = 0; k < S_KNOWN; k++) Py_XSETREF(stored_names[k], Py_NewRef(PyTuple_GET_ITEM(args[2], k)));
    grace_ms = g, max_epoch_ms = me, min_every_ms = mv;
    Py_XSETREF(firing_cls, Py_NewRef(args[0]));
    Py_RETURN_NONE;
}

PyMethodDef kds_firing_methods[] = {
    {"firing_setup", (PyCFunction)(void (*)(void))native_firing_setup, METH_FASTCALL, NULL},
    {"fire_every", (PyCFunction)(void (*)(void))native_fire_every, METH_FASTCALL, NULL},
    {"rearm_blob", (PyCFunction)(void (*)(void))native_rearm_blob, METH_FASTCALL, NULL},
    {"rearm_run", (PyCFunction)(void (*)(void))native_rearm_run, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}};
