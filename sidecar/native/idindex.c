/* sidecar._native, id index core (sidecar/store/idprobe.py, the reference): 16-byte slots
 * (u64 hash, u64 ref) after a header, linear probing; the hash is kds_id_hash (BLAKE2b-64). The
 * Python side keeps the counts and decides growth; the functions here probe and write slots, for
 * the IdIndex methods (a table's copy and the pre-cancel sweep included) and for the intake
 * fast path (kds_idx_intake_slot, kds_idx_write). */
#include "native.h"

#include <sys/mman.h>
#include <unistd.h>


static PyObject *native_id_hash(PyObject *self, PyObject *rid) {
    Py_buffer view;
    if (PyObject_GetBuffer(rid, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint64_t h = kds_id_hash((const uint8_t *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(h);
}

typedef struct {
    Py_buffer view;
    uint8_t *base; /* first slot */
    uint64_t mask, h;
} Table;

/* (buf, header_size, mask, h, ...): the table and the hash */
static int table_get(PyObject *const *args, Table *t, int writable) {
    Py_ssize_t hs = PyLong_AsSsize_t(args[1]);
    t->mask = PyLong_AsUnsignedLongLong(args[2]);
    t->h = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred()) return -1;
    if (PyObject_GetBuffer(args[0], &t->view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) return -1;
    if (hs < 0 || (t->mask & (t->mask + 1)) || t->view.len < hs || (uint64_t)(t->view.len - hs) < (t->mask + 1) * IDX_SLOT_SIZE) {
        PyBuffer_Release(&t->view);
        PyErr_SetString(PyExc_ValueError, "id index: buffer does not hold the table");
        return -1;
    }
    t->base = (uint8_t *)t->view.buf + hs;
    return 0;
}

static inline uint64_t slot_hash(Table *t, uint64_t i) {
    uint64_t v;
    memcpy(&v, t->base + i * IDX_SLOT_SIZE, 8);
    return v;
}
static inline uint64_t slot_ref(Table *t, uint64_t i) {
    uint64_t v;
    memcpy(&v, t->base + i * IDX_SLOT_SIZE + 8, 8);
    return v;
}

/* The table's tags (one byte a slot, kds_idx_tag) from obj into *tv; NULL (the table released,
 * an exception set) if obj has no buffer or too few bytes for the table's slots. */
static const uint8_t *tags_get(PyObject *obj, Table *t, Py_buffer *tv, const char *fn) {
    if (PyObject_GetBuffer(obj, tv, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&t->view);
        return NULL;
    }
    if ((uint64_t)tv->len < t->mask + 1) {
        PyBuffer_Release(tv);
        PyBuffer_Release(&t->view);
        PyErr_Format(PyExc_ValueError, "%s: the tags hold fewer bytes than the table slots", fn);
        return NULL;
    }
    return tv->buf;
}

/* idx_find(buf, header_size, mask, h[, tags]) -> list[int]: every ref stored under h. tags: the
 * table's tag bytes (one per slot, kds_idx_tag), or None: a slot is read only where its tag is h's. */
static PyObject *native_idx_find(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "idx_find(buf, header_size, mask, h[, tags])");
        return NULL;
    }
    Table t;
    if (table_get(args, &t, 0) < 0) return NULL;
    Py_buffer tv = {0};
    const uint8_t *tags = NULL;
    if (nargs == 5 && args[4] != Py_None && !(tags = tags_get(args[4], &t, &tv, "idx_find"))) return NULL;
    const uint8_t want = kds_idx_tag(t.h);
    PyObject *out = PyList_New(0);
    for (uint64_t i = t.h & t.mask, n = 0; out && n <= t.mask; i = (i + 1) & t.mask, n++) {
        if (tags) {
            if (tags[i] == IDX_EMPTY) break;
            if (tags[i] != want) continue;
        }
        uint64_t sh = slot_hash(&t, i);
        if (sh == IDX_EMPTY && !tags) break;
        if (sh == t.h) {
            PyObject *ref = PyLong_FromUnsignedLongLong(slot_ref(&t, i));
            if (!ref || PyList_Append(out, ref) < 0) Py_CLEAR(out);
            Py_XDECREF(ref);
        }
    }
    if (tags) PyBuffer_Release(&tv);
    PyBuffer_Release(&t.view);
    return out;
}

/* idx_put(buf, header_size, mask, h, ref) -> int: 0 if (h, ref) is already there (nothing
 * written); else the byte offset of the slot written, negated if it was a tombstone. The caller
 * keeps the counts (and has made room: the table is never full). */
static PyObject *native_idx_put(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "idx_put(buf, header_size, mask, h, ref)");
        return NULL;
    }
    uint64_t ref = PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    Table t;
    if (table_get(args, &t, 1) < 0) return NULL;
    int64_t free_slot = -1;
    uint64_t i = t.h & t.mask, n = 0;
    for (; n <= t.mask; i = (i + 1) & t.mask, n++) {
        uint64_t sh = slot_hash(&t, i);
        if (sh == IDX_EMPTY) break;
        if (sh == t.h && slot_ref(&t, i) == ref) {
            PyBuffer_Release(&t.view);
            return PyLong_FromLong(0);
        }
        if (sh == IDX_TOMB && free_slot < 0) free_slot = (int64_t)i;
    }
    if (n > t.mask && free_slot < 0) {
        PyBuffer_Release(&t.view);
        PyErr_SetString(PyExc_RuntimeError, "id index is full");
        return NULL;
    }
    uint64_t at = free_slot >= 0 ? (uint64_t)free_slot : i;
    memcpy(t.base + at * IDX_SLOT_SIZE, &t.h, 8);
    memcpy(t.base + at * IDX_SLOT_SIZE + 8, &ref, 8);
    long long off = (long long)(t.base - (uint8_t *)t.view.buf) + (long long)at * IDX_SLOT_SIZE;
    PyBuffer_Release(&t.view);
    return PyLong_FromLongLong(free_slot >= 0 ? -off : off);
}

/* Remove (h, ref) from the table: 1 if found (its byte offset and the tombstone delta set); 0 if
 * not, -1 if not and the probe went round the table without meeting an empty slot. */
static int table_remove(Table *t, uint64_t h, uint64_t ref, long long *off_out, long long *tombs_out) {
    long long hs = (long long)(t->base - (uint8_t *)t->view.buf);
    for (uint64_t i = h & t->mask, n = 0; n <= t->mask; i = (i + 1) & t->mask, n++) {
        uint64_t sh = slot_hash(t, i);
        if (sh == IDX_EMPTY) return 0;
        if (sh != h || slot_ref(t, i) != ref) continue;
        long long tombs = 0;
        uint64_t v;
        if (slot_hash(t, (i + 1) & t->mask) != IDX_EMPTY) {
            v = IDX_TOMB;
            memcpy(t->base + i * IDX_SLOT_SIZE, &v, 8);
            tombs = 1;
        } else {
            v = IDX_EMPTY;
            memcpy(t->base + i * IDX_SLOT_SIZE, &v, 8);
            for (uint64_t j = (i - 1) & t->mask; slot_hash(t, j) == IDX_TOMB; j = (j - 1) & t->mask) {
                memcpy(t->base + j * IDX_SLOT_SIZE, &v, 8);
                tombs -= 1;
            }
        }
        *off_out = hs + (long long)i * IDX_SLOT_SIZE;
        *tombs_out = tombs;
        return 1;
    }
    return -1; /* round the table: no empty slot ends the chain */
}

/* idx_remove(buf, header_size, mask, h, ref) -> None | (off, tombs): remove (h, ref). The slot
 * becomes a tombstone, or empty when the probe chain ends right after it, and then the tombstones
 * just before it are emptied too (idindex.py explains why). Returns the removed slot's byte offset
 * and the change in the tombstone count. */
static PyObject *native_idx_remove(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "idx_remove(buf, header_size, mask, h, ref)");
        return NULL;
    }
    uint64_t ref = PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    Table t;
    if (table_get(args, &t, 1) < 0) return NULL;
    long long off, tombs;
    int found = table_remove(&t, t.h, ref, &off, &tombs);
    PyBuffer_Release(&t.view);
    if (found <= 0) Py_RETURN_NONE;
    return Py_BuildValue("(LL)", off, tombs);
}

/* idx_remove_delivered(buf, header_size, mask, pairs) -> (removed, tombs, journal): remove
 * (id_hash(rec.id), ref) for every (ref, rec) of a settled batch, in order; return how many were
 * found, the change in the tombstone count, and the journal's records of those removes: for each
 * pair the marker (IDX_TOMB, 0) then (h, ref), 32 bytes little-endian (kds_jnl_read), found or
 * not (a replay applies what the live table did). Each id is hashed once for both: BLAKE2b is
 * most of this work, and hashing it again for the journal in a second call doubled it. */
static PyObject *native_idx_remove_delivered(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "idx_remove_delivered(buf, header_size, mask, pairs: list)");
        return NULL;
    }
    PyObject *targs[4] = {args[0], args[1], args[2], args[1]}; /* h is per pair: any int here */
    Table t;
    if (table_get(targs, &t, 1) < 0) return NULL;
    PyObject *pairs = args[3];
    Py_ssize_t n = PyList_GET_SIZE(pairs);
    PyObject *journal = PyBytes_FromStringAndSize(NULL, n * 32);
    if (!journal) goto fail;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(journal);
    const uint64_t mark = IDX_TOMB, zero = 0;
    long long removed = 0, tombs = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *pair = PyList_GET_ITEM(pairs, k);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyObject_TypeCheck(PyTuple_GET_ITEM(pair, 1), &kds_RecordType)) {
            PyErr_SetString(PyExc_TypeError, "pairs must be (ref, Record) tuples");
            goto fail;
        }
        uint64_t ref = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(pair, 0));
        if (PyErr_Occurred()) goto fail;
        PyObject *rid = ((RecordObject *)PyTuple_GET_ITEM(pair, 1))->id;
        uint64_t h = kds_id_hash((const uint8_t *)PyBytes_AS_STRING(rid), PyBytes_GET_SIZE(rid));
        long long off, dt;
        if (table_remove(&t, h, ref, &off, &dt) > 0) {
            removed++;
            tombs += dt;
        }
        memcpy(p + k * 32, &mark, 8);
        memcpy(p + k * 32 + 8, &zero, 8);
        memcpy(p + k * 32 + 16, &h, 8);
        memcpy(p + k * 32 + 24, &ref, 8);
    }
    PyBuffer_Release(&t.view);
    return Py_BuildValue("(LLN)", removed, tombs, journal);
fail:
    Py_XDECREF(journal);
    PyBuffer_Release(&t.view);
    return NULL;
}

/* Insert (h, ref) into the table at base (mask) unless it is there: 0 if it was, else the slot's
 * byte offset from the file's start (base - hs), negated for a reused tombstone (*full set,
 * nothing written, if no slot is free: the caller keeps the table at most half full; with
 * need_empty, also when the probe went round the table without meeting an empty slot). */
static long long raw_put(uint8_t *base, uint64_t mask, long long hs, uint64_t h, uint64_t ref, int need_empty,
                         int *full) {
    int64_t free_slot = -1;
    uint64_t i = h & mask, n = 0, sh, sr;
    *full = 0;
    for (; n <= mask; i = (i + 1) & mask, n++) {
        memcpy(&sh, base + i * IDX_SLOT_SIZE, 8);
        if (sh == IDX_EMPTY) break;
        if (sh == h) {
            memcpy(&sr, base + i * IDX_SLOT_SIZE + 8, 8);
            if (sr == ref) return 0;
        }
        if (sh == IDX_TOMB && free_slot < 0) free_slot = (int64_t)i;
    }
    if (n > mask && (free_slot < 0 || need_empty)) {
        *full = 1;
        return 0;
    }
    uint64_t at = free_slot >= 0 ? (uint64_t)free_slot : i;
    memcpy(base + at * IDX_SLOT_SIZE, &h, 8);
    memcpy(base + at * IDX_SLOT_SIZE + 8, &ref, 8);
    long long off = hs + (long long)at * IDX_SLOT_SIZE;
    return free_slot >= 0 ? -off : off;
}

/* a copy into a larger table (idx_copy): the live slots lo <= k < hi of the old table at old into
 * the table at base (mask; hs: its header size) unless there already; out: live slots seen,
 * inserted, tombstones reused (idprobe.py's py_copy). -1: the table is full */
static int copy_range(const uint8_t *old, uint8_t *base, uint64_t mask, long long hs, long long lo, long long hi,
                      long long out[3]) {
    long long seen = 0, inserted = 0, reused = 0;
    for (long long k = lo; k < hi; k++) {
        uint64_t h, r;
        memcpy(&h, old + k * IDX_SLOT_SIZE, 8);
        if (h <= IDX_TOMB) continue;
        memcpy(&r, old + k * IDX_SLOT_SIZE + 8, 8);
        seen++;
        int full;
        long long off = raw_put(base, mask, hs, h, r, 0, &full);
        if (full) return -1;
        if (off == 0) continue;
        inserted++;
        reused += off < 0;
    }
    out[0] = seen;
    out[1] = inserted;
    out[2] = reused;
    return 0;
}

/* idx_copy(old_buf, new_buf, header_size, lo, hi, new_mask) -> (seen, inserted, reused): a copy
 * into a larger table (idindex.py: a stage's growth, the format-2 upgrade's migration): insert the
 * live slots lo <= k < hi of the old table into the new one unless there already; return the live
 * slots seen, how many were inserted, and how many of those reused a tombstone. */
static PyObject *native_idx_copy(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "idx_copy(old_buf, new_buf, header_size, lo, hi, new_mask)");
        return NULL;
    }
    Py_ssize_t hs = PyLong_AsSsize_t(args[2]);
    long long lo = PyLong_AsLongLong(args[3]), hi = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    PyObject *targs[4] = {args[1], args[2], args[5], args[2]}; /* the new table; h unused */
    Table t;
    if (table_get(targs, &t, 1) < 0) return NULL;
    Py_buffer ov;
    if (PyObject_GetBuffer(args[0], &ov, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&t.view);
        return NULL;
    }
    PyObject *out = NULL;
    long long d[3];
    if (hs < 0 || lo < 0 || hi < lo || (long long)(ov.len - hs) < hi * IDX_SLOT_SIZE) {
        PyErr_SetString(PyExc_ValueError, "id index: the old buffer does not hold the slots");
    } else if (copy_range((const uint8_t *)ov.buf + hs, t.base, t.mask, hs, lo, hi, d) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "id index: the new table is full");
    } else {
        out = Py_BuildValue("(LLL)", d[0], d[1], d[2]);
    }
    PyBuffer_Release(&ov);
    PyBuffer_Release(&t.view);
    return out;
}

/* idx_expired(buf, header_size, lo, hi, cutoff) -> list[(h, ref)]: the pre-cancels among slots
 * lo <= k < hi whose time is before cutoff (ms): the sweep of expired pre-cancels. */
static PyObject *native_idx_expired(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "idx_expired(buf, header_size, lo, hi, cutoff)");
        return NULL;
    }
    Py_ssize_t hs = PyLong_AsSsize_t(args[1]);
    long long lo = PyLong_AsLongLong(args[2]), hi = PyLong_AsLongLong(args[3]), cutoff = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer v;
    if (PyObject_GetBuffer(args[0], &v, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *out = NULL;
    if (hs < 0 || lo < 0 || hi < lo || (long long)(v.len - hs) < hi * IDX_SLOT_SIZE) {
        PyErr_SetString(PyExc_ValueError, "id index: buffer does not hold the slots");
        goto done;
    }
    const uint8_t *base = (const uint8_t *)v.buf + hs;
    out = PyList_New(0);
    for (long long k = lo; out && k < hi; k++) {
        uint64_t h, r;
        memcpy(&h, base + k * IDX_SLOT_SIZE, 8);
        if (h <= IDX_TOMB) continue;
        memcpy(&r, base + k * IDX_SLOT_SIZE + 8, 8);
        if (!(r >> 63) || (long long)(r & ~(1ULL << 63)) >= cutoff) continue;
        PyObject *pair = Py_BuildValue("(KK)", (unsigned long long)h, (unsigned long long)r);
        if (!pair || PyList_Append(out, pair) < 0) Py_CLEAR(out);
        Py_XDECREF(pair);
    }
done:
    PyBuffer_Release(&v);
    return out;
}

/* idx_apply(buf, header_size, mask, records) -> (live, tombs): a journal's operations
 * (kds_jnl_read, native.h) applied in order to the table in buf, as the IdIndex calls would: an
 * insert is idx_put's (nothing if the pair is there), a remove idx_remove's (nothing if absent),
 * each writing the slots that call writes. Returns the change in live and in tombstone slots. It
 * loads a journal into an in-memory stage at recovery. Refused before any write (ValueError):
 * records not a whole number of 16-byte records or malformed, a buffer that does not hold the
 * table. An operation whose probe goes round the table without meeting an empty slot (the Python
 * probes would never end) raises RuntimeError, nothing written for it: the ones before it stay
 * applied. */
static PyObject *native_idx_apply(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "idx_apply(buf, header_size, mask, records)");
        return NULL;
    }
    PyObject *targs[4] = {args[0], args[1], args[2], args[2]}; /* h is per record: the mask, converted anyway */
    Table t;
    if (table_get(targs, &t, 1) < 0) return NULL;
    Py_buffer rv;
    if (PyObject_GetBuffer(args[3], &rv, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&t.view);
        return NULL;
    }
    const uint8_t *rec = (const uint8_t *)rv.buf;
    uint64_t n = (uint64_t)rv.len / IDX_SLOT_SIZE, k = 0, bad = 0;
    PyObject *out = NULL;
    long long live = 0, tombs = 0;
    if (rv.len % IDX_SLOT_SIZE) {
        PyErr_SetString(PyExc_ValueError, "idx_apply: records are 16-byte (hash, ref) pairs");
        goto done;
    }
    if (kds_jnl_check(rec, n, &bad) < 0) { /* every record checked before the first write */
        PyErr_Format(PyExc_ValueError, "idx_apply: record %llu is malformed (a hash below 2 outside a remove's "
                     "marker, or a marker with a ref or without its pair)", (unsigned long long)bad);
        goto done;
    }
    while (k < n) {
        uint64_t h = 0, ref = 0;
        int remove = 0;
        uint64_t at = k;
        k += (uint64_t)kds_jnl_read(rec, n, k, &h, &ref, &remove);
        if (remove) {
            long long off, dt;
            int found = table_remove(&t, h, ref, &off, &dt);
            if (found < 0) goto no_empty;
            if (found) {
                live--;
                tombs += dt;
            }
        } else {
            int full;
            /* only zero (present) and the sign (a tombstone) are used: an offset from 1, never 0
               (one from the header would be 0 for slot 0 of a header-less table) */
            long long off = raw_put(t.base, t.mask, 1, h, ref, 1, &full);
            if (full) goto no_empty;
            if (off) {
                live++;
                tombs -= off < 0;
            }
        }
        continue;
    no_empty:
        PyErr_Format(PyExc_RuntimeError, "idx_apply: record %llu: the table has no empty slot on its probe",
                     (unsigned long long)at);
        goto done;
    }
    out = Py_BuildValue("(LL)", live, tombs);
done:
    PyBuffer_Release(&rv);
    PyBuffer_Release(&t.view);
    return out;
}

/* Is the page holding p in memory? (mincore: the page cache's answer for a file mapping, one
 * system call, ~1 us.) A page the kernel evicted would make the reader wait for the disk: 50-135 ms
 * on the loop at 100M pending on six partitions behind the passes' writeback (the scale bench
 * scenario). An error
 * counts as resident: the read then happens as before. */
static int page_resident(const uint8_t *p) {
    static long page = 0;
    if (!page) page = sysconf(_SC_PAGESIZE);
    unsigned char vec = 1;
    void *at = (void *)((uintptr_t)p & ~(uintptr_t)(page - 1));
    if (mincore(at, (size_t)page, &vec) < 0) return 1;
    return vec & 1;
}

/* idx_wait(buf, header_size, mask, h, tags) -> int: the first slot idx_find(..., h, tags) would
 * read whose page is not in memory, or -1. The loop's reference path asks before a cancel's look-up
 * (PartitionStore.ingest_fields), which the C intake never takes: read on the loop, such a page is
 * a wait for the disk (the slowest turns of the 100M scale bench scenario). Only the tags are read here. */
static PyObject *native_idx_wait(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "idx_wait(buf, header_size, mask, h, tags)");
        return NULL;
    }
    Table t;
    if (table_get(args, &t, 0) < 0) return NULL;
    Py_buffer tv;
    const uint8_t *tags = tags_get(args[4], &t, &tv, "idx_wait"), want = kds_idx_tag(t.h);
    if (!tags) return NULL;
    long long wait = -1;
    for (uint64_t i = t.h & t.mask, n = 0; n <= t.mask; i = (i + 1) & t.mask, n++) {
        if (tags[i] == IDX_EMPTY) break;
        if (tags[i] == want && !page_resident(t.base + i * IDX_SLOT_SIZE)) {
            wait = (long long)i;
            break;
        }
    }
    PyBuffer_Release(&tv);
    PyBuffer_Release(&t.view);
    return PyLong_FromLongLong(wait);
}

/* 1 if the table may hold an entry under h: one is there, or the probe went round the table
 * without meeting an empty slot (the caller then leaves the id to the reference path). With tags,
 * a slot is read only where its tag is h's; 2 (the slot in *wait) when that slot's page is not
 * in memory and the table is probed `resident`. */
static int intake_seen(const KdsProbed *t, uint64_t h, long long *wait) {
    uint64_t sh, probes = 0, mask = t->mask;
    if (t->tags) {
        const uint8_t want = kds_idx_tag(h);
        for (uint64_t at = h & mask;; at = (at + 1) & mask, probes++) {
            if (probes > mask) return 1;
            uint8_t tag = t->tags[at];
            if (tag == IDX_EMPTY) return 0;
            if (tag != want) continue;
            if (t->resident && !page_resident(t->slots + at * IDX_SLOT_SIZE)) {
                *wait = (long long)at;
                return 2;
            }
            memcpy(&sh, t->slots + at * IDX_SLOT_SIZE, 8);
            if (sh == h) return 1;
        }
    }
    for (uint64_t at = h & mask;; at = (at + 1) & mask, probes++) {
        if (probes > mask) return 1;
        memcpy(&sh, t->slots + at * IDX_SLOT_SIZE, 8);
        if (sh == IDX_EMPTY) return 0;
        if (sh == h) return 1;
    }
}

long long kds_idx_intake_slot(const uint8_t *base, uint64_t mask, long long live, long long tombs, uint64_t h,
                              int *tomb, const KdsProbed *probed, int nprobed, long long *wait) {
    if ((live + tombs + 1) * 2 > (long long)(mask + 1)) return -1; /* IdIndex.put would grow the table */
    /* an entry under h in a table probed for presence (the staged index's sealed stage or
       table) counts as one in this table */
    for (int k = 0; k < nprobed; k++) {
        int seen = intake_seen(&probed[k], h, wait);
        if (seen) return seen == 2 ? -2 : -1;
    }
    int64_t free_slot = -1;
    uint64_t at = h & mask, probes = 0;
    for (;; at = (at + 1) & mask, probes++) {
        uint64_t sh;
        if (probes > mask) return -1;
        memcpy(&sh, base + at * IDX_SLOT_SIZE, 8);
        if (sh == IDX_EMPTY) break;
        if (sh == h) return -1; /* an entry under h: the duplicate and pre-cancel checks */
        if (sh == IDX_TOMB && free_slot < 0) free_slot = (int64_t)at;
    }
    *tomb = free_slot >= 0;
    return free_slot >= 0 ? free_slot : (long long)at;
}

void kds_idx_write(uint8_t *base, uint64_t at, uint64_t h, uint64_t ref) {
    memcpy(base + at * IDX_SLOT_SIZE, &h, 8);
    memcpy(base + at * IDX_SLOT_SIZE + 8, &ref, 8);
}

PyMethodDef kds_idindex_methods[] = {
    {"id_hash", native_id_hash, METH_O, NULL},
    {"idx_find", (PyCFunction)(void (*)(void))native_idx_find, METH_FASTCALL, NULL},
    {"idx_wait", (PyCFunction)(void (*)(void))native_idx_wait, METH_FASTCALL, NULL},
    {"idx_put", (PyCFunction)(void (*)(void))native_idx_put, METH_FASTCALL, NULL},
    {"idx_remove", (PyCFunction)(void (*)(void))native_idx_remove, METH_FASTCALL, NULL},
    {"idx_remove_delivered", (PyCFunction)(void (*)(void))native_idx_remove_delivered, METH_FASTCALL, NULL},
    {"idx_copy", (PyCFunction)(void (*)(void))native_idx_copy, METH_FASTCALL, NULL},
    {"idx_expired", (PyCFunction)(void (*)(void))native_idx_expired, METH_FASTCALL, NULL},
    {"idx_apply", (PyCFunction)(void (*)(void))native_idx_apply, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}};
