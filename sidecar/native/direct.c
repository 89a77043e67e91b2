/* sidecar._native, direct core: a consumed request already due when it arrives is published by the
 * intake itself, not stored (the reference for everything else is the stored path; the orchestration,
 * the decisions and every report that is not plain: sidecar/engine/direct.py).
 *
 * ingest_run (intake.c) asks kds_direct_flying for every record of a run with a port (an id in
 * flight here stops the run: the reference path decides a duplicate, a replace, a cancel of it),
 * and, for a one-shot request due at `now` whose id has no id-index entry, kds_direct_ready (the
 * Publisher's room: max-in-flight, no target troubled, the broker up); then kds_direct_publish
 * produces it with the headers the stored record would be delivered with (codec.c
 * kds_fields_headers) and a DirectDelivery as its report callable, counts it in flight (the
 * Publisher's counts, publish.c), and files it in the port's `flights` under its id's hash. With
 * the changelog on, its commit-log bytes are held as its put, its id `fresh` (StoreMirror.held /
 * fresh: written only if a checkpoint or a later put needs them first, sorted by source offset). A
 * produce the producer refuses (a full queue) returns 0 and the intake stores the record as before.
 *
 * A DirectDelivery's plain success (the Publisher's plain conditions, publish.c kds_pub_plain) is
 * done here: the counts, the flight dropped, the lateness recorded, the held put and fresh id
 * dropped (nothing was written under the id: none is; else StoreMirror.remove writes the
 * tombstone), the id appended to the port's `delivered` (engine/direct.py settles them after the
 * poll: counters, recent outcomes). Anything else goes to the port's `fallback` after the counts.
 *
 * While a record is in flight the store's checkpoint names its ingress offset in `direct` and the
 * offset commit stops below it (store/partition.py, engine/durability.py): a crash or a handover
 * before its report consumes it again. */
#include "native.h"

typedef struct {
    PyObject_HEAD PyObject *publisher; /* the loop's Publisher (publish.c): its state and counts */
    PyObject *produce;                 /* the producer's bound produce (set before each run) */
    PyObject *store, *key;             /* the PartitionStore, its key in the stores map */
    PyObject *lateness;                /* the store's lateness list (its tenant's) */
    PyObject *topic_bytes;             /* the ingress topic, bytes (delay.source) */
    PyObject *flights;                 /* dict: id hash -> DirectDelivery in flight */
    PyObject *delivered;               /* list: ids of plain successes not yet settled */
    PyObject *held, *fresh;            /* StoreMirror.held, .fresh; None: the changelog is off */
    PyObject *mirror_remove;           /* StoreMirror.remove (None: off): a tombstone is needed */
    PyObject *fallback;                /* DirectPublish.report(delivery, err, msg) */
    long long max_in_flight;
    long long partition; /* the ingress partition (delay.source) */
    long long taken;     /* records published by runs since Python last zeroed it */
} DirectPortObject;

/* the port's object fields, once: traverse and clear walk them */
#define DIRECT_PORT_FIELDS(X)                                                                                      \
    X(publisher) X(produce) X(store) X(key) X(lateness) X(topic_bytes) X(flights) X(delivered) X(held) X(fresh)    \
        X(mirror_remove) X(fallback)

static int DirectPort_traverse(DirectPortObject *p, visitproc visit, void *arg) {
#define VISIT_FIELD(f) Py_VISIT(p->f);
    DIRECT_PORT_FIELDS(VISIT_FIELD)
#undef VISIT_FIELD
    return 0;
}

static int DirectPort_clear(DirectPortObject *p) {
#define CLEAR_FIELD(f) Py_CLEAR(p->f);
    DIRECT_PORT_FIELDS(CLEAR_FIELD)
#undef CLEAR_FIELD
    return 0;
}

static void DirectPort_dealloc(DirectPortObject *p) {
    PyObject_GC_UnTrack(p);
    DirectPort_clear(p);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

/* DirectPort(publisher, store, key, lateness, topic_bytes, partition, flights, delivered, held,
 * fresh, mirror_remove, fallback): produce and max_in_flight are set before each run. */
static PyObject *DirectPort_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"publisher", "store", "key", "lateness", "topic_bytes", "partition", "flights",
                             "delivered", "held", "fresh", "mirror_remove", "fallback", NULL};
    PyObject *o[12];
    long long partition;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$OOOO!O!LO!O!OOOO:DirectPort", kwlist, &o[0], &o[1], &o[2],
                                     &PyList_Type, &o[3], &PyBytes_Type, &o[4], &partition, &PyDict_Type, &o[6],
                                     &PyList_Type, &o[7], &o[8], &o[9], &o[10], &o[11]))
        return NULL;
    if (kds_pub_check(o[0]) < 0) return NULL;
    if ((o[8] != Py_None && !PyDict_Check(o[8])) || (o[9] != Py_None && !PySet_Check(o[9]))) {
        PyErr_SetString(PyExc_TypeError, "DirectPort: held is a dict or None, fresh a set or None");
        return NULL;
    }
    DirectPortObject *p = (DirectPortObject *)type->tp_alloc(type, 0);
    if (!p) return NULL;
    p->publisher = Py_NewRef(o[0]);
    p->produce = Py_NewRef(Py_None);
    p->store = Py_NewRef(o[1]);
    p->key = Py_NewRef(o[2]);
    p->lateness = Py_NewRef(o[3]);
    p->topic_bytes = Py_NewRef(o[4]);
    p->partition = partition;
    p->flights = Py_NewRef(o[6]);
    p->delivered = Py_NewRef(o[7]);
    p->held = Py_NewRef(o[8]);
    p->fresh = Py_NewRef(o[9]);
    p->mirror_remove = Py_NewRef(o[10]);
    p->fallback = Py_NewRef(o[11]);
    return (PyObject *)p;
}

static PyMemberDef DirectPort_members[] = {
    {"produce", T_OBJECT_EX, offsetof(DirectPortObject, produce), 0, "the producer's bound produce"},
    {"max_in_flight", T_LONGLONG, offsetof(DirectPortObject, max_in_flight), 0, "the loop's max-in-flight"},
    {"taken", T_LONGLONG, offsetof(DirectPortObject, taken), 0, "records published since last zeroed"},
    {"store", T_OBJECT_EX, offsetof(DirectPortObject, store), READONLY, "its PartitionStore"},
    {"flights", T_OBJECT_EX, offsetof(DirectPortObject, flights), READONLY, "id hash -> DirectDelivery"},
    {"delivered", T_OBJECT_EX, offsetof(DirectPortObject, delivered), READONLY, "ids delivered, not settled"},
    {"lateness", T_OBJECT_EX, offsetof(DirectPortObject, lateness), READONLY, "the store's lateness list"},
    {NULL}};

static PyTypeObject DirectPortType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sidecar._native.DirectPort",
    .tp_doc = "A store's port for records published from the intake (sidecar/engine/direct.py).",
    .tp_basicsize = sizeof(DirectPortObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = DirectPort_new,
    .tp_dealloc = (destructor)DirectPort_dealloc,
    .tp_traverse = (traverseproc)DirectPort_traverse,
    .tp_clear = (inquiry)DirectPort_clear,
    .tp_members = DirectPort_members,
};

typedef struct {
    PyObject_HEAD DirectPortObject *port;
    PyObject *rid, *topic, *msg, *hkey; /* hkey: its key in flights (the id's hash) */
    long long offset, due;
    char superseded; /* a newer version of its id was stored meanwhile: its changelog is that one's */
    vectorcallfunc vectorcall;
} DirectDeliveryObject;

/* Not tracked by the collector (one per record in flight, as publish.c's Delivery): the cycle
 * port -> flights -> delivery -> port is cut by its report, or when the store closes
 * (store/flights.py Flights.close clears them). */
static void DirectDelivery_dealloc(DirectDeliveryObject *d) {
    Py_XDECREF(d->port);
    Py_XDECREF(d->rid);
    Py_XDECREF(d->topic);
    Py_XDECREF(d->msg);
    Py_XDECREF(d->hkey);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyMemberDef DirectDelivery_members[] = {
    {"port", T_OBJECT_EX, offsetof(DirectDeliveryObject, port), READONLY, "its store's DirectPort"},
    {"rid", T_OBJECT_EX, offsetof(DirectDeliveryObject, rid), READONLY, "its delay.id"},
    {"topic", T_OBJECT_EX, offsetof(DirectDeliveryObject, topic), READONLY, "its target topic"},
    {"msg", T_OBJECT_EX, offsetof(DirectDeliveryObject, msg), READONLY, "the consumed ingress message"},
    {"hash", T_OBJECT_EX, offsetof(DirectDeliveryObject, hkey), READONLY, "its id's hash (its key in flights)"},
    {"offset", T_LONGLONG, offsetof(DirectDeliveryObject, offset), READONLY, "its ingress offset"},
    {"due", T_LONGLONG, offsetof(DirectDeliveryObject, due), READONLY, "its committed due time, epoch ms"},
    {"superseded", T_BOOL, offsetof(DirectDeliveryObject, superseded), 0, "a newer version of its id is stored"},
    {NULL}};

/* A plain success (after the counts): out of the flights, its lateness (read from msg, or ts when
 * msg is NULL), its changelog put settled, delivered. 0, or -1 with an error set. */
static int direct_taken(DirectDeliveryObject *d, PyObject *msg, long long ts) {
    PyObject *self = (PyObject *)d;
    DirectPortObject *p = d->port;
    PyObject *v = PyDict_GetItemWithError(p->flights, d->hkey);
    if (v == self) {
        if (PyDict_DelItem(p->flights, d->hkey) < 0) return -1;
    } else if (!v && PyErr_Occurred()) {
        return -1;
    }
    if (msg ? kds_pub_lateness(p->publisher, msg, d->due, p->lateness) < 0
            : kds_pub_lateness_at(p->publisher, ts, d->due, p->lateness) < 0)
        return -1;
    if (p->held != Py_None && !d->superseded) {
        /* its put still held and never written (fresh): nothing under the id is in the changelog */
        int done = 0;
        if (PyDict_GET_SIZE(p->held)) {
            int has = PyDict_Contains(p->held, d->rid), fresh = 0;
            if (has < 0) return -1;
            if (has && p->fresh != Py_None) {
                fresh = PySet_Contains(p->fresh, d->rid);
                if (fresh < 0) return -1;
            }
            if (has && fresh) {
                if (PyDict_DelItem(p->held, d->rid) < 0 || PySet_Discard(p->fresh, d->rid) < 0) return -1;
                done = 1;
            }
        }
        if (!done) { /* written by a flush (or held as not fresh): StoreMirror.remove writes the tombstone */
            PyObject *r = PyObject_CallOneArg(p->mirror_remove, d->rid);
            if (!r) return -1;
            Py_DECREF(r);
        }
    }
    return PyList_Append(p->delivered, d->rid);
}

/* The report: the plain success here, everything else (after the counts) to port.fallback. */
static PyObject *DirectDelivery_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    DirectDeliveryObject *d = (DirectDeliveryObject *)self;
    if (PyVectorcall_NARGS(nargsf) != 2 || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "DirectDelivery(err, msg)");
        return NULL;
    }
    PyObject *err = args[0], *msg = args[1];
    DirectPortObject *p = d->port;
    if (kds_pub_count(p->publisher, d->topic, -1) < 0) return NULL;
    int plain = err == Py_None ? kds_pub_plain(p->publisher, p->key, p->store) : 0;
    if (plain < 0) return NULL;
    if (!plain) {
        PyObject *a[3] = {self, err, msg};
        return PyObject_Vectorcall(p->fallback, a, 3, NULL);
    }
    if (direct_taken(d, msg, 0) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyTypeObject DirectDeliveryType;

int kds_is_direct_delivery(PyObject *o) { return Py_IS_TYPE(o, &DirectDeliveryType); }

/* the plain success from the native producer's report (the vectorcall's checks, plain first so that
 * 0 leaves everything as it was): 1 taken, 0 not plain, -1 error */
int kds_direct_ok(PyObject *o, const kds_report_t *rep) {
    DirectDeliveryObject *d = (DirectDeliveryObject *)o;
    DirectPortObject *p = d->port;
    int plain = kds_pub_plain(p->publisher, p->key, p->store);
    if (plain <= 0) return plain;
    if (kds_pub_count(p->publisher, d->topic, -1) < 0) return -1;
    return direct_taken(d, NULL, rep->ts) < 0 ? -1 : 1;
}

static PyTypeObject DirectDeliveryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sidecar._native.DirectDelivery",
    .tp_doc = "The delivery report of a record published from the intake (sidecar/engine/direct.py).",
    .tp_basicsize = sizeof(DirectDeliveryObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_dealloc = (destructor)DirectDelivery_dealloc,
    .tp_vectorcall_offset = offsetof(DirectDeliveryObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_members = DirectDelivery_members,
};

int kds_direct_port(PyObject *o, PyObject **port) {
    if (o == Py_None) {
        *port = NULL;
        return 0;
    }
    if (!PyObject_TypeCheck(o, &DirectPortType)) {
        PyErr_SetString(PyExc_TypeError, "IngestRun.direct is a DirectPort or None");
        return -1;
    }
    *port = o;
    return 0;
}

int kds_direct_flying(PyObject *po, uint64_t h) {
    DirectPortObject *p = (DirectPortObject *)po;
    if (!PyDict_GET_SIZE(p->flights)) return 0;
    PyObject *k = PyLong_FromUnsignedLongLong(h);
    if (!k) return -1;
    int rc = PyDict_Contains(p->flights, k);
    Py_DECREF(k);
    return rc;
}

int kds_direct_ready(PyObject *po) {
    DirectPortObject *p = (DirectPortObject *)po;
    return kds_pub_room(p->publisher, p->max_in_flight);
}

int kds_direct_sync(PyObject *po) { return kds_pub_sync(((DirectPortObject *)po)->publisher); }

int kds_direct_holds(PyObject *po) { return ((DirectPortObject *)po)->held != Py_None; }

/* kds_fields_headers_each's arguments, for the native producer's entry */
struct fields_fill {
    PyObject *user, *rid, *topic_bytes;
    long long due, enq, partition, offset;
};

static int fields_fill(void *fctx, kds_hadd add, void *actx) {
    struct fields_fill *f = fctx;
    return kds_fields_headers_each(f->user, f->rid, f->due, f->enq, f->topic_bytes, f->partition, f->offset, add, actx);
}

int kds_direct_publish(PyObject *po, PyObject *msg, PyObject *rid, uint64_t h, long long offset, long long due,
                       long long ts, PyObject *topic, long long tpart, PyObject *key, PyObject *value,
                       PyObject *user, PyObject *raw) {
    DirectPortObject *p = (DirectPortObject *)po;
    /* the native producer's C entry takes the headers straight into librdkafka's (no list) */
    PyObject *np = kds_native_producer(p->produce), *headers = NULL;
    if (!np && !(headers = kds_fields_headers(user, rid, due, ts, p->topic_bytes, p->partition, offset))) return -1;
    PyObject *hkey = PyLong_FromUnsignedLongLong(h), *tp = PyLong_FromLongLong(tpart);
    DirectDeliveryObject *cb = hkey && tp ? PyObject_New(DirectDeliveryObject, &DirectDeliveryType) : NULL;
    int out = -1;
    if (!cb) goto done;
    cb->vectorcall = DirectDelivery_vectorcall;
    cb->port = (DirectPortObject *)Py_NewRef(po);
    cb->rid = Py_NewRef(rid);
    cb->topic = Py_NewRef(topic);
    cb->msg = Py_NewRef(msg);
    cb->hkey = Py_NewRef(hkey);
    cb->offset = offset;
    cb->due = due;
    cb->superseded = 0;
    PyObject *zero = PyLong_FromLong(0);
    Py_DECREF(zero); /* a cached small int: stays alive */
    /* positional, in the client's order (publish.c publish_due): topic, value, key, partition,
     * callback, on_delivery (alias, unused), timestamp (0: now), headers */
    PyObject *res;
    if (np) {
        struct fields_fill f = {user, rid, p->topic_bytes, due, ts, p->partition, offset};
        res = kds_np_send(np, topic, value, key, tpart, (PyObject *)cb, fields_fill, &f) < 0 ? NULL : Py_NewRef(Py_None);
    } else {
        PyObject *a[8] = {topic, value, key, tp, (PyObject *)cb, Py_None, zero, headers};
        res = PyObject_Vectorcall(p->produce, a, 8, NULL);
    }
    if (!res) {
        if (kds_pub_refused(p->publisher)) { /* a full queue: stored instead, published from the store */
            PyErr_Clear();
            out = 0;
        }
        goto done;
    }
    Py_DECREF(res);
    if (kds_pub_count(p->publisher, topic, 1) < 0) goto done;
    if (PyDict_SetItem(p->flights, hkey, (PyObject *)cb) < 0) goto done;
    if (raw && (PyDict_SetItem(p->held, rid, raw) < 0 || (p->fresh != Py_None && PySet_Add(p->fresh, rid) < 0)))
        goto done;
    p->taken++;
    out = 1;
done:
    Py_XDECREF((PyObject *)cb);
    Py_XDECREF(hkey);
    Py_XDECREF(tp);
    Py_XDECREF(headers);
    return out;
}

int kds_direct_init(PyObject *m) {
    PyTypeObject *types[] = {&DirectPortType, &DirectDeliveryType};
    const char *names[] = {"DirectPort", "DirectDelivery"};
    return kds_add_types(m, types, names, sizeof types / sizeof types[0]);
}
