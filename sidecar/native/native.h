/* sidecar._native: what its translation units share (module.c explains the whole).
 *
 * Each .c file here is one core of the extension, compiled on its own; a function or object one
 * core uses from another is a kds_-prefixed extern declared below, and a small helper several
 * cores inline is a static inline function here. Byte layouts follow the Python twins (named at
 * each block); the intake's state array is declared in sidecar/store/intake_layout.py, which
 * generates intake_layout.h. */
#ifndef KDS_NATIVE_H
#define KDS_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#include "layouts.h" /* sizes, states and flags shared with Python (sidecar/store/native_layouts.py) */
#include "native_args.h" /* argument structs of the C calls with many arguments (sidecar/store/native_args.py) */

/* -- little-endian field access (the module refuses a big-endian host at import) -------------- */

static inline uint16_t rd16(const uint8_t *p) { /* u16 at p */
    return (uint16_t)(p[0] | p[1] << 8);
}
static inline uint32_t rd32(const uint8_t *p) { /* u32 at p */
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline int64_t rd64(const uint8_t *p) { /* i64 at p */
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline void wr16(uint8_t *p, uint16_t v) { /* u16 to p */
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void wr32(uint8_t *p, uint32_t v) { /* u32 to p */
    memcpy(p, &v, 4);
}
static inline void wr64(uint8_t *p, int64_t v) { /* i64 to p */
    memcpy(p, &v, 8);
}
static inline long long floordiv64(long long a, long long b) { /* Python's a // b */
    long long q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

/* -- hash.c: CRC32C and the id hash ------------------------------------------------------------ */

extern int kds_have_sse42;                                     /* the CPU has SSE4.2's crc32 */
void kds_crc_init(void);                                       /* build the tables, probe the CPU */
uint32_t kds_crc32c(const uint8_t *p, size_t n);               /* CRC32C, hardware when it can */
uint32_t kds_crc32c_sw(uint32_t crc, const uint8_t *p, size_t n); /* CRC32C by table */
uint64_t kds_blake2b64(const uint8_t *in, size_t n);           /* BLAKE2b-64, unkeyed, little-endian */
extern PyMethodDef kds_hash_methods[];                         /* crc32c, crc32c_software */

static inline uint64_t kds_id_hash(const uint8_t *p, size_t n) { /* idindex.py's id_hash */
    uint64_t h = kds_blake2b64(p, n);
    return h >= 2 ? h : h + 2; /* 0 and 1 mark empty and tombstone slots in the id index */
}

/* -- codec.c: records (codec.py) ---------------------------------------------------------------- */


typedef struct { /* codec.Record with bytes fields (a C type: built without running Python code) */
    PyObject_HEAD long long length;
    long long due_ms, enqueue_ms, src_offset;
    int rtype, src_partition, target_partition, retry_count, level;
    PyObject *id, *topic, *key, *value, *headers;
} RecordObject;

typedef struct { /* the bytes of one optional field: a buffer, or None (null) */
    Py_buffer view;
    int null, held;
} Field;

typedef struct { /* a mapped file's buffer (files[first].buf) held for the length of a call */
    long long first;
    int have;
    Py_buffer v;
} KdsFile;

extern PyTypeObject kds_RecordType; /* sidecar._native.Record */
/* write one record at dst: fs = rid, topic, key, value, headers blob; room checked by the caller */
void kds_write_record(uint8_t *dst, uint32_t length, uint32_t body_len, int rtype, int64_t due, int64_t enq,
                      int64_t srco, int32_t srcp, int32_t tgtp, int retry, int level, Field *fs);
PyObject *kds_encode_headers(PyObject *self, PyObject *headers); /* encode_headers(headers) -> bytes */
PyObject *kds_delivery_headers(PyObject *self, PyObject *const *args, Py_ssize_t nargs); /* delivery_headers */
/* one header handed to a sink: name (nl bytes), value (vl bytes; NULL and -1: null); nobj / vobj
 * the same as objects when the caller has them (NULL: not). 0, or -1 with an error set. */
typedef int (*kds_hadd)(void *ctx, PyObject *nobj, const char *name, Py_ssize_t nl, PyObject *vobj, const char *val,
                        Py_ssize_t vl);
/* delivery_headers' headers (rec: a Record, source_topic: bytes), each handed to add */
int kds_delivery_headers_each(PyObject *rec, PyObject *source_topic, kds_hadd add, void *ctx);
/* kds_fields_headers' headers, each handed to add */
int kds_fields_headers_each(PyObject *user, PyObject *rid, long long due, long long enq, PyObject *topic_bytes,
                            long long partition, long long offset, kds_hadd add, void *ctx);
/* the delivery headers of a MESSAGE record's fields, as delivery_headers gives the stored record's */
PyObject *kds_fields_headers(PyObject *user, PyObject *rid, long long due, long long enq, PyObject *topic_bytes,
                             long long partition, long long offset);
int kds_fmt_ll(char *p, long long v);   /* v in decimal at p, unterminated; returns the length */
/* delay.source's value, "<topic>:<partition>:<offset>" (topic_bytes: bytes), or NULL with an error */
PyObject *kds_source(PyObject *topic_bytes, long long partition, long long offset);
int kds_codec_ready(void);              /* 0 once setup() ran, else -1 with RuntimeError set */
void kds_file_release(KdsFile *f);      /* let go of the held buffer */
int kds_file_get(KdsFile *f, PyObject *files, long long key, int writable); /* 1 held, 0 no such key, -1 */
/* the record at commit-log position pos, decoded from its segment; NULL without an error: the
 * caller reads it itself (segment gone, record does not decode) */
PyObject *kds_log_decode_at(KdsFile *seg, PyObject *segments, long long seg_bytes, uint64_t pos);
extern PyMethodDef kds_codec_methods[]; /* setup, decode, encode, append, *_headers */

/* -- idindex.c: the id index (idindex.py) ------------------------------------------------------- */

/* A table's tag bytes (sidecar/store/idindex.py, "Tags"): one per slot, 0 empty, 1 tombstone,
 * else the hash's top byte, 0 and 1 folded onto 2 and 3 (254 values: an absent id's tag matches
 * 1 in 252 occupied slots; 0x80 | 7 bits matched 1 in 128). A probe walks the tags and reads a
 * slot only where its tag matches: an absent id rarely reads the table's pages (which may have
 * left the page cache). */
static inline uint8_t kds_idx_tag(uint64_t h) {
    uint8_t top = (uint8_t)(h >> 56);
    return h <= 1 ? (uint8_t)h : (uint8_t)(top < 2 ? top + 2 : top);
}

/* A table the intake only probes for presence: its first slot, its tags (NULL: none), its mask;
 * resident: a slot is read only where its page is in memory (mincore), else the probe stops
 * (the id index's file-backed table, when the caller can wait for the page off the loop). */
typedef struct {
    const uint8_t *slots, *tags;
    uint64_t mask;
    int resident;
} KdsProbed;

/* the slot index the intake's insert of h takes in the table at base (mask), with live + tombs
 * occupied: -1 when h has an entry already (in that table, or in one of the nprobed tables probed
 * for presence) or the insert would grow the table (the reference path's cases); -2 when a probed
 * table's slot to read (a tag match) is on a page not in memory, its index in *wait (a probed
 * table with `resident` set); *tomb set when the slot is a tombstone */
long long kds_idx_intake_slot(const uint8_t *base, uint64_t mask, long long live, long long tombs, uint64_t h,
                              int *tomb, const KdsProbed *probed, int nprobed, long long *wait);
void kds_idx_write(uint8_t *base, uint64_t at, uint64_t h, uint64_t ref); /* (h, ref) into slot at */
extern PyMethodDef kds_idindex_methods[]; /* id_hash, idx_* */
extern PyMethodDef kds_merge_methods[];   /* idx_merge_pass, idx_merge_journal, idx_rebuild, idx_pass_idle */
extern PyMethodDef kds_pages_methods[];   /* populate */

/* -- parse.c: the common ingress request (headers.py) ------------------------------------------ */

typedef struct { /* parse_core's answer: topic, user and spec (NULL: one-shot) new references, rid
                  and mode borrowed */
    PyObject *topic, *rid, *mode, *user, *spec;
    long long partition, due;
} Request;

typedef struct { /* the last target topic parse_core checked: bytes and str, strong references */
    PyObject *bytes, *str;
} TopicMemo;

extern PyObject *kds_MODE_NOW; /* "now": the mode of a request with no delay header */
/* 1 and *out filled for the common request, 0 for any other (the full parser answers), -1 error;
 * recurring_ok: the common recurring record too (out->spec set) */
int kds_parse_core(PyObject *headers, long long ts, long long now, long long size, long long max_bytes,
                   long long max_delay, PyObject *checked, TopicMemo *memo, int recurring_ok, Request *out);
extern PyMethodDef kds_parse_methods[]; /* parse_request, setup_parser */

/* -- wheel.c: the timer wheel's files (wheel/layout.py) ---------------------------------------- */

/* A timer-log file keeps its entries' states apart from the entries (layout.py): nent state bytes
 * after the header, then the entries. hs = the byte offset of the file's first ENTRY (header +
 * nent), so entry x is at hs + (x - f0) * WL_SIZE and its state byte at hs - nent + (x - f0). */
#define WL_STATE_OFF(hs, nent, f0, x) ((hs) - (nent) + ((x) - (f0)))

/* a new timer-log entry (layout.ENTRY): pending, no next yet, tagged with its index */
static inline void wl_entry(uint8_t *ent, int64_t due, int64_t loc, int flags, int level, long long idx) {
    wr64(ent, due);
    wr64(ent + 8, loc);
    wr64(ent + 16, -1);
    ent[24] = 0;
    ent[25] = (uint8_t)flags;
    wr16(ent + 26, (uint16_t)(level & 0xFFFF));
    wr32(ent + 28, (uint32_t)(idx & 0xFFFFFFFF));
}

int kds_seg_add(PyObject *segs, long long g, long long c); /* segs[g] += c (releases per log segment) */
extern PyMethodDef kds_wheel_methods[];                    /* wl_* */

/* -- levels.c: the delay levels' queue files (levels/queue.py) ---------------------------------- */

#define LV_IDX_MASK ((1LL << LV_IDX_BITS) - 1)
extern PyMethodDef kds_levels_methods[]; /* lv_due, lv_ack */

/* -- module.c --------------------------------------------------------------------------------- */

/* each of types readied and added to module m under its name: 0, or -1 with an error set */
int kds_add_types(PyObject *m, PyTypeObject **types, const char **names, size_t n);

/* -- intake.c: the intake fast path (store/intake.py ingest_many) ------------------------------ */

/* the Message accessors ingest_run calls, in this order */
enum { M_ERROR, M_PARTITION, M_TIMESTAMP, M_OFFSET, M_KEY, M_VALUE, M_HEADERS, M_TOPIC, M_COUNT };
PyObject *kds_msg_call(PyObject *m, int k); /* m.<accessor k>(), raising what it raises */
extern PyMethodDef kds_intake_methods[];    /* ingest_run */

/* -- publish.c: the publish fast path (engine/loop.py) ----------------------------------------- */

int kds_publish_init(PyObject *m);        /* PublishState, Publisher, Delivery */
extern PyMethodDef kds_publish_methods[]; /* publish_due */
/* the Publisher's state as the direct path (direct.c) shares it: each returns -1 with an error set */
int kds_pub_check(PyObject *pub);                                 /* 0: a Publisher */
int kds_pub_room(PyObject *pub, long long max_in_flight);         /* 1: a fast path may produce now */
int kds_pub_count(PyObject *pub, PyObject *topic, long long delta); /* in flight (and to topic) += delta */
int kds_pub_sync(PyObject *pub);                                  /* the topic counts into the state */
int kds_pub_refused(PyObject *pub);                               /* 1: the error set is handed back */
int kds_pub_plain(PyObject *pub, PyObject *key, PyObject *store); /* 1: a success report is plain */
/* a delivered record's lateness (msg's timestamp - due) into lateness, counted early when negative */
int kds_pub_lateness(PyObject *pub, PyObject *msg, long long due, PyObject *lateness);

int kds_pub_lateness_at(PyObject *pub, long long t, long long due, PyObject *lateness); /* the same, at t */

/* A success report as the native producer (producer.c) hands it to the C report callables
 * (Delivery, DirectDelivery, MirrorReport) without a Message object: each one's *_ok serves it as
 * its vectorcall would serve (None, msg), returning 1 taken, 0 not plain (nothing changed: the
 * producer calls it with a report object instead), -1 error. */
typedef struct {
    long long offset, ts; /* where it was written; its timestamp, epoch ms */
    const char *value;    /* the record's value (NULL: null), value_len bytes */
    size_t value_len;
} kds_report_t;
int kds_is_delivery(PyObject *o); /* publish.c: o is a publish_due Delivery */
int kds_delivery_ok(PyObject *d, const kds_report_t *rep);

/* -- producer.c: NativeProducer, librdkafka bound at run time (rdk.h) ------------------------- */

int kds_producer_init(PyObject *m);        /* NativeProducer, DeliveryReport */
extern PyMethodDef kds_producer_methods[]; /* rdk_bind */
/* a record's headers, handed to add one by one (kds_delivery_headers_each, ...): 0 or -1 */
typedef int (*kds_hfill)(void *fctx, kds_hadd add, void *actx);
PyObject *kds_native_producer(PyObject *produce); /* the NativeProducer a bound produce is of, or NULL */
/* produce as NativeProducer.produce(topic, value, key, partition, cb, None, 0, headers) would, the
 * headers from fill (NULL: none) straight into librdkafka's: 0, or -1 with what it would raise */
int kds_np_send(PyObject *np, PyObject *topic, PyObject *value, PyObject *key, long long partition, PyObject *cb,
                kds_hfill fill, void *fctx);

/* -- direct.c: records due on arrival published from the intake (engine/direct.py) ------------ */

int kds_direct_init(PyObject *m); /* DirectPort, DirectDelivery */
/* The run's port (IngestRun.direct) as a DirectPort, NULL for None; -1 with an error otherwise. */
int kds_direct_port(PyObject *o, PyObject **port);
int kds_direct_flying(PyObject *port, uint64_t h);  /* 1: an id under h is in flight, 0: not, -1 */
int kds_direct_ready(PyObject *port);               /* 1: may publish now, 0: store it, -1 */
int kds_direct_holds(PyObject *port);               /* 1: the changelog is on (held puts) */
int kds_direct_sync(PyObject *port);                /* the Publisher's topic counts into its state */
/* publish a request due at arrival: 1 produced, 0 refused (the caller stores it), -1 error. raw:
 * its commit-log bytes, held as its changelog put (NULL when the changelog is off). */
int kds_direct_publish(PyObject *port, PyObject *msg, PyObject *rid, uint64_t h, long long offset, long long due,
                       long long ts, PyObject *topic, long long tpart, PyObject *key, PyObject *value,
                       PyObject *user, PyObject *raw);

int kds_is_direct_delivery(PyObject *o);
int kds_direct_ok(PyObject *d, const kds_report_t *rep);

/* -- firing.c: a delay.every schedule's firing (store/firings.py) ------------------------------ */

/* the headers RECURRING record rec fires with at now, its decision kept in store.firings; NULL
 * without an error: the reference decides (Firings.fire) */
PyObject *kds_fire(PyObject *store, PyObject *ref, PyObject *rec, long long now, PyObject *topic_bytes);
extern PyMethodDef kds_firing_methods[]; /* firing_setup, fire_every, rearm_blob */

/* -- mirror.c: the changelog writes' fast path (engine/changelog.py) ---------------------------- */

int kds_mirror_init(PyObject *m);        /* MirrorReport */
extern PyMethodDef kds_mirror_methods[]; /* mirror_puts, mirror_tombstones, mirror_writes */
int kds_is_mirror_report(PyObject *o);
int kds_mirror_ok(PyObject *r, const kds_report_t *rep);

/* -- the id index's journal records (sidecar/store/idslot.py) ------------------------------------
 * 16 bytes each, the slot layout: (hash, ref) an insert; a remove is two records, the marker
 * (TOMB, 0) then (hash, ref). Every ref bit is some scheduler's (pre-cancels use bit 63, bucket refs
 * bit 62 and the 62 below), so the remove is marked by a hash no id has. kds_jnl_read: the operation
 * at record k of n: its pair in *h, *ref, *remove set for a remove; the records it took (1 or 2),
 * 0 if malformed (a hash below 2 outside a marker, a marker with a ref or without its pair). */
static inline int kds_jnl_read(const uint8_t *rec, uint64_t n, uint64_t k, uint64_t *h, uint64_t *ref, int *remove) {
    uint64_t a, b;
    memcpy(&a, rec + k * 16, 8);
    memcpy(&b, rec + k * 16 + 8, 8);
    if (a >= 2) {
        *h = a, *ref = b, *remove = 0;
        return 1;
    }
    if (a != 1 || b != 0 || k + 1 >= n) return 0;
    memcpy(&a, rec + (k + 1) * 16, 8);
    memcpy(&b, rec + (k + 1) * 16 + 8, 8);
    if (a < 2) return 0;
    *h = a, *ref = b, *remove = 1;
    return 2;
}

/* -1 and the index of the first malformed record in *bad, else 0 */
static inline int kds_jnl_check(const uint8_t *rec, uint64_t n, uint64_t *bad) {
    uint64_t h, ref;
    int rm;
    for (uint64_t k = 0; k < n;) {
        int took = kds_jnl_read(rec, n, k, &h, &ref, &rm);
        if (!took) {
            *bad = k;
            return -1;
        }
        k += (uint64_t)took;
    }
    return 0;
}

#endif
