/* sidecar._native: the per-record byte work of the hot path, in C.
 *
 * Every function here has a pure-Python twin that stays the reference (sidecar/store/codec.py,
 * sidecar/store/idindex.py): the twins are property-tested to give the same bytes and the same
 * answers (tests/unit/test_native.py), and the Python ones run wherever this module cannot be
 * built. What moved here is what the profile of the delivery path showed as Python overhead per
 * record, not logic: record encode/decode with its CRC32C, the header blob, the headers a
 * delivery carries, the id hash (BLAKE2b-64), the id index's probes and the timer wheel's
 * per-entry walks (twins in sidecar/wheel/layout.py) and the level scheduler's (twins in
 * sidecar/levels/queue.py), and the publish side's per-record bookkeeping (publish_due /
 * Delivery; the reference is Sidecar._produce / _on_delivery in sidecar/engine/loop.py, which
 * take every case that is not plain). Control flow, scheduling and durability order stay in
 * Python.
 *
 * Layouts are documented where the Python twins live; this file follows them byte for byte.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * CRC32C (Castagnoli): SSE4.2's crc32 instruction where the CPU has it, else a table. */

static uint32_t crc_table[8][256];
static int have_sse42 = 0;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t crc_sw(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^ crc_table[5][(w >> 16) & 0xff] ^
              crc_table[4][(w >> 24) & 0xff] ^ crc_table[3][(w >> 32) & 0xff] ^ crc_table[2][(w >> 40) & 0xff] ^
              crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = ~crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}
#endif

static uint32_t crc32c(const uint8_t *p, size_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (have_sse42) return crc_hw(0, p, n);
#endif
    return crc_sw(0, p, n);
}

/* ---------------------------------------------------------------------------------------------
 * BLAKE2b with an 8-byte digest and no key (RFC 7693): the id index's hash, the same value as
 * hashlib.blake2b(rid, digest_size=8) read little-endian. */

static const uint64_t b2_iv[8] = {
    0x6A09E667F3BCC908ULL, 0xBB67AE8584CAA73BULL, 0x3C6EF372FE94F82BULL, 0xA54FF53A5F1D36F1ULL,
    0x510E527FADE682D1ULL, 0x9B05688C2B3E6C1FULL, 0x1F83D9ABFB41BD6BULL, 0x5BE0CD19137E2179ULL};
static const uint8_t b2_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

#define ROTR64(x, y) (((x) >> (y)) | ((x) << (64 - (y))))
#define B2G(a, b, c, d, x, y)                \
    do {                                     \
        v[a] = v[a] + v[b] + (x);            \
        v[d] = ROTR64(v[d] ^ v[a], 32);      \
        v[c] = v[c] + v[d];                  \
        v[b] = ROTR64(v[b] ^ v[c], 24);      \
        v[a] = v[a] + v[b] + (y);            \
        v[d] = ROTR64(v[d] ^ v[a], 16);      \
        v[c] = v[c] + v[d];                  \
        v[b] = ROTR64(v[b] ^ v[c], 63);      \
    } while (0)

#define B2ROUND(r)                                                                  \
    do {                                                                            \
        B2G(0, 4, 8, 12, m[b2_sigma[r][0]], m[b2_sigma[r][1]]);                     \
        B2G(1, 5, 9, 13, m[b2_sigma[r][2]], m[b2_sigma[r][3]]);                     \
        B2G(2, 6, 10, 14, m[b2_sigma[r][4]], m[b2_sigma[r][5]]);                    \
        B2G(3, 7, 11, 15, m[b2_sigma[r][6]], m[b2_sigma[r][7]]);                    \
        B2G(0, 5, 10, 15, m[b2_sigma[r][8]], m[b2_sigma[r][9]]);                    \
        B2G(1, 6, 11, 12, m[b2_sigma[r][10]], m[b2_sigma[r][11]]);                  \
        B2G(2, 7, 8, 13, m[b2_sigma[r][12]], m[b2_sigma[r][13]]);                   \
        B2G(3, 4, 9, 14, m[b2_sigma[r][14]], m[b2_sigma[r][15]]);                   \
    } while (0)

static inline uint64_t ld64(const uint8_t *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return w; /* little-endian hosts only: see the check in the module init */
}

static void b2_compress(uint64_t h[8], const uint8_t *block, uint64_t t, int last) {
    uint64_t v[16], m[16];
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = b2_iv[i];
    }
    v[12] ^= t;
    if (last) v[14] = ~v[14];
    for (int i = 0; i < 16; i++) m[i] = ld64(block + 8 * i);
    /* The twelve rounds written out (as RFC 7693's reference code does): with a constant round
     * number every message index is a constant, so m[] stays in registers; a loop over r reads
     * the schedule from memory and ran about twice as slow (gcc -O2 does not unroll it). */
    B2ROUND(0);
    B2ROUND(1);
    B2ROUND(2);
    B2ROUND(3);
    B2ROUND(4);
    B2ROUND(5);
    B2ROUND(6);
    B2ROUND(7);
    B2ROUND(8);
    B2ROUND(9);
    B2ROUND(10);
    B2ROUND(11);
    for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
}

static uint64_t blake2b64(const uint8_t *in, size_t n) {
    uint64_t h[8];
    memcpy(h, b2_iv, sizeof h);
    h[0] ^= 0x01010000ULL ^ 8; /* fanout 1, depth 1, no key, 8-byte digest */
    uint64_t t = 0;
    while (n > 128) { /* the last block, even a full one, is compressed as the final one */
        t += 128;
        b2_compress(h, in, t, 0);
        in += 128;
        n -= 128;
    }
    uint8_t block[128];
    memset(block, 0, sizeof block);
    if (n) memcpy(block, in, n);
    t += n;
    b2_compress(h, block, t, 1);
    return h[0];
}

static inline uint64_t id_hash_of(const uint8_t *p, size_t n) {
    uint64_t h = blake2b64(p, n);
    return h >= 2 ? h : h + 2; /* 0 and 1 mark empty and tombstone slots in the id index */
}

/* ---------------------------------------------------------------------------------------------
 * Module state set by sidecar.store.codec / sidecar.contract at import (setup()). */

static PyObject *CorruptRecord = NULL; /* codec.CorruptRecord */
static PyObject *H_ID, *H_DELIVER_AT, *H_ENQUEUED_AT, *H_SOURCE, *H_RETRY_COUNT; /* header names (str) */

/* ---------------------------------------------------------------------------------------------
 * Record: codec.Record with bytes fields (a C type: built without running Python code). */

typedef struct {
    PyObject_HEAD long long length;
    long long due_ms, enqueue_ms, src_offset;
    int rtype, src_partition, target_partition, retry_count, level;
    PyObject *id, *topic, *key, *value, *headers;
} RecordObject;

static PyTypeObject RecordType;

static void Record_dealloc(RecordObject *r) {
    Py_XDECREF(r->id);
    Py_XDECREF(r->topic);
    Py_XDECREF(r->key);
    Py_XDECREF(r->value);
    Py_XDECREF(r->headers);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static const char *record_fields[] = {"length", "rtype", "due_ms", "enqueue_ms", "src_offset", "src_partition",
                                      "target_partition", "retry_count", "level", "id", "topic", "key", "value",
                                      "headers", NULL};

static PyObject *Record_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    long long length, due, enq, srco;
    int rtype, srcp, tgtp, retry, level;
    PyObject *id, *topic, *key, *value, *headers;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LiLLLiiiiOOOOO:Record", (char **)record_fields, &length, &rtype,
                                     &due, &enq, &srco, &srcp, &tgtp, &retry, &level, &id, &topic, &key, &value,
                                     &headers))
        return NULL;
    RecordObject *r = (RecordObject *)type->tp_alloc(type, 0);
    if (!r) return NULL;
    r->length = length;
    r->rtype = rtype;
    r->due_ms = due;
    r->enqueue_ms = enq;
    r->src_offset = srco;
    r->src_partition = srcp;
    r->target_partition = tgtp;
    r->retry_count = retry;
    r->level = level;
    Py_INCREF(id);
    r->id = id;
    Py_INCREF(topic);
    r->topic = topic;
    Py_INCREF(key);
    r->key = key;
    Py_INCREF(value);
    r->value = value;
    Py_INCREF(headers);
    r->headers = headers;
    return (PyObject *)r;
}

static PyObject *Record_astuple(RecordObject *r) {
    return Py_BuildValue("(LiLLLiiiiOOOOO)", r->length, r->rtype, r->due_ms, r->enqueue_ms, r->src_offset,
                         r->src_partition, r->target_partition, r->retry_count, r->level, r->id, r->topic, r->key,
                         r->value, r->headers);
}

static PyObject *Record_repr(RecordObject *r) {
    return PyUnicode_FromFormat(
        "Record(length=%lld, rtype=%d, due_ms=%lld, enqueue_ms=%lld, src_offset=%lld, src_partition=%d, "
        "target_partition=%d, retry_count=%d, level=%d, id=%R, topic=%R, key=%R, value=%R, headers=%R)",
        r->length, r->rtype, r->due_ms, r->enqueue_ms, r->src_offset, r->src_partition, r->target_partition,
        r->retry_count, r->level, r->id, r->topic, r->key, r->value, r->headers);
}

static PyObject *Record_richcompare(PyObject *a, PyObject *b, int op) {
    if ((op != Py_EQ && op != Py_NE) || !PyObject_TypeCheck(b, &RecordType)) Py_RETURN_NOTIMPLEMENTED;
    PyObject *ta = Record_astuple((RecordObject *)a);
    if (!ta) return NULL;
    PyObject *tb = Record_astuple((RecordObject *)b);
    if (!tb) {
        Py_DECREF(ta);
        return NULL;
    }
    PyObject *res = PyObject_RichCompare(ta, tb, op);
    Py_DECREF(ta);
    Py_DECREF(tb);
    return res;
}

static PyMemberDef Record_members[] = {
    {"length", T_LONGLONG, offsetof(RecordObject, length), READONLY, NULL},
    {"rtype", T_INT, offsetof(RecordObject, rtype), READONLY, NULL},
    {"due_ms", T_LONGLONG, offsetof(RecordObject, due_ms), READONLY, NULL},
    {"enqueue_ms", T_LONGLONG, offsetof(RecordObject, enqueue_ms), READONLY, NULL},
    {"src_offset", T_LONGLONG, offsetof(RecordObject, src_offset), READONLY, NULL},
    {"src_partition", T_INT, offsetof(RecordObject, src_partition), READONLY, NULL},
    {"target_partition", T_INT, offsetof(RecordObject, target_partition), READONLY, NULL},
    {"retry_count", T_INT, offsetof(RecordObject, retry_count), READONLY, NULL},
    {"level", T_INT, offsetof(RecordObject, level), READONLY, NULL},
    {"id", T_OBJECT, offsetof(RecordObject, id), READONLY, NULL},
    {"topic", T_OBJECT, offsetof(RecordObject, topic), READONLY, NULL},
    {"key", T_OBJECT, offsetof(RecordObject, key), READONLY, NULL},
    {"value", T_OBJECT, offsetof(RecordObject, value), READONLY, NULL},
    {"headers", T_OBJECT, offsetof(RecordObject, headers), READONLY, NULL},
    {NULL}};

static PyTypeObject RecordType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sidecar._native.Record",
    .tp_doc = "A decoded commit-log record (codec.Record): byte fields are bytes copies.",
    .tp_basicsize = sizeof(RecordObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Record_new,
    .tp_dealloc = (destructor)Record_dealloc,
    .tp_repr = (reprfunc)Record_repr,
    .tp_richcompare = Record_richcompare,
    .tp_members = Record_members,
    .tp_hash = PyObject_HashNotImplemented,
};

/* ---------------------------------------------------------------------------------------------
 * Record layout (codec.py): 72-byte head, then id | topic | key | value | headers, padded to 8. */

#define HEAD_SIZE 72
#define ALIGN 8
#define VERSION 1
#define FLAG_KEY_NULL 1
#define FLAG_VALUE_NULL 2

static inline uint16_t rd16(const uint8_t *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}
static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline int64_t rd64(const uint8_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline void wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void wr32(uint8_t *p, uint32_t v) {
    memcpy(p, &v, 4);
}
static inline void wr64(uint8_t *p, int64_t v) {
    memcpy(p, &v, 8);
}

/* A new timer-log entry (layout.ENTRY, docs/wheel.md): pending, no next yet, tagged with its index. */
static inline void wl_entry(uint8_t *ent, int64_t due, int64_t loc, int flags, int level, long long idx) {
    wr64(ent, due);
    wr64(ent + 8, loc);
    wr64(ent + 16, -1);
    ent[24] = 0;
    ent[25] = (uint8_t)flags;
    wr16(ent + 26, (uint16_t)(level & 0xFFFF));
    wr32(ent + 28, (uint32_t)(idx & 0xFFFFFFFF));
}

static PyObject *corrupt(const char *fmt, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c) {
    PyObject *msg = PyUnicode_FromFormat(fmt, a, b, c);
    if (msg) {
        PyErr_SetObject(CorruptRecord ? CorruptRecord : PyExc_ValueError, msg);
        Py_DECREF(msg);
    }
    return NULL;
}

static PyObject *bytes_or_none(int null, const uint8_t *p, Py_ssize_t n) {
    if (null) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)p, n);
}

/* decode(buf, offset, limit=None, verify=True) -> Record */
static PyObject *native_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *limit_o = Py_None;
    int verify = 1;
    if (nargs < 2 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "decode(buf, offset, limit=None, verify=True)");
        return NULL;
    }
    if (nargs >= 3) limit_o = args[2];
    if (nargs == 4 && (verify = PyObject_IsTrue(args[3])) < 0) return NULL;
    if (kwnames) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nk; i++) {
            PyObject *k = PyTuple_GET_ITEM(kwnames, i), *v = args[nargs + i];
            if (PyUnicode_CompareWithASCIIString(k, "limit") == 0) {
                limit_o = v;
            } else if (PyUnicode_CompareWithASCIIString(k, "verify") == 0) {
                if ((verify = PyObject_IsTrue(v)) < 0) return NULL;
            } else {
                PyErr_Format(PyExc_TypeError, "decode() got an unexpected keyword argument %R", k);
                return NULL;
            }
        }
    }
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
    if (offset == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL;
    Py_ssize_t end = view.len;
    if (limit_o != Py_None) {
        end = PyLong_AsSsize_t(limit_o);
        if (end == -1 && PyErr_Occurred()) goto done;
    }
    const uint8_t *base = (const uint8_t *)view.buf;
    if (offset < 0 || offset + HEAD_SIZE > end || end > view.len) {
        corrupt("no room for a record header at %zd", offset, 0, 0);
        goto done;
    }
    const uint8_t *p = base + offset;
    uint32_t length = rd32(p), crc = rd32(p + 4), body_len = rd32(p + 12);
    int rtype = p[8], version = p[9], flags = rd16(p + 10);
    if (length == 0) {
        corrupt("end of data at %zd", offset, 0, 0);
        goto done;
    }
    if (length % ALIGN || length < HEAD_SIZE || offset + (Py_ssize_t)length > end || (uint64_t)body_len + 8 > length ||
        (uint64_t)body_len + 8 + ALIGN <= length) {
        corrupt("bad record length %zd at %zd", (Py_ssize_t)length, offset, 0);
        goto done;
    }
    if (version != VERSION || rtype < 1 || rtype > 3) {
        corrupt("bad record type/version %zd/%zd at %zd", rtype, version, offset);
        goto done;
    }
    uint32_t id_len = rd16(p + 52), topic_len = rd16(p + 54), key_len = rd32(p + 56), value_len = rd32(p + 60),
             headers_len = rd32(p + 64);
    if ((uint64_t)HEAD_SIZE - 8 + id_len + topic_len + (uint64_t)key_len + value_len + headers_len != body_len) {
        corrupt("record fields do not add up at %zd", offset, 0, 0);
        goto done;
    }
    if (verify) {
        if (crc32c(p + 8, body_len) != crc) {
            corrupt("CRC mismatch at %zd", offset, 0, 0);
            goto done;
        }
        for (uint32_t i = 8 + body_len; i < length; i++)
            if (p[i]) {
                corrupt("non-zero padding at %zd", offset, 0, 0);
                goto done;
            }
    }
    RecordObject *r = (RecordObject *)RecordType.tp_alloc(&RecordType, 0);
    if (!r) goto done;
    r->length = length;
    r->rtype = rtype;
    r->due_ms = rd64(p + 16);
    r->enqueue_ms = rd64(p + 24);
    r->src_offset = rd64(p + 32);
    r->src_partition = (int32_t)rd32(p + 40);
    r->target_partition = (int32_t)rd32(p + 44);
    r->retry_count = rd16(p + 48);
    r->level = rd16(p + 50);
    const uint8_t *q = p + HEAD_SIZE;
    r->id = PyBytes_FromStringAndSize((const char *)q, id_len);
    q += id_len;
    r->topic = PyBytes_FromStringAndSize((const char *)q, topic_len);
    q += topic_len;
    r->key = bytes_or_none(flags & FLAG_KEY_NULL, q, key_len);
    q += key_len;
    r->value = bytes_or_none(flags & FLAG_VALUE_NULL, q, value_len);
    q += value_len;
    r->headers = PyBytes_FromStringAndSize((const char *)q, headers_len);
    if (!r->id || !r->topic || !r->key || !r->value || !r->headers) {
        Py_DECREF(r);
        goto done;
    }
    result = (PyObject *)r;
done:
    PyBuffer_Release(&view);
    return result;
}

/* The bytes of one optional field: a buffer, or None (null). */
typedef struct {
    Py_buffer view;
    int null, held;
} Field;

static int field_get(PyObject *o, Field *f, int nullable, const char *name) {
    f->held = 0;
    f->null = 0;
    if (o == Py_None) {
        if (!nullable) {
            PyErr_Format(PyExc_TypeError, "%s must be bytes, not None", name);
            return -1;
        }
        f->null = 1;
        f->view.buf = NULL;
        f->view.len = 0;
        return 0;
    }
    if (PyObject_GetBuffer(o, &f->view, PyBUF_SIMPLE) < 0) return -1;
    f->held = 1;
    return 0;
}

static void field_release(Field *f) {
    if (f->held) PyBuffer_Release(&f->view);
    f->held = 0;
}

/* Write one record at dst (room for `length` bytes, checked by the caller). */
static void write_record(uint8_t *dst, uint32_t length, uint32_t body_len, int rtype, int64_t due, int64_t enq,
                         int64_t srco, int32_t srcp, int32_t tgtp, int retry, int level, Field *fs) {
    uint8_t *p = dst;
    p[8] = (uint8_t)rtype;
    p[9] = VERSION;
    wr16(p + 10, (uint16_t)((fs[2].null ? FLAG_KEY_NULL : 0) | (fs[3].null ? FLAG_VALUE_NULL : 0)));
    wr32(p + 12, body_len);
    wr64(p + 16, due);
    wr64(p + 24, enq);
    wr64(p + 32, srco);
    wr32(p + 40, (uint32_t)srcp);
    wr32(p + 44, (uint32_t)tgtp);
    wr16(p + 48, (uint16_t)retry);
    wr16(p + 50, (uint16_t)level);
    wr16(p + 52, (uint16_t)fs[0].view.len);
    wr16(p + 54, (uint16_t)fs[1].view.len);
    wr32(p + 56, (uint32_t)fs[2].view.len);
    wr32(p + 60, (uint32_t)fs[3].view.len);
    wr32(p + 64, (uint32_t)fs[4].view.len);
    wr32(p + 68, 0);
    uint8_t *q = p + HEAD_SIZE;
    for (int i = 0; i < 5; i++) {
        if (fs[i].view.len) memcpy(q, fs[i].view.buf, fs[i].view.len);
        q += fs[i].view.len;
    }
    memset(q, 0, (size_t)(p + length - q));
    wr32(p, length);
    wr32(p + 4, crc32c(p + 8, body_len));
}

/* The arguments of encode/encode_into after the buffer ones:
 * rtype, due_ms, enqueue_ms, src_offset, src_partition, target_partition, retry_count, level,
 * rid, topic, key, value, headers_blob */
typedef struct {
    long long due, enq, srco;
    long rtype, srcp, tgtp, retry, level;
    Field fs[5];
    uint32_t length, body_len;
} EncodeArgs;

static int encode_args(PyObject *const *a, EncodeArgs *e) {
    e->rtype = PyLong_AsLong(a[0]);
    e->due = PyLong_AsLongLong(a[1]);
    e->enq = PyLong_AsLongLong(a[2]);
    e->srco = PyLong_AsLongLong(a[3]);
    e->srcp = PyLong_AsLong(a[4]);
    e->tgtp = PyLong_AsLong(a[5]);
    e->retry = PyLong_AsLong(a[6]);
    e->level = PyLong_AsLong(a[7]);
    if (PyErr_Occurred()) return -1;
    if (e->rtype < 0 || e->rtype > 255 || e->srcp < INT32_MIN || e->srcp > INT32_MAX || e->tgtp < INT32_MIN ||
        e->tgtp > INT32_MAX || e->retry < 0 || e->retry > 0xffff || e->level < 0 || e->level > 0xffff) {
        PyErr_SetString(PyExc_ValueError, "record field out of range");
        return -1;
    }
    static const char *names[5] = {"rid", "topic", "key", "value", "headers_blob"};
    int i;
    for (i = 0; i < 5; i++)
        if (field_get(a[8 + i], &e->fs[i], i == 2 || i == 3, names[i]) < 0) goto fail;
    if (e->fs[0].view.len > 0xffff || e->fs[1].view.len > 0xffff || e->fs[2].view.len > 0xffffffffLL ||
        e->fs[3].view.len > 0xffffffffLL || e->fs[4].view.len > 0xffffffffLL) {
        PyErr_SetString(PyExc_ValueError, "record field too long");
        goto fail;
    }
    uint64_t body = (uint64_t)HEAD_SIZE - 8;
    for (int k = 0; k < 5; k++) body += (uint64_t)e->fs[k].view.len;
    uint64_t length = (8 + body + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
    if (length >= (1ULL << 31)) {
        PyErr_SetString(PyExc_ValueError, "record too large");
        goto fail;
    }
    e->body_len = (uint32_t)body;
    e->length = (uint32_t)length;
    return 0;
fail:
    while (--i >= 0) field_release(&e->fs[i]);
    return -1;
}

static void encode_release(EncodeArgs *e) {
    for (int i = 0; i < 5; i++) field_release(&e->fs[i]);
}

/* encode(rtype, due_ms, ..., headers_blob) -> bytes: codec.encode */
static PyObject *native_encode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "encode() takes 13 positional arguments");
        return NULL;
    }
    EncodeArgs e;
    if (encode_args(args, &e) < 0) return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, e.length);
    if (out)
        write_record((uint8_t *)PyBytes_AS_STRING(out), e.length, e.body_len, (int)e.rtype, e.due, e.enq, e.srco,
                     (int32_t)e.srcp, (int32_t)e.tgtp, (int)e.retry, (int)e.level, e.fs);
    encode_release(&e);
    return out;
}

/* append(buf, offset, limit, rtype, ..., headers_blob) -> int: write the record at buf[offset:]
 * if it ends at or before `limit` and return its length; else write nothing and return minus
 * its length (the caller rolls to a new segment). */
static PyObject *native_append(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 16) {
        PyErr_SetString(PyExc_TypeError, "append() takes 16 positional arguments");
        return NULL;
    }
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]), limit = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) return NULL;
    EncodeArgs e;
    if (encode_args(args + 3, &e) < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) {
        encode_release(&e);
        return NULL;
    }
    PyObject *out = NULL;
    if (offset < 0 || limit > view.len) {
        PyErr_SetString(PyExc_ValueError, "append: offset or limit outside the buffer");
    } else if (offset + (Py_ssize_t)e.length > limit) {
        out = PyLong_FromLong(-(long)e.length);
    } else {
        write_record((uint8_t *)view.buf + offset, e.length, e.body_len, (int)e.rtype, e.due, e.enq, e.srco,
                     (int32_t)e.srcp, (int32_t)e.tgtp, (int)e.retry, (int)e.level, e.fs);
        out = PyLong_FromLong((long)e.length);
    }
    PyBuffer_Release(&view);
    encode_release(&e);
    return out;
}

/* ---------------------------------------------------------------------------------------------
 * Header blob: u16 count, then per header u16 name_len, name, i32 value_len (-1: null), value. */

static PyObject *native_encode_headers(PyObject *self, PyObject *headers) {
    PyObject *seq = PySequence_Fast(headers, "headers must be a sequence of (name, value) pairs");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = NULL;
    if (n > 0xffff) {
        PyErr_SetString(PyExc_ValueError, "more than 65535 headers");
        goto done;
    }
    Py_ssize_t size = 2;
    for (Py_ssize_t i = 0; i < n; i++) { /* first pass: validate and size */
        PyObject *it = items[i];
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 2) {
            PyErr_SetString(PyExc_TypeError, "a header must be a (name, value) tuple");
            goto done;
        }
        Py_ssize_t nl;
        if (!PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(it, 0), &nl)) goto done;
        if (nl > 0xffff) {
            PyErr_SetString(PyExc_ValueError, "header name over 65535 bytes");
            goto done;
        }
        PyObject *v = PyTuple_GET_ITEM(it, 1);
        size += 2 + nl + 4;
        if (v != Py_None) {
            if (!PyBytes_Check(v)) {
                PyErr_SetString(PyExc_TypeError, "a header value must be bytes or None");
                goto done;
            }
            if (PyBytes_GET_SIZE(v) > INT32_MAX) {
                PyErr_SetString(PyExc_ValueError, "header value too long");
                goto done;
            }
            size += PyBytes_GET_SIZE(v);
        }
    }
    out = PyBytes_FromStringAndSize(NULL, size);
    if (!out) goto done;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
    wr16(p, (uint16_t)n);
    p += 2;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = items[i], *v = PyTuple_GET_ITEM(it, 1);
        Py_ssize_t nl;
        const char *name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(it, 0), &nl);
        wr16(p, (uint16_t)nl);
        memcpy(p + 2, name, nl);
        p += 2 + nl;
        if (v == Py_None) {
            wr32(p, 0xffffffffu);
            p += 4;
        } else {
            Py_ssize_t vl = PyBytes_GET_SIZE(v);
            wr32(p, (uint32_t)vl);
            memcpy(p + 4, PyBytes_AS_STRING(v), vl);
            p += 4 + vl;
        }
    }
done:
    Py_DECREF(seq);
    return out;
}

/* Append the headers of blob[0:n] to list `out`. */
static int decode_headers_into(const uint8_t *b, Py_ssize_t n, PyObject *out) {
    if (n == 0) return 0;
    if (n < 2) goto bad;
    Py_ssize_t count = rd16(b), pos = 2;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (pos + 2 > n) goto bad;
        Py_ssize_t nl = rd16(b + pos);
        pos += 2;
        if (pos + nl + 4 > n) goto bad;
        PyObject *name = PyUnicode_DecodeUTF8((const char *)b + pos, nl, NULL);
        if (!name) return -1;
        pos += nl;
        int32_t vl = (int32_t)rd32(b + pos);
        pos += 4;
        PyObject *value;
        if (vl < 0) {
            value = Py_None;
            Py_INCREF(value);
        } else {
            if (pos + vl > n) {
                Py_DECREF(name);
                goto bad;
            }
            value = PyBytes_FromStringAndSize((const char *)b + pos, vl);
            pos += vl;
        }
        if (!value) {
            Py_DECREF(name);
            return -1;
        }
        PyObject *t = PyTuple_New(2);
        if (!t) {
            Py_DECREF(name);
            Py_DECREF(value);
            return -1;
        }
        PyTuple_SET_ITEM(t, 0, name);
        PyTuple_SET_ITEM(t, 1, value);
        int rc = PyList_Append(out, t);
        Py_DECREF(t);
        if (rc < 0) return -1;
    }
    return 0;
bad:
    PyErr_SetString(CorruptRecord ? CorruptRecord : PyExc_ValueError, "header blob is truncated");
    return -1;
}

static PyObject *native_decode_headers(PyObject *self, PyObject *blob) {
    Py_buffer view;
    if (PyObject_GetBuffer(blob, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *out = PyList_New(0);
    if (out && decode_headers_into((const uint8_t *)view.buf, view.len, out) < 0) Py_CLEAR(out);
    PyBuffer_Release(&view);
    return out;
}

static int append_pair(PyObject *out, PyObject *name, PyObject *value) {
    if (!value) return -1;
    PyObject *t = PyTuple_Pack(2, name, value);
    Py_DECREF(value);
    if (!t) return -1;
    int rc = PyList_Append(out, t);
    Py_DECREF(t);
    return rc;
}

/* v in decimal at p, unterminated; returns the length (at most 20). snprintf("%lld") costs ~1k
 * instructions a call, three to four calls per published record. */
static int fmt_ll(char *p, long long v) {
    char tmp[20];
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    int n = 0, k = 0;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) p[k++] = '-';
    while (n) p[k++] = tmp[--n];
    return k;
}

/* delivery_headers(rec, source_topic) -> list: the headers a delivered record carries. The
 * stored ones, then for a MESSAGE delay.id, delay.deliver-at, delay.enqueued-at, delay.source
 * ("<topic>:<partition>:<offset>") and delay.retry-count when > 0 (DESIGN.md 1, outgoing). */
static PyObject *native_delivery_headers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyObject_TypeCheck(args[0], &RecordType) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "delivery_headers(rec: Record, source_topic: bytes)");
        return NULL;
    }
    RecordObject *r = (RecordObject *)args[0];
    if (!H_ID) {
        PyErr_SetString(PyExc_RuntimeError, "sidecar._native.setup() was not called");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    if (decode_headers_into((const uint8_t *)PyBytes_AS_STRING(r->headers), PyBytes_GET_SIZE(r->headers), out) < 0)
        goto fail;
    if (r->rtype == 1) {
        char tmp[48];
        if (append_pair(out, H_ID, (Py_INCREF(r->id), r->id)) < 0) goto fail;
        int n = fmt_ll(tmp, r->due_ms);
        if (append_pair(out, H_DELIVER_AT, PyBytes_FromStringAndSize(tmp, n)) < 0) goto fail;
        n = fmt_ll(tmp, r->enqueue_ms);
        if (append_pair(out, H_ENQUEUED_AT, PyBytes_FromStringAndSize(tmp, n)) < 0) goto fail;
        tmp[0] = ':';
        n = 1 + fmt_ll(tmp + 1, r->src_partition);
        tmp[n++] = ':';
        n += fmt_ll(tmp + n, r->src_offset);
        Py_ssize_t sl = PyBytes_GET_SIZE(args[1]);
        PyObject *source = PyBytes_FromStringAndSize(NULL, sl + n);
        if (source) {
            memcpy(PyBytes_AS_STRING(source), PyBytes_AS_STRING(args[1]), sl);
            memcpy(PyBytes_AS_STRING(source) + sl, tmp, n);
        }
        if (append_pair(out, H_SOURCE, source) < 0) goto fail;
        if (r->retry_count) {
            n = fmt_ll(tmp, r->retry_count);
            if (append_pair(out, H_RETRY_COUNT, PyBytes_FromStringAndSize(tmp, n)) < 0) goto fail;
        }
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * The id index (idindex.py): 16-byte slots (u64 hash, u64 ref) after a header, linear probing. */

#define EMPTY 0
#define TOMB 1

static PyObject *native_id_hash(PyObject *self, PyObject *rid) {
    Py_buffer view;
    if (PyObject_GetBuffer(rid, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint64_t h = id_hash_of((const uint8_t *)view.buf, view.len);
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
    if (hs < 0 || (t->mask & (t->mask + 1)) || (uint64_t)(t->view.len - hs) < (t->mask + 1) * 16) {
        PyBuffer_Release(&t->view);
        PyErr_SetString(PyExc_ValueError, "id index: buffer does not hold the table");
        return -1;
    }
    t->base = (uint8_t *)t->view.buf + hs;
    return 0;
}

static inline uint64_t slot_hash(Table *t, uint64_t i) {
    uint64_t v;
    memcpy(&v, t->base + i * 16, 8);
    return v;
}
static inline uint64_t slot_ref(Table *t, uint64_t i) {
    uint64_t v;
    memcpy(&v, t->base + i * 16 + 8, 8);
    return v;
}

/* idx_find(buf, header_size, mask, h) -> list[int]: every ref stored under h */
static PyObject *native_idx_find(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "idx_find(buf, header_size, mask, h)");
        return NULL;
    }
    Table t;
    if (table_get(args, &t, 0) < 0) return NULL;
    PyObject *out = PyList_New(0);
    for (uint64_t i = t.h & t.mask, n = 0; out && n <= t.mask; i = (i + 1) & t.mask, n++) {
        uint64_t sh = slot_hash(&t, i);
        if (sh == EMPTY) break;
        if (sh == t.h) {
            PyObject *ref = PyLong_FromUnsignedLongLong(slot_ref(&t, i));
            if (!ref || PyList_Append(out, ref) < 0) Py_CLEAR(out);
            Py_XDECREF(ref);
        }
    }
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
        if (sh == EMPTY) break;
        if (sh == t.h && slot_ref(&t, i) == ref) {
            PyBuffer_Release(&t.view);
            return PyLong_FromLong(0);
        }
        if (sh == TOMB && free_slot < 0) free_slot = (int64_t)i;
    }
    if (n > t.mask && free_slot < 0) {
        PyBuffer_Release(&t.view);
        PyErr_SetString(PyExc_RuntimeError, "id index is full");
        return NULL;
    }
    uint64_t at = free_slot >= 0 ? (uint64_t)free_slot : i;
    memcpy(t.base + at * 16, &t.h, 8);
    memcpy(t.base + at * 16 + 8, &ref, 8);
    long long off = (long long)(t.base - (uint8_t *)t.view.buf) + (long long)at * 16;
    PyBuffer_Release(&t.view);
    return PyLong_FromLongLong(free_slot >= 0 ? -off : off);
}

/* idx_remove(buf, header_size, mask, h, ref, scan_off) -> None | (off, tombs, scan_tombs):
 * remove (h, ref). The slot becomes a tombstone, or empty when the probe chain ends right after
 * it, and then the tombstones just before it are emptied too (idindex.py explains why). Returns
 * the removed slot's byte offset and the change in the tombstone count, overall and among the
 * slots below scan_off (the background recount's counted part). */
/* Remove (h, ref) from the table: 1 if found (its byte offset and the tombstone deltas set). */
static int table_remove(Table *t, uint64_t h, uint64_t ref, long long scan_off, long long *off_out,
                        long long *tombs_out, long long *scan_tombs_out) {
    long long hs = (long long)(t->base - (uint8_t *)t->view.buf);
    for (uint64_t i = h & t->mask, n = 0; n <= t->mask; i = (i + 1) & t->mask, n++) {
        uint64_t sh = slot_hash(t, i);
        if (sh == EMPTY) break;
        if (sh != h || slot_ref(t, i) != ref) continue;
        long long off = hs + (long long)i * 16, tombs = 0, scan_tombs = 0;
        uint64_t v;
        if (slot_hash(t, (i + 1) & t->mask) != EMPTY) {
            v = TOMB;
            memcpy(t->base + i * 16, &v, 8);
            tombs = 1;
            scan_tombs = off < scan_off;
        } else {
            v = EMPTY;
            memcpy(t->base + i * 16, &v, 8);
            for (uint64_t j = (i - 1) & t->mask; slot_hash(t, j) == TOMB; j = (j - 1) & t->mask) {
                memcpy(t->base + j * 16, &v, 8);
                tombs -= 1;
                if (hs + (long long)j * 16 < scan_off) scan_tombs -= 1;
            }
        }
        *off_out = off;
        *tombs_out = tombs;
        *scan_tombs_out = scan_tombs;
        return 1;
    }
    return 0;
}

/* idx_remove(buf, header_size, mask, h, ref, scan_off) -> None | (off, tombs, scan_tombs):
 * remove (h, ref). The slot becomes a tombstone, or empty when the probe chain ends right after
 * it, and then the tombstones just before it are emptied too (idindex.py explains why). Returns
 * the removed slot's byte offset and the change in the tombstone count, overall and among the
 * slots below scan_off (the background recount's counted part). */
static PyObject *native_idx_remove(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "idx_remove(buf, header_size, mask, h, ref, scan_off)");
        return NULL;
    }
    uint64_t ref = PyLong_AsUnsignedLongLong(args[4]);
    long long scan_off = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    Table t;
    if (table_get(args, &t, 1) < 0) return NULL;
    long long off, tombs, scan_tombs;
    int found = table_remove(&t, t.h, ref, scan_off, &off, &tombs, &scan_tombs);
    PyBuffer_Release(&t.view);
    if (!found) Py_RETURN_NONE;
    return Py_BuildValue("(LLL)", off, tombs, scan_tombs);
}

/* idx_remove_delivered(buf, header_size, mask, pairs, scan_off) -> (removed, tombs, scan_live,
 * scan_tombs): remove (id_hash(rec.id), ref) for every (ref, rec) of a settled batch, in order;
 * return how many were found and the count deltas (scan_live: removed slots below scan_off). */
static PyObject *native_idx_remove_delivered(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "idx_remove_delivered(buf, header_size, mask, pairs: list, scan_off)");
        return NULL;
    }
    long long scan_off = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    PyObject *targs[4] = {args[0], args[1], args[2], args[1]}; /* h is per pair: any int here */
    Table t;
    if (table_get(targs, &t, 1) < 0) return NULL;
    long long removed = 0, tombs = 0, scan_live = 0, scan_tombs = 0;
    PyObject *pairs = args[3];
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(pairs); k++) {
        PyObject *pair = PyList_GET_ITEM(pairs, k);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyObject_TypeCheck(PyTuple_GET_ITEM(pair, 1), &RecordType)) {
            PyErr_SetString(PyExc_TypeError, "pairs must be (ref, Record) tuples");
            goto fail;
        }
        uint64_t ref = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(pair, 0));
        if (PyErr_Occurred()) goto fail;
        PyObject *rid = ((RecordObject *)PyTuple_GET_ITEM(pair, 1))->id;
        uint64_t h = id_hash_of((const uint8_t *)PyBytes_AS_STRING(rid), PyBytes_GET_SIZE(rid));
        long long off, dt, dst;
        if (table_remove(&t, h, ref, scan_off, &off, &dt, &dst)) {
            removed++;
            tombs += dt;
            scan_tombs += dst;
            scan_live -= off < scan_off;
        }
    }
    PyBuffer_Release(&t.view);
    return Py_BuildValue("(LLLL)", removed, tombs, scan_live, scan_tombs);
fail:
    PyBuffer_Release(&t.view);
    return NULL;
}

/* idx_rehash(old_buf, new_buf, header_size, old_cap, new_mask) -> int: insert every live slot of
 * the old table into the (empty) new one; return how many. The id index's growth, at C speed. */
static PyObject *native_idx_rehash(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "idx_rehash(old_buf, new_buf, header_size, old_cap, new_mask)");
        return NULL;
    }
    Py_ssize_t hs = PyLong_AsSsize_t(args[2]);
    uint64_t cap = PyLong_AsUnsignedLongLong(args[3]), mask = PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer ov, nv;
    if (PyObject_GetBuffer(args[0], &ov, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &nv, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&ov);
        return NULL;
    }
    PyObject *out = NULL;
    if (hs < 0 || (mask & (mask + 1)) || (uint64_t)(ov.len - hs) < cap * 16 ||
        (uint64_t)(nv.len - hs) < (mask + 1) * 16) {
        PyErr_SetString(PyExc_ValueError, "id index: buffer does not hold the table");
        goto done;
    }
    const uint8_t *src = (const uint8_t *)ov.buf + hs;
    uint8_t *dst = (uint8_t *)nv.buf + hs;
    uint64_t live = 0;
    for (uint64_t k = 0; k < cap; k++) {
        uint64_t h, r, e;
        memcpy(&h, src + k * 16, 8);
        if (h <= TOMB) continue;
        memcpy(&r, src + k * 16 + 8, 8);
        if (++live > mask + 1) {
            PyErr_SetString(PyExc_RuntimeError, "id index: the new table is too small");
            goto done;
        }
        uint64_t i = h & mask;
        for (;;) {
            memcpy(&e, dst + i * 16, 8);
            if (e == EMPTY) break;
            i = (i + 1) & mask;
        }
        memcpy(dst + i * 16, &h, 8);
        memcpy(dst + i * 16 + 8, &r, 8);
    }
    out = PyLong_FromUnsignedLongLong(live);
done:
    PyBuffer_Release(&ov);
    PyBuffer_Release(&nv);
    return out;
}

/* ---------------------------------------------------------------------------------------------
 * parse_request: the common ingress request, parsed without Python code (headers.py has the
 * full parser, which stays the only authority). It answers only for a record whose control
 * headers are among delay.target-topic (a target already checked and accepted), delay.ms or
 * delay.deliver-at (one at most), delay.target-partition and delay.id, each once, with a
 * non-empty ASCII value, strict decimal numbers and everything in range; then its answer is the
 * one the full parser gives. Anything else (a cancel, a level, a retry, the kafka-message-
 * scheduler headers, any fault at all) returns None, and the caller runs the full parser. */

static PyObject *control_codes = NULL; /* dict: control header name -> code (0: not handled here) */
static PyObject *MODE_NOW, *MODE_MS, *MODE_AT;
#define C_TOPIC 1
#define C_MS 2
#define C_AT 3
#define C_PARTITION 4
#define C_ID 5
#define MAX_EPOCH_MS 253402300799999LL

/* strict decimal: 1..18 ASCII digits (headers.py's _int fast case) */
static int digits(PyObject *v, long long *out) {
    Py_ssize_t n = PyBytes_GET_SIZE(v);
    const char *p = PyBytes_AS_STRING(v);
    if (n < 1 || n > 18) return 0;
    long long x = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        x = x * 10 + (p[i] - '0');
    }
    *out = x;
    return 1;
}

static int ascii_nonempty(PyObject *v) {
    if (!PyBytes_Check(v) || PyBytes_GET_SIZE(v) == 0) return 0;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(v);
    for (Py_ssize_t i = 0, n = PyBytes_GET_SIZE(v); i < n; i++)
        if (p[i] & 0x80) return 0;
    return 1;
}

/* The parsed common request (parse_core). topic and user are new references, rid and mode
 * borrowed (rid: the delay.id value, or NULL). */
typedef struct {
    PyObject *topic, *rid, *mode, *user;
    long long partition, due;
} Request;

/* The last target topic parse_core checked (ingest_run keeps one per call, and releases it): the
 * same bytes give the same str, already found in checked_targets, without a decode and a set
 * lookup per record. Both are strong references (the headers they came from are freed). */
typedef struct {
    PyObject *bytes, *str;
} TopicMemo;

#define PARSE_MAX_HEADERS 64 /* more headers: the full parser (they are remembered on the stack) */

/* parse_request's work: 1 and *out filled for the common request, 0 for any other (the full
 * parser answers), -1 with an exception set. `memo` may be NULL. */
static int parse_core(PyObject *headers, long long ts, long long now, long long size, long long max_bytes,
                      long long max_delay, PyObject *checked, TopicMemo *memo, Request *out) {
    if (!control_codes) {
        PyErr_SetString(PyExc_RuntimeError, "sidecar._native.setup_parser() was not called");
        return -1;
    }
    PyObject *found[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    unsigned char control[PARSE_MAX_HEADERS];
    Py_ssize_t n = 0;
    PyObject **items = NULL;
    if (headers != Py_None) {
        if (!PyList_Check(headers) && !PyTuple_Check(headers)) return 0;
        n = PySequence_Fast_GET_SIZE(headers);
        items = PySequence_Fast_ITEMS(headers);
    }
    if (n > PARSE_MAX_HEADERS) return 0;
    Py_ssize_t n_user = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = items[i];
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 2) return 0;
        PyObject *name = PyTuple_GET_ITEM(it, 0), *value = PyTuple_GET_ITEM(it, 1);
        if (!PyUnicode_CheckExact(name)) return 0;
        size += PyUnicode_GET_LENGTH(name);
        if (value != Py_None) {
            if (!PyBytes_Check(value)) return 0;
            size += PyBytes_GET_SIZE(value);
        }
        PyObject *code_o = PyDict_GetItemWithError(control_codes, name);
        control[i] = code_o != NULL;
        if (!code_o) {
            if (PyErr_Occurred()) return -1;
            n_user++;
            continue;
        }
        long code = PyLong_AsLong(code_o);
        if (code <= 0 || code > 5 || found[code] || !ascii_nonempty(value)) return 0;
        found[code] = value;
    }
    if (size > max_bytes || !found[C_TOPIC] || (found[C_MS] && found[C_AT])) return 0;
    PyObject *tb = found[C_TOPIC], *topic;
    if (memo && memo->bytes && PyBytes_GET_SIZE(memo->bytes) == PyBytes_GET_SIZE(tb) &&
        !memcmp(PyBytes_AS_STRING(memo->bytes), PyBytes_AS_STRING(tb), PyBytes_GET_SIZE(tb))) {
        topic = Py_NewRef(memo->str);
    } else {
        topic = PyUnicode_DecodeASCII(PyBytes_AS_STRING(tb), PyBytes_GET_SIZE(tb), NULL);
        if (!topic) return -1;
        int known = PySet_Contains(checked, topic);
        if (known <= 0) {
            Py_DECREF(topic);
            return known;
        }
        if (memo) {
            Py_XSETREF(memo->bytes, Py_NewRef(tb));
            Py_XSETREF(memo->str, Py_NewRef(topic));
        }
    }
    long long partition = -1, due = ts, x = 0;
    PyObject *mode = MODE_NOW;
    int ok = 1;
    if (found[C_PARTITION]) ok = digits(found[C_PARTITION], &partition) && partition <= 1000000;
    if (ok && found[C_ID]) ok = PyBytes_GET_SIZE(found[C_ID]) <= 255;
    if (ok && found[C_MS]) {
        ok = digits(found[C_MS], &x);
        due = ts + x;
        mode = MODE_MS;
    } else if (ok && found[C_AT]) {
        ok = digits(found[C_AT], &x);
        due = x;
        mode = MODE_AT;
    }
    if (ok) ok = due <= MAX_EPOCH_MS && due - (now > ts ? now : ts) <= max_delay;
    if (!ok) {
        Py_DECREF(topic);
        return 0;
    }
    PyObject *user = PyTuple_New(n_user);
    if (!user) {
        Py_DECREF(topic);
        return -1;
    }
    for (Py_ssize_t i = 0, k = 0; i < n; i++) {
        if (control[i]) continue;
        Py_INCREF(items[i]);
        PyTuple_SET_ITEM(user, k++, items[i]);
    }
    out->topic = topic;
    out->rid = found[C_ID];
    out->mode = mode;
    out->user = user;
    out->partition = partition;
    out->due = due;
    return 1;
}

/* parse_request(headers, ts, now, size, max_record_bytes, max_delay_ms, checked_targets)
 *   -> None | (target_topic, target_partition, id | None, due_ms, mode, user_headers)
 * `size` is the key and value bytes; the headers are counted here (len(name) + len(value)). */
static PyObject *native_parse_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "parse_request(headers, ts, now, size, max_record_bytes, max_delay_ms, "
                                         "checked_targets)");
        return NULL;
    }
    long long ts = PyLong_AsLongLong(args[1]), now = PyLong_AsLongLong(args[2]), size = PyLong_AsLongLong(args[3]),
              max_bytes = PyLong_AsLongLong(args[4]), max_delay = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    Request r;
    int rc = parse_core(args[0], ts, now, size, max_bytes, max_delay, args[6], NULL, &r);
    if (rc < 0) return NULL;
    if (rc == 0) Py_RETURN_NONE;
    return Py_BuildValue("(NLOLON)", r.topic, r.partition, r.rid ? r.rid : Py_None, r.due, r.mode, r.user);
}

/* setup_parser(codes): {control header name: code}, 1 target topic, 2 delay.ms, 3 deliver-at,
 * 4 target partition, 5 id, 0 any other control header (headers.py owns the names). */
static PyObject *native_setup_parser(PyObject *self, PyObject *codes) {
    if (!PyDict_Check(codes)) {
        PyErr_SetString(PyExc_TypeError, "setup_parser(codes: dict[str, int])");
        return NULL;
    }
    Py_INCREF(codes);
    Py_XSETREF(control_codes, codes);
    if (!MODE_NOW) {
        MODE_NOW = PyUnicode_InternFromString("now");
        MODE_MS = PyUnicode_InternFromString("ms");
        MODE_AT = PyUnicode_InternFromString("at");
        if (!MODE_NOW || !MODE_MS || !MODE_AT) return NULL;
    }
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------------
 * crc32c(data) -> int: exposed for the tests (the same checksum the records carry). */

static PyObject *native_crc32c(PyObject *self, PyObject *data) {
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c = crc32c((const uint8_t *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *native_crc32c_software(PyObject *self, PyObject *data) {
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c = crc_sw(0, (const uint8_t *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

/* setup(corrupt_record, id, deliver_at, enqueued_at, source, retry_count): the exception class
 * decode raises and the outgoing header names, from codec.py and contract.py (one definition). */
static PyObject *native_setup(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "setup(CorruptRecord, id, deliver_at, enqueued_at, source, retry_count)");
        return NULL;
    }
    for (int i = 1; i < 6; i++)
        if (!PyUnicode_Check(args[i])) {
            PyErr_SetString(PyExc_TypeError, "header names must be str");
            return NULL;
        }
    PyObject **slots[6] = {&CorruptRecord, &H_ID, &H_DELIVER_AT, &H_ENQUEUED_AT, &H_SOURCE, &H_RETRY_COUNT};
    for (int i = 0; i < 6; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(*slots[i], args[i]);
    }
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------------
 * Timer wheel (sidecar/wheel/layout.py): the intake's fixed-size writes into the mmapped timer
 * log and slot file, in one call instead of four struct calls. The Python twin, wl_link in
 * layout.py, is the reference. Entry: due i64 | loc i64 | next i64 | 0 u8 | flags u8 |
 * level u16 | tag u32; its state u8 in the file's state array (below). Slot: time i64 | first i64 |
 * last i64 | count u32 | min_off u16 | 0 u16. */

#define WL_SIZE 32
#define WL_PENDING 0
#define WL_CANCELLED 1
#define WL_DONE 2
#define WL_DROPPED 3
#define WL_LATE 1
#define WL_BUCKET_BIT (1LL << 62)
/* A timer-log file keeps its entries' states apart from the entries (layout.py): nent state bytes
 * after the header, then the entries. Every function here takes hs = the byte offset of the file's
 * first ENTRY (header + nent), so entry x is at hs + (x - f0) * WL_SIZE and its state byte at
 * hs - nent + (x - f0). */
#define WL_STATE_OFF(hs, nent, f0, x) ((hs) - (nent) + ((x) - (f0)))

/* wl_link(tl_buf, hs, tl_first, nent, idx, due, loc, flags, level, slot_buf, slot_off,
 * slot_time) -> int: write entry idx (pending, no next, tagged) into the timer-log file whose
 * first index is tl_first, and append it to the chain of the slot at slot_off that starts at
 * slot_time. Returns -1 if the slot held no such chain (it now holds idx alone), else the
 * chain's previous tail, whose link was patched here when it lives in the same file
 * (tail >= tl_first); the caller patches one in an older file, and records what is dirty. */
static PyObject *native_wl_link(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError,
                        "wl_link(tl_buf, hs, tl_first, nent, idx, due, loc, flags, level, slot_buf, slot_off, "
                        "slot_time)");
        return NULL;
    }
    long long hs = PyLong_AsLongLong(args[1]), first = PyLong_AsLongLong(args[2]), nent = PyLong_AsLongLong(args[3]);
    long long idx = PyLong_AsLongLong(args[4]), due = PyLong_AsLongLong(args[5]), loc = PyLong_AsLongLong(args[6]);
    long flags = PyLong_AsLong(args[7]), level = PyLong_AsLong(args[8]);
    long long soff = PyLong_AsLongLong(args[10]), stime = PyLong_AsLongLong(args[11]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer tv, sv;
    if (PyObject_GetBuffer(args[0], &tv, PyBUF_WRITABLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[9], &sv, PyBUF_WRITABLE) < 0) {
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
 * file, 3 next entry needs the caller. */


static inline long long floordiv64(long long a, long long b) {
    long long q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

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

/* wl_send(buf, hs, f0, nent, lst, i, e, last, base, o, nxt, after, room, budget, vlim, pend)
 * -> (why, i, e, after, nxt, budget, room, lo, hi) */
static PyObject *native_wl_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 16 || !PyList_Check(args[15])) {
        PyErr_SetString(PyExc_TypeError,
                        "wl_send(buf, hs, f0, nent, lst, i, e, last, base, o, nxt, after, room, budget, vlim, pend)");
        return NULL;
    }
    WalkBufs w;
    w.hs = PyLong_AsLongLong(args[1]);
    w.f0 = PyLong_AsLongLong(args[2]);
    w.nent = PyLong_AsLongLong(args[3]);
    long long i = PyLong_AsLongLong(args[5]), e = PyLong_AsLongLong(args[6]), last = PyLong_AsLongLong(args[7]);
    long long base = PyLong_AsLongLong(args[8]), o = PyLong_AsLongLong(args[9]), nxt = PyLong_AsLongLong(args[10]);
    long long after = PyLong_AsLongLong(args[11]), room = PyLong_AsLongLong(args[12]);
    long long budget = PyLong_AsLongLong(args[13]), vlim = PyLong_AsLongLong(args[14]);
    if (PyErr_Occurred()) return NULL;
    PyObject *pend = args[15];
    if (walk_open(&w, args[0], args[4], 1) < 0) return NULL;
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
    out = Py_BuildValue("(iLLLLLLLL)", why, i, e, after, nxt, budget, room, lo, hi);
fail:
    walk_close(&w);
    return out;
}

/* flush a run of releases in one commit-log segment into segs */
static int seg_add(PyObject *segs, long long g, long long c) {
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

/* wl_done(buf, hs, f0, nent, lst, i, e, last, base, o, nxt, after, budget, seg_bytes, segs, blocs)
 * -> (why, i, e, after, nxt, budget, passed) */
static PyObject *native_wl_done(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 16 || !PyDict_Check(args[14]) || !PyList_Check(args[15])) {
        PyErr_SetString(PyExc_TypeError,
                        "wl_done(buf, hs, f0, nent, lst, i, e, last, base, o, nxt, after, budget, seg_bytes, segs, blocs)");
        return NULL;
    }
    WalkBufs w;
    w.hs = PyLong_AsLongLong(args[1]);
    w.f0 = PyLong_AsLongLong(args[2]);
    w.nent = PyLong_AsLongLong(args[3]);
    long long i = PyLong_AsLongLong(args[5]), e = PyLong_AsLongLong(args[6]), last = PyLong_AsLongLong(args[7]);
    long long base = PyLong_AsLongLong(args[8]), o = PyLong_AsLongLong(args[9]), nxt = PyLong_AsLongLong(args[10]);
    long long after = PyLong_AsLongLong(args[11]), budget = PyLong_AsLongLong(args[12]);
    long long seg_bytes = PyLong_AsLongLong(args[13]);
    if (PyErr_Occurred()) return NULL;
    if (seg_bytes <= 0) {
        PyErr_SetString(PyExc_ValueError, "wl_done: segment size must be positive");
        return NULL;
    }
    PyObject *segs = args[14], *blocs = args[15];
    if (walk_open(&w, args[0], args[4], 0) < 0) return NULL;
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
                    if (seg_add(segs, run_g, run_c) < 0) goto fail;
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
    if (seg_add(segs, run_g, run_c) < 0) goto fail;
    out = Py_BuildValue("(iLLLLLL)", why, i, e, after, nxt, budget, passed);
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

/* wl_ack(buf, hs, f0, nent, refs, j, head, P, s_k, s_o, s_after, l_sent, wait_a, wait_b)
 * -> (j, lo, hi, wake) */
static PyObject *native_wl_ack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 14 || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "wl_ack(buf, hs, f0, nent, refs, j, head, P, s_k, s_o, s_after, l_sent, wait_a, wait_b)");
        return NULL;
    }
    long long hs = PyLong_AsLongLong(args[1]), f0 = PyLong_AsLongLong(args[2]), nent = PyLong_AsLongLong(args[3]);
    Py_ssize_t j = PyLong_AsSsize_t(args[5]);
    long long head = PyLong_AsLongLong(args[6]), P = PyLong_AsLongLong(args[7]), s_k = PyLong_AsLongLong(args[8]);
    long long s_o = PyLong_AsLongLong(args[9]), s_after = PyLong_AsLongLong(args[10]);
    long long l_sent = PyLong_AsLongLong(args[11]), wa = PyLong_AsLongLong(args[12]), wb = PyLong_AsLongLong(args[13]);
    if (PyErr_Occurred()) return NULL;
    if (P <= 0 || j < 0 || nent <= 0 || hs < nent) {
        PyErr_SetString(PyExc_ValueError, "wl_ack: bad precision, position or file geometry");
        return NULL;
    }
    Py_buffer tv;
    if (PyObject_GetBuffer(args[0], &tv, PyBUF_WRITABLE) < 0) return NULL;
    PyObject *refs = args[4], *out = NULL;
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
    out = Py_BuildValue("(nLLO)", j, lo, hi, wake ? Py_True : Py_False);
done:
    PyBuffer_Release(&tv);
    return out;
}

/* ---------------------------------------------------------------------------------------------
 * Intake fast path (sidecar/store/partition.py, PartitionStore.ingest_many): the common consumed
 * record stored and scheduled in one C loop over the consumer's Message list. The Python path
 * (Sidecar._ingest -> PartitionStore.ingest_fields) is the reference: this loop handles a record
 * only when that path would run its plain branch (no error, this store's partition, a request the
 * fast parser accepts, no id-index entry under its id's hash, a plan, room in the current commit-
 * log segment, the scheduler's plain append, no index growth), with every check made before the
 * first write; at the first other record it stops and returns its index, and Python runs that one
 * through the reference path. The state the Python objects keep (log head, counts, cursors, dirty
 * ranges) travels in the int64 array `st` (layout: the IN_* indexes, mirrored in partition.py). */

#define IN_KIND 0
#define IN_HEAD 1
#define IN_SB 2
#define IN_HS 3
#define IN_NEXT 4
#define IN_MAXB 5
#define IN_MAXD 6
#define IN_IMASK 7
#define IN_ILIVE 8
#define IN_ITOMBS 9
#define IN_ISCAN 10
#define IN_ISCAN_LIVE 11
#define IN_ISCAN_TOMBS 12
#define IN_SCHED 16
/* wheel */
#define IN_W_P 16
#define IN_W_N 17
#define IN_W_LATE_BELOW 18
#define IN_W_SK 19
#define IN_W_SO 20
#define IN_W_GUARD 21
#define IN_W_HEAD 22
#define IN_W_PF 23
#define IN_W_F0 24
#define IN_W_APP_LO 25
#define IN_W_APP_HI 26
#define IN_W_SD_LO 27
#define IN_W_SD_HI 28
#define IN_W_MARK_LO 29
#define IN_W_MARK_HI 30
#define IN_W_WIDTH 31
#define IN_W_LHEAD 32
#define IN_W_LTAIL 33
#define IN_W_NEW 34 /* slot chains started here (occ_send flags set): the scheduler's search memo is stale */
#define IN_W_SIZE 35
/* levels: per level L, IN_L_BASE + IN_L_STRIDE * L + (write, first, dirty_from, dirty_to, ms) */
#define IN_L_COUNT 16
#define IN_L_PER_FILE 17
#define IN_L_BASE 24
#define IN_L_STRIDE 5
#define IN_L_ENTRY 24
#define IN_MIN_DUE (-(1LL << 62))
#define IN_MAX_DUE ((1LL << 62) - 1)

static PyObject *S_error, *S_partition, *S_timestamp, *S_offset, *S_key, *S_value, *S_headers;

static int in_names(void) {
    if (S_error) return 0;
    S_error = PyUnicode_InternFromString("error");
    S_partition = PyUnicode_InternFromString("partition");
    S_timestamp = PyUnicode_InternFromString("timestamp");
    S_offset = PyUnicode_InternFromString("offset");
    S_key = PyUnicode_InternFromString("key");
    S_value = PyUnicode_InternFromString("value");
    S_headers = PyUnicode_InternFromString("headers");
    return (S_error && S_partition && S_timestamp && S_offset && S_key && S_value && S_headers) ? 0 : -1;
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

/* The message accessors ingest_run calls, in this order. For the last message type seen, their
 * method descriptors (a C type's methods) are looked up once and called directly: a call by name
 * looks the method up in the type's dictionary each time, seven times per record. A type whose
 * accessors are anything else (a Python class in a test) is called by name. */
enum { M_ERROR, M_PARTITION, M_TIMESTAMP, M_OFFSET, M_KEY, M_VALUE, M_HEADERS, M_COUNT };
static PyTypeObject *in_type = NULL; /* strong reference */
static PyObject *in_descr[M_COUNT];  /* NULL: call by name */

static PyObject *in_name(int k) {
    PyObject *names[M_COUNT] = {S_error, S_partition, S_timestamp, S_offset, S_key, S_value, S_headers};
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

/* m.<accessor k>(), raising what it raises */
static PyObject *msg_call(PyObject *m, int k) {
    if (in_names() < 0) return NULL;
    if (Py_TYPE(m) != in_type) in_learn(Py_TYPE(m));
    return in_descr[k] ? PyObject_Vectorcall(in_descr[k], &m, 1, NULL) : PyObject_CallMethodNoArgs(m, in_name(k));
}

static PyObject *in_call(PyObject *m, int k) {
    PyObject *r = msg_call(m, k);
    if (!r) PyErr_Clear(); /* the reference path calls it again and raises */
    return r;
}

/* ingest_run(msgs, start, now, partition, id_prefix, checked_targets, no_headers, seg_buf, idx_buf,
 *            st, sched_bufs) -> int: see above. sched_bufs: wheel (tl_buf | None, slot_buf,
 * occ_send, occ_done, by_range: the buckets not fully linked yet); levels: a tuple of each level's current queue file buffer (or None). */
static PyObject *native_ingest_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "ingest_run(msgs, start, now, partition, id_prefix, checked_targets, "
                                         "no_headers, seg_buf, idx_buf, st, sched_bufs)");
        return NULL;
    }
    if (in_names() < 0) return NULL;
    TopicMemo memo = {NULL, NULL};
    PyObject *msgs = args[0], *prefix = args[4], *checked = args[5], *no_headers = args[6], *sbufs = args[10];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    long long now = PyLong_AsLongLong(args[2]), partition = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (!PyList_Check(msgs) || !PyBytes_Check(prefix) || !PyBytes_Check(no_headers) || !PyTuple_Check(sbufs) ||
        PyBytes_GET_SIZE(prefix) > 200) {
        PyErr_SetString(PyExc_TypeError, "ingest_run: bad argument types");
        return NULL;
    }
    Py_buffer stv, segv, idxv;
    if (PyObject_GetBuffer(args[9], &stv, PyBUF_WRITABLE | PyBUF_FORMAT) < 0) return NULL;
    if (stv.itemsize != 8 || stv.len < (Py_ssize_t)(8 * IN_L_BASE)) {
        PyBuffer_Release(&stv);
        PyErr_SetString(PyExc_ValueError, "ingest_run: st must be an int64 array");
        return NULL;
    }
    int64_t *st = (int64_t *)stv.buf;
    Py_ssize_t nst = stv.len / 8;
    int kind = (int)st[IN_KIND];
    Py_ssize_t i = start, n = PyList_GET_SIZE(msgs);
    int have_seg = 0, have_idx = 0, nbuf = 0;
    Py_buffer bufs[64];
    uint8_t *bp[64];
    Py_ssize_t blen[64];
    PyObject *result = NULL;
    if (args[7] != Py_None) {
        if (PyObject_GetBuffer(args[7], &segv, PyBUF_WRITABLE) < 0) goto fail;
        have_seg = 1;
    }
    if (PyObject_GetBuffer(args[8], &idxv, PyBUF_WRITABLE) < 0) goto fail;
    have_idx = 1;
    Py_ssize_t nsb = PyTuple_GET_SIZE(sbufs);
    if (nsb > 64 || (kind == 0 && (nsb != 5 || nst < IN_W_SIZE || !PyDict_Check(PyTuple_GET_ITEM(sbufs, 4)))) ||
        (kind == 1 && (nsb != st[IN_L_COUNT] || nst < IN_L_BASE + IN_L_STRIDE * nsb)) || kind < 0 || kind > 1) {
        PyErr_SetString(PyExc_ValueError, "ingest_run: scheduler buffers do not match the state");
        goto fail;
    }
    for (; nbuf < nsb; nbuf++) {
        PyObject *b = PyTuple_GET_ITEM(sbufs, nbuf);
        if (b == Py_None || (kind == 0 && nbuf == 4)) {
            bp[nbuf] = NULL;
            blen[nbuf] = 0;
            bufs[nbuf].obj = NULL;
            continue;
        }
        if (PyObject_GetBuffer(b, &bufs[nbuf], PyBUF_WRITABLE) < 0) goto fail;
        bp[nbuf] = (uint8_t *)bufs[nbuf].buf;
        blen[nbuf] = bufs[nbuf].len;
    }
    const long long hs = st[IN_HS], sb = st[IN_SB], maxb = st[IN_MAXB], maxd = st[IN_MAXD];
    const uint64_t mask = (uint64_t)st[IN_IMASK];
    if (hs < 0 || sb <= hs || (have_seg && segv.len < sb) || (mask & (mask + 1)) ||
        (uint64_t)(idxv.len - hs) < (mask + 1) * 16) {
        PyErr_SetString(PyExc_ValueError, "ingest_run: log or index buffer does not match the state");
        goto fail;
    }
    uint8_t *ibase = (uint8_t *)idxv.buf + hs;
    for (; i < n && have_seg; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        PyObject *err = NULL, *po = NULL, *tso = NULL, *offo = NULL, *key = NULL, *value = NULL, *headers = NULL;
        PyObject *blob = NULL;
        Request req;
        int ok = 0, parsed = 0;
        long long part, ts_type, ts, offset;
        /* -- every check, before the first write ---------------------------------------------- */
        if (!(err = in_call(m, M_ERROR)) || err != Py_None) goto next;
        if (!(po = in_call(m, M_PARTITION)) || !in_ll(po, &part) || part != partition) goto next;
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
        int prc = parse_core(headers, ts, now, size, maxb, maxd, checked, &memo, &req);
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
            rlen += fmt_ll(ridbuf + rlen, offset);
            rid = ridbuf;
        }
        uint64_t h = id_hash_of((const uint8_t *)rid, rlen);
        /* id index: no entry under h (else the duplicate / pre-cancel checks), no growth due */
        if ((st[IN_ILIVE] + st[IN_ITOMBS] + 1) * 2 > (long long)(mask + 1)) goto next;
        int64_t free_slot = -1;
        uint64_t at = h & mask, probes = 0;
        for (;; at = (at + 1) & mask, probes++) {
            uint64_t sh;
            if (probes > mask) goto next;
            memcpy(&sh, ibase + at * 16, 8);
            if (sh == EMPTY) break;
            if (sh == h) goto next;
            if (sh == TOMB && free_slot < 0) free_slot = (int64_t)at;
        }
        if (free_slot >= 0) at = (uint64_t)free_slot;
        /* plan */
        long long level = 0;
        if (kind == 0) {
            if (due < IN_MIN_DUE || due > IN_MAX_DUE) goto next;
        } else if (mode != MODE_NOW) {
            long long delay = due - ts, nl = st[IN_L_COUNT] - 1;
            if (delay > 0) {
                long long lo = 0, hi = nl; /* bisect_left over levels_ms */
                while (lo < hi) {
                    long long mid = (lo + hi) / 2;
                    if (st[IN_L_BASE + IN_L_STRIDE * (mid + 1) + 4] < delay)
                        lo = mid + 1;
                    else
                        hi = mid;
                }
                if (lo >= nl) goto next; /* beyond the last level: rejected by the reference path */
                level = lo + 1;
                due = ts + st[IN_L_BASE + IN_L_STRIDE * level + 4];
            }
        }
        /* the record: fits the rest of the current segment */
        if (PyTuple_GET_SIZE(user)) {
            if (!(blob = native_encode_headers(NULL, user))) {
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
        long long head = st[IN_HEAD], soff_log = head % sb;
        if (head < 0 || soff_log < hs || length >= (1ULL << 31) || soff_log + (long long)length > sb) goto next;
        if (tpart < INT32_MIN || tpart > INT32_MAX) goto next;
        /* the scheduler's plain append */
        long long ref = 0;
        if (kind == 0) {
            long long P = st[IN_W_P], N = st[IN_W_N], kd = floordiv64(due, P), sk = st[IN_W_SK], so = st[IN_W_SO];
            if (kd < st[IN_W_LATE_BELOW] || kd < sk || (kd == sk && so >= 0 && so > due - kd * P)) {
                /* already due (its slot is behind the reader): a LATE entry at the tail of the late
                   chain, as add -> _link(_LATE) does; the reference patches a tail in an older file */
                long long idx = st[IN_W_HEAD], pf = st[IN_W_PF], f0 = idx - idx % pf, lt = st[IN_W_LTAIL];
                long long ths = hs + pf; /* the file's entries follow its state bytes */
                if (f0 != st[IN_W_F0] || !bp[0] || ths + (idx - f0 + 1) * WL_SIZE > blen[0]) goto next;
                if (lt != -1 && (lt < f0 || lt >= idx)) goto next;
                write_record((uint8_t *)segv.buf + soff_log, (uint32_t)length, (uint32_t)body, 1, due, ts, offset,
                             (int32_t)partition, (int32_t)tpart, 0, 0, fs);
                wl_entry(bp[0] + ths + (idx - f0) * WL_SIZE, due, head, WL_LATE, 0, idx);
                bp[0][hs + (idx - f0)] = WL_PENDING;
                if (st[IN_W_APP_LO] < 0) st[IN_W_APP_LO] = idx;
                st[IN_W_APP_HI] = idx + 1;
                if (lt == -1) {
                    st[IN_W_LHEAD] = idx;
                } else { /* TimerLog.set_next: patched and marked for flush whatever the range */
                    long long moff_e = ths + (lt - f0) * WL_SIZE;
                    wr64(bp[0] + moff_e + 16, idx);
                    if (st[IN_W_MARK_LO] < 0 || moff_e < st[IN_W_MARK_LO]) st[IN_W_MARK_LO] = moff_e;
                    if (moff_e + WL_SIZE > st[IN_W_MARK_HI]) st[IN_W_MARK_HI] = moff_e + WL_SIZE;
                }
                st[IN_W_LTAIL] = idx;
                st[IN_W_HEAD] = idx + 1;
                ref = idx;
                goto stored;
            }
            if (kd >= st[IN_W_GUARD] + N) goto next;
            PyObject *by_range = PyTuple_GET_ITEM(sbufs, 4);
            if (PyDict_GET_SIZE(by_range)) { /* its bucket is not fully linked yet: the reference joins it */
                long long w = st[IN_W_WIDTH], r = due % w;
                if (r < 0) r += w;
                PyObject *bk = Py_BuildValue("(LL)", due - r, w);
                int in = bk ? PyDict_Contains(by_range, bk) : -1;
                Py_XDECREF(bk);
                if (in != 0) {
                    PyErr_Clear();
                    goto next;
                }
            }
            long long idx = st[IN_W_HEAD], pf = st[IN_W_PF], f0 = idx - idx % pf, ths = hs + pf;
            if (f0 != st[IN_W_F0] || !bp[0] || ths + (idx - f0 + 1) * WL_SIZE > blen[0]) goto next;
            long long pos = kd % N;
            if (pos < 0) pos += N;
            long long soff = hs + pos * WL_SIZE, stime = kd * P, moff = due - stime;
            if (!bp[1] || soff + WL_SIZE > blen[1] || pos >= blen[2] || pos >= blen[3] || moff < 0 || moff > 0xFFFF)
                goto next;
            uint8_t *slot = bp[1] + soff;
            int64_t t = rd64(slot), last = rd64(slot + 16);
            uint32_t count = rd32(slot + 24);
            if (count == 0xFFFFFFFF) goto next;
            int linked = count && t == stime;
            if (linked && (last < f0 || last >= idx)) goto next; /* the old tail is in an older file */
            /* -- writes: log, timer log + slot, id index ---------------------------------------- */
            write_record((uint8_t *)segv.buf + soff_log, (uint32_t)length, (uint32_t)body, 1, due, ts, offset,
                         (int32_t)partition, (int32_t)tpart, 0, 0, fs);
            wl_entry(bp[0] + ths + (idx - f0) * WL_SIZE, due, head, 0, 0, idx);
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
                st[IN_W_NEW]++;
            }
            if (soff < st[IN_W_SD_LO] || st[IN_W_SD_LO] < 0) st[IN_W_SD_LO] = soff;
            if (soff + WL_SIZE > st[IN_W_SD_HI]) st[IN_W_SD_HI] = soff + WL_SIZE;
            st[IN_W_HEAD] = idx + 1;
            ref = idx;
        } else {
            int64_t *lv = st + IN_L_BASE + IN_L_STRIDE * level;
            long long idx = lv[0], first = lv[1], pf = st[IN_L_PER_FILE];
            if (first < 0 || idx < first || idx >= first + pf || !bp[level] ||
                hs + (idx - first + 1) * IN_L_ENTRY > blen[level])
                goto next;
            write_record((uint8_t *)segv.buf + soff_log, (uint32_t)length, (uint32_t)body, 1, due, ts, offset,
                         (int32_t)partition, (int32_t)tpart, 0, (int)level, fs);
            uint8_t *ent = bp[level] + hs + (idx - first) * IN_L_ENTRY;
            wr64(ent, head);
            wr64(ent + 8, due);
            memset(ent + 16, 0, 8);
            if (lv[2] < 0 || idx < lv[2]) lv[2] = idx;
            if (idx + 1 > lv[3]) lv[3] = idx + 1;
            lv[0] = idx + 1;
            ref = (level << 48) | idx;
        }
    stored:
        st[IN_HEAD] = head + (long long)length;
        memcpy(ibase + at * 16, &h, 8);
        memcpy(ibase + at * 16 + 8, &ref, 8);
        long long ioff = hs + (long long)at * 16, scan = st[IN_ISCAN];
        if (free_slot >= 0) {
            st[IN_ITOMBS]--;
            if (ioff < scan) st[IN_ISCAN_TOMBS]--;
        }
        if (ioff < scan) st[IN_ISCAN_LIVE]++;
        st[IN_ILIVE]++;
        st[IN_NEXT] = offset + 1;
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
        }
        Py_XDECREF(blob);
        if (!ok) break;
    }
    result = PyLong_FromSsize_t(i);
fail:
    Py_XDECREF(memo.bytes);
    Py_XDECREF(memo.str);
    while (--nbuf >= 0)
        if (bufs[nbuf].obj) PyBuffer_Release(&bufs[nbuf]);
    if (have_idx) PyBuffer_Release(&idxv);
    if (have_seg) PyBuffer_Release(&segv);
    PyBuffer_Release(&stv);
    return result;
}

/* ---------------------------------------------------------------------------------------------
 * Delay levels (sidecar/levels/queue.py): the dequeue's walk over one queue file (lv_due) and
 * the batch ack with the done cursor's advance (lv_ack); the Python twins there are the
 * reference and say what each returns. Queue entry (24 bytes): log_pos u64 | due i64 | state u8 |
 * 7 zero bytes. An entry in [done, send) is finished exactly when its state is not PENDING, so
 * the done cursor reads the state bytes; releases are counted per commit-log segment in segs. */

#define LV_SIZE 24
#define LV_PENDING 0
#define LV_DELIVERED 1
#define LV_IDX_BITS 48
#define LV_IDX_MASK ((1LL << LV_IDX_BITS) - 1)

static PyObject *LV_BUF = NULL; /* "buf": the MappedFile attribute holding the mapping */

/* One mapped file held for the length of a call: the buffer of files[first] (a MappedFile's
 * buf, or a commit-log segment's), re-fetched when the walk moves to another file. */
typedef struct {
    long long first;
    int have;
    Py_buffer v;
} LvFile;

static void lv_file_release(LvFile *f) {
    if (f->have) PyBuffer_Release(&f->v);
    f->have = 0;
}

/* Hold the buffer of files[key] in f. Returns 1 if held, 0 if files has no such key (no error
 * set), -1 on error. */
static int lv_file_get(LvFile *f, PyObject *files, long long key, int writable) {
    if (f->have && f->first == key) return 1;
    lv_file_release(f);
    if (!LV_BUF && !(LV_BUF = PyUnicode_InternFromString("buf"))) return -1;
    PyObject *k = PyLong_FromLongLong(key);
    if (!k) return -1;
    PyObject *mf = PyDict_GetItemWithError(files, k);
    Py_DECREF(k);
    if (!mf) return PyErr_Occurred() ? -1 : 0;
    PyObject *mv = PyObject_GetAttr(mf, LV_BUF);
    if (!mv) return -1;
    int rc = PyObject_GetBuffer(mv, &f->v, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE);
    Py_DECREF(mv);
    if (rc < 0) return -1;
    f->have = 1;
    f->first = key;
    return 1;
}

/* run-length count of releases per segment, flushed into segs with seg_add */
typedef struct {
    long long g, c;
} LvRun;

static inline int lv_release(LvRun *r, PyObject *segs, uint64_t pos, long long seg_bytes) {
    if (pos == 0) return 0; /* NO_POS: a dropped entry releases nothing */
    long long g = (long long)(pos / (uint64_t)seg_bytes);
    if (r->c && g != r->g) {
        if (seg_add(segs, r->g, r->c) < 0) return -1;
        r->c = 0;
    }
    r->g = g;
    r->c++;
    return 0;
}

/* The record at commit-log position pos, decoded from its segment (seg caches the segment's
 * buffer between calls): a new reference; NULL with no exception set when the caller must read it
 * itself (the segment is gone, or the record does not decode: CommitLog.read raises for it as it
 * always did); NULL with an exception on error. */
static PyObject *log_decode_at(LvFile *seg, PyObject *segments, long long seg_bytes, uint64_t pos) {
    int got = lv_file_get(seg, segments, (long long)(pos / (uint64_t)seg_bytes), 0);
    if (got <= 0) return NULL;
    PyObject *o = PyLong_FromUnsignedLongLong(pos % (uint64_t)seg_bytes);
    if (!o) return NULL;
    PyObject *dargs[4] = {seg->v.obj, o, Py_None, Py_False};
    PyObject *rec = native_decode(NULL, dargs, 4, NULL);
    Py_DECREF(o);
    if (!rec && CorruptRecord && PyErr_ExceptionMatches(CorruptRecord)) PyErr_Clear();
    return rec;
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
    LvFile segs2[2] = {{0}, {0}};
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
        PyObject *rec = log_decode_at(&segs2[use], segments, seg_bytes, (uint64_t)loc);
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
    lv_file_release(&segs2[0]);
    lv_file_release(&segs2[1]);
    return res;
}

/* lv_due(buf, hs, f0, idx, stop, now, restored, done, room, ref_hi, segments, seg_bytes, segs,
 * out) -> (why, idx, done, room) */
static PyObject *native_lv_due(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 14 || !PyDict_Check(args[10]) || !PyDict_Check(args[12]) || !PyList_Check(args[13])) {
        PyErr_SetString(PyExc_TypeError,
                        "lv_due(buf, hs, f0, idx, stop, now, restored, done, room, ref_hi, segments, seg_bytes, segs, out)");
        return NULL;
    }
    long long hs = PyLong_AsLongLong(args[1]), f0 = PyLong_AsLongLong(args[2]), idx = PyLong_AsLongLong(args[3]);
    long long stop = PyLong_AsLongLong(args[4]), now = PyLong_AsLongLong(args[5]);
    long long restored = PyLong_AsLongLong(args[6]), done = PyLong_AsLongLong(args[7]);
    long long room = PyLong_AsLongLong(args[8]), ref_hi = PyLong_AsLongLong(args[9]);
    long long seg_bytes = PyLong_AsLongLong(args[11]);
    if (PyErr_Occurred()) return NULL;
    if (seg_bytes <= 0) {
        PyErr_SetString(PyExc_ValueError, "lv_due: segment size must be positive");
        return NULL;
    }
    PyObject *segments = args[10], *segs = args[12], *out = args[13], *res = NULL;
    Py_buffer qv;
    if (PyObject_GetBuffer(args[0], &qv, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *qb = (const uint8_t *)qv.buf;
    LvFile seg = {0};
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
            PyObject *rec = log_decode_at(&seg, segments, seg_bytes, pos);
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
    if (seg_add(segs, run.g, run.c) < 0) goto fail;
    run.c = 0;
    res = Py_BuildValue("(iLLL)", why, idx, done, room);
fail:
    if (!res && run.c) {
        /* keep what was counted: the caller releases segs even when this raises */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        (void)seg_add(segs, run.g, run.c);
        PyErr_Restore(et, ev, tb);
    }
    lv_file_release(&seg);
    PyBuffer_Release(&qv);
    return res;
}

/* the entry idx of a level: its bytes in f (files: the level's {first: MappedFile}); NULL with an
 * error set if its file is missing (KeyError, as LevelQueue._locate) */
static uint8_t *lv_entry(LvFile *f, PyObject *files, long long per_file, long long hs, long long idx) {
    long long first = idx - idx % per_file;
    int got = lv_file_get(f, files, first, 1);
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
    LvFile *fs = PyMem_Calloc(nlv ? nlv : 1, sizeof(LvFile));
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
    if (seg_add(segs, run.g, run.c) < 0) goto fail;
    run.c = 0;
    res = Py_NewRef(Py_None);
fail:
    if (!res && run.c) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        (void)seg_add(segs, run.g, run.c);
        PyErr_Restore(et, ev, tb);
    }
    for (Py_ssize_t n = 0; n < nlv; n++) lv_file_release(&fs[n]);
    PyMem_Free(fs);
    PyBuffer_Release(&cv);
    return res;
}

/* ---------------------------------------------------------------------------------------------
 * The publish fast path (engine/loop.py: Sidecar._produce and Sidecar._on_delivery are the
 * reference). ``publish_due`` produces a due batch with the client's bound ``produce``; each record
 * gets a ``Delivery`` as its delivery-report callable. Both read and write the loop's state where
 * the Python code keeps it, the Sidecar's instance dict (in_flight, topic_in_flight, troubled,
 * broker_up, stores, lateness_batch, counters), so the two paths can interleave record by record.
 * The two in-flight counts are the exception: C keeps its changes to them in the Publisher and
 * adds them to the dict at ``sync`` (a read, a new int and a write per record and count cost
 * about 4 % of the loop thread). ``publish_due`` syncs before it returns, and the loop syncs
 * after every producer poll (Sidecar._poll), so Python reads exact counts everywhere outside a
 * poll; inside one, a delivery report of the reference path subtracts its own record from counts
 * that still include the C reports' records, never reaching zero early.
 * Anything not plain goes back to Python: a record not due yet (the never-early check), a troubled
 * target, a refused produce (BufferError / KafkaException, handed back to the caller), a failed
 * delivery, a revoked partition, the broker marked down. */

static PyObject *S_in_flight, *S_topic_in_flight, *S_troubled, *S_broker_up, *S_stores, *S_lateness_batch,
    *S_counters, *S_early, *S_acked, *S_timestamp, *S_topic_bytes, *S_partition;

typedef struct {
    PyObject_HEAD PyObject *state; /* the Sidecar's __dict__ */
    PyObject *on_delivery;         /* Sidecar._on_delivery (bound): the reference path */
    PyObject *refused;             /* exception types a produce call hands back, not raises */
    PyObject *topic_b, *topic_s;   /* the last target topic, bytes and str (one decode per topic) */
    long long pend_in_flight;      /* not yet added to state["in_flight"] (sync) */
    PyObject *pend_topic;          /* the topic whose pend_tif is not yet in state["topic_in_flight"] */
    long long pend_tif;
} PublisherObject;

static int Publisher_traverse(PublisherObject *p, visitproc visit, void *arg) {
    Py_VISIT(p->state);
    Py_VISIT(p->on_delivery);
    Py_VISIT(p->refused);
    return 0;
}

static int Publisher_clear(PublisherObject *p) {
    Py_CLEAR(p->state);
    Py_CLEAR(p->on_delivery);
    Py_CLEAR(p->refused);
    Py_CLEAR(p->topic_b);
    Py_CLEAR(p->topic_s);
    Py_CLEAR(p->pend_topic);
    return 0;
}

static void Publisher_dealloc(PublisherObject *p) {
    PyObject_GC_UnTrack(p);
    Publisher_clear(p);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyObject *Publisher_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *state, *on_delivery, *refused;
    if (!PyArg_ParseTuple(args, "O!OO:Publisher", &PyDict_Type, &state, &on_delivery, &refused)) return NULL;
    PublisherObject *p = (PublisherObject *)type->tp_alloc(type, 0);
    if (!p) return NULL;
    Py_INCREF(state);
    p->state = state;
    Py_INCREF(on_delivery);
    p->on_delivery = on_delivery;
    Py_INCREF(refused);
    p->refused = refused;
    return (PyObject *)p;
}


typedef struct {
    PyObject_HEAD PublisherObject *pub;
    PyObject *ref, *rec, *store, *topic, *partition;
    vectorcallfunc vectorcall;
} DeliveryObject;

static void Delivery_dealloc(DeliveryObject *d) {
    Py_XDECREF(d->pub);
    Py_XDECREF(d->ref);
    Py_XDECREF(d->rec);
    Py_XDECREF(d->store);
    Py_XDECREF(d->topic);
    Py_XDECREF(d->partition);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

/* state[name] (a KeyError as an AttributeError would be: the Sidecar always has these) */
static PyObject *state_get(PyObject *state, PyObject *name) {
    PyObject *v = PyDict_GetItemWithError(state, name);
    if (!v && !PyErr_Occurred()) PyErr_SetObject(PyExc_AttributeError, name);
    return v; /* borrowed */
}

/* state[name] += delta for an int */
static int state_add(PyObject *d, PyObject *name, long long delta) {
    PyObject *v = state_get(d, name);
    if (!v) return -1;
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    PyObject *nv = PyLong_FromLongLong(x + delta);
    if (!nv) return -1;
    int rc = PyDict_SetItem(d, name, nv);
    Py_DECREF(nv);
    return rc;
}

/* topic_in_flight[topic] += 1, or -= 1 and gone at 0 (a missing key is a KeyError, as in Python) */
static int tif_add(PyObject *state, PyObject *topic, long long delta) {
    PyObject *tif = state_get(state, S_topic_in_flight);
    if (!tif) return -1;
    if (!PyDict_Check(tif)) {
        PyErr_SetString(PyExc_TypeError, "topic_in_flight is not a dict");
        return -1;
    }
    PyObject *v = PyDict_GetItemWithError(tif, topic);
    long long x = 0;
    if (v) {
        x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred()) return -1;
    } else if (PyErr_Occurred()) {
        return -1;
    } else if (delta < 0) {
        PyErr_SetObject(PyExc_KeyError, topic);
        return -1;
    }
    x += delta;
    if (x == 0) return PyDict_DelItem(tif, topic);
    PyObject *nv = PyLong_FromLongLong(x);
    if (!nv) return -1;
    int rc = PyDict_SetItem(tif, topic, nv);
    Py_DECREF(nv);
    return rc;
}

/* Add the pending topic count to state["topic_in_flight"]. */
static int pub_sync_tif(PublisherObject *p) {
    if (!p->pend_topic) return 0;
    long long d = p->pend_tif;
    PyObject *topic = p->pend_topic;
    p->pend_topic = NULL;
    p->pend_tif = 0;
    int rc = d ? tif_add(p->state, topic, d) : 0;
    Py_DECREF(topic);
    return rc;
}

/* Both pending counts into the state dict. */
static int pub_sync(PublisherObject *p) {
    long long d = p->pend_in_flight;
    p->pend_in_flight = 0;
    if (d && state_add(p->state, S_in_flight, d) < 0) {
        p->pend_in_flight = d;
        return -1;
    }
    return pub_sync_tif(p);
}

/* topic_in_flight[topic] += delta, pending; a change of topic syncs the previous one. */
static int pub_tif(PublisherObject *p, PyObject *topic, long long delta) {
    if (p->pend_topic != topic) {
        if (pub_sync_tif(p) < 0) return -1;
        Py_INCREF(topic);
        p->pend_topic = topic;
    }
    p->pend_tif += delta;
    return 0;
}

static PyObject *Publisher_sync(PublisherObject *p, PyObject *Py_UNUSED(ignored)) {
    if (pub_sync(p) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Publisher_methods[] = {
    {"sync", (PyCFunction)Publisher_sync, METH_NOARGS,
     "Add the in-flight counts the C path changed to the loop's state (after every producer poll)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PublisherType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sidecar._native.Publisher",
    .tp_doc = "Publisher(state, on_delivery, refused): the loop state publish_due and its Delivery reports use.",
    .tp_basicsize = sizeof(PublisherObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Publisher_new,
    .tp_dealloc = (destructor)Publisher_dealloc,
    .tp_traverse = (traverseproc)Publisher_traverse,
    .tp_clear = (inquiry)Publisher_clear,
    .tp_methods = Publisher_methods,
};

/* The delivery report: the common success in C, everything else through Sidecar._on_delivery. */
static PyObject *Delivery_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    DeliveryObject *d = (DeliveryObject *)self;
    if (PyVectorcall_NARGS(nargsf) != 2 || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "Delivery(err, msg)");
        return NULL;
    }
    PyObject *err = args[0], *msg = args[1], *state = d->pub->state;
    PyObject *troubled = state_get(state, S_troubled);
    if (!troubled) return NULL;
    PyObject *broker_up = state_get(state, S_broker_up);
    if (!broker_up) return NULL;
    PyObject *stores = state_get(state, S_stores);
    if (!stores) return NULL;
    PyObject *current = NULL;
    if (PyDict_Check(stores)) {
        current = PyDict_GetItemWithError(stores, d->partition);
        if (!current && PyErr_Occurred()) return NULL;
    }
    if (err != Py_None || !PyDict_Check(troubled) || PyDict_GET_SIZE(troubled) || broker_up != Py_True ||
        current != d->store) {
        PyObject *a[7] = {d->ref, d->rec, d->store, Py_None, d->topic, err, msg};
        return PyObject_Vectorcall(d->pub->on_delivery, a, 7, NULL);
    }
    PublisherObject *pub = d->pub;
    pub->pend_in_flight--;
    if (pub_tif(pub, d->topic, -1) < 0) return NULL;
    PyObject *ts = msg_call(msg, M_TIMESTAMP); /* the delivered Message is the consumed ones' type */
    if (!ts) return NULL;
    long long t = -1;
    if (PyTuple_Check(ts) && PyTuple_GET_SIZE(ts) == 2) {
        t = PyLong_AsLongLong(PyTuple_GET_ITEM(ts, 1));
    } else {
        PyErr_SetString(PyExc_TypeError, "msg.timestamp() is not a (type, ms) pair");
    }
    Py_DECREF(ts);
    if (t == -1 && PyErr_Occurred()) return NULL;
    long long lateness = t - ((RecordObject *)d->rec)->due_ms;
    if (lateness < 0) {
        PyObject *counters = state_get(state, S_counters);
        if (!counters) return NULL;
        PyObject *early = PyObject_GetAttr(counters, S_early);
        if (!early) return NULL;
        long long e = PyLong_AsLongLong(early);
        Py_DECREF(early);
        if (e == -1 && PyErr_Occurred()) return NULL;
        PyObject *ne = PyLong_FromLongLong(e + 1);
        if (!ne) return NULL;
        int rc = PyObject_SetAttr(counters, S_early, ne);
        Py_DECREF(ne);
        if (rc < 0) return NULL;
    }
    PyObject *batch = state_get(state, S_lateness_batch);
    if (!batch) return NULL;
    PyObject *lv = PyLong_FromLongLong(lateness);
    if (!lv) return NULL;
    int rc = PyList_Check(batch) ? PyList_Append(batch, lv) : -1;
    Py_DECREF(lv);
    if (rc < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "lateness_batch is not a list");
        return NULL;
    }
    PyObject *acked = PyObject_GetAttr(d->store, S_acked);
    if (!acked) return NULL;
    PyObject *pair = PyTuple_Pack(2, d->ref, d->rec);
    rc = pair && PyList_Check(acked) ? PyList_Append(acked, pair) : -1;
    Py_XDECREF(pair);
    Py_DECREF(acked);
    if (rc < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "store.acked is not a list");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyTypeObject DeliveryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sidecar._native.Delivery",
    .tp_doc = "The delivery-report callable of a record produced by publish_due.",
    .tp_basicsize = sizeof(DeliveryObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_dealloc = (destructor)Delivery_dealloc,
    .tp_vectorcall_offset = offsetof(DeliveryObject, vectorcall),
    .tp_call = PyVectorcall_Call,
};

/* rec.topic.decode(), the same str object while the topic does not change */
static PyObject *topic_str(PublisherObject *p, PyObject *b) {
    if (p->topic_b && (p->topic_b == b || (PyBytes_GET_SIZE(p->topic_b) == PyBytes_GET_SIZE(b) &&
                                           !memcmp(PyBytes_AS_STRING(p->topic_b), PyBytes_AS_STRING(b),
                                                   PyBytes_GET_SIZE(b))))) {
        Py_INCREF(p->topic_s);
        return p->topic_s;
    }
    PyObject *s = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b), NULL);
    if (!s) return NULL;
    Py_INCREF(b);
    Py_XSETREF(p->topic_b, b);
    Py_INCREF(s);
    Py_XSETREF(p->topic_s, s);
    return s;
}

/* publish_due(pub, produce, batch, i, store, now) -> (j, refused)
 *
 * Produces batch[i:] ((ref, Record) pairs from the scheduler's due) while each is plain: due at
 * ``now`` (re-checked here, never early) and no target troubled. Stops at the first record that is
 * not (j: the caller runs Sidecar._produce on it) or whose produce raised one of ``refused``
 * (returned, j: that record; nothing was counted for it); j == len(batch) when all went. */
static PyObject *native_publish_due(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyObject_TypeCheck(args[0], &PublisherType) || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "publish_due(pub: Publisher, produce, batch: list, i, store, now)");
        return NULL;
    }
    PublisherObject *pub = (PublisherObject *)args[0];
    PyObject *produce = args[1], *batch = args[2], *store = args[4], *state = pub->state;
    Py_ssize_t i = PyLong_AsSsize_t(args[3]);
    long long now = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (!H_ID) {
        PyErr_SetString(PyExc_RuntimeError, "sidecar._native.setup() was not called");
        return NULL;
    }
    if (pub_sync(pub) < 0) return NULL;
    PyObject *topic_bytes = PyObject_GetAttr(store, S_topic_bytes);
    if (!topic_bytes) return NULL;
    PyObject *partition = PyObject_GetAttr(store, S_partition), *refused = NULL;
    if (!partition || !PyBytes_Check(topic_bytes)) {
        if (partition) PyErr_SetString(PyExc_TypeError, "store.topic_bytes is not bytes");
        goto fail;
    }
    PyObject *zero = PyLong_FromLong(0);
    Py_DECREF(zero); /* a cached small int: stays alive */
    for (; i < PyList_GET_SIZE(batch); i++) {
        PyObject *pair = PyList_GET_ITEM(batch, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "publish_due: batch items are (ref, Record) pairs");
            goto fail;
        }
        PyObject *ref = PyTuple_GET_ITEM(pair, 0), *recobj = PyTuple_GET_ITEM(pair, 1);
        if (!PyObject_TypeCheck(recobj, &RecordType)) break;
        RecordObject *rec = (RecordObject *)recobj;
        if (rec->due_ms > now || !PyBytes_Check(rec->topic)) break;
        PyObject *troubled = state_get(state, S_troubled);
        if (!troubled) goto fail;
        if (!PyDict_Check(troubled) || PyDict_GET_SIZE(troubled)) break;
        PyObject *topic = topic_str(pub, rec->topic);
        if (!topic) goto fail;
        PyObject *hargs[2] = {recobj, topic_bytes};
        PyObject *headers = native_delivery_headers(NULL, hargs, 2);
        DeliveryObject *cb = headers ? PyObject_New(DeliveryObject, &DeliveryType) : NULL;
        PyObject *tp = cb ? PyLong_FromLong(rec->target_partition) : NULL;
        if (cb) {
            cb->vectorcall = Delivery_vectorcall;
            Py_INCREF(pub);
            cb->pub = pub;
            Py_INCREF(ref);
            cb->ref = ref;
            Py_INCREF(recobj);
            cb->rec = recobj;
            Py_INCREF(store);
            cb->store = store;
            Py_INCREF(topic);
            cb->topic = topic;
            Py_INCREF(partition);
            cb->partition = partition;
        }
        PyObject *res = NULL;
        if (tp) {
            /* positional, in the client's order: topic, value, key, partition, callback,
             * on_delivery (alias, unused), timestamp (0: now), headers */
            PyObject *a[8] = {topic, rec->value, rec->key, tp, (PyObject *)cb, Py_None, zero, headers};
            res = PyObject_Vectorcall(produce, a, 8, NULL);
        }
        Py_XDECREF(tp);
        Py_XDECREF((PyObject *)cb);
        Py_XDECREF(headers);
        if (!res) {
            Py_DECREF(topic);
            if (!PyErr_ExceptionMatches(pub->refused)) goto fail;
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb && value) PyException_SetTraceback(value, tb);
            Py_XDECREF(type);
            Py_XDECREF(tb);
            refused = value;
            break;
        }
        Py_DECREF(res);
        pub->pend_in_flight++;
        int rc = pub_tif(pub, topic, 1);
        Py_DECREF(topic);
        if (rc < 0) goto fail;
    }
    Py_DECREF(topic_bytes);
    Py_DECREF(partition);
    if (pub_sync(pub) < 0) {
        Py_XDECREF(refused);
        return NULL;
    }
    PyObject *out = Py_BuildValue("(nO)", i, refused ? refused : Py_None);
    Py_XDECREF(refused);
    return out;
fail:
    Py_DECREF(topic_bytes);
    Py_XDECREF(partition);
    { /* the records produced before the failure are in flight: count them */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (pub_sync(pub) < 0) PyErr_Clear();
        PyErr_Restore(et, ev, tb);
    }
    return NULL;
}

static int publish_init(PyObject *m) {
    static const char *names[] = {"in_flight", "topic_in_flight", "troubled", "broker_up", "stores",
                                  "lateness_batch", "counters", "early", "acked", "timestamp",
                                  "topic_bytes", "partition"};
    PyObject **slots[] = {&S_in_flight, &S_topic_in_flight, &S_troubled, &S_broker_up, &S_stores,
                          &S_lateness_batch, &S_counters, &S_early, &S_acked, &S_timestamp,
                          &S_topic_bytes, &S_partition};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (!(*slots[k] = PyUnicode_InternFromString(names[k]))) return -1;
    if (PyType_Ready(&PublisherType) < 0 || PyType_Ready(&DeliveryType) < 0) return -1;
    Py_INCREF(&PublisherType);
    if (PyModule_AddObject(m, "Publisher", (PyObject *)&PublisherType) < 0) {
        Py_DECREF(&PublisherType);
        return -1;
    }
    Py_INCREF(&DeliveryType);
    if (PyModule_AddObject(m, "Delivery", (PyObject *)&DeliveryType) < 0) {
        Py_DECREF(&DeliveryType);
        return -1;
    }
    return 0;
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))native_setup, METH_FASTCALL, NULL},
    {"decode", (PyCFunction)(void (*)(void))native_decode, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"encode", (PyCFunction)(void (*)(void))native_encode, METH_FASTCALL, NULL},
    {"append", (PyCFunction)(void (*)(void))native_append, METH_FASTCALL, NULL},
    {"encode_headers", native_encode_headers, METH_O, NULL},
    {"decode_headers", native_decode_headers, METH_O, NULL},
    {"delivery_headers", (PyCFunction)(void (*)(void))native_delivery_headers, METH_FASTCALL, NULL},
    {"id_hash", native_id_hash, METH_O, NULL},
    {"idx_find", (PyCFunction)(void (*)(void))native_idx_find, METH_FASTCALL, NULL},
    {"idx_put", (PyCFunction)(void (*)(void))native_idx_put, METH_FASTCALL, NULL},
    {"idx_remove", (PyCFunction)(void (*)(void))native_idx_remove, METH_FASTCALL, NULL},
    {"idx_remove_delivered", (PyCFunction)(void (*)(void))native_idx_remove_delivered, METH_FASTCALL, NULL},
    {"idx_rehash", (PyCFunction)(void (*)(void))native_idx_rehash, METH_FASTCALL, NULL},
    {"parse_request", (PyCFunction)(void (*)(void))native_parse_request, METH_FASTCALL, NULL},
    {"setup_parser", native_setup_parser, METH_O, NULL},
    {"wl_link", (PyCFunction)(void (*)(void))native_wl_link, METH_FASTCALL, NULL},
    {"wl_send", (PyCFunction)(void (*)(void))native_wl_send, METH_FASTCALL, NULL},
    {"wl_read", (PyCFunction)(void (*)(void))native_wl_read, METH_FASTCALL, NULL},
    {"wl_done", (PyCFunction)(void (*)(void))native_wl_done, METH_FASTCALL, NULL},
    {"wl_group", (PyCFunction)(void (*)(void))native_wl_group, METH_FASTCALL, NULL},
    {"wl_ack", (PyCFunction)(void (*)(void))native_wl_ack, METH_FASTCALL, NULL},
    {"ingest_run", (PyCFunction)(void (*)(void))native_ingest_run, METH_FASTCALL, NULL},
    {"lv_due", (PyCFunction)(void (*)(void))native_lv_due, METH_FASTCALL, NULL},
    {"lv_ack", (PyCFunction)(void (*)(void))native_lv_ack, METH_FASTCALL, NULL},
    {"publish_due", (PyCFunction)(void (*)(void))native_publish_due, METH_FASTCALL, NULL},
    {"crc32c", native_crc32c, METH_O, NULL},
    {"crc32c_software", native_crc32c_software, METH_O, NULL},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "sidecar._native",
                                       "The hot path's per-record byte work in C (see the file header).", -1,
                                       methods};

PyMODINIT_FUNC PyInit__native(void) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "sidecar._native needs a little-endian host");
        return NULL;
    }
    crc_init();
    if (PyType_Ready(&RecordType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    Py_INCREF(&RecordType);
    if (PyModule_AddObject(m, "Record", (PyObject *)&RecordType) < 0) {
        Py_DECREF(&RecordType);
        Py_DECREF(m);
        return NULL;
    }
    if (publish_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "HARDWARE_CRC", have_sse42);
    return m;
}
