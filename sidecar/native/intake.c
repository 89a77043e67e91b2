/* sidecar._native, intake core. Intake fast path (sidecar/store/intake.py,
 * Intake.ingest_many): the common consumed record stored and scheduled in one C loop over
 * the consumer's Message list. The Python path (Ingress.ingest -> Intake.ingest_fields) is
 * the reference: this loop handles a record only when that path would run its plain branch (no
 * error, this store's partition (and topic, with several ingress topics), a request the fast
 * parser accepts (with the common recurring
 * record: delay.every and a start, stored as a RECURRING record, firings.py arm), no id-index entry under its
 * id's hash, a plan, room in the current commit-log segment, the scheduler's plain append, no index
 * growth), with every check made before the first write; at the first other record it stops and
 * returns its index, and Python runs that one through the reference path. The state the Python
 * objects keep (log head, counts, cursors, dirty ranges) travels in a list of ints, `st`, copied
 * into a C array for the loop and the values it changed written back; its layout (the IN_*
 * indexes) is declared in sidecar/store/intake_layout.py and generated from there into
 * intake_layout.h. */
#include "native.h"
#include "intake_run.h"


static PyObject *S_error, *S_partition, *S_timestamp, *S_offset, *S_key, *S_value, *S_headers, *S_topic;

static int in_names(void) {
    if (S_error) return 0;
    S_error = PyUnicode_InternFromString("error");
    S_partition = PyUnicode_InternFromString("partition");
    S_timestamp = PyUnicode_InternFromString("timestamp");
    S_offset = PyUnicode_InternFromString("offset");
    S_key = PyUnicode_InternFromString("key");
    S_value = PyUnicode_InternFromString("value");
    S_headers = PyUnicode_InternFromString("headers");
    S_topic = PyUnicode_InternFromString("topic");
    return (S_error && S_partition && S_timestamp && S_offset && S_key && S_value && S_headers && S_topic) ? 0 : -1;
}

/* A Python int as a C long long; 0 (and no error left set) if it is not one or does not fit. */
static int in_ll(PyObject *o, long long *out) {
    if (!o || !PyLong_Check(o)) return 0;
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* The message accessors ingest_run calls (M_* in native.h). For the last message type seen, their
 * method descriptors (a C type's methods) are looked up once and called directly: a call by name
 * looks the method up in the type's dictionary each time, seven times per record. A type whose
 * accessors are anything else (a Python class in a test) is called by name. */
static PyTypeObject *in_type = NULL; /* strong reference */
static PyObject *in_descr[M_COUNT];  /* NULL: call by name */

static PyObject *in_name(int k) {
    PyObject *names[M_COUNT] = {S_error, S_partition, S_timestamp, S_offset, S_key, S_value, S_headers, S_topic};
    return names[k];
}

static void in_learn(PyTypeObject *tp) {
    for (int k = 0; k < M_COUNT; k++) Py_CLEAR(in_descr[k]);
    Py_INCREF(tp);
    Py_XSETREF(in_type, tp);
    PyObject *found[M_COUNT];
    int all = 1;
    for (int k = 0; k < M_COUNT; k++) {
        found[k] = PyObject_GetAttr((PyObject *)tp, in_name(k));
        if (!found[k]) PyErr_Clear();
        all = all && found[k] && Py_IS_TYPE(found[k], &PyMethodDescr_Type);
    }
    for (int k = 0; k < M_COUNT; k++) {
        if (all)
            in_descr[k] = found[k];
        else
            Py_XDECREF(found[k]);
    }
}

/* m.<accessor k>(), raising what it raises (the publish path's delivery report calls it too) */
PyObject *kds_msg_call(PyObject *m, int k) {
    if (in_names() < 0) return NULL;
    if (Py_TYPE(m) != in_type) in_learn(Py_TYPE(m));
    return in_descr[k] ? PyObject_Vectorcall(in_descr[k], &m, 1, NULL) : PyObject_CallMethodNoArgs(m, in_name(k));
}

static PyObject *in_call(PyObject *m, int k) {
    PyObject *r = kds_msg_call(m, k);
    if (!r) PyErr_Clear(); /* the reference path calls it again and raises */
    return r;
}

/* The state list's ints into r->st (and a copy into r->st_in); its length, or -1 with an error set. */
static Py_ssize_t state_in(PyObject *lst, int64_t *st, int64_t *orig) {
    if (!PyList_Check(lst) || PyList_GET_SIZE(lst) < IN_L_BASE || PyList_GET_SIZE(lst) > IN_MAX_STATE) {
        PyErr_SetString(PyExc_ValueError, "intake: st must be a list of ints (sidecar/store/intake_layout.py)");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(lst);
    for (Py_ssize_t k = 0; k < n; k++) {
        st[k] = PyLong_AsLongLong(PyList_GET_ITEM(lst, k));
        if (st[k] == -1 && PyErr_Occurred()) return -1;
    }
    memcpy(orig, st, (size_t)n * sizeof *st);
    return n;
}

/* The values the loop changed back into the state list. */
int kds_in_state_out(PyObject *lst, const int64_t *st, const int64_t *orig, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k++) {
        if (st[k] == orig[k]) continue;
        PyObject *v = PyLong_FromLongLong(st[k]);
        if (!v || PyList_SetItem(lst, k, v) < 0) return -1; /* (steals v, drops the old value) */
    }
    return 0;
}

void kds_in_close(InRun *r) {
    while (--r->nbuf >= 0)
        if (r->bufs[r->nbuf].obj) PyBuffer_Release(&r->bufs[r->nbuf]);
    if (r->have_idx) PyBuffer_Release(&r->idxv);
    if (r->have_old) PyBuffer_Release(&r->oldv);
    if (r->have_old2) PyBuffer_Release(&r->old2v);
    if (r->have_jnl) PyBuffer_Release(&r->jnlv);
    if (r->have_tags) PyBuffer_Release(&r->tagsv);
    if (r->have_seg) PyBuffer_Release(&r->segv);
    r->have_idx = r->have_old = r->have_old2 = r->have_jnl = r->have_tags = r->have_seg = 0;
}

/* A table probed for presence only (buffer b, capacity - 1 in st[mask_at]) appended to r->probed:
 * 0 (b None or absent: nothing appended), or -1 with an error set. */
static int in_probed(InRun *r, PyObject *b, int mask_at, Py_buffer *v, int *have) {
    uint64_t mask = (uint64_t)r->st[mask_at];
    if (b == NULL || b == Py_None) return 0;
    if (PyObject_GetBuffer(b, v, PyBUF_SIMPLE) < 0) return -1;
    *have = 1;
    if (r->st[mask_at] < 0 || (mask & (mask + 1)) || v->len < r->hs ||
        (uint64_t)(v->len - r->hs) < (mask + 1) * 16) {
        PyErr_SetString(PyExc_ValueError, "intake: a probed index buffer does not match the state");
        return -1;
    }
    r->probed[r->nprobed++] = (KdsProbed){(const uint8_t *)v->buf + r->hs, NULL, mask, 0};
    return 0;
}

/* Take the state and the buffers (seg None: the head's segment is not mapped yet, nothing fits);
 * 0, or -1 with an error set (kds_in_close releases what was taken). sbufs: wheel (tl_buf | None,
 * slot_buf, occ_send, occ_done, by_range: the buckets not fully linked yet); levels: a tuple of
 * each level's current queue file buffer (or None). opt: the nopt optional arguments after
 * sched_bufs (IN_OPT_*: idx_old_buf, idx_old2_buf, idx_jnl_buf, idx_tags_buf). */
int kds_in_open(InRun *r, PyObject *seg, PyObject *idx, PyObject *stl, PyObject *sbufs, PyObject *const *opt,
                   Py_ssize_t nopt) {
    r->have_seg = r->have_idx = r->have_old = r->have_old2 = r->have_jnl = r->have_tags = r->nbuf = 0;
    r->nprobed = 0;
    r->jbase = NULL;
    r->jlen = 0;
    PyObject *o[IN_OPT_COUNT] = {NULL, NULL, NULL, NULL};
    for (Py_ssize_t k = 0; k < nopt && k < IN_OPT_COUNT; k++) o[k] = opt[k];
    if (!PyTuple_Check(sbufs)) {
        PyErr_SetString(PyExc_TypeError, "intake: sched_bufs must be a tuple");
        return -1;
    }
    r->sbufs = sbufs;
    if ((r->nst = state_in(stl, r->st, r->st_in)) < 0) return -1;
    int64_t *st = r->st;
    r->kind = (int)st[IN_KIND];
    if (seg != Py_None) {
        if (PyObject_GetBuffer(seg, &r->segv, PyBUF_WRITABLE) < 0) return -1;
        r->have_seg = 1;
    }
    if (PyObject_GetBuffer(idx, &r->idxv, PyBUF_WRITABLE) < 0) return -1;
    r->have_idx = 1;
    Py_ssize_t nsb = PyTuple_GET_SIZE(sbufs);
    int kind = r->kind;
    if (nsb > IN_MAX_BUFS || (kind != IN_KIND_WHEEL && kind != IN_KIND_LEVELS) ||
        (kind == IN_KIND_WHEEL && (nsb != 5 || r->nst < IN_W_SIZE || !PyDict_Check(PyTuple_GET_ITEM(sbufs, 4)))) ||
        (kind == IN_KIND_LEVELS && (nsb != st[IN_L_COUNT] || r->nst < IN_L_BASE + IN_L_STRIDE * nsb))) {
        PyErr_SetString(PyExc_ValueError, "intake: scheduler buffers do not match the state");
        return -1;
    }
    for (; r->nbuf < nsb; r->nbuf++) {
        int k = r->nbuf;
        PyObject *b = PyTuple_GET_ITEM(sbufs, k);
        if (b == Py_None || (kind == IN_KIND_WHEEL && k == 4)) {
            r->bp[k] = NULL;
            r->blen[k] = 0;
            r->bufs[k].obj = NULL;
            continue;
        }
        if (PyObject_GetBuffer(b, &r->bufs[k], PyBUF_WRITABLE) < 0) return -1;
        r->bp[k] = (uint8_t *)r->bufs[k].buf;
        r->blen[k] = r->bufs[k].len;
    }
    r->hs = st[IN_HEADER_SIZE], r->sb = st[IN_SEG_BYTES];
    r->mask = (uint64_t)st[IN_IDX_MASK];
    if (r->hs < 0 || r->sb <= r->hs || (r->have_seg && r->segv.len < r->sb) || (r->mask & (r->mask + 1)) ||
        r->idxv.len < r->hs || (uint64_t)(r->idxv.len - r->hs) < (r->mask + 1) * 16) {
        PyErr_SetString(PyExc_ValueError, "intake: log or index buffer does not match the state");
        return -1;
    }
    r->ibase = (uint8_t *)r->idxv.buf + r->hs;
    if (in_probed(r, o[IN_OPT_OLD], IN_IDX_OLD_MASK, &r->oldv, &r->have_old) < 0 ||
        in_probed(r, o[IN_OPT_OLD2], IN_IDX_OLD2_MASK, &r->old2v, &r->have_old2) < 0)
        return -1;
    PyObject *tags = o[IN_OPT_TAGS];
    if (tags != NULL && tags != Py_None) {
        if (PyObject_GetBuffer(tags, &r->tagsv, PyBUF_SIMPLE) < 0) return -1;
        r->have_tags = 1;
        KdsProbed *last = r->nprobed ? &r->probed[r->nprobed - 1] : NULL;
        if (!last || (uint64_t)r->tagsv.len < last->mask + 1) {
            PyErr_SetString(PyExc_ValueError, "intake: the tags do not match the last probed table");
            return -1;
        }
        last->tags = (const uint8_t *)r->tagsv.buf;
        last->resident = st[IN_IDX_RESIDENT] == 1; /* the table is file-backed: its pages may be out */
    }
    PyObject *jnl = o[IN_OPT_JNL];
    if (jnl != NULL && jnl != Py_None && st[IN_IDX_JNL_AT] >= 0) {
        if (PyObject_GetBuffer(jnl, &r->jnlv, PyBUF_WRITABLE) < 0) return -1;
        r->have_jnl = 1;
        if (st[IN_IDX_JNL_AT] > r->jnlv.len) {
            PyErr_SetString(PyExc_ValueError, "intake: the journal buffer does not match the state");
            return -1;
        }
        r->jbase = (uint8_t *)r->jnlv.buf;
        r->jlen = r->jnlv.len;
    }
    return 0;
}

/* The segment offset a record of `length` bytes is appended at (the head's), or -1 if it does not
 * fit the rest of the head's segment (the reference rolls to a new one). */
long long kds_in_room(const InRun *r, uint64_t length) {
    long long head = r->st[IN_HEAD], soff = head % r->sb;
    if (!r->have_seg || head < 0 || soff < r->hs || length >= (1ULL << 31) || soff + (long long)length > r->sb)
        return -1;
    return soff;
}

/* The scheduler's plain append of an entry (due, level) for the record at log position `head`
 * (wheel: add -> _append_slot, or an already due record's _link to the late chain; levels: add),
 * every check before the first write: the new entry's ref, or -1 with nothing written (the
 * reference path's case). */
long long kds_in_sched_add(InRun *r, long long due, long long level, long long head) {
    int64_t *st = r->st;
    uint8_t **bp = r->bp;
    Py_ssize_t *blen = r->blen;
    const long long hs = r->hs;
    if (r->kind == IN_KIND_WHEEL) {
        if (due < WL_MIN_DUE || due > WL_MAX_DUE || level < 0 || level > 0xffff) return -1;
        long long P = st[IN_W_P], N = st[IN_W_N], kd = floordiv64(due, P), sk = st[IN_W_S_K], so = st[IN_W_S_O];
        if (kd < st[IN_W_LATE_BELOW] || kd < sk || (kd == sk && so >= 0 && so > due - kd * P)) {
            /* already due (its slot is behind the reader): a LATE entry at the tail of the late
               chain, as add -> _link(_LATE) does; the reference patches a tail in an older file */
            long long idx = st[IN_W_HEAD], pf = st[IN_W_PER_FILE], f0 = idx - idx % pf, lt = st[IN_W_LATE_TAIL];
            long long ths = hs + pf; /* the file's entries follow its state bytes */
            if (f0 != st[IN_W_F0] || !bp[0] || ths + (idx - f0 + 1) * WL_SIZE > blen[0]) return -1;
            if (lt != -1 && (lt < f0 || lt >= idx)) return -1;
            wl_entry(bp[0] + ths + (idx - f0) * WL_SIZE, due, head, WL_LATE, (int)level, idx);
            bp[0][hs + (idx - f0)] = WL_PENDING;
            if (st[IN_W_APP_LO] < 0) st[IN_W_APP_LO] = idx;
            st[IN_W_APP_HI] = idx + 1;
            if (lt == -1) {
                st[IN_W_LATE_HEAD] = idx;
            } else { /* TimerLog.set_next: patched and marked for flush whatever the range */
                long long moff_e = ths + (lt - f0) * WL_SIZE;
                wr64(bp[0] + moff_e + 16, idx);
                if (st[IN_W_MARK_LO] < 0 || moff_e < st[IN_W_MARK_LO]) st[IN_W_MARK_LO] = moff_e;
                if (moff_e + WL_SIZE > st[IN_W_MARK_HI]) st[IN_W_MARK_HI] = moff_e + WL_SIZE;
            }
            st[IN_W_LATE_TAIL] = idx;
            st[IN_W_HEAD] = idx + 1;
            return idx;
        }
        if (kd >= st[IN_W_GUARD] + N) return -1;
        PyObject *by_range = PyTuple_GET_ITEM(r->sbufs, 4);
        if (PyDict_GET_SIZE(by_range)) { /* its bucket is not fully linked yet: the reference joins it */
            long long w = st[IN_W_WIDTH], rem = due % w;
            if (rem < 0) rem += w;
            PyObject *bk = Py_BuildValue("(LL)", due - rem, w);
            int in = bk ? PyDict_Contains(by_range, bk) : -1;
            Py_XDECREF(bk);
            if (in != 0) {
                PyErr_Clear();
                return -1;
            }
        }
        long long idx = st[IN_W_HEAD], pf = st[IN_W_PER_FILE], f0 = idx - idx % pf, ths = hs + pf;
        if (f0 != st[IN_W_F0] || !bp[0] || ths + (idx - f0 + 1) * WL_SIZE > blen[0]) return -1;
        long long pos = kd % N;
        if (pos < 0) pos += N;
        long long soff = hs + pos * WL_SIZE, stime = kd * P, moff = due - stime;
        if (!bp[1] || soff + WL_SIZE > blen[1] || pos >= blen[2] || pos >= blen[3] || moff < 0 || moff > 0xFFFF)
            return -1;
        uint8_t *slot = bp[1] + soff;
        int64_t t = rd64(slot), last = rd64(slot + 16);
        uint32_t count = rd32(slot + 24);
        if (count == 0xFFFFFFFF) return -1;
        int linked = count && t == stime;
        if (linked && (last < f0 || last >= idx)) return -1; /* the old tail is in an older file */
        /* -- writes: timer log + slot ----------------------------------------------------------- */
        wl_entry(bp[0] + ths + (idx - f0) * WL_SIZE, due, head, 0, (int)level, idx);
        bp[0][hs + (idx - f0)] = WL_PENDING;
        long long lo = st[IN_W_APP_LO];
        if (lo < 0) st[IN_W_APP_LO] = lo = idx;
        st[IN_W_APP_HI] = idx + 1;
        if (linked) {
            wr64(bp[0] + ths + (last - f0) * WL_SIZE + 16, idx);
            wr64(slot + 16, idx);
            wr32(slot + 24, count + 1);
            if (moff < rd16(slot + 28)) wr16(slot + 28, (uint16_t)moff);
            wr16(slot + 30, 0);
            if (last < lo) { /* patched before this flush's appended range: flush msyncs it too */
                long long moff_e = ths + (last - f0) * WL_SIZE;
                if (st[IN_W_MARK_LO] < 0 || moff_e < st[IN_W_MARK_LO]) st[IN_W_MARK_LO] = moff_e;
                if (moff_e + WL_SIZE > st[IN_W_MARK_HI]) st[IN_W_MARK_HI] = moff_e + WL_SIZE;
            }
        } else {
            wr64(slot, stime);
            wr64(slot + 8, idx);
            wr64(slot + 16, idx);
            wr32(slot + 24, 1);
            wr16(slot + 28, (uint16_t)moff);
            wr16(slot + 30, 0);
            bp[2][pos] = 1;
            bp[3][pos] = 1;
            st[IN_W_NEW_CHAINS]++;
        }
        if (soff < st[IN_W_SLOT_DIRTY_LO] || st[IN_W_SLOT_DIRTY_LO] < 0) st[IN_W_SLOT_DIRTY_LO] = soff;
        if (soff + WL_SIZE > st[IN_W_SLOT_DIRTY_HI]) st[IN_W_SLOT_DIRTY_HI] = soff + WL_SIZE;
        st[IN_W_HEAD] = idx + 1;
        return idx;
    }
    if (level < 0 || level >= st[IN_L_COUNT]) return -1;
    int64_t *lv = st + IN_L_BASE + IN_L_STRIDE * level;
    long long idx = lv[IN_LV_WRITE], first = lv[IN_LV_FIRST], pf = st[IN_L_PER_FILE];
    if (first < 0 || idx < first || idx >= first + pf || !bp[level] || hs + (idx - first + 1) * LV_SIZE > blen[level])
        return -1;
    uint8_t *ent = bp[level] + hs + (idx - first) * LV_SIZE;
    wr64(ent, head);
    wr64(ent + 8, due);
    memset(ent + 16, 0, 8);
    if (lv[IN_LV_DIRTY_FROM] < 0 || idx < lv[IN_LV_DIRTY_FROM]) lv[IN_LV_DIRTY_FROM] = idx;
    if (idx + 1 > lv[IN_LV_DIRTY_TO]) lv[IN_LV_DIRTY_TO] = idx + 1;
    lv[IN_LV_WRITE] = idx + 1;
    return (level << 48) | idx;
}

/* After the record of `length` bytes is written at the head: the head moves, and (h, ref) goes
 * into id-index slot `at` (kds_idx_intake_slot's answer) with the counts IdIndex.put keeps, and
 * into the journal (kds_in_jnl_room said there is room) as a 16-byte record (u64 h, u64 ref). */
void kds_in_stored(InRun *r, uint64_t length, long long at, int tomb, uint64_t h, long long ref) {
    int64_t *st = r->st;
    st[IN_HEAD] += (long long)length;
    kds_idx_write(r->ibase, (uint64_t)at, h, (uint64_t)ref);
    if (r->jbase) {
        kds_idx_write(r->jbase + st[IN_IDX_JNL_AT], 0, h, (uint64_t)ref); /* the slot's layout */
        st[IN_IDX_JNL_AT] += 16;
    }
    if (tomb) st[IN_IDX_TOMBS]--;
    st[IN_IDX_LIVE]++;
}

/* Every run's call shape: (records: list, start: int, a: <its argument object>). */
int kds_in_args(PyObject *const *args, Py_ssize_t nargs, PyTypeObject *type, const char *call) {
    if (nargs != 3 || !PyList_Check(args[0]) || !PyLong_Check(args[1]) || !Py_IS_TYPE(args[2], type)) {
        PyErr_Format(PyExc_TypeError, "%s(records: list, start: int, a: %s)", call, type->tp_name);
        return -1;
    }
    return 0;
}

/* ingest_run(msgs, start, a: IngestRun) -> int: see above. a's fields (sidecar/store/native_args.py):
 * now, partition, id_prefix, checked_targets, no_headers, topic; seg_buf, idx_buf, st, sched_bufs and the
 * id index's buffers, those below None when it has none:
 *   idx_old_buf   a table probed for presence only (its mask st[IN_IDX_OLD_MASK]; the id index's
 *                 sealed stage, or its table): an id with an entry there is left to the reference
 *                 path, as one in idx_buf
 *   idx_old2_buf  a second table probed for presence only (its mask st[IN_IDX_OLD2_MASK]), the same
 *   idx_jnl_buf   a writable journal (used when st[IN_IDX_JNL_AT] >= 0): each (h, ref) inserted into
 *                 the index is appended at byte st[IN_IDX_JNL_AT] as 16 bytes (u64 h, u64 ref,
 *                 little-endian), which moves by 16.
 *   idx_tags_buf  the tag bytes of the table probed last (idx_old2_buf if given, else idx_old_buf;
 *                 kds_idx_tag): a slot of it is read only where its tag is the id's. With
 *                 st[IN_IDX_RESIDENT] 1, only where its page is in memory too: else the run stops
 *                 before the message, with the slot in st[IN_IDX_WAIT] (the caller has the page
 *                 read off the loop and calls again later).
 * Returns the index of the first message not stored (len(msgs) if all were): every message before
 * it is stored, indexed and journaled, nothing of it or after it. A record with no room left in
 * the journal (st[IN_IDX_JNL_AT] + 16 > len(idx_jnl_buf)) is not stored, like any record the loop
 * leaves to the reference path: the caller can tell it by the journal's room, and either runs it
 * through the reference path or calls again from it with room. */
static PyObject *native_ingest_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (kds_in_args(args, nargs, &kds_IngestRunType, "ingest_run") < 0) return NULL;
    if (in_names() < 0) return NULL;
    TopicMemo memo = {NULL, NULL};
    KdsIngestRun *a = (KdsIngestRun *)args[2];
    PyObject *msgs = args[0], *prefix = a->id_prefix, *checked = a->checked_targets, *no_headers = a->no_headers;
    PyObject *topic = a->topic;
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    long long now = kds_arg(a->now), partition = kds_arg(a->partition);
    if (PyErr_Occurred()) return NULL;
    if (!PyBytes_Check(prefix) || !PyBytes_Check(no_headers) || PyBytes_GET_SIZE(prefix) > 200 ||
        (topic != Py_None && !PyUnicode_CheckExact(topic))) {
        PyErr_SetString(PyExc_TypeError, "ingest_run: bad argument types");
        return NULL;
    }
    PyObject *port; /* records due on arrival published, not stored (direct.c); NULL: none */
    if (kds_direct_port(a->direct, &port) < 0) return NULL;
    InRun run;
    InRun *r = &run;
    PyObject *result = NULL;
    int failed = 0; /* an error set by the direct path: the state goes back, then NULL */
    Py_ssize_t i = start, n = PyList_GET_SIZE(msgs);
    if (KDS_IN_OPEN(r, a) < 0) goto fail;
    int64_t *st = r->st;
    const long long maxb = st[IN_MAX_RECORD_BYTES], maxd = st[IN_MAX_DELAY_MS];
    const int kind = r->kind;
    for (; i < n && r->have_seg; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        PyObject *err = NULL, *po = NULL, *tso = NULL, *offo = NULL, *key = NULL, *value = NULL, *headers = NULL;
        PyObject *blob = NULL;
        Request req;
        int ok = 0, parsed = 0;
        long long part, ts_type, ts, offset;
        /* -- every check, before the first write ---------------------------------------------- */
        if (!(err = in_call(m, M_ERROR)) || err != Py_None) goto next;
        if (!(po = in_call(m, M_PARTITION)) || !in_ll(po, &part) || part != partition) goto next;
        if (topic != Py_None) { /* several ingress topics: the same partition number of another one */
            PyObject *to = in_call(m, M_TOPIC);
            int same = to && PyUnicode_CheckExact(to) && PyUnicode_Compare(to, topic) == 0;
            Py_XDECREF(to);
            if (!same) goto next;
        }
        if (!(tso = in_call(m, M_TIMESTAMP)) || !PyTuple_Check(tso) || PyTuple_GET_SIZE(tso) != 2 ||
            !in_ll(PyTuple_GET_ITEM(tso, 0), &ts_type))
            goto next;
        if (ts_type) {
            if (!in_ll(PyTuple_GET_ITEM(tso, 1), &ts)) goto next;
        } else {
            ts = now;
        }
        if (!(offo = in_call(m, M_OFFSET)) || !in_ll(offo, &offset) || offset < 0) goto next;
        if (!(key = in_call(m, M_KEY)) || (key != Py_None && !PyBytes_CheckExact(key))) goto next;
        if (!(value = in_call(m, M_VALUE)) || (value != Py_None && !PyBytes_CheckExact(value))) goto next;
        if (!(headers = in_call(m, M_HEADERS))) goto next;
        long long size = (key == Py_None ? 0 : PyBytes_GET_SIZE(key)) + (value == Py_None ? 0 : PyBytes_GET_SIZE(value));
        int prc = kds_parse_core(headers, ts, now, size, maxb, maxd, checked, &memo, 1, &req);
        if (prc < 0) PyErr_Clear();
        if (prc <= 0) goto next;
        parsed = 1;
        PyObject *mode = req.mode, *user = req.user;
        long long tpart = req.partition, due = req.due;
        Py_ssize_t tlen;
        const char *tname = PyUnicode_AsUTF8AndSize(req.topic, &tlen);
        if (!tname || tlen > 0xffff) {
            PyErr_Clear();
            goto next;
        }
        char ridbuf[256 + 32];
        const char *rid;
        Py_ssize_t rlen;
        if (req.rid && PyBytes_GET_SIZE(req.rid) > 0) {
            rid = PyBytes_AS_STRING(req.rid);
            rlen = PyBytes_GET_SIZE(req.rid);
        } else { /* the default delay.id: <topic>:<partition>:<offset> */
            rlen = PyBytes_GET_SIZE(prefix);
            memcpy(ridbuf, PyBytes_AS_STRING(prefix), rlen);
            rlen += kds_fmt_ll(ridbuf + rlen, offset);
            rid = ridbuf;
        }
        uint64_t h = kds_id_hash((const uint8_t *)rid, rlen);
        /* id index: no entry under h (else the duplicate / pre-cancel checks), no growth due */
        int tomb = 0;
        long long wait = -1;
        long long at = kds_idx_intake_slot(r->ibase, r->mask, st[IN_IDX_LIVE], st[IN_IDX_TOMBS], h, &tomb, r->probed,
                                           r->nprobed, &wait);
        if (at == -2) st[IN_IDX_WAIT] = wait; /* its page is not in memory: the caller has it read */
        if (at < 0 || !kds_in_jnl_room(r)) goto next;
        if (port) { /* its id in flight from the intake: the reference path decides (a duplicate...) */
            int flying = kds_direct_flying(port, h);
            if (flying) {
                failed = flying < 0;
                goto next;
            }
        }
        /* plan */
        long long level = 0;
        if (kind == IN_KIND_WHEEL) {
            if (due < WL_MIN_DUE || due > WL_MAX_DUE) goto next;
        } else if (mode != kds_MODE_NOW) {
            long long delay = due - ts, nl = st[IN_L_COUNT] - 1;
            if (delay > 0) {
                long long lo = 0, hi = nl; /* bisect_left over levels_ms */
                while (lo < hi) {
                    long long mid = (lo + hi) / 2;
                    if (st[IN_L_BASE + IN_L_STRIDE * (mid + 1) + IN_LV_DELAY_MS] < delay)
                        lo = mid + 1;
                    else
                        hi = mid;
                }
                if (lo >= nl) goto next; /* beyond the last level: rejected by the reference path */
                level = lo + 1;
                due = ts + st[IN_L_BASE + IN_L_STRIDE * level + IN_LV_DELAY_MS];
            }
        }
        /* the record: fits the rest of the current segment. A recurring one (req.spec) is stored
         * at its first firing with the user's headers and then its schedule's (firings.py arm). */
        if (req.spec) {
            PyObject *all = PySequence_Concat(user, req.spec);
            blob = all ? kds_encode_headers(NULL, all) : NULL;
            Py_XDECREF(all);
            if (!blob) {
                PyErr_Clear();
                goto next;
            }
        } else if (PyTuple_GET_SIZE(user)) {
            if (!(blob = kds_encode_headers(NULL, user))) {
                PyErr_Clear();
                goto next;
            }
        } else {
            blob = Py_NewRef(no_headers);
        }
        Field fs[5];
        memset(fs, 0, sizeof fs);
        fs[0].view.buf = (void *)rid, fs[0].view.len = rlen;
        fs[1].view.buf = (void *)tname, fs[1].view.len = tlen;
        if (key == Py_None) fs[2].null = 1;
        else fs[2].view.buf = PyBytes_AS_STRING(key), fs[2].view.len = PyBytes_GET_SIZE(key);
        if (value == Py_None) fs[3].null = 1;
        else fs[3].view.buf = PyBytes_AS_STRING(value), fs[3].view.len = PyBytes_GET_SIZE(value);
        fs[4].view.buf = PyBytes_AS_STRING(blob), fs[4].view.len = PyBytes_GET_SIZE(blob);
        if (fs[2].view.len > 0xffffffffLL || fs[3].view.len > 0xffffffffLL || fs[4].view.len > 0xffffffffLL) goto next;
        uint64_t body = (uint64_t)HEAD_SIZE - 8;
        for (int k = 0; k < 5; k++) body += (uint64_t)fs[k].view.len;
        uint64_t length = (8 + body + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
        if (tpart < INT32_MIN || tpart > INT32_MAX) goto next;
        if (port && !req.spec && due <= now) { /* due on arrival: published now, not stored (direct.c) */
            int ready = kds_direct_ready(port);
            PyObject *ridobj = NULL, *raw = NULL;
            if (ready > 0) {
                ridobj = req.rid && PyBytes_GET_SIZE(req.rid) > 0 ? Py_NewRef(req.rid)
                                                                  : PyBytes_FromStringAndSize(rid, rlen);
                if (ridobj && kds_direct_holds(port) && (raw = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)length)))
                    kds_write_record((uint8_t *)PyBytes_AS_STRING(raw), (uint32_t)length, (uint32_t)body, REC_MESSAGE,
                                     due, ts, offset, (int32_t)partition, (int32_t)tpart, 0, (int)level, fs);
                if (!ridobj || (kds_direct_holds(port) && !raw))
                    ready = -1;
                else
                    ready = kds_direct_publish(port, m, ridobj, h, offset, due, ts, req.topic, tpart, key, value, user,
                                               raw);
            }
            Py_XDECREF(ridobj);
            Py_XDECREF(raw);
            if (ready < 0) {
                failed = 1;
                goto next;
            }
            if (ready) {
                st[IN_NEXT_OFFSET] = offset + 1;
                ok = 1;
                goto next;
            }
        }
        long long head = st[IN_HEAD], soff_log = kds_in_room(r, length);
        if (soff_log < 0) goto next;
        /* the scheduler's plain append, then the record */
        long long ref = kds_in_sched_add(r, due, level, head);
        if (ref < 0) goto next;
        kds_write_record((uint8_t *)r->segv.buf + soff_log, (uint32_t)length, (uint32_t)body,
                         req.spec ? REC_RECURRING : REC_MESSAGE, due, ts, offset,
                         (int32_t)partition, (int32_t)tpart, 0, (int)level, fs);
        kds_in_stored(r, length, at, tomb, h, ref);
        st[IN_NEXT_OFFSET] = offset + 1;
        ok = 1;
    next:
        Py_XDECREF(err);
        Py_XDECREF(po);
        Py_XDECREF(tso);
        Py_XDECREF(offo);
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(headers);
        if (parsed) {
            Py_DECREF(req.topic);
            Py_DECREF(req.user);
            Py_XDECREF(req.spec);
        }
        Py_XDECREF(blob);
        if (!ok) break;
    }
    if (port && kds_direct_sync(port) < 0) failed = 1;
    if (failed) { /* the records before it are stored or published: their state goes back first */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (kds_in_state_out(a->st, r->st, r->st_in, r->nst) < 0) PyErr_Clear();
        PyErr_Restore(et, ev, tb);
    } else if (kds_in_state_out(a->st, r->st, r->st_in, r->nst) == 0) {
        result = PyLong_FromSsize_t(i);
    }
fail:
    Py_XDECREF(memo.bytes);
    Py_XDECREF(memo.str);
    kds_in_close(r);
    return result;
}

/* The changelog value v (n bytes) if it is a record restore_put stores as it is, in the canonical
 * form codec.encode writes (so its bytes are what restore_put's re-encoding appends): exactly one
 * whole record (bounds, version, a MESSAGE or a DEAD, fields adding up, no flag but the null
 * ones, null fields empty, reserved 0, CRC32C, zero padding) whose id is `key`. 1 if so, else 0. */
static int in_changelog_record(const uint8_t *v, Py_ssize_t n, const char *key, Py_ssize_t klen) {
    if (n < HEAD_SIZE) return 0;
    uint32_t length = rd32(v), crc = rd32(v + 4), body = rd32(v + 12);
    int rtype = v[8], version = v[9], flags = rd16(v + 10);
    if ((Py_ssize_t)length != n || length % ALIGN || (uint64_t)body + 8 > length ||
        (uint64_t)body + 8 + ALIGN <= length || version != VERSION || (rtype != REC_MESSAGE && rtype != REC_DEAD) || (flags & ~3))
        return 0;
    uint64_t id_len = rd16(v + 52), topic_len = rd16(v + 54), key_len = rd32(v + 56), value_len = rd32(v + 60);
    uint64_t headers_len = rd32(v + 64);
    if (((flags & FLAG_KEY_NULL) && key_len) || ((flags & FLAG_VALUE_NULL) && value_len) || rd32(v + 68)) return 0;
    if ((uint64_t)HEAD_SIZE - 8 + id_len + topic_len + key_len + value_len + headers_len != body) return 0;
    if ((Py_ssize_t)id_len != klen || memcmp(v + HEAD_SIZE, key, (size_t)klen)) return 0;
    for (uint32_t k = 8 + body; k < length; k++)
        if (v[k]) return 0;
    return kds_crc32c(v + 8, body) == crc;
}

/* restore_run(msgs, start, a: RestoreRun) -> int (a's fields: partition, end, and ingest_run's buffers): the restore's
 * fast path (sidecar/store/restore.py, Restore.many; the reference is
 * Restore.put, per changelog record). From msgs[start] on, each consumed changelog message is
 * stored while it is a put restore_put would append as it is: no error, this partition, offset
 * below `end` (-1: no end, a standby), bytes key and value, the value a record
 * (in_changelog_record) of the key's id, no id-index entry under the id's hash (nothing pending,
 * no pre-cancel; in none of the tables given) and no index growth due, room in the journal (if
 * one is given) and in the head's segment, the scheduler's plain append at the record's own due
 * time and level. The value's bytes are appended as they are, each insert is journaled. The
 * optional buffers are ingest_run's, with the same meaning and the same stop contract. Returns
 * the index of the first message not stored (a tombstone, a CANCEL, an id already known, a full
 * journal, ...): the caller runs it through the reference path (or, for a full journal, may call
 * again with room). st's NEXT_OFFSET takes the changelog offset after the last message stored,
 * RESTORED_BYTES and MAX_SRC_OFFSET what the caller reports. */
static PyObject *native_restore_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (kds_in_args(args, nargs, &kds_RestoreRunType, "restore_run") < 0) return NULL;
    if (in_names() < 0) return NULL;
    KdsRestoreRun *a = (KdsRestoreRun *)args[2];
    PyObject *msgs = args[0];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    long long partition = kds_arg(a->partition), end = kds_arg(a->end);
    if (PyErr_Occurred()) return NULL;
    InRun run;
    InRun *r = &run;
    PyObject *result = NULL;
    Py_ssize_t i = start, n = PyList_GET_SIZE(msgs);
    if (KDS_IN_OPEN(r, a) < 0) goto fail;
    int64_t *st = r->st;
    for (; i < n && r->have_seg; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        PyObject *err = NULL, *po = NULL, *offo = NULL, *key = NULL, *value = NULL;
        int ok = 0;
        long long part, offset;
        /* -- every check, before the first write ---------------------------------------------- */
        if (!(err = in_call(m, M_ERROR)) || err != Py_None) goto next;
        if (!(po = in_call(m, M_PARTITION)) || !in_ll(po, &part) || part != partition) goto next;
        if (!(offo = in_call(m, M_OFFSET)) || !in_ll(offo, &offset) || offset < 0 || (end >= 0 && offset >= end))
            goto next;
        if (!(key = in_call(m, M_KEY)) || !PyBytes_CheckExact(key)) goto next;
        if (!(value = in_call(m, M_VALUE)) || !PyBytes_CheckExact(value)) goto next;
        const uint8_t *v = (const uint8_t *)PyBytes_AS_STRING(value);
        Py_ssize_t vlen = PyBytes_GET_SIZE(value), klen = PyBytes_GET_SIZE(key);
        if (!in_changelog_record(v, vlen, PyBytes_AS_STRING(key), klen)) goto next;
        uint64_t h = kds_id_hash((const uint8_t *)PyBytes_AS_STRING(key), (size_t)klen);
        int tomb = 0;
        long long wait = -1;
        long long at = kds_idx_intake_slot(r->ibase, r->mask, st[IN_IDX_LIVE], st[IN_IDX_TOMBS], h, &tomb, r->probed,
                                           r->nprobed, &wait); /* never -2: restore_many probes without resident */
        if (at < 0 || !kds_in_jnl_room(r)) goto next;
        long long head = st[IN_HEAD], soff_log = kds_in_room(r, (uint64_t)vlen);
        if (soff_log < 0) goto next;
        long long ref = kds_in_sched_add(r, rd64(v + 16), rd16(v + 50), head);
        if (ref < 0) goto next;
        memcpy((uint8_t *)r->segv.buf + soff_log, v, (size_t)vlen);
        kds_in_stored(r, (uint64_t)vlen, at, tomb, h, ref);
        st[IN_NEXT_OFFSET] = offset + 1;
        st[IN_RESTORED_BYTES] += vlen;
        long long src = rd64(v + 32);
        if (src > st[IN_MAX_SRC_OFFSET]) st[IN_MAX_SRC_OFFSET] = src;
        ok = 1;
    next:
        Py_XDECREF(err);
        Py_XDECREF(po);
        Py_XDECREF(offo);
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (!ok) break;
    }
    if (kds_in_state_out(a->st, r->st, r->st_in, r->nst) == 0) result = PyLong_FromSsize_t(i);
fail:
    kds_in_close(r);
    return result;
}

PyMethodDef kds_intake_methods[] = {
    {"ingest_run", (PyCFunction)(void (*)(void))native_ingest_run, METH_FASTCALL, NULL},
    {"restore_run", (PyCFunction)(void (*)(void))native_restore_run, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}};
