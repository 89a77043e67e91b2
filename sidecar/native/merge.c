/* sidecar._native, the id index's merge pass: a batch of removes and inserts applied to a table
 * file in slot order, one chunk at a time, with pread/pwrite and the GIL released.
 *
 * Why: a random write into a GiB table costs tens of microseconds of CPU on this project's
 * reference VM (60-75 us a fault through the mapping, 27 us a pwrite), a sequential rewrite 1.3 us
 * per 4 KiB page (bench/micro/index_io.c; docs/benchmarks.md, "The id index's write path"). So the staged
 * index gathers a stage's operations and merges them in one ascending pass.
 *
 * The table is the id index's (sidecar/store/idindex.py): 16-byte slots (u64 hash, u64 ref) after
 * a header, hash 0 empty, 1 tombstone, home slot hash & mask, linear probing. The pass sorts the
 * operations by home slot, then walks the table in chunks of `chunk` slots. A buffer holds the
 * slots from the current chunk's first one up to as far as a probe went; a probe that runs past
 * the chunk (a chain crossing it) loads more, and what it changed there is carried to the next
 * chunk rather than written twice. For each chunk: the removes, then the inserts homed in it, then
 * the pre-cancels made before `cutoff` (ms) among its slots are removed; its slots are counted and,
 * if anything in them changed, written back. A chain that runs past the last slot wraps to slot 0:
 * those slots are read again after the first chunk was written and written back at the end.
 *
 * Each write keeps the table valid for a reader probing it at the same time through a mapping:
 * an insert fills an empty or tombstone slot, a remove turns an entry into a tombstone, or, where
 * the chain ends right after it, into an empty slot together with the tombstones just before it
 * (as idx_remove does): no entry a probe can reach ever moves or disappears, except the removed.
 * A remove is of (hash, ref) exactly, an insert of a pair already present writes nothing, so the
 * pass is idempotent: one cut short by a crash can be run again.
 *
 * A pass given the table's tags (idx_merge_journal's last argument; kds_idx_tag, a byte per slot in
 * anonymous memory) rewrites each chunk's tags from its slots after the chunk is written, every
 * chunk, changed or not, so a pass also builds fresh tags whole. A tag goes through the same
 * transitions as its slot, so a reader walking the tags meanwhile (idx_find, the intake) is as
 * safe as one walking the slots: each tag is its slot's state before the pass or after it.
 *
 * The rebuild (idx_rebuild) is the growth: every live entry of a table but the expired
 * pre-cancels, into a new, empty file of the same size (tombstones shed) or twice it, through the
 * same chunked writer, so the new file too is written in ascending order. Its chunk [lo, hi) takes
 * the old entries homed at [lo, hi) mod the old size (when the table doubles, the hash's bit of the
 * old size tells the halves apart); they sit in the old table from their home up to the first
 * empty slot after the range, which is all the rebuild reads for that chunk.
 *
 * Measured (2^27 slots, 2 GiB, on the reference VM): 400,000 inserts merged in 1.3 s (1.1 s CPU,
 * synced); a rebuild into 2^27 slots 2.1 s, into 2^28 4.1 s.
 *
 * At SCHED_IDLE, without the GIL (idx_pass_idle): a pass keeps a core busy for seconds and must
 * leave it the moment the loop wakes, so it runs at SCHED_IDLE; but a thread at SCHED_IDLE must
 * never take the GIL. CPython hands the GIL to a thread that asks for it at the holder's next
 * switch interval and makes the holder wait until the taker has it (forced switching), and an idle
 * thread on a busy machine runs only when nothing else wants its core: whenever the pass's thread
 * came back from a call like these, the loop could wait for it as long as the machine stayed busy
 * (in the 100M scale bench scenario: a 712 ms wait for the GIL in a consume, turns of 50-529 ms
 * during the growths' passes). So the pass's Python thread is SCHED_BATCH and calls idx_pass_idle(True): from then on
 * the GIL-free part of each call below on that thread runs on a native thread of its own that
 * makes itself SCHED_IDLE and never touches the GIL, while the calling thread waits for it with the
 * GIL released. (Tried first with a thread started per pass: in the scale scenario the loop then
 * waited for each new thread to start; the pass threads are kept now, sidecar/store/idpass.py Workers.) */
#define _GNU_SOURCE
#include "native.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#define WRITEBACK_BEHIND 8 /* chunks: a pass leaves at most this many dirty for its final sync */

typedef struct {
    uint64_t h, ref;
} Slot;
_Static_assert(sizeof(Slot) == IDX_SLOT_SIZE, "a Slot is one id index slot (native_layouts.py)");

typedef struct {
    int fd, sync;
    long long hs;
    uint64_t cap, mask, chunk;
    Slot *buf;          /* virtual slots [v0, v0 + n); virtual slot v is table slot v & mask */
    uint8_t *mod;       /* per slot of buf: 1 if the pass changed it */
    uint64_t v0, n, size;
    long long wrap_live, wrap_tombs; /* counts of the wrapped slots as they were read */
    int err;            /* errno of a failed read or write */
    uint8_t *tags;      /* the table's tag bytes, one per slot, rewritten as the pass goes (NULL: none) */
} Pass;

static int io_slots(Pass *p, Slot *mem, uint64_t slot, uint64_t count, int write) {
    uint8_t *b = (uint8_t *)mem;
    size_t left = count * IDX_SLOT_SIZE;
    off_t off = (off_t)(p->hs + slot * IDX_SLOT_SIZE);
    while (left) {
        ssize_t r = write ? pwrite(p->fd, b, left, off) : pread(p->fd, b, left, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            p->err = r < 0 ? errno : EIO;
            return -1;
        }
        b += r, left -= (size_t)r, off += r;
    }
    return 0;
}

/* The buffer never holds a table slot twice: a probe that wrapped all the way round to the
 * buffer's first slot (virtual v0 + cap) finds it where it was loaded first. */
static inline uint64_t vmap(Pass *p, uint64_t v) { return v >= p->v0 + p->cap ? v - p->cap : v; }

/* make the buffer hold virtual slot `v` */
static int need(Pass *p, uint64_t v) {
    v = vmap(p, v);
    while (v >= p->v0 + p->n) {
        uint64_t at = p->v0 + p->n, want = p->chunk;
        if (want > p->v0 + p->cap - at) want = p->v0 + p->cap - at;
        if (p->n + want > p->size) {
            uint64_t size = p->size * 2 > p->n + want ? p->size * 2 : p->n + want;
            Slot *nb = realloc(p->buf, size * IDX_SLOT_SIZE);
            if (nb) p->buf = nb;
            uint8_t *nm = nb ? realloc(p->mod, size) : NULL;
            if (!nm) {
                p->err = ENOMEM;
                return -1;
            }
            p->mod = nm, p->size = size;
        }
        uint64_t slot = at & p->mask;
        if (want > p->cap - slot) want = p->cap - slot; /* a read stops at the table's end */
        if (io_slots(p, p->buf + p->n, slot, want, 0) < 0) return -1;
        memset(p->mod + p->n, 0, want);
        if (at >= p->cap)
            for (uint64_t k = 0; k < want; k++) {
                p->wrap_live += p->buf[p->n + k].h > IDX_TOMB;
                p->wrap_tombs += p->buf[p->n + k].h == IDX_TOMB;
            }
        p->n += want;
    }
    return 0;
}

static inline Slot *at(Pass *p, uint64_t v) { return p->buf + (vmap(p, v) - p->v0); }
static inline void touched(Pass *p, uint64_t v) { p->mod[vmap(p, v) - p->v0] = 1; }
static int changed(Pass *p, uint64_t from, uint64_t count) {
    for (uint64_t k = 0; k < count; k++)
        if (p->mod[from + k]) return 1;
    return 0;
}
static int full(Pass *p) { /* a probe as long as the table: no empty slot (the caller keeps room) */
    p->err = ENOSPC;
    return -1;
}

/* remove the entry at virtual slot v (in the buffer) */
static int remove_at(Pass *p, uint64_t v) {
    if (need(p, v + 1) < 0) return -1;
    touched(p, v);
    if (at(p, v + 1)->h != IDX_EMPTY) {
        at(p, v)->h = IDX_TOMB;
        return 0;
    }
    /* the chain ends right after it: no probe needs it, nor the tombstones just before it (back
     * to the buffer's first slot: one before it is written already and stays a tombstone) */
    at(p, v)->h = IDX_EMPTY;
    for (uint64_t j = vmap(p, v); j > p->v0 && at(p, j - 1)->h == IDX_TOMB; j--) {
        at(p, j - 1)->h = IDX_EMPTY;
        touched(p, j - 1);
    }
    return 0;
}

/* 1 if (h, ref) was found and removed, 0 if absent, -1 on error */
static int remove_op(Pass *p, uint64_t h, uint64_t ref) {
    for (uint64_t v = h & p->mask;; v++) {
        if (v - (h & p->mask) >= p->cap) return full(p);
        if (need(p, v) < 0) return -1;
        Slot *s = at(p, v);
        if (s->h == IDX_EMPTY) return 0;
        if (s->h == h && s->ref == ref) return remove_at(p, v) < 0 ? -1 : 1;
    }
}

/* 1 if (h, ref) was inserted, 0 if it was there already, -1 on error */
static int put_op(Pass *p, uint64_t h, uint64_t ref) {
    uint64_t v = h & p->mask, free_v = UINT64_MAX;
    for (;; v++) {
        if (v - (h & p->mask) >= p->cap) return full(p);
        if (need(p, v) < 0) return -1;
        Slot *s = at(p, v);
        if (s->h == IDX_EMPTY) break;
        if (s->h == h && s->ref == ref) return 0;
        if (s->h == IDX_TOMB && free_v == UINT64_MAX) free_v = v;
    }
    if (free_v != UINT64_MAX) v = free_v;
    at(p, v)->h = h, at(p, v)->ref = ref;
    touched(p, v);
    return 1;
}

/* home slot, then hash, then ref: one order, so the Python twin writes the same bytes */
static int by_home(const void *a, const void *b, void *mask) {
    const Slot *s = a, *t = b;
    uint64_t m = *(const uint64_t *)mask, x = s->h & m, y = t->h & m;
    if (x != y) return x < y ? -1 : 1;
    if (s->h != t->h) return s->h < t->h ? -1 : 1;
    return s->ref < t->ref ? -1 : s->ref > t->ref;
}

typedef struct {
    long long live, tombs, inserted, removed, expired, written;
} Result;

/* begin the chunk [lo, hi): the slots after the last chunk that a probe loaded come first */
static int chunk_begin(Pass *p, uint64_t lo, uint64_t hi) {
    if (p->n) {
        uint64_t drop = lo - p->v0;
        memmove(p->buf, p->buf + drop, (p->n - drop) * IDX_SLOT_SIZE);
        memmove(p->mod, p->mod + drop, p->n - drop);
        p->n -= drop;
    }
    p->v0 = lo;
    return need(p, hi - 1);
}

/* end the chunk [lo, hi): sweep, count, write back what changed */
static int chunk_end(Pass *p, uint64_t lo, uint64_t hi, uint64_t cutoff, Result *out) {
    for (uint64_t v = lo; v < hi; v++) {
        Slot *s = at(p, v);
        if (s->h > IDX_TOMB && (s->ref & IDX_PRECANCEL) && (s->ref & ~IDX_PRECANCEL) < cutoff) {
            if (remove_at(p, v) < 0) return -1;
            out->expired++;
        }
    }
    for (uint64_t v = lo; v < hi; v++) {
        out->live += at(p, v)->h > IDX_TOMB;
        out->tombs += at(p, v)->h == IDX_TOMB;
    }
    int dirty = changed(p, 0, hi - lo);
    if (dirty && io_slots(p, p->buf, lo, hi - lo, 1) < 0) return -1;
    /* every chunk's tags, written or not: a pass given fresh tags builds them whole */
    if (p->tags)
        for (uint64_t v = lo; v < hi; v++) p->tags[v] = kds_idx_tag(at(p, v)->h);
    if (!dirty) return 0;
    out->written++;
    if (!p->sync) return 0;
    /* start this chunk's writeback, wait for the one WRITEBACK_BEHIND chunks back: the
     * writeback comes as the pass goes, not in one final burst that stalls readers */
    off_t off = (off_t)(p->hs + lo * IDX_SLOT_SIZE), len = (off_t)((hi - lo) * IDX_SLOT_SIZE), back = (off_t)(WRITEBACK_BEHIND * p->chunk * IDX_SLOT_SIZE);
    sync_file_range(p->fd, off, len, SYNC_FILE_RANGE_WRITE);
    if (off - p->hs >= back)
        sync_file_range(p->fd, off - back, len,
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    return 0;
}

/* after the last chunk: chains that ran past the last slot changed slots 0.. */
static int pass_end(Pass *p, Result *out) {
    if (p->v0 + p->n > p->cap) {
        uint64_t first = p->cap - p->v0, e = p->n - first;
        for (uint64_t k = 0; k < e; k++) {
            out->live += p->buf[first + k].h > IDX_TOMB;
            out->tombs += p->buf[first + k].h == IDX_TOMB;
        }
        out->live -= p->wrap_live, out->tombs -= p->wrap_tombs;
        if (changed(p, first, e)) {
            if (io_slots(p, p->buf + first, 0, e, 1) < 0) return -1;
            out->written++;
        }
        if (p->tags)
            for (uint64_t k = 0; k < e; k++) p->tags[k] = kds_idx_tag(p->buf[first + k].h);
    }
    if (p->sync && fdatasync(p->fd) < 0) {
        p->err = errno;
        return -1;
    }
    return 0;
}

static int run(Pass *p, Slot *rm, uint64_t nrm, Slot *put, uint64_t nput, uint64_t cutoff, Result *out) {
    uint64_t ir = 0, ip = 0;
    for (uint64_t lo = 0; lo < p->cap; lo += p->chunk) {
        uint64_t hi = lo + p->chunk < p->cap ? lo + p->chunk : p->cap;
        if (chunk_begin(p, lo, hi) < 0) return -1;
        for (; ir < nrm && (rm[ir].h & p->mask) < hi; ir++) {
            int r = remove_op(p, rm[ir].h, rm[ir].ref);
            if (r < 0) return -1;
            out->removed += r;
        }
        for (; ip < nput && (put[ip].h & p->mask) < hi; ip++) {
            /* an expired pre-cancel is not inserted, and removed if it is there: the sweep
             * may have passed its slot already (a chain that wrapped) */
            int dead = (put[ip].ref & IDX_PRECANCEL) && (put[ip].ref & ~IDX_PRECANCEL) < cutoff;
            int r = dead ? remove_op(p, put[ip].h, put[ip].ref) : put_op(p, put[ip].h, put[ip].ref);
            if (r < 0) return -1;
            if (dead) out->expired += r;
            else out->inserted += r;
        }
        if (chunk_end(p, lo, hi, cutoff, out) < 0) return -1;
    }
    return pass_end(p, out);
}

/* The rebuild: every live entry of an old table (fd `old`, `ocap` slots) but expired pre-cancels,
 * into the empty table of `p` (ocap or 2 * ocap slots), in the new table's slot order. New chunk
 * [lo, hi) holds the entries homed there; they are homed in the old table at [lo, hi) mod ocap
 * (with the bit ocap of their hash telling the halves apart when the table doubles), and sit at or
 * after that home: in old slots [lo mod ocap, up to the first empty slot after hi mod ocap). */
static int rebuild(Pass *p, int old, uint64_t ocap, uint64_t cutoff, Result *out) {
    Pass o = {.fd = old, .hs = p->hs, .cap = ocap, .mask = ocap - 1, .chunk = p->chunk};
    o.size = 2 * o.chunk;
    o.buf = malloc(o.size * IDX_SLOT_SIZE), o.mod = malloc(o.size);
    Slot *got = malloc(p->chunk * IDX_SLOT_SIZE * 2 + 16);
    uint64_t gsize = p->chunk * 2 + 1;
    int rc = -1;
    if (!o.buf || !o.mod || !got) {
        p->err = ENOMEM;
        goto done;
    }
    for (uint64_t lo = 0, hi; lo < p->cap; lo = hi) {
        uint64_t half = lo < ocap ? ocap : p->cap;
        hi = lo + p->chunk;
        if (hi > half) hi = half; /* a chunk stays in one half of a doubled table */
        uint64_t a = lo & o.mask, b = a + (hi - lo), bit = p->cap > ocap ? (lo & ocap) : 0, n = 0;
        o.n = 0, o.v0 = a; /* the old slots from home a on, read again for each half */
        uint64_t v = a;
        for (;; v++) {
            if (v >= a + ocap) break; /* every slot seen once */
            if (need(&o, v) < 0) goto done;
            Slot *s = at(&o, v);
            if (s->h == IDX_EMPTY && v >= b) break;
            uint64_t home = s->h & o.mask;
            if (s->h <= IDX_TOMB || home < a || home >= b || (p->cap > ocap && (s->h & ocap) != bit)) continue;
            if ((s->ref & IDX_PRECANCEL) && (s->ref & ~IDX_PRECANCEL) < cutoff) {
                out->expired++;
                continue;
            }
            if (n == gsize) {
                Slot *ng = realloc(got, (gsize *= 2) * IDX_SLOT_SIZE);
                if (!ng) {
                    p->err = ENOMEM;
                    goto done;
                }
                got = ng;
            }
            got[n++] = *s;
        }
        qsort_r(got, n, sizeof(Slot), by_home, &p->mask);
        if (chunk_begin(p, lo, hi) < 0) goto done;
        for (uint64_t k = 0; k < n; k++) {
            int r = put_op(p, got[k].h, got[k].ref);
            if (r < 0) goto done;
            out->inserted += r;
        }
        if (chunk_end(p, lo, hi, cutoff, out) < 0) goto done;
    }
    rc = pass_end(p, out);
done:
    if (o.err && !p->err) p->err = o.err;
    free(o.buf);
    free(o.mod);
    free(got);
    return rc;
}

/* -- the GIL-free part at SCHED_IDLE (the module comment's last part) ------------------------ */

static _Thread_local int pass_idle; /* this thread's calls run their GIL-free part at SCHED_IDLE */

typedef struct {
    void (*fn)(void *);
    void *arg;
} IdleJob;

static void *idle_main(void *a) {
    IdleJob *j = a;
    struct sched_param none = {0};
    (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &none); /* refused: the caller's policy */
    j->fn(j->arg);
    return NULL;
}

/* fn(arg), called with the GIL released: on an idle thread of its own if this thread asked for it
 * (idx_pass_idle), or here if it did not or no thread could be started */
static void gil_free(void (*fn)(void *), void *arg) {
    if (pass_idle) {
        IdleJob j = {fn, arg};
        pthread_t t;
        if (pthread_create(&t, NULL, idle_main, &j) == 0) {
            (void)pthread_setname_np(t, "kds-ids-idle");
            pthread_join(t, NULL);
            return;
        }
    }
    fn(arg);
}

/* idx_pass_idle(on) -> None: whether this thread's merge calls run their GIL-free part at
 * SCHED_IDLE on a native thread (the module comment's last part) */
static PyObject *native_idx_pass_idle(PyObject *self, PyObject *on) {
    int v = PyObject_IsTrue(on);
    if (v < 0) return NULL;
    pass_idle = v;
    Py_RETURN_NONE;
}

static Slot *ops_copy(PyObject *obj, uint64_t *n) {
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_SIMPLE) < 0) return NULL;
    if (v.len % IDX_SLOT_SIZE) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_ValueError, "idx_merge_pass: operations are 16-byte (hash, ref) pairs");
        return NULL;
    }
    Slot *s = malloc(v.len ? (size_t)v.len : 16);
    if (s) memcpy(s, v.buf, (size_t)v.len);
    *n = (uint64_t)v.len / IDX_SLOT_SIZE;
    PyBuffer_Release(&v);
    if (!s) PyErr_NoMemory();
    return s;
}

/* the arguments both calls share: the table written (fd, header size, mask), the pre-cancels'
 * cutoff, the chunk, whether to sync; -1 with a Python error set */
static int pass_args(Pass *p, PyObject *fd, PyObject *hs, PyObject *mask, PyObject *cutoff, PyObject *chunk,
                     PyObject *sync, uint64_t *cutoff_ms) {
    p->fd = PyLong_AsLong(fd);
    p->hs = PyLong_AsLongLong(hs);
    p->mask = PyLong_AsUnsignedLongLong(mask);
    *cutoff_ms = PyLong_AsUnsignedLongLong(cutoff);
    p->chunk = PyLong_AsUnsignedLongLong(chunk);
    p->sync = PyObject_IsTrue(sync);
    p->cap = p->mask + 1;
    return PyErr_Occurred() ? -1 : 0;
}

/* the pass's buffer, freed by pass_done */
static int pass_alloc(Pass *p) {
    p->size = 2 * p->chunk;
    p->buf = malloc(p->size * IDX_SLOT_SIZE);
    p->mod = malloc(p->size);
    if (p->buf && p->mod) return 0;
    p->err = ENOMEM;
    return -1;
}

/* free the buffer; on failure (rc < 0) raise OSError from the pass's errno */
static int pass_done(Pass *p, int rc) {
    free(p->buf);
    free(p->mod);
    if (rc < 0) {
        errno = p->err;
        PyErr_SetFromErrno(PyExc_OSError);
    }
    return rc;
}

/* the GIL-free part of idx_merge_pass and idx_merge_journal: (from records, the journal's) the
 * operations sorted, then the pass */
typedef struct {
    Pass *p;
    Slot *rm, *put;
    const uint8_t *records; /* a journal's records (idx_merge_journal), or NULL: rm and put given */
    uint64_t nrm, nput, nrec, cutoff;
    Result out;
    int rc;
} MergeJob;

static int net_ops(const uint8_t *rec, uint64_t n, uint64_t mask, Slot *rm, uint64_t *nrm, Slot *put, uint64_t *nput);

static void merge_job(void *a) {
    MergeJob *j = a;
    if (j->records) {
        if (!j->rm || !j->put || net_ops(j->records, j->nrec, j->p->mask, j->rm, &j->nrm, j->put, &j->nput) < 0) {
            j->p->err = ENOMEM;
            return;
        }
    } else {
        qsort_r(j->rm, j->nrm, sizeof(Slot), by_home, &j->p->mask);
        qsort_r(j->put, j->nput, sizeof(Slot), by_home, &j->p->mask);
    }
    j->rc = pass_alloc(j->p) < 0 ? -1 : run(j->p, j->rm, j->nrm, j->put, j->nput, j->cutoff, &j->out);
}

/* idx_merge_pass(fd, header_size, mask, removes, inserts, cutoff_ms, chunk_slots, sync)
 *   -> (live, tombs, inserted, removed, expired, chunks_written)
 * removes and inserts: bytes of 16-byte (hash, ref) pairs, in any order. */
static PyObject *native_idx_merge_pass(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "idx_merge_pass(fd, header_size, mask, removes, inserts, cutoff_ms, chunk_slots, sync)");
        return NULL;
    }
    Pass p = {0};
    uint64_t cutoff;
    if (pass_args(&p, args[0], args[1], args[2], args[5], args[6], args[7], &cutoff) < 0) return NULL;
    if (p.hs < 0 || (p.mask & p.cap) || !p.chunk) {
        PyErr_SetString(PyExc_ValueError, "idx_merge_pass: a power-of-two table and a chunk of slots");
        return NULL;
    }
    if (p.chunk > p.cap) p.chunk = p.cap;
    uint64_t nrm, nput;
    Slot *rm = ops_copy(args[3], &nrm), *put = rm ? ops_copy(args[4], &nput) : NULL;
    if (!put) {
        free(rm);
        return NULL;
    }
    MergeJob j = {.p = &p, .rm = rm, .put = put, .nrm = nrm, .nput = nput, .cutoff = cutoff, .rc = -1};
    Py_BEGIN_ALLOW_THREADS;
    gil_free(merge_job, &j);
    Py_END_ALLOW_THREADS;
    free(rm);
    free(put);
    if (pass_done(&p, j.rc) < 0) return NULL;
    return Py_BuildValue("(LLLLLL)", j.out.live, j.out.tombs, j.out.inserted, j.out.removed, j.out.expired, j.out.written);
}

typedef struct { /* idx_rebuild's GIL-free part */
    Pass *p;
    int old, rc;
    uint64_t ocap, cutoff;
    Result out;
} RebuildJob;

static void rebuild_job(void *a) {
    RebuildJob *j = a;
    j->rc = pass_alloc(j->p) < 0 ? -1 : rebuild(j->p, j->old, j->ocap, j->cutoff, &j->out);
}

/* idx_rebuild(old_fd, new_fd, header_size, old_mask, new_mask, cutoff_ms, chunk_slots, sync)
 *   -> (live, tombs, inserted, expired, chunks_written)
 * The new table (the same size or twice the old one) must be empty: its file made beforehand. */
static PyObject *native_idx_rebuild(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "idx_rebuild(old_fd, new_fd, header_size, old_mask, new_mask, cutoff_ms, chunk_slots, sync)");
        return NULL;
    }
    Pass p = {0};
    uint64_t cutoff;
    int old = PyLong_AsLong(args[0]);
    uint64_t omask = PyLong_AsUnsignedLongLong(args[3]), ocap = omask + 1;
    if (PyErr_Occurred() || pass_args(&p, args[1], args[2], args[4], args[5], args[6], args[7], &cutoff) < 0)
        return NULL;
    if (p.hs < 0 || (omask & ocap) || !p.chunk || (p.cap != ocap && p.cap != 2 * ocap)) {
        PyErr_SetString(PyExc_ValueError, "idx_rebuild: power-of-two tables, the new one the same size or twice the old");
        return NULL;
    }
    if (p.chunk > ocap) p.chunk = ocap;
    RebuildJob j = {.p = &p, .old = old, .ocap = ocap, .cutoff = cutoff, .rc = -1};
    Py_BEGIN_ALLOW_THREADS;
    gil_free(rebuild_job, &j);
    Py_END_ALLOW_THREADS;
    if (pass_done(&p, j.rc) < 0) return NULL;
    return Py_BuildValue("(LLLLL)", j.out.live, j.out.tombs, j.out.inserted, j.out.expired, j.out.written);
}

/* -- a journal's records as the pass's operations ----------------------------------------------
 * A journal holds the stage's operations in order (kds_jnl_read, native.h: an insert is one record,
 * a remove the marker and the pair). Only the last operation on each pair matters to the table: an
 * insert and then a remove of the same pair (a record delivered within the generation) is a remove
 * of a pair the table does not hold, a no-op. */
typedef struct {
    uint64_t h, ref, seq; /* seq: the operation's place in the journal, then 1 bit: a remove */
} Op;

static int by_pair(const void *a, const void *b, void *mask) {
    const Op *s = a, *t = b;
    uint64_t m = *(const uint64_t *)mask, x = s->h & m, y = t->h & m;
    if (x != y) return x < y ? -1 : 1;
    if (s->h != t->h) return s->h < t->h ? -1 : 1;
    if (s->ref != t->ref) return s->ref < t->ref ? -1 : 1;
    return s->seq < t->seq ? -1 : s->seq > t->seq;
}

/* the last operation on each pair, removes and inserts apart, each in by_home order; the records
 * were checked (kds_jnl_check) */
static int net_ops(const uint8_t *rec, uint64_t n, uint64_t mask, Slot *rm, uint64_t *nrm, Slot *put, uint64_t *nput) {
    Op *ops = malloc(n ? n * sizeof(Op) : sizeof(Op));
    if (!ops) return -1;
    uint64_t m = 0;
    for (uint64_t k = 0; k < n;) {
        uint64_t h = 0, ref = 0;
        int remove = 0;
        int took = kds_jnl_read(rec, n, k, &h, &ref, &remove);
        ops[m] = (Op){h, ref, (m << 1) | (uint64_t)remove};
        m++;
        k += (uint64_t)(took ? took : 1);
    }
    qsort_r(ops, m, sizeof(Op), by_pair, &mask);
    *nrm = *nput = 0;
    for (uint64_t k = 0; k < m; k++) {
        if (k + 1 < m && ops[k + 1].h == ops[k].h && ops[k + 1].ref == ops[k].ref)
            continue; /* a later operation on the same pair */
        if (ops[k].seq & 1) rm[(*nrm)++] = (Slot){ops[k].h, ops[k].ref};
        else put[(*nput)++] = (Slot){ops[k].h, ops[k].ref};
    }
    free(ops);
    return 0;
}

/* idx_merge_journal(fd, header_size, mask, records, cutoff_ms, chunk_slots, sync[, tags])
 *   -> (live, tombs, inserted, removed, expired, chunks_written)
 * records: a journal's 16-byte records, in journal order (kds_jnl_read). tags: a writable buffer
 * of a byte per slot, or None: each chunk's tags are rewritten from its slots once it is written
 * (kds_idx_tag), so after the pass they mirror the table. */
static PyObject *native_idx_merge_journal(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 && nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "idx_merge_journal(fd, header_size, mask, records, cutoff_ms, chunk_slots, sync[, tags])");
        return NULL;
    }
    Pass p = {0};
    uint64_t cutoff, n;
    if (pass_args(&p, args[0], args[1], args[2], args[4], args[5], args[6], &cutoff) < 0) return NULL;
    if (p.hs < 0 || (p.mask & p.cap) || !p.chunk) {
        PyErr_SetString(PyExc_ValueError, "idx_merge_journal: a power-of-two table and a chunk of slots");
        return NULL;
    }
    if (p.chunk > p.cap) p.chunk = p.cap;
    Py_buffer tv = {0};
    int have_tags = nargs == 8 && args[7] != Py_None;
    if (have_tags) {
        if (PyObject_GetBuffer(args[7], &tv, PyBUF_WRITABLE) < 0) return NULL;
        if ((uint64_t)tv.len < p.cap) {
            PyBuffer_Release(&tv);
            PyErr_SetString(PyExc_ValueError, "idx_merge_journal: the tags hold fewer bytes than the table slots");
            return NULL;
        }
        p.tags = tv.buf;
    }
    Slot *rec = ops_copy(args[3], &n);
    if (!rec) {
        if (have_tags) PyBuffer_Release(&tv);
        return NULL;
    }
    uint64_t bad;
    if (kds_jnl_check((const uint8_t *)rec, n, &bad) < 0) {
        free(rec);
        if (have_tags) PyBuffer_Release(&tv);
        PyErr_Format(PyExc_ValueError, "idx_merge_journal: record %llu is malformed (a hash below 2 outside a "
                     "remove's marker, or a marker with a ref or without its pair)", (unsigned long long)bad);
        return NULL;
    }
    MergeJob j = {.p = &p, .rm = malloc(n * IDX_SLOT_SIZE + 16), .put = malloc(n * IDX_SLOT_SIZE + 16), .records = (const uint8_t *)rec,
                  .nrec = n, .cutoff = cutoff, .rc = -1};
    Py_BEGIN_ALLOW_THREADS;
    gil_free(merge_job, &j);
    Py_END_ALLOW_THREADS;
    free(rec);
    free(j.rm);
    free(j.put);
    if (have_tags) PyBuffer_Release(&tv);
    if (pass_done(&p, j.rc) < 0) return NULL;
    return Py_BuildValue("(LLLLLL)", j.out.live, j.out.tombs, j.out.inserted, j.out.removed, j.out.expired, j.out.written);
}

PyMethodDef kds_merge_methods[] = {
    {"idx_merge_journal", (PyCFunction)(void (*)(void))native_idx_merge_journal, METH_FASTCALL, NULL},
    {"idx_merge_pass", (PyCFunction)(void (*)(void))native_idx_merge_pass, METH_FASTCALL, NULL},
    {"idx_rebuild", (PyCFunction)(void (*)(void))native_idx_rebuild, METH_FASTCALL, NULL},
    {"idx_pass_idle", native_idx_pass_idle, METH_O, NULL},
    {NULL, NULL, 0, NULL}};
