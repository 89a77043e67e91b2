/* hybrid_forward: bench.passthrough's produce side in C, its consume side left in Python.
 *
 * A CPython module over a librdkafka producer of its own (the library the confluent-kafka wheel
 * ships, the one its Consumer runs on): produce(batch, i, max_in_flight) takes the consumed
 * confluent-kafka Message objects of a batch from index i, reads each one's value, key and headers
 * through its methods (as the sidecar's C intake does) and produces it with rd_kafka_producev,
 * the headers built as rd_kafka_headers_t; delivery reports are counted in C by poll / flush, no
 * Python object made per report. Records whose error() is set are skipped and counted. With
 * bench.passthrough --native-produce this measures a forwarder that keeps the Python client's
 * consumer (its rebalance and commit machinery) and moves only the produce and its reports out of
 * Python objects (docs/benchmarks.md, "A forward path without Python objects").
 *
 * One producer per process (module state): init(conf: dict, topic) once. Built by
 * scripts/setup.d/80-native-forward.sh.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <librdkafka/rdkafka.h>

static rd_kafka_t *rk;
static rd_kafka_topic_t *rkt;
static long long in_flight, acked, failed, consume_errors;
static PyObject *S_value, *S_key, *S_headers, *S_error;

static void on_delivery(rd_kafka_t *r, const rd_kafka_message_t *m, void *opaque) {
    (void)r, (void)opaque;
    in_flight--;
    if (m->err) failed++;
    else acked++;
}

/* init(conf: dict[str, str], topic: str): the producer, once per process */
static PyObject *init(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *conf, *k, *v;
    const char *topic;
    char err[512];
    if (!PyArg_ParseTuple(args, "O!s", &PyDict_Type, &conf, &topic)) return NULL;
    if (rk) {
        PyErr_SetString(PyExc_RuntimeError, "hybrid_forward.init: already initialised");
        return NULL;
    }
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    Py_ssize_t pos = 0;
    while (PyDict_Next(conf, &pos, &k, &v)) {
        const char *ks = PyUnicode_AsUTF8(k), *vs = PyUnicode_AsUTF8(v);
        if (!ks || !vs || rd_kafka_conf_set(c, ks, vs, err, sizeof err) != RD_KAFKA_CONF_OK) {
            if (ks && vs) PyErr_Format(PyExc_ValueError, "%s=%s: %s", ks, vs, err);
            rd_kafka_conf_destroy(c);
            return NULL;
        }
    }
    rd_kafka_conf_set_dr_msg_cb(c, on_delivery);
    rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    if (!rk) { /* only a successful rd_kafka_new takes the conf */
        rd_kafka_conf_destroy(c);
        PyErr_SetString(PyExc_RuntimeError, err);
        return NULL;
    }
    rkt = rd_kafka_topic_new(rk, topic, NULL);
    Py_RETURN_NONE;
}

/* bytes or None -> pointer and length (NULL, 0 for None); -1 with TypeError else */
static int bytes_of(PyObject *o, const void **p, size_t *n) {
    char *b = NULL;
    Py_ssize_t l = 0;
    if (o != Py_None && PyBytes_AsStringAndSize(o, &b, &l) < 0) return -1;
    *p = b;
    *n = (size_t)l;
    return 0;
}

/* the Message's headers (None or a list of (str, bytes | None)) as librdkafka's; NULL for none */
static int headers_of(PyObject *h, rd_kafka_headers_t **out) {
    *out = NULL;
    if (h == Py_None) return 0;
    if (!PyList_Check(h)) {
        PyErr_SetString(PyExc_TypeError, "Message.headers() is not a list");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(h);
    rd_kafka_headers_t *hd = rd_kafka_headers_new((size_t)n);
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *t = PyList_GET_ITEM(h, j);
        Py_ssize_t nl;
        const char *name;
        const void *hp;
        size_t hl;
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2 || !(name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(t, 0), &nl)) ||
            bytes_of(PyTuple_GET_ITEM(t, 1), &hp, &hl) < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a header is not (str, bytes | None)");
            rd_kafka_headers_destroy(hd);
            return -1;
        }
        rd_kafka_header_add(hd, name, nl, hp, (ssize_t)hl);
    }
    *out = hd;
    return 0;
}

/* produce(batch: list[Message], i, max_in_flight) -> j: batch[i:j] produced (or skipped as errors);
 * stops at max_in_flight unacknowledged or a full producer queue */
static PyObject *produce(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *batch;
    Py_ssize_t i;
    long long max;
    if (!PyArg_ParseTuple(args, "O!nL", &PyList_Type, &batch, &i, &max)) return NULL;
    if (!rk) {
        PyErr_SetString(PyExc_RuntimeError, "hybrid_forward.produce before init");
        return NULL;
    }
    for (; i < PyList_GET_SIZE(batch) && in_flight < max; i++) {
        PyObject *m = PyList_GET_ITEM(batch, i);
        PyObject *e = PyObject_CallMethodNoArgs(m, S_error);
        if (!e) return NULL;
        int bad = e != Py_None;
        Py_DECREF(e);
        if (bad) {
            consume_errors++;
            continue;
        }
        PyObject *v = PyObject_CallMethodNoArgs(m, S_value), *k = v ? PyObject_CallMethodNoArgs(m, S_key) : NULL,
                 *h = k ? PyObject_CallMethodNoArgs(m, S_headers) : NULL;
        const void *vp, *kp;
        size_t vn, kn;
        rd_kafka_headers_t *hd = NULL;
        if (!h || bytes_of(v, &vp, &vn) < 0 || bytes_of(k, &kp, &kn) < 0 || headers_of(h, &hd) < 0) {
            Py_XDECREF(v), Py_XDECREF(k), Py_XDECREF(h);
            return NULL;
        }
        rd_kafka_resp_err_t err = rd_kafka_producev(rk, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_VALUE((void *)vp, vn),
                                                    RD_KAFKA_V_KEY(kp, kn), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                                    RD_KAFKA_V_HEADERS(hd), RD_KAFKA_V_END);
        Py_DECREF(v), Py_DECREF(k), Py_DECREF(h);
        if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            if (hd) rd_kafka_headers_destroy(hd);
            break;
        }
        if (err) {
            if (hd) rd_kafka_headers_destroy(hd);
            PyErr_Format(PyExc_RuntimeError, "produce: %s", rd_kafka_err2str(err));
            return NULL;
        }
        in_flight++;
    }
    return PyLong_FromSsize_t(i);
}

static PyObject *counts(void) {
    return Py_BuildValue("{sLsLsLsL}", "in_flight", in_flight, "acked", acked, "failed", failed, "consume_errors",
                         consume_errors);
}

/* the reports served, waiting up to timeout_ms: for one (poll) or for all (flush); the counts */
static PyObject *serve(PyObject *args, int all) {
    int t;
    if (!PyArg_ParseTuple(args, "i", &t)) return NULL;
    if (rk) {
        Py_BEGIN_ALLOW_THREADS if (all) rd_kafka_flush(rk, t);
        else rd_kafka_poll(rk, t);
        Py_END_ALLOW_THREADS
    }
    return counts();
}

static PyObject *poll(PyObject *self, PyObject *args) { return (void)self, serve(args, 0); }

static PyObject *flush(PyObject *self, PyObject *args) { return (void)self, serve(args, 1); }

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "init(conf: dict[str, str], topic: str): the producer"},
    {"produce", produce, METH_VARARGS, "produce(batch, i, max_in_flight) -> j"},
    {"poll", poll, METH_VARARGS, "poll(timeout_ms) -> counts"},
    {"flush", flush, METH_VARARGS, "flush(timeout_ms) -> counts"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "hybrid_forward", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_hybrid_forward(void) {
    if (!(S_value = PyUnicode_InternFromString("value")) || !(S_key = PyUnicode_InternFromString("key")) ||
        !(S_headers = PyUnicode_InternFromString("headers")) || !(S_error = PyUnicode_InternFromString("error")))
        return NULL;
    return PyModule_Create(&module);
}
