/* sidecar._native, producer core: NativeProducer, a Kafka producer on librdkafka's C API with
 * confluent-kafka's Producer interface as the engine uses it (sidecar/engine/native_client.py says
 * when it is used; docs/design.md 5.2, why).
 *
 * Binding: rdk_bind(path) dlopens the librdkafka the confluent-kafka module has already loaded
 * (RTLD_NOLOAD: never a second copy) and takes the functions rdk.h lists with dlsym. The
 * extension is not linked against the library, so it builds without it and the producer runs on
 * the exact library the consumer runs on.
 *
 * The client: rd_kafka_new with the conf dict's entries as strings (bool as true/false), its
 * delivery reports, errors and (with a logger) log lines routed as events to its main queue,
 * served by poll / flush on the calling thread: one queue poll hands a batch of reports, each
 * dispatched with the GIL held; the GIL is released only while a poll waits.
 *
 * A report's callable is the produce call's callback (a strong reference rides as the message's
 * opaque). The success of a C report callable (publish.c's Delivery, direct.c's DirectDelivery,
 * mirror.c's MirrorReport) is served in C from the report's fields (kds_report_t, each one's *_ok)
 * when it is plain: no Python object per report. Every other callable gets
 * (err, report): err None or a confluent_kafka.KafkaError, report a DeliveryReport with the
 * Message accessors the engine reads (topic, partition, offset, timestamp, error, key, value).
 * An exception a callable raises stops the poll once the batch in hand is dispatched, and the
 * poll raises it (confluent-kafka's rule).
 *
 * Refusals are confluent-kafka's: a full queue raises BufferError, any other produce error
 * KafkaException(KafkaError). error_cb gets KafkaError(code, reason, fatal=...) with a fatal
 * error's underlying code, as confluent-kafka's does. close() purges what is queued, drops the
 * reports still to come (their callables are released, not called) and destroys the client. */
#include "native.h"
#include "rdk.h"

#include <dlfcn.h>

#define RDK_DECL(ret, name, params) ret(*name) params;
static struct {
    RDK_FUNCS(RDK_DECL)
} R;
#undef RDK_DECL
static int rdk_bound;
static PyObject *KafkaErrorT, *KafkaExceptionT; /* confluent_kafka.KafkaError, KafkaException */
static PyObject *S_fatal, *S_fmt;

/* rdk_bind(path, KafkaError, KafkaException) -> rd_kafka_version(): librdkafka's functions from
 * the already-loaded library at path (bound once per process: a later call returns the bound version) */
static PyObject *native_rdk_bind(PyObject *self, PyObject *args) {
    const char *path;
    PyObject *kerr, *kexc;
    if (!PyArg_ParseTuple(args, "sOO:rdk_bind", &path, &kerr, &kexc)) return NULL;
    if (!rdk_bound) {
        void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
        if (!h) {
            PyErr_Format(PyExc_ImportError, "rdk_bind: %s is not loaded in this process (%s)", path, dlerror());
            return NULL;
        }
#define RDK_LOAD(ret, name, params)                                                                 \
    if (!(*(void **)&R.name = dlsym(h, #name))) {                                                  \
        PyErr_Format(PyExc_ImportError, "rdk_bind: %s has no %s (librdkafka >= 1.5 is needed)", path, #name); \
        memset(&R, 0, sizeof R);                                                                     \
        return NULL;                                                                                 \
    }
        RDK_FUNCS(RDK_LOAD)
#undef RDK_LOAD
        /* the handle stays open: the functions are used for the life of the process */
        if (R.rd_kafka_version() < RDK_MIN_VERSION) {
            PyErr_Format(PyExc_ImportError, "rdk_bind: librdkafka 0x%x is older than 1.5.0", R.rd_kafka_version());
            memset(&R, 0, sizeof R);
            return NULL;
        }
        rdk_bound = 1;
    }
    Py_XSETREF(KafkaErrorT, Py_NewRef(kerr));
    Py_XSETREF(KafkaExceptionT, Py_NewRef(kexc));
    return PyLong_FromLong(R.rd_kafka_version());
}

/* KafkaError(code[, reason][, fatal=True]); reason NULL: the library's text for the code */
static PyObject *kafka_error(int code, const char *reason, int fatal) {
    PyObject *args = reason ? Py_BuildValue("(is)", code, reason) : Py_BuildValue("(i)", code);
    if (!args) return NULL;
    PyObject *kw = fatal ? Py_BuildValue("{OO}", S_fatal, Py_True) : NULL;
    PyObject *e = (!fatal || kw) ? PyObject_Call(KafkaErrorT, args, kw) : NULL;
    Py_DECREF(args);
    Py_XDECREF(kw);
    return e;
}

/* KafkaException(KafkaError(code, reason)) raised: confluent-kafka's refusal */
static void raise_kafka(int code, const char *reason) {
    PyObject *e = kafka_error(code, reason, 0);
    if (e) {
        PyErr_SetObject(KafkaExceptionT, e);
        Py_DECREF(e);
    }
}

/* ---------------------------------------------------------------------------------------------
 * DeliveryReport: what a callable other than a plain Delivery gets as its `msg` */

typedef struct {
    PyObject_HEAD PyObject *topic, *err, *key, *value; /* str; None or KafkaError; bytes or None */
    long long partition, offset, ts;
    int tstype;
} ReportObject;

static void Report_dealloc(ReportObject *r) {
    Py_XDECREF(r->topic);
    Py_XDECREF(r->err);
    Py_XDECREF(r->key);
    Py_XDECREF(r->value);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *Report_topic(ReportObject *r, PyObject *u) { return Py_NewRef(r->topic); }
static PyObject *Report_error(ReportObject *r, PyObject *u) { return Py_NewRef(r->err); }
static PyObject *Report_key(ReportObject *r, PyObject *u) { return Py_NewRef(r->key); }
static PyObject *Report_value(ReportObject *r, PyObject *u) { return Py_NewRef(r->value); }
static PyObject *Report_partition(ReportObject *r, PyObject *u) { return PyLong_FromLongLong(r->partition); }
static PyObject *Report_offset(ReportObject *r, PyObject *u) { return PyLong_FromLongLong(r->offset); }
static PyObject *Report_timestamp(ReportObject *r, PyObject *u) { return Py_BuildValue("(iL)", r->tstype, r->ts); }
static PyObject *Report_headers(ReportObject *r, PyObject *u) { Py_RETURN_NONE; }

static PyMethodDef Report_methods[] = {
    {"topic", (PyCFunction)Report_topic, METH_NOARGS, "the target topic"},
    {"partition", (PyCFunction)Report_partition, METH_NOARGS, "the partition written (-1: none)"},
    {"offset", (PyCFunction)Report_offset, METH_NOARGS, "the offset written (-1001: none)"},
    {"timestamp", (PyCFunction)Report_timestamp, METH_NOARGS, "(timestamp type, ms)"},
    {"error", (PyCFunction)Report_error, METH_NOARGS, "None, or the KafkaError of a failed delivery"},
    {"key", (PyCFunction)Report_key, METH_NOARGS, "the record's key"},
    {"value", (PyCFunction)Report_value, METH_NOARGS, "the record's value"},
    {"headers", (PyCFunction)Report_headers, METH_NOARGS, "None: a report does not carry them"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject ReportType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sidecar._native.DeliveryReport",
    .tp_doc = "A NativeProducer's delivery report: confluent-kafka's Message accessors.",
    .tp_basicsize = sizeof(ReportObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Report_dealloc,
    .tp_methods = Report_methods,
};

static PyObject *bytes_or_none(const void *p, size_t n) {
    return p ? PyBytes_FromStringAndSize(p, (Py_ssize_t)n) : Py_NewRef(Py_None);
}

/* ---------------------------------------------------------------------------------------------
 * NativeProducer */

typedef struct {
    PyObject_HEAD rd_kafka_t *rk;
    rd_kafka_queue_t *mainq;
    PyObject *error_cb, *logger; /* NULL when not given */
    PyObject *topic;             /* the last report's topic (str), reused while it does not change */
    PyObject *failed;            /* the first exception a callable raised in the current poll */
} ProducerObject;

static PyTypeObject ProducerType;

static int Producer_traverse(ProducerObject *p, visitproc visit, void *arg) {
    Py_VISIT(p->error_cb);
    Py_VISIT(p->logger);
    return 0;
}

static int Producer_clear(ProducerObject *p) {
    Py_CLEAR(p->error_cb);
    Py_CLEAR(p->logger);
    return 0;
}

/* a conf value as librdkafka's string; NULL with an error set */
static PyObject *conf_str(PyObject *v) {
    if (PyBool_Check(v)) return PyUnicode_FromString(v == Py_True ? "true" : "false");
    if (PyUnicode_Check(v)) return Py_NewRef(v);
    return PyObject_Str(v);
}

static int conf_fill(rd_kafka_conf_t *c, PyObject *conf, ProducerObject *p) {
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    char errstr[512];
    while (PyDict_Next(conf, &pos, &k, &v)) {
        const char *ks = PyUnicode_Check(k) ? PyUnicode_AsUTF8(k) : NULL;
        if (!ks) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "NativeProducer: conf keys are str");
            return -1;
        }
        if (!strcmp(ks, "error_cb")) {
            Py_XSETREF(p->error_cb, Py_NewRef(v));
            continue;
        }
        if (!strcmp(ks, "logger")) {
            Py_XSETREF(p->logger, Py_NewRef(v));
            continue;
        }
        if (v == Py_None) continue;
        if (PyCallable_Check(v)) {
            PyErr_Format(PyExc_ValueError,
                         "NativeProducer: conf %s: a callback it does not take (error_cb and logger only)", ks);
            return -1;
        }
        PyObject *s = conf_str(v);
        const char *vs = s ? PyUnicode_AsUTF8(s) : NULL;
        if (!vs) {
            Py_XDECREF(s);
            return -1;
        }
        if (R.rd_kafka_conf_set(c, ks, vs, errstr, sizeof errstr) != RDK_CONF_OK) {
            raise_kafka(RDK_ERR_INVALID_ARG, errstr);
            Py_DECREF(s);
            return -1;
        }
        Py_DECREF(s);
    }
    return 0;
}

static PyObject *Producer_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *conf;
    if (!PyArg_ParseTuple(args, "O!:NativeProducer", &PyDict_Type, &conf)) return NULL;
    if (!rdk_bound) {
        PyErr_SetString(PyExc_RuntimeError, "NativeProducer: librdkafka is not bound (rdk_bind)");
        return NULL;
    }
    ProducerObject *p = (ProducerObject *)type->tp_alloc(type, 0);
    if (!p) return NULL;
    char errstr[512];
    rd_kafka_conf_t *c = R.rd_kafka_conf_new();
    if (conf_fill(c, conf, p) < 0) goto fail;
    if (p->logger && R.rd_kafka_conf_set(c, "log.queue", "true", errstr, sizeof errstr) != RDK_CONF_OK) {
        PyErr_Format(PyExc_RuntimeError, "NativeProducer: log.queue: %s", errstr);
        goto fail;
    }
    R.rd_kafka_conf_set_events(c, RDK_EVENT_DR | RDK_EVENT_ERROR | (p->logger ? RDK_EVENT_LOG : 0));
    p->rk = R.rd_kafka_new(RDK_PRODUCER, c, errstr, sizeof errstr);
    if (!p->rk) {
        raise_kafka(RDK_ERR_INVALID_ARG, errstr);
        goto fail;
    }
    c = NULL; /* rd_kafka_new took it */
    p->mainq = R.rd_kafka_queue_get_main(p->rk);
    if (p->logger) R.rd_kafka_set_log_queue(p->rk, NULL); /* NULL: the main queue, served by poll */
    return (PyObject *)p;
fail:
    if (c) R.rd_kafka_conf_destroy(c);
    Py_DECREF(p);
    return NULL;
}

/* a callable's exception during a poll: the first is kept (raised by the poll), others reported */
static void keep_failure(ProducerObject *p) {
    if (p->failed) {
        PyErr_WriteUnraisable(NULL);
        return;
    }
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb && v) PyException_SetTraceback(v, tb);
    Py_XDECREF(t);
    Py_XDECREF(tb);
    p->failed = v;
}

static PyObject *report_topic(ProducerObject *p, const rd_kafka_message_t *m) {
    const char *name = m->rkt ? R.rd_kafka_topic_name(m->rkt) : "";
    if (p->topic) {
        const char *have = PyUnicode_AsUTF8(p->topic);
        if (have && !strcmp(have, name)) return Py_NewRef(p->topic);
    }
    PyObject *s = PyUnicode_FromString(name);
    if (s) Py_XSETREF(p->topic, Py_NewRef(s));
    return s;
}

/* one delivery report: its callable called (or a plain Delivery's success taken in C), the
 * reference the message held released */
static void deliver(ProducerObject *p, const rd_kafka_message_t *m) {
    PyObject *cb = m->_private;
    if (!cb) return;
    int tstype = 0;
    int64_t ts = R.rd_kafka_message_timestamp(m, &tstype);
    int (*ok)(PyObject *, const kds_report_t *) = NULL;
    if (!m->err)
        ok = kds_is_delivery(cb)         ? kds_delivery_ok
             : kds_is_mirror_report(cb)  ? kds_mirror_ok
             : kds_is_direct_delivery(cb) ? kds_direct_ok
                                          : NULL;
    if (ok) {
        kds_report_t rep = {m->offset, ts, m->payload, m->len};
        int rc = ok(cb, &rep);
        if (rc) {
            if (rc < 0) keep_failure(p);
            Py_DECREF(cb);
            return;
        }
    }
    PyObject *err = m->err ? kafka_error(m->err, NULL, 0) : Py_NewRef(Py_None);
    ReportObject *r = err ? PyObject_New(ReportObject, &ReportType) : NULL;
    if (r) {
        r->err = Py_NewRef(err);
        r->partition = m->partition;
        r->offset = m->offset;
        r->ts = ts;
        r->tstype = tstype;
        r->topic = report_topic(p, m);
        r->key = bytes_or_none(m->key, m->key_len);
        r->value = bytes_or_none(m->payload, m->len);
        if (!r->topic || !r->key || !r->value) Py_CLEAR(r);
    }
    PyObject *res = NULL;
    if (r) {
        PyObject *a[2] = {err, (PyObject *)r};
        res = PyObject_Vectorcall(cb, a, 2, NULL);
    }
    if (!res) keep_failure(p);
    Py_XDECREF(res);
    Py_XDECREF((PyObject *)r);
    Py_XDECREF(err);
    Py_DECREF(cb);
}

/* syslog level -> logging level (confluent-kafka's table) */
static int log_level(int level) {
    static const int map[8] = {50, 50, 50, 40, 30, 20, 20, 10};
    return map[level < 0 ? 0 : level > 7 ? 7 : level];
}

static void on_event(ProducerObject *p, rd_kafka_event_t *ev) {
    int type = R.rd_kafka_event_type(ev);
    if (type == RDK_EVENT_DR) {
        const rd_kafka_message_t *m;
        while ((m = R.rd_kafka_event_message_next(ev))) deliver(p, m);
    } else if (type == RDK_EVENT_ERROR && p->error_cb) {
        int code = R.rd_kafka_event_error(ev), fatal = R.rd_kafka_event_error_is_fatal(ev);
        const char *reason = R.rd_kafka_event_error_string(ev);
        char buf[512];
        if (code == RDK_ERR_FATAL) { /* the error that made it fatal, as confluent-kafka reports it */
            code = R.rd_kafka_fatal_error(p->rk, buf, sizeof buf);
            reason = buf;
            fatal = 1;
        }
        PyObject *e = kafka_error(code, reason, fatal);
        PyObject *res = e ? PyObject_CallOneArg(p->error_cb, e) : NULL;
        if (!res) keep_failure(p);
        Py_XDECREF(res);
        Py_XDECREF(e);
    } else if (type == RDK_EVENT_LOG && p->logger) {
        const char *fac = "", *str = "";
        int level = 6;
        R.rd_kafka_event_log(ev, &fac, &str, &level);
        PyObject *res = PyObject_CallMethod(p->logger, "log", "iOsss", log_level(level), S_fmt, fac,
                                            R.rd_kafka_name(p->rk), str);
        if (!res) keep_failure(p);
        Py_XDECREF(res);
    }
    R.rd_kafka_event_destroy(ev);
}

/* serve the main queue: wait up to timeout_ms (< 0: forever) for the first event, then take what
 * is there. Returns the events served, or -1 with the first callable's exception set. */
static long serve(ProducerObject *p, int timeout_ms) {
    long n = 0;
    for (;;) {
        rd_kafka_event_t *ev;
        if (n == 0 && timeout_ms != 0) {
            Py_BEGIN_ALLOW_THREADS ev = R.rd_kafka_queue_poll(p->mainq, timeout_ms);
            Py_END_ALLOW_THREADS
        } else {
            ev = R.rd_kafka_queue_poll(p->mainq, 0);
        }
        if (!ev) break;
        n++;
        on_event(p, ev);
        if (p->failed) break;
    }
    if (p->failed) {
        PyObject *e = p->failed;
        p->failed = NULL;
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        Py_DECREF(e);
        return -1;
    }
    return n;
}

static int open_or_raise(ProducerObject *p) {
    if (p->rk) return 0;
    PyErr_SetString(PyExc_RuntimeError, "NativeProducer: closed");
    return -1;
}

/* seconds (None or < 0: forever) as librdkafka's ms */
static int timeout_ms_of(PyObject *t, int *ms) {
    if (!t || t == Py_None) {
        *ms = -1;
        return 0;
    }
    double s = PyFloat_AsDouble(t);
    if (s == -1.0 && PyErr_Occurred()) return -1;
    *ms = s < 0 ? -1 : s * 1000.0 > 2147483647.0 ? 2147483647 : (int)(s * 1000.0);
    return 0;
}

static PyObject *Producer_poll(ProducerObject *p, PyObject *const *args, Py_ssize_t nargs) {
    int ms = -1;
    if (open_or_raise(p) < 0 || timeout_ms_of(nargs ? args[0] : NULL, &ms) < 0) return NULL;
    long n = serve(p, ms);
    return n < 0 ? NULL : PyLong_FromLong(n);
}

/* flush(timeout=None) -> the records still queued or in flight: served until none is left */
static PyObject *Producer_flush(ProducerObject *p, PyObject *const *args, Py_ssize_t nargs) {
    int ms = -1;
    if (open_or_raise(p) < 0 || timeout_ms_of(nargs ? args[0] : NULL, &ms) < 0) return NULL;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long start_ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    while (R.rd_kafka_outq_len(p->rk) > 0) {
        int wait = 100;
        if (ms >= 0) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            long long left = start_ms + ms - ((long long)now.tv_sec * 1000 + now.tv_nsec / 1000000);
            if (left <= 0) break;
            if (left < wait) wait = (int)left;
        }
        if (serve(p, wait) < 0) return NULL;
    }
    return PyLong_FromLong(R.rd_kafka_outq_len(p->rk));
}

/* positional order: topic, value, key, partition, callback, on_delivery, timestamp, headers */
enum { A_TOPIC, A_VALUE, A_KEY, A_PARTITION, A_CALLBACK, A_ON_DELIVERY, A_TIMESTAMP, A_HEADERS, A_N };
static const char *const arg_names[A_N] = {"topic", "value", "key", "partition", "callback", "on_delivery",
                                           "timestamp", "headers"};

/* a key or value: bytes (borrowed), str (UTF-8), or None */
static int mem_of(PyObject *o, const char *what, void **ptr, size_t *size) {
    if (!o || o == Py_None) {
        *ptr = NULL, *size = 0;
        return 0;
    }
    if (PyBytes_Check(o)) {
        *ptr = PyBytes_AS_STRING(o), *size = (size_t)PyBytes_GET_SIZE(o);
        return 0;
    }
    if (PyUnicode_Check(o)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(o, &n);
        if (!s) return -1;
        *ptr = (void *)s, *size = (size_t)n;
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "produce: %s must be bytes, str or None, not %.80s", what, Py_TYPE(o)->tp_name);
    return -1;
}

static int header_add(rd_kafka_headers_t *h, PyObject *name, PyObject *val) {
    Py_ssize_t nn;
    const char *ns = PyUnicode_Check(name) ? PyUnicode_AsUTF8AndSize(name, &nn) : NULL;
    if (!ns) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "produce: a header name must be str");
        return -1;
    }
    void *vp;
    size_t vn;
    if (mem_of(val, "a header value", &vp, &vn) < 0) return -1;
    R.rd_kafka_header_add(h, ns, nn, vp, vp ? (ssize_t)vn : -1);
    return 0;
}

/* headers: a list or tuple of (name, value) pairs, or a dict; NULL with an error, or *out NULL for none */
static int headers_of(PyObject *o, rd_kafka_headers_t **out) {
    *out = NULL;
    if (!o || o == Py_None) return 0;
    if (PyDict_Check(o)) {
        *out = R.rd_kafka_headers_new((size_t)PyDict_GET_SIZE(o));
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        while (PyDict_Next(o, &pos, &k, &v))
            if (header_add(*out, k, v) < 0) goto fail;
        return 0;
    }
    PyObject *seq = PySequence_Fast(o, "produce: headers must be a list of (name, value) pairs or a dict");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    *out = R.rd_kafka_headers_new((size_t)n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "produce: each header is a (name, value) pair");
            Py_DECREF(seq);
            goto fail;
        }
        if (header_add(*out, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1)) < 0) {
            Py_DECREF(seq);
            goto fail;
        }
    }
    Py_DECREF(seq);
    return 0;
fail:
    R.rd_kafka_headers_destroy(*out);
    *out = NULL;
    return -1;
}

/* one record to librdkafka (value, key and headers copied or taken by it; cb's reference rides as
 * the opaque): 0, or -1 with confluent-kafka's exception (BufferError for a full queue, else
 * KafkaException); hdrs is destroyed on failure */
static int send(ProducerObject *p, const char *topic, int32_t partition, void *vp, size_t vn, void *kp, size_t kn,
                long long timestamp, PyObject *cb, rd_kafka_headers_t *hdrs) {
    rd_kafka_vu_t vu[8];
    size_t c = 0;
    vu[c].vtype = RDK_VTYPE_TOPIC, vu[c++].u.cstr = topic;
    vu[c].vtype = RDK_VTYPE_PARTITION, vu[c++].u.i32 = partition;
    vu[c].vtype = RDK_VTYPE_VALUE, vu[c].u.mem.ptr = vp, vu[c++].u.mem.size = vn;
    vu[c].vtype = RDK_VTYPE_KEY, vu[c].u.mem.ptr = kp, vu[c++].u.mem.size = kn;
    vu[c].vtype = RDK_VTYPE_MSGFLAGS, vu[c++].u.i = RDK_MSG_F_COPY;
    vu[c].vtype = RDK_VTYPE_OPAQUE, vu[c++].u.ptr = cb;
    if (timestamp) vu[c].vtype = RDK_VTYPE_TIMESTAMP, vu[c++].u.i64 = timestamp;
    if (hdrs) vu[c].vtype = RDK_VTYPE_HEADERS, vu[c++].u.headers = hdrs;
    Py_XINCREF(cb); /* the message's reference, released when its report is served */
    rd_kafka_error_t *error = R.rd_kafka_produceva(p->rk, vu, c);
    if (!error) return 0;
    Py_XDECREF(cb);
    if (hdrs) R.rd_kafka_headers_destroy(hdrs); /* kept by the caller on failure */
    int code = R.rd_kafka_error_code(error);
    if (code == RDK_ERR_QUEUE_FULL) {
        PyErr_SetString(PyExc_BufferError, R.rd_kafka_error_string(error));
    } else {
        raise_kafka(code, R.rd_kafka_error_string(error));
    }
    R.rd_kafka_error_destroy(error);
    return -1;
}

/* produce(topic, value=None, key=None, partition=-1, callback=None, on_delivery=None, timestamp=0,
 * headers=None): confluent-kafka's signature and refusals */
static PyObject *Producer_produce(ProducerObject *p, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyObject *a[A_N] = {NULL};
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n > A_N) {
        PyErr_SetString(PyExc_TypeError, "produce() takes at most 8 positional arguments");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) a[i] = args[i];
    if (kwnames) {
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, k);
            int found = -1;
            for (int j = 0; j < A_N; j++)
                if (PyUnicode_CompareWithASCIIString(name, arg_names[j]) == 0) found = j;
            if (found < 0 || a[found]) {
                PyErr_Format(PyExc_TypeError, "produce() got %s keyword argument '%U'",
                             found < 0 ? "an unexpected" : "a repeated", name);
                return NULL;
            }
            a[found] = args[n + k];
        }
    }
    if (open_or_raise(p) < 0) return NULL;
    if (!a[A_TOPIC] || !PyUnicode_Check(a[A_TOPIC])) {
        PyErr_SetString(PyExc_TypeError, "produce: topic must be a str");
        return NULL;
    }
    const char *topic = PyUnicode_AsUTF8(a[A_TOPIC]);
    if (!topic) return NULL;
    void *vp, *kp;
    size_t vn, kn;
    if (mem_of(a[A_VALUE], "value", &vp, &vn) < 0 || mem_of(a[A_KEY], "key", &kp, &kn) < 0) return NULL;
    long partition = RDK_PARTITION_UA;
    long long timestamp = 0;
    if (a[A_PARTITION] && a[A_PARTITION] != Py_None) {
        partition = PyLong_AsLong(a[A_PARTITION]);
        if (partition == -1 && PyErr_Occurred()) return NULL;
    }
    if (a[A_TIMESTAMP] && a[A_TIMESTAMP] != Py_None) {
        timestamp = PyLong_AsLongLong(a[A_TIMESTAMP]);
        if (timestamp == -1 && PyErr_Occurred()) return NULL;
    }
    PyObject *cb = a[A_CALLBACK] && a[A_CALLBACK] != Py_None ? a[A_CALLBACK] : a[A_ON_DELIVERY];
    if (cb == Py_None) cb = NULL;
    rd_kafka_headers_t *hdrs;
    if (headers_of(a[A_HEADERS], &hdrs) < 0) return NULL;
    if (send(p, topic, (int32_t)partition, vp, vn, kp, kn, timestamp, cb, hdrs) < 0) return NULL;
    Py_RETURN_NONE;
}

/* a kds_hadd into an rd_kafka_headers_t (the value copied by librdkafka) */
static int rdk_hadd(void *ctx, PyObject *nobj, const char *name, Py_ssize_t nl, PyObject *vobj, const char *val,
                    Py_ssize_t vl) {
    R.rd_kafka_header_add((rd_kafka_headers_t *)ctx, name, nl, val, val ? vl : -1);
    return 0;
}

PyObject *kds_native_producer(PyObject *produce) {
    if (!PyCFunction_Check(produce)) return NULL;
    PyObject *self = PyCFunction_GET_SELF(produce);
    return self && Py_IS_TYPE(self, &ProducerType) ? self : NULL;
}

int kds_np_send(PyObject *np, PyObject *topic, PyObject *value, PyObject *key, long long partition, PyObject *cb,
                kds_hfill fill, void *fctx) {
    ProducerObject *p = (ProducerObject *)np;
    if (open_or_raise(p) < 0) return -1;
    const char *t = PyUnicode_AsUTF8(topic);
    void *vp, *kp;
    size_t vn, kn;
    if (!t || mem_of(value, "value", &vp, &vn) < 0 || mem_of(key, "key", &kp, &kn) < 0) return -1;
    rd_kafka_headers_t *hdrs = NULL;
    if (fill) {
        hdrs = R.rd_kafka_headers_new(8);
        if (fill(fctx, rdk_hadd, hdrs) < 0) {
            R.rd_kafka_headers_destroy(hdrs);
            return -1;
        }
    }
    return send(p, t, (int32_t)partition, vp, vn, kp, kn, 0, cb, hdrs);
}

/* purge(in_queue=True, in_flight=True, blocking=True) */
static PyObject *Producer_purge(ProducerObject *p, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"in_queue", "in_flight", "blocking", NULL};
    int q = 1, f = 1, b = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|ppp:purge", kwlist, &q, &f, &b)) return NULL;
    if (open_or_raise(p) < 0) return NULL;
    int flags = (q ? RDK_PURGE_F_QUEUE : 0) | (f ? RDK_PURGE_F_INFLIGHT : 0) | (b ? 0 : RDK_PURGE_F_NON_BLOCKING);
    int code;
    Py_BEGIN_ALLOW_THREADS code = R.rd_kafka_purge(p->rk, flags);
    Py_END_ALLOW_THREADS
    if (code) {
        raise_kafka(code, NULL);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* the client destroyed: what is queued purged, the reports still to come dropped (each one's
 * callable released, not called) for up to a second, then rd_kafka_destroy */
static void shut(ProducerObject *p) {
    if (!p->rk) return;
    rd_kafka_t *rk = p->rk;
    R.rd_kafka_purge(rk, RDK_PURGE_F_QUEUE | RDK_PURGE_F_INFLIGHT | RDK_PURGE_F_NON_BLOCKING);
    for (int round = 0; round < 20 && R.rd_kafka_outq_len(rk) > 0; round++) {
        rd_kafka_event_t *ev;
        Py_BEGIN_ALLOW_THREADS ev = R.rd_kafka_queue_poll(p->mainq, 50);
        Py_END_ALLOW_THREADS
        if (!ev) continue;
        if (R.rd_kafka_event_type(ev) == RDK_EVENT_DR) {
            const rd_kafka_message_t *m;
            while ((m = R.rd_kafka_event_message_next(ev))) Py_XDECREF((PyObject *)m->_private);
        }
        R.rd_kafka_event_destroy(ev);
    }
    R.rd_kafka_queue_destroy(p->mainq);
    p->mainq = NULL;
    p->rk = NULL;
    Py_BEGIN_ALLOW_THREADS R.rd_kafka_destroy(rk);
    Py_END_ALLOW_THREADS
}

static PyObject *Producer_close(ProducerObject *p, PyObject *unused) {
    shut(p);
    Py_RETURN_NONE;
}

static Py_ssize_t Producer_len(ProducerObject *p) { return p->rk ? R.rd_kafka_outq_len(p->rk) : 0; }

static void Producer_dealloc(ProducerObject *p) {
    PyObject_GC_UnTrack(p);
    shut(p);
    Producer_clear(p);
    Py_CLEAR(p->topic);
    Py_CLEAR(p->failed);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyMethodDef Producer_methods[] = {
    {"produce", (PyCFunction)(void (*)(void))Producer_produce, METH_FASTCALL | METH_KEYWORDS,
     "produce(topic, value=None, key=None, partition=-1, callback=None, on_delivery=None, timestamp=0, headers=None)"},
    {"poll", (PyCFunction)(void (*)(void))Producer_poll, METH_FASTCALL,
     "poll(timeout=None) -> events served: delivery reports, errors, log lines"},
    {"flush", (PyCFunction)(void (*)(void))Producer_flush, METH_FASTCALL,
     "flush(timeout=None) -> records still queued or in flight"},
    {"purge", (PyCFunction)(void (*)(void))Producer_purge, METH_VARARGS | METH_KEYWORDS,
     "purge(in_queue=True, in_flight=True, blocking=True)"},
    {"close", (PyCFunction)Producer_close, METH_NOARGS, "purge, drop the reports to come, destroy the client"},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods Producer_seq = {.sq_length = (lenfunc)Producer_len};

static PyTypeObject ProducerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sidecar._native.NativeProducer",
    .tp_doc = "NativeProducer(conf): a librdkafka producer with confluent-kafka's Producer interface "
              "(sidecar/native/producer.c).",
    .tp_basicsize = sizeof(ProducerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Producer_new,
    .tp_dealloc = (destructor)Producer_dealloc,
    .tp_traverse = (traverseproc)Producer_traverse,
    .tp_clear = (inquiry)Producer_clear,
    .tp_methods = Producer_methods,
    .tp_as_sequence = &Producer_seq,
};

int kds_producer_init(PyObject *m) {
    if (!(S_fatal = PyUnicode_InternFromString("fatal")) ||
        !(S_fmt = PyUnicode_InternFromString("%s [%s] %s")))
        return -1;
    PyTypeObject *types[] = {&ProducerType, &ReportType};
    const char *names[] = {"NativeProducer", "DeliveryReport"};
    return kds_add_types(m, types, names, sizeof types / sizeof types[0]);
}

PyMethodDef kds_producer_methods[] = {
    {"rdk_bind", (PyCFunction)native_rdk_bind, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};
