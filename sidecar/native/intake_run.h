/* sidecar._native: the intake's run over the store (intake.c), shared with the firings' re-arm
 * run (firing.c): the state list and the buffers held for a run, the commit-log room, the
 * scheduler's plain append and the id-index insert with its journal record. */
#ifndef KDS_INTAKE_RUN_H
#define KDS_INTAKE_RUN_H

#include "native.h"
#include "intake_layout.h"

#define IN_MAX_BUFS 64                                       /* scheduler buffers: one per level at most */
#define IN_MAX_STATE (IN_L_BASE + IN_L_STRIDE * IN_MAX_BUFS) /* the longest state (the levels') */

/* What a run holds for its length: the state (a C copy of the list, and the values it started
 * with), the head segment's, the id index's and the scheduler's buffers. */
typedef struct {
    int64_t st[IN_MAX_STATE], st_in[IN_MAX_STATE];
    Py_ssize_t nst;
    int kind, have_seg, have_idx, have_old, have_old2, have_jnl, have_tags, nbuf, nprobed;
    Py_buffer segv, idxv, oldv, old2v, jnlv, tagsv, bufs[IN_MAX_BUFS];
    uint8_t *bp[IN_MAX_BUFS], *ibase;
    KdsProbed probed[2]; /* the tables probed for presence only, the id index's table last */
    uint8_t *jbase;      /* the journal buffer, each insert appended at st[IN_IDX_JNL_AT] (NULL: none) */
    Py_ssize_t blen[IN_MAX_BUFS], jlen;
    PyObject *sbufs;
    long long hs, sb;
    uint64_t mask;
} InRun;

/* The optional buffers after sched_bufs, in this order (None: none). */
enum { IN_OPT_OLD, IN_OPT_OLD2, IN_OPT_JNL, IN_OPT_TAGS, IN_OPT_COUNT };

/* the run's state and buffers: 0, or -1 with an error set (kds_in_close releases what was taken) */
int kds_in_open(InRun *r, PyObject *seg, PyObject *idx, PyObject *stl, PyObject *sbufs, PyObject *const *opt,
                Py_ssize_t nopt);
/* kds_in_open with the buffers of a run's argument object (KdsRunBufs, KdsIngestRun, KdsRestoreRun:
 * their RunBufs fields, sidecar/store/native_args.py) */
#define KDS_IN_OPEN(r, a)                                                                                          \
    kds_in_open((r), (a)->seg_buf, (a)->idx_buf, (a)->st, (a)->sched_bufs,                                       \
                (PyObject *const[IN_OPT_COUNT]){(a)->idx_old_buf, (a)->idx_old2_buf, (a)->idx_jnl_buf,           \
                                                (a)->idx_tags_buf},                                               \
                IN_OPT_COUNT)
/* args[2] is a run's argument object of `type` (its name in the error), msgs args[0] a list: 0, or -1
 * with an error set */
int kds_in_args(PyObject *const *args, Py_ssize_t nargs, PyTypeObject *type, const char *call);
void kds_in_close(InRun *r);
int kds_in_state_out(PyObject *lst, const int64_t *st, const int64_t *orig, Py_ssize_t n); /* changed values back */
long long kds_in_room(const InRun *r, uint64_t length);        /* segment offset for a record, or -1 */
long long kds_in_sched_add(InRun *r, long long due, long long level, long long head); /* its ref, or -1 */
void kds_in_stored(InRun *r, uint64_t length, long long at, int tomb, uint64_t h, long long ref);

/* Room in the journal for one more record (always, without a journal): checked before the first
 * write, so a full journal stops the run before the record, as any check the loop makes does. */
static inline int kds_in_jnl_room(const InRun *r) {
    return !r->jbase || r->st[IN_IDX_JNL_AT] + 16 <= (long long)r->jlen;
}

#endif
