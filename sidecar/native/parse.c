/* sidecar._native, parse core. parse_request: the common ingress request, parsed without Python
 * code (headers.py has the full parser, which stays the only authority). It answers only for a
 * record whose control headers are among delay.target-topic (a target already checked and
 * accepted), delay.ms or delay.deliver-at (one at most), delay.target-partition and delay.id, each
 * once, with a non-empty ASCII value, strict decimal numbers and everything in range; then its
 * answer is the one the full parser gives. Anything else (a cancel, a level, a retry, the
 * kafka-message-scheduler headers, any fault at all) returns None, and the caller runs the full
 * parser. So does any other header whose name starts with the contract's prefix ("delay.", given
 * by setup_parser): a pass-through one or one the sidecar does not know, which the full parser
 * rejects as bad-header; no list of names is kept here. The intake fast path (intake.c) runs the
 * same parse per record (kds_parse_core). */
#include "native.h"

static PyObject *control_codes = NULL; /* dict: control header name -> code (0: not handled here) */
static Py_UCS4 prefix[16];            /* the contract's prefix ("delay."): such a name is never a user header here */
static Py_ssize_t prefix_len = 0;
PyObject *kds_MODE_NOW = NULL;
static PyObject *MODE_MS, *MODE_AT;
#define C_TOPIC 1
#define C_MS 2
#define C_AT 3
#define C_PARTITION 4
#define C_ID 5
#define C_EVERY 6 /* delay.every: a recurring record, taken only by the intake's run (recurring_ok) */
#define C_START 7 /* delay.start: its start, with delay.every only */
#define C_COUNT 8
static long long min_every_ms = 1000; /* contract.MIN_EVERY_MS, from setup_parser */
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

/* does `name` (a str) start with the prefix? Most names differ at the first character. */
static int has_prefix(PyObject *name) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(name);
    if (n < prefix_len) return 0;
    int kind = PyUnicode_KIND(name);
    const void *data = PyUnicode_DATA(name);
    for (Py_ssize_t i = 0; i < prefix_len; i++)
        if (PyUnicode_READ(kind, data, i) != prefix[i]) return 0;
    return 1;
}

#define PARSE_MAX_HEADERS 64 /* more headers: the full parser (they are remembered on the stack) */

/* parse_request's work: 1 and *out filled for the common request, 0 for any other (the full
 * parser answers), -1 with an exception set. out->topic and out->user are new references, rid
 * (the delay.id value, or NULL) and mode borrowed. `memo` may be NULL: else the last target topic
 * checked (ingest_run keeps one per call, and releases it), so the same bytes give the same str,
 * already found in checked_targets, without a decode and a set lookup per record.
 * With `recurring_ok`, the common recurring record is taken too: delay.every (>= the least
 * interval) with a delay.id, an optional delay.start (default: the record's timestamp, or 0),
 * beside none of delay.ms / delay.deliver-at, and no other recurring header (delay.cron, tz, end,
 * max-count, misfire: code 0, the full parser). Its first firing is its start (store/firings.py
 * ``arm``: the first of start + k * every after start - 1), its due time that, in mode "at";
 * out->spec is then a new tuple of its schedule headers as given, in contract.RECURRING_HEADERS
 * order (delay.every, delay.start), which the stored headers carry after the user's. */
int kds_parse_core(PyObject *headers, long long ts, long long now, long long size, long long max_bytes,
                   long long max_delay, PyObject *checked, TopicMemo *memo, int recurring_ok, Request *out) {
    if (!control_codes) {
        PyErr_SetString(PyExc_RuntimeError, "sidecar._native.setup_parser() was not called");
        return -1;
    }
    PyObject *found[C_COUNT] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    PyObject *spec_item[C_COUNT] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
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
            if (prefix_len && has_prefix(name)) return 0;
            n_user++;
            continue;
        }
        long code = PyLong_AsLong(code_o);
        if (code <= 0 || code >= C_COUNT || found[code] || !ascii_nonempty(value)) return 0;
        found[code] = value;
        spec_item[code] = it;
    }
    if (size > max_bytes || !found[C_TOPIC] || (found[C_MS] && found[C_AT])) return 0;
    int recurring = found[C_EVERY] || found[C_START];
    if (recurring && (!recurring_ok || !found[C_EVERY] || !found[C_ID] || found[C_MS] || found[C_AT])) return 0;
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
    PyObject *mode = kds_MODE_NOW;
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
    } else if (ok && recurring) {
        ok = digits(found[C_EVERY], &x) && x >= min_every_ms;
        due = ts > 0 ? ts : 0;
        if (ok && found[C_START]) ok = digits(found[C_START], &due);
        mode = MODE_AT;
    }
    if (ok) ok = due <= MAX_EPOCH_MS && due - (now > ts ? now : ts) <= max_delay;
    if (!ok) {
        Py_DECREF(topic);
        return 0;
    }
    PyObject *spec = NULL;
    if (recurring) {
        spec = found[C_START] ? PyTuple_Pack(2, spec_item[C_EVERY], spec_item[C_START])
                              : PyTuple_Pack(1, spec_item[C_EVERY]);
        if (!spec) {
            Py_DECREF(topic);
            return -1;
        }
    }
    PyObject *user = PyTuple_New(n_user);
    if (!user) {
        Py_DECREF(topic);
        Py_XDECREF(spec);
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
    out->spec = spec;
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
    int rc = kds_parse_core(args[0], ts, now, size, max_bytes, max_delay, args[6], NULL, 0, &r);
    if (rc < 0) return NULL;
    if (rc == 0) Py_RETURN_NONE;
    return Py_BuildValue("(NLOLON)", r.topic, r.partition, r.rid ? r.rid : Py_None, r.due, r.mode, r.user);
}

/* setup_parser(codes, prefix[, min_every_ms]): {control header name: code}, 1 target topic, 2
 * delay.ms, 3 deliver-at, 4 target partition, 5 id, 6 delay.every, 7 delay.start, 0 any other
 * control header; prefix: the contract's ("delay."), a name starting with it and not in codes is
 * left to the full parser (headers.py owns the names and the prefix); min_every_ms: the least
 * delay.every (contract.MIN_EVERY_MS). */
static PyObject *native_setup_parser(PyObject *self, PyObject *args) {
    PyObject *codes, *pfx;
    long long least = 1000;
    if (!PyArg_ParseTuple(args, "O!U|L:setup_parser", &PyDict_Type, &codes, &pfx, &least)) return NULL;
    min_every_ms = least;
    Py_ssize_t plen = PyUnicode_GET_LENGTH(pfx);
    if (plen < 1 || plen > (Py_ssize_t)(sizeof prefix / sizeof prefix[0])) {
        PyErr_SetString(PyExc_ValueError, "setup_parser: the prefix must be 1..16 characters");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < plen; i++) prefix[i] = PyUnicode_READ_CHAR(pfx, i);
    prefix_len = plen;
    Py_INCREF(codes);
    Py_XSETREF(control_codes, codes);
    if (!kds_MODE_NOW) {
        kds_MODE_NOW = PyUnicode_InternFromString("now");
        MODE_MS = PyUnicode_InternFromString("ms");
        MODE_AT = PyUnicode_InternFromString("at");
        if (!kds_MODE_NOW || !MODE_MS || !MODE_AT) return NULL;
    }
    Py_RETURN_NONE;
}

PyMethodDef kds_parse_methods[] = {
    {"parse_request", (PyCFunction)(void (*)(void))native_parse_request, METH_FASTCALL, NULL},
    {"setup_parser", native_setup_parser, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};
