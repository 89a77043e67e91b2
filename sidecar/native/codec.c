/* sidecar._native, codec core: the commit-log record (encode, append, decode: the Record type), the
 * header blob, the headers a delivery carries, and a record read straight from its log segment.
 * Twins: sidecar/store/codec.py, the reference (same bytes, same answers and errors). */
#include "native.h"

/* ---------------------------------------------------------------------------------------------
 * Module state set by sidecar.store.codec / sidecar.contract at import (setup()). */

static PyObject *CorruptRecord = NULL; /* codec.CorruptRecord */
static PyObject *H_ID, *H_DELIVER_AT, *H_ENQUEUED_AT, *H_SOURCE, *H_RETRY_COUNT; /* header names (str) */

/* ---------------------------------------------------------------------------------------------
 * Record: codec.Record with bytes fields (a C type: built without running Python code). */

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
    if ((op != Py_EQ && op != Py_NE) || !PyObject_TypeCheck(b, &kds_RecordType)) Py_RETURN_NOTIMPLEMENTED;
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

PyTypeObject kds_RecordType = {
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
    if (version != VERSION || rtype < REC_MESSAGE || rtype > REC_RECURRING) {
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
        if (kds_crc32c(p + 8, body_len) != crc) {
            corrupt("CRC mismatch at %zd", offset, 0, 0);
            goto done;
        }
        for (uint32_t i = 8 + body_len; i < length; i++)
            if (p[i]) {
                corrupt("non-zero padding at %zd", offset, 0, 0);
                goto done;
            }
    }
    RecordObject *r = (RecordObject *)kds_RecordType.tp_alloc(&kds_RecordType, 0);
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
void kds_write_record(uint8_t *dst, uint32_t length, uint32_t body_len, int rtype, int64_t due, int64_t enq,
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
    wr32(p + 4, kds_crc32c(p + 8, body_len));
}

/* The arguments of encode/append after the buffer ones: head (a RecordHead: the eight integer
 * fields, named, sidecar/store/native_args.py), rid, topic, key, value, headers_blob */
typedef struct {
    long long due, enq, srco;
    long long rtype, srcp, tgtp, retry, level;
    Field fs[5];
    uint32_t length, body_len;
} EncodeArgs;

static int encode_args(PyObject *const *a, EncodeArgs *e) {
    if (!PyObject_TypeCheck(a[0], &kds_RecordHeadType)) {
        PyErr_SetString(PyExc_TypeError, "the record's head must be a RecordHead (sidecar.store.codec.head)");
        return -1;
    }
    KdsRecordHead *h = (KdsRecordHead *)a[0];
    e->rtype = kds_arg(h->rtype);
    e->due = kds_arg(h->due_ms);
    e->enq = kds_arg(h->enqueue_ms);
    e->srco = kds_arg(h->src_offset);
    e->srcp = kds_arg(h->src_partition);
    e->tgtp = kds_arg(h->target_partition);
    e->retry = kds_arg(h->retry_count);
    e->level = kds_arg(h->level);
    if (PyErr_Occurred()) return -1;
    if (e->rtype < 0 || e->rtype > 255 || e->srcp < INT32_MIN || e->srcp > INT32_MAX || e->tgtp < INT32_MIN ||
        e->tgtp > INT32_MAX || e->retry < 0 || e->retry > 0xffff || e->level < 0 || e->level > 0xffff) {
        PyErr_SetString(PyExc_ValueError, "record field out of range");
        return -1;
    }
    static const char *names[5] = {"rid", "topic", "key", "value", "headers_blob"};
    int i;
    for (i = 0; i < 5; i++)
        if (field_get(a[1 + i], &e->fs[i], i == 2 || i == 3, names[i]) < 0) goto fail;
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

/* encode(head, rid, topic, key, value, headers_blob) -> bytes: codec.encode */
static PyObject *native_encode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "encode(head, rid, topic, key, value, headers_blob)");
        return NULL;
    }
    EncodeArgs e;
    if (encode_args(args, &e) < 0) return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, e.length);
    if (out)
        kds_write_record((uint8_t *)PyBytes_AS_STRING(out), e.length, e.body_len, (int)e.rtype, e.due, e.enq, e.srco,
                     (int32_t)e.srcp, (int32_t)e.tgtp, (int)e.retry, (int)e.level, e.fs);
    encode_release(&e);
    return out;
}

/* append(buf, offset, limit, head, rid, topic, key, value, headers_blob) -> int: write the record at buf[offset:]
 * if it ends at or before `limit` and return its length; else write nothing and return minus
 * its length (the caller rolls to a new segment). */
static PyObject *native_append(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "append(buf, offset, limit, head, rid, topic, key, value, headers_blob)");
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
        kds_write_record((uint8_t *)view.buf + offset, e.length, e.body_len, (int)e.rtype, e.due, e.enq, e.srco,
                     (int32_t)e.srcp, (int32_t)e.tgtp, (int)e.retry, (int)e.level, e.fs);
        out = PyLong_FromLong((long)e.length);
    }
    PyBuffer_Release(&view);
    encode_release(&e);
    return out;
}

/* ---------------------------------------------------------------------------------------------
 * Header blob: u16 count, then per header u16 name_len, name, i32 value_len (-1: null), value. */

PyObject *kds_encode_headers(PyObject *self, PyObject *headers) {
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
/* Each header of a blob (u16 count, then per header u16 name_len, name, i32 value_len (-1: null),
 * value) handed to add, in order: 0, or -1 with an error set (CorruptRecord for a short blob). */
static int headers_each(const uint8_t *b, Py_ssize_t n, kds_hadd add, void *ctx) {
    if (n == 0) return 0;
    if (n < 2) goto bad;
    Py_ssize_t count = rd16(b), pos = 2;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (pos + 2 > n) goto bad;
        Py_ssize_t nl = rd16(b + pos);
        pos += 2;
        if (pos + nl + 4 > n) goto bad;
        const char *name = (const char *)b + pos;
        pos += nl;
        int32_t vl = (int32_t)rd32(b + pos);
        pos += 4;
        if (vl >= 0 && pos + vl > n) goto bad;
        if (add(ctx, NULL, name, nl, NULL, vl < 0 ? NULL : (const char *)b + pos, vl < 0 ? -1 : vl) < 0) return -1;
        if (vl > 0) pos += vl;
    }
    return 0;
bad:
    PyErr_SetString(CorruptRecord ? CorruptRecord : PyExc_ValueError, "header blob is truncated");
    return -1;
}

/* a kds_hadd into a list of (str, bytes | None) pairs; nobj / vobj: the name / value object when
 * the caller has it (the interned delay.* names, a record's id) */
static int list_add(void *ctx, PyObject *nobj, const char *name, Py_ssize_t nl, PyObject *vobj, const char *val,
                    Py_ssize_t vl) {
    PyObject *k = nobj ? Py_NewRef(nobj) : PyUnicode_DecodeUTF8(name, nl, NULL);
    if (!k) return -1;
    PyObject *v = vobj ? Py_NewRef(vobj) : val ? PyBytes_FromStringAndSize(val, vl) : Py_NewRef(Py_None);
    if (!v) {
        Py_DECREF(k);
        return -1;
    }
    PyObject *t = PyTuple_New(2);
    if (!t) {
        Py_DECREF(k);
        Py_DECREF(v);
        return -1;
    }
    PyTuple_SET_ITEM(t, 0, k);
    PyTuple_SET_ITEM(t, 1, v);
    int rc = PyList_Append((PyObject *)ctx, t);
    Py_DECREF(t);
    return rc;
}

static int decode_headers_into(const uint8_t *b, Py_ssize_t n, PyObject *out) {
    return headers_each(b, n, list_add, out);
}

static PyObject *native_decode_headers(PyObject *self, PyObject *blob) {
    Py_buffer view;
    if (PyObject_GetBuffer(blob, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *out = PyList_New(0);
    if (out && decode_headers_into((const uint8_t *)view.buf, view.len, out) < 0) Py_CLEAR(out);
    PyBuffer_Release(&view);
    return out;
}

/* v in decimal at p, unterminated; returns the length (at most 20). snprintf("%lld") costs ~1k
 * instructions a call, three to four calls per published record. */
int kds_fmt_ll(char *p, long long v) {
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

PyObject *kds_source(PyObject *topic_bytes, long long partition, long long offset) {
    char tmp[48];
    tmp[0] = ':';
    int n = 1 + kds_fmt_ll(tmp + 1, partition);
    tmp[n++] = ':';
    n += kds_fmt_ll(tmp + n, offset);
    Py_ssize_t sl = PyBytes_GET_SIZE(topic_bytes);
    PyObject *source = PyBytes_FromStringAndSize(NULL, sl + n);
    if (source) {
        memcpy(PyBytes_AS_STRING(source), PyBytes_AS_STRING(topic_bytes), sl);
        memcpy(PyBytes_AS_STRING(source) + sl, tmp, n);
    }
    return source;
}

/* a delay.* header: its interned name, a value object or bytes */
static int add_named(kds_hadd add, void *ctx, PyObject *name, PyObject *vobj, const char *val, Py_ssize_t vl) {
    Py_ssize_t nl;
    const char *ns = PyUnicode_AsUTF8AndSize(name, &nl);
    if (!ns) return -1;
    if (vobj) return add(ctx, name, ns, nl, vobj, PyBytes_AS_STRING(vobj), PyBytes_GET_SIZE(vobj));
    return add(ctx, name, ns, nl, NULL, val, vl);
}

/* the four delay.* headers every delivered MESSAGE carries: delay.id, delay.deliver-at,
 * delay.enqueued-at, delay.source ("<topic>:<partition>:<offset>") */
static int add_delay_headers(kds_hadd add, void *ctx, PyObject *rid, long long due, long long enq,
                             PyObject *topic_bytes, long long partition, long long offset) {
    char tmp[48];
    if (add_named(add, ctx, H_ID, rid, NULL, 0) < 0) return -1;
    if (add_named(add, ctx, H_DELIVER_AT, NULL, tmp, kds_fmt_ll(tmp, due)) < 0) return -1;
    if (add_named(add, ctx, H_ENQUEUED_AT, NULL, tmp, kds_fmt_ll(tmp, enq)) < 0) return -1;
    Py_ssize_t sl = PyBytes_GET_SIZE(topic_bytes);
    if (sl <= 256) { /* a Kafka topic name has at most 249 characters */
        char src[256 + 48];
        memcpy(src, PyBytes_AS_STRING(topic_bytes), sl);
        int n = (int)sl;
        src[n++] = ':';
        n += kds_fmt_ll(src + n, partition);
        src[n++] = ':';
        n += kds_fmt_ll(src + n, offset);
        return add_named(add, ctx, H_SOURCE, NULL, src, n);
    }
    PyObject *source = kds_source(topic_bytes, partition, offset);
    if (!source) return -1;
    int rc = add_named(add, ctx, H_SOURCE, source, NULL, 0);
    Py_DECREF(source);
    return rc;
}

/* The headers a delivered record carries, each handed to add: the stored ones, then for a
 * MESSAGE delay.id, delay.deliver-at, delay.enqueued-at, delay.source and delay.retry-count
 * when > 0 (DESIGN.md 1, outgoing). rec: a Record; source_topic: bytes. */
int kds_delivery_headers_each(PyObject *recobj, PyObject *source_topic, kds_hadd add, void *ctx) {
    RecordObject *r = (RecordObject *)recobj;
    if (kds_codec_ready() < 0) return -1;
    if (headers_each((const uint8_t *)PyBytes_AS_STRING(r->headers), PyBytes_GET_SIZE(r->headers), add, ctx) < 0)
        return -1;
    if (r->rtype != REC_MESSAGE) return 0;
    if (add_delay_headers(add, ctx, r->id, r->due_ms, r->enqueue_ms, source_topic, r->src_partition,
                          r->src_offset) < 0)
        return -1;
    if (!r->retry_count) return 0;
    char tmp[24];
    return add_named(add, ctx, H_RETRY_COUNT, NULL, tmp, kds_fmt_ll(tmp, r->retry_count));
}

/* delivery_headers(rec, source_topic) -> list: kds_delivery_headers_each's headers as pairs */
PyObject *kds_delivery_headers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyObject_TypeCheck(args[0], &kds_RecordType) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "delivery_headers(rec: Record, source_topic: bytes)");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out && kds_delivery_headers_each(args[0], args[1], list_add, out) < 0) Py_CLEAR(out);
    return out;
}

/* The headers a MESSAGE record of these fields is delivered with, as delivery_headers gives a stored
 * one's (the user's, then delay.id, delay.deliver-at, delay.enqueued-at, delay.source; no retry
 * count), each handed to add: a record published without being stored (direct.c). user: the
 * parser's tuple of (str, bytes | None) pairs. */
int kds_fields_headers_each(PyObject *user, PyObject *rid, long long due, long long enq, PyObject *topic_bytes,
                            long long partition, long long offset, kds_hadd add, void *ctx) {
    if (kds_codec_ready() < 0) return -1;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(user); k++) {
        PyObject *pair = PyTuple_GET_ITEM(user, k);
        PyObject *name = PyTuple_GET_ITEM(pair, 0), *value = PyTuple_GET_ITEM(pair, 1);
        Py_ssize_t nl;
        const char *ns = PyUnicode_AsUTF8AndSize(name, &nl);
        if (!ns) return -1;
        if (value != Py_None && !PyBytes_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "a header value is bytes or None");
            return -1;
        }
        int rc = value == Py_None ? add(ctx, name, ns, nl, NULL, NULL, -1)
                                  : add(ctx, name, ns, nl, value, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value));
        if (rc < 0) return -1;
    }
    return add_delay_headers(add, ctx, rid, due, enq, topic_bytes, partition, offset);
}

PyObject *kds_fields_headers(PyObject *user, PyObject *rid, long long due, long long enq, PyObject *topic_bytes,
                             long long partition, long long offset) {
    PyObject *out = PyList_New(0);
    if (out && kds_fields_headers_each(user, rid, due, enq, topic_bytes, partition, offset, list_add, out) < 0)
        Py_CLEAR(out);
    return out;
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

int kds_codec_ready(void) {
    if (H_ID) return 0;
    PyErr_SetString(PyExc_RuntimeError, "sidecar._native.setup() was not called");
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * One mapped file held for the length of a call: the buffer of files[first] (a MappedFile's buf,
 * or a commit-log segment's), re-fetched when a walk moves to another file; and the record at a
 * commit-log position, decoded straight from its segment (the wheel's and the levels' reads). */

static PyObject *S_buf = NULL; /* "buf": the MappedFile attribute holding the mapping */

void kds_file_release(KdsFile *f) {
    if (f->have) PyBuffer_Release(&f->v);
    f->have = 0;
}

/* Hold the buffer of files[key] in f. Returns 1 if held, 0 if files has no such key (no error
 * set), -1 on error. */
int kds_file_get(KdsFile *f, PyObject *files, long long key, int writable) {
    if (f->have && f->first == key) return 1;
    kds_file_release(f);
    if (!S_buf && !(S_buf = PyUnicode_InternFromString("buf"))) return -1;
    PyObject *k = PyLong_FromLongLong(key);
    if (!k) return -1;
    PyObject *mf = PyDict_GetItemWithError(files, k);
    Py_DECREF(k);
    if (!mf) return PyErr_Occurred() ? -1 : 0;
    PyObject *mv = PyObject_GetAttr(mf, S_buf);
    if (!mv) return -1;
    int rc = PyObject_GetBuffer(mv, &f->v, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE);
    Py_DECREF(mv);
    if (rc < 0) return -1;
    f->have = 1;
    f->first = key;
    return 1;
}

/* The record at commit-log position pos, decoded from its segment (seg caches the segment's
 * buffer between calls): a new reference; NULL with no exception set when the caller must read it
 * itself (the segment is gone, or the record does not decode: CommitLog.read raises for it as it
 * always did); NULL with an exception on error. */
PyObject *kds_log_decode_at(KdsFile *seg, PyObject *segments, long long seg_bytes, uint64_t pos) {
    int got = kds_file_get(seg, segments, (long long)(pos / (uint64_t)seg_bytes), 0);
    if (got <= 0) return NULL;
    PyObject *o = PyLong_FromUnsignedLongLong(pos % (uint64_t)seg_bytes);
    if (!o) return NULL;
    PyObject *dargs[4] = {seg->v.obj, o, Py_None, Py_False};
    PyObject *rec = native_decode(NULL, dargs, 4, NULL);
    Py_DECREF(o);
    if (!rec && CorruptRecord && PyErr_ExceptionMatches(CorruptRecord)) PyErr_Clear();
    return rec;
}

PyMethodDef kds_codec_methods[] = {
    {"setup", (PyCFunction)(void (*)(void))native_setup, METH_FASTCALL, NULL},
    {"decode", (PyCFunction)(void (*)(void))native_decode, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"encode", (PyCFunction)(void (*)(void))native_encode, METH_FASTCALL, NULL},
    {"append", (PyCFunction)(void (*)(void))native_append, METH_FASTCALL, NULL},
    {"encode_headers", kds_encode_headers, METH_O, NULL},
    {"decode_headers", native_decode_headers, METH_O, NULL},
    {"delivery_headers", (PyCFunction)(void (*)(void))kds_delivery_headers, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}};
