/* sidecar._native, publish core: the publish fast path (the reference is sidecar/engine/loop.py,
 * Publishing._produce and Publishing._on_delivery, which take every case that is not plain).
 *
 * publish_due produces a due batch with the client's bound produce (or, when that is a
 * NativeProducer's, its C entry kds_np_send, the headers written straight into librdkafka's); each
 * record gets a Delivery as its delivery-report callable. The loop state both paths read and write is one PublishState
 * (sidecar/engine/publish_state.py): a C type whose fields are struct members, read here directly
 * and by Python as attributes of the same object, so the two paths interleave record by record.
 * in_flight is a C integer, exact at every moment. topic_in_flight, a dict, is the exception: C
 * keeps its changes to it in the Publisher and adds them at sync (a dict read, a new int and a
 * write per record cost about 4 % of the loop thread); publish_due syncs before it returns and
 * the loop after every producer poll (Publishing.poll), so Python reads exact counts everywhere
 * outside a poll; inside one, a delivery report of the reference path subtracts its own record
 * from counts that still include the C reports' records, never reaching zero early. The store and
 * the counters are Python objects: their fields (acked, lateness, topic_bytes, partition, early) are
 * read by name; a store's lateness list is its tenant's (engine/tenant_counts.py), looked up once per
 * publish_due call and held by each Delivery.
 *
 * Anything not plain goes back to Python: a record not due yet (the never-early check), a recurring
 * schedule's firing firing.c does not take, a troubled
 * target, a refused produce (BufferError / KafkaException, handed back to the caller), a failed
 * delivery, a revoked partition, the broker marked down. */
#include "native.h"

static PyObject *S_early, *S_acked, *S_topic_bytes, *S_key, *S_lateness;

/* ---------------------------------------------------------------------------------------------
 * PublishState: the loop's publish state (its Python twin and the field docs: publish_state.py). */

typedef struct {
    PyObject_HEAD long long in_flight; /* records produced, their reports not yet served */
    PyObject *topic_in_flight;         /* dict: target topic -> records in flight (see sync) */
    PyObject *troubled;                /* dict: target topic -> when its last publish failed */
    char broker_up;                    /* bool: no sign of a broker outage since the last success */
    PyObject *stores;                  /* dict: (topic, partition) -> its PartitionStore (the assigned ones) */
    PyObject *counters;                /* partition.Counters, shared with the stores */
} PublishStateObject;

/* an object member of the state, or NULL with AttributeError if it was deleted */
static PyObject *ps_field(PyObject *v, const char *name) {
    if (!v) PyErr_Format(PyExc_AttributeError, "PublishState.%s is not set", name);
    return v;
}

static int PublishState_traverse(PublishStateObject *s, visitproc visit, void *arg) {
    Py_VISIT(s->topic_in_flight);
    Py_VISIT(s->troubled);
    Py_VISIT(s->stores);
    Py_VISIT(s->counters);
    return 0;
}

static int PublishState_clear(PublishStateObject *s) {
    Py_CLEAR(s->topic_in_flight);
    Py_CLEAR(s->troubled);
    Py_CLEAR(s->stores);
    Py_CLEAR(s->counters);
    return 0;
}

static void PublishState_dealloc(PublishStateObject *s) {
    PyObject_GC_UnTrack(s);
    PublishState_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* PublishState(stores, counters): nothing in flight, no troubled target, the broker up. */
static PyObject *PublishState_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"stores", "counters", NULL};
    PyObject *stores, *counters;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:PublishState", kwlist, &stores, &counters)) return NULL;
    PublishStateObject *s = (PublishStateObject *)type->tp_alloc(type, 0);
    if (!s) return NULL;
    s->broker_up = 1;
    s->stores = Py_NewRef(stores);
    s->counters = Py_NewRef(counters);
    s->topic_in_flight = PyDict_New();
    s->troubled = PyDict_New();
    if (!s->topic_in_flight || !s->troubled) {
        Py_DECREF(s);
        return NULL;
    }
    return (PyObject *)s;
}

static PyMemberDef PublishState_members[] = {
    {"in_flight", T_LONGLONG, offsetof(PublishStateObject, in_flight), 0, "records produced, not yet reported"},
    {"topic_in_flight", T_OBJECT_EX, offsetof(PublishStateObject, topic_in_flight), 0,
     "target topic -> records in flight"},
    {"troubled", T_OBJECT_EX, offsetof(PublishStateObject, troubled), 0, "target topic -> when its publish failed"},
    {"broker_up", T_BOOL, offsetof(PublishStateObject, broker_up), 0, "no sign of a broker outage"},
    {"stores", T_OBJECT_EX, offsetof(PublishStateObject, stores), 0, "(topic, partition) -> its PartitionStore"},
    {"counters", T_OBJECT_EX, offsetof(PublishStateObject, counters), 0, "the loop's own Counters"},
    {NULL}};

static PyTypeObject PublishStateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sidecar._native.PublishState",
    .tp_doc = "PublishState(stores, counters): the loop state the publish paths share (engine/publish_state.py).",
    .tp_basicsize = sizeof(PublishStateObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PublishState_new,
    .tp_dealloc = (destructor)PublishState_dealloc,
    .tp_traverse = (traverseproc)PublishState_traverse,
    .tp_clear = (inquiry)PublishState_clear,
    .tp_members = PublishState_members,
};

/* ---------------------------------------------------------------------------------------------
 * Publisher: the state, the reference path and what publish_due and its reports keep. */

typedef struct {
    PyObject_HEAD PublishStateObject *state; /* the loop's */
    PyObject *on_delivery;                   /* Publishing._on_delivery (bound): the reference path */
    PyObject *refused;                       /* exception types a produce call hands back, not raises */
    PyObject *topic_b, *topic_s;             /* the last target topic, bytes and str (one decode per topic) */
    PyObject *pend_topic;                    /* the topic whose pend_tif is not yet in topic_in_flight */
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
    if (!PyArg_ParseTuple(args, "O!OO:Publisher", &PublishStateType, &state, &on_delivery, &refused)) return NULL;
    PublisherObject *p = (PublisherObject *)type->tp_alloc(type, 0);
    if (!p) return NULL;
    p->state = (PublishStateObject *)Py_NewRef(state);
    p->on_delivery = Py_NewRef(on_delivery);
    p->refused = Py_NewRef(refused);
    return (PyObject *)p;
}

typedef struct {
    PyObject_HEAD PublisherObject *pub;
    PyObject *ref, *rec, *store, *topic, *partition, *lateness; /* lateness: the store's tenant's list */
    vectorcallfunc vectorcall;
} DeliveryObject;

static void Delivery_dealloc(DeliveryObject *d) {
    Py_XDECREF(d->pub);
    Py_XDECREF(d->ref);
    Py_XDECREF(d->rec);
    Py_XDECREF(d->store);
    Py_XDECREF(d->topic);
    Py_XDECREF(d->partition);
    Py_XDECREF(d->lateness);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

/* topic_in_flight[topic] += delta, and gone at 0 (a missing key is a KeyError, as in Python) */
static int tif_add(PublishStateObject *ps, PyObject *topic, long long delta) {
    PyObject *tif = ps_field(ps->topic_in_flight, "topic_in_flight");
    if (!tif) return -1;
    if (!PyDict_Check(tif)) {
        PyErr_SetString(PyExc_TypeError, "PublishState.topic_in_flight is not a dict");
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

/* Add the pending topic count to topic_in_flight. */
static int pub_sync(PublisherObject *p) {
    if (!p->pend_topic) return 0;
    long long d = p->pend_tif;
    PyObject *topic = p->pend_topic;
    p->pend_topic = NULL;
    p->pend_tif = 0;
    int rc = d ? tif_add(p->state, topic, d) : 0;
    Py_DECREF(topic);
    return rc;
}

/* topic_in_flight[topic] += delta, pending; a change of topic syncs the previous one. */
static int pub_tif(PublisherObject *p, PyObject *topic, long long delta) {
    if (p->pend_topic != topic) {
        if (pub_sync(p) < 0) return -1;
        p->pend_topic = Py_NewRef(topic);
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
     "Add the topic in-flight counts the C path changed to the state (after every producer poll)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PublisherType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sidecar._native.Publisher",
    .tp_doc = "Publisher(state, on_delivery, refused): what publish_due and its Delivery reports use.",
    .tp_basicsize = sizeof(PublisherObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Publisher_new,
    .tp_dealloc = (destructor)Publisher_dealloc,
    .tp_traverse = (traverseproc)Publisher_traverse,
    .tp_clear = (inquiry)Publisher_clear,
    .tp_methods = Publisher_methods,
};

/* A record delivered at t (ms): its lateness (t - its due time) into `lateness` (a list), and
 * counters.early += 1 when it is negative: 0, or -1 with an error set. */
static int lateness_at(PublishStateObject *ps, long long t, long long due, PyObject *lateness) {
    if (t - due < 0) {
        PyObject *counters = ps_field(ps->counters, "counters");
        if (!counters) return -1;
        PyObject *early = PyObject_GetAttr(counters, S_early);
        if (!early) return -1;
        long long e = PyLong_AsLongLong(early);
        Py_DECREF(early);
        if (e == -1 && PyErr_Occurred()) return -1;
        PyObject *ne = PyLong_FromLongLong(e + 1);
        if (!ne) return -1;
        int rc = PyObject_SetAttr(counters, S_early, ne);
        Py_DECREF(ne);
        if (rc < 0) return -1;
    }
    PyObject *lv = PyLong_FromLongLong(t - due);
    if (!lv) return -1;
    int rc = PyList_Check(lateness) ? PyList_Append(lateness, lv) : -1;
    Py_DECREF(lv);
    if (rc < 0 && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "store.lateness is not a list");
    return rc;
}

/* the same, t read from the delivered Message (the consumed ones' type, or a DeliveryReport) */
static int report_lateness(PublishStateObject *ps, PyObject *msg, long long due, PyObject *lateness) {
    PyObject *ts = kds_msg_call(msg, M_TIMESTAMP);
    if (!ts) return -1;
    long long t = -1;
    if (PyTuple_Check(ts) && PyTuple_GET_SIZE(ts) == 2) {
        t = PyLong_AsLongLong(PyTuple_GET_ITEM(ts, 1));
    } else {
        PyErr_SetString(PyExc_TypeError, "msg.timestamp() is not a (type, ms) pair");
    }
    Py_DECREF(ts);
    if (t == -1 && PyErr_Occurred()) return -1;
    return lateness_at(ps, t, due, lateness);
}

/* 1: a success report of d is plain (no target troubled, the broker up, d's store still the
 * stores map's), 0: the reference decides, -1: error */
static int delivery_plain(DeliveryObject *d) {
    PublishStateObject *ps = d->pub->state;
    PyObject *troubled = ps_field(ps->troubled, "troubled");
    if (!troubled) return -1;
    PyObject *stores = ps_field(ps->stores, "stores");
    if (!stores) return -1;
    if (!PyDict_Check(troubled) || PyDict_GET_SIZE(troubled) || !ps->broker_up || !PyDict_Check(stores)) return 0;
    PyObject *current = PyDict_GetItemWithError(stores, d->partition);
    if (!current && PyErr_Occurred()) return -1;
    return current == d->store;
}

/* a plain success: out of flight, its lateness (t < 0: read from msg), acked in its store */
static int delivery_taken(DeliveryObject *d, PyObject *msg, long long t) {
    PublishStateObject *ps = d->pub->state;
    ps->in_flight--;
    if (pub_tif(d->pub, d->topic, -1) < 0) return -1;
    long long due = ((RecordObject *)d->rec)->due_ms;
    if ((msg ? report_lateness(ps, msg, due, d->lateness) : lateness_at(ps, t, due, d->lateness)) < 0) return -1;
    PyObject *acked = PyObject_GetAttr(d->store, S_acked);
    if (!acked) return -1;
    PyObject *pair = PyTuple_Pack(2, d->ref, d->rec);
    int rc = pair && PyList_Check(acked) ? PyList_Append(acked, pair) : -1;
    Py_XDECREF(pair);
    Py_DECREF(acked);
    if (rc < 0 && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "store.acked is not a list");
    return rc;
}

/* The delivery report: the common success in C, everything else through Publishing._on_delivery. */
static PyObject *Delivery_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    DeliveryObject *d = (DeliveryObject *)self;
    if (PyVectorcall_NARGS(nargsf) != 2 || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "Delivery(err, msg)");
        return NULL;
    }
    PyObject *err = args[0], *msg = args[1];
    int plain = err == Py_None ? delivery_plain(d) : 0;
    if (plain < 0) return NULL;
    if (!plain) {
        PyObject *a[7] = {d->ref, d->rec, d->store, Py_None, d->topic, err, msg};
        return PyObject_Vectorcall(d->pub->on_delivery, a, 7, NULL);
    }
    if (delivery_taken(d, msg, 0) < 0) return NULL;
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

/* What NativeProducer (producer.c) calls for a report whose callable is a Delivery: the plain
 * success served from the delivery's timestamp, no Message object made. */
int kds_is_delivery(PyObject *o) { return Py_IS_TYPE(o, &DeliveryType); }

/* 1: taken, 0: not plain (nothing changed: call the Delivery with a report), -1: error */
int kds_delivery_ok(PyObject *o, const kds_report_t *rep) {
    DeliveryObject *d = (DeliveryObject *)o;
    int plain = delivery_plain(d);
    if (plain <= 0) return plain;
    return delivery_taken(d, NULL, rep->ts) < 0 ? -1 : 1;
}

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

/* ---------------------------------------------------------------------------------------------
 * What the direct path (direct.c: records due on arrival published from the intake) shares with
 * this one: the same in-flight counts, the same conditions for a plain publish and report. */

int kds_pub_check(PyObject *pub) {
    if (PyObject_TypeCheck(pub, &PublisherType)) return 0;
    PyErr_SetString(PyExc_TypeError, "not a sidecar._native.Publisher");
    return -1;
}

/* 1: a record may be produced now by a fast path (fewer than max_in_flight in flight, no target
 * troubled, no sign of a broker outage), 0: not (the stored path takes it), -1: error */
int kds_pub_room(PyObject *pubo, long long max_in_flight) {
    PublishStateObject *ps = ((PublisherObject *)pubo)->state;
    PyObject *troubled = ps_field(ps->troubled, "troubled");
    if (!troubled) return -1;
    return ps->in_flight < max_in_flight && PyDict_Check(troubled) && !PyDict_GET_SIZE(troubled) && ps->broker_up;
}

/* a record to `topic` produced (+1) or reported (-1) */
int kds_pub_count(PyObject *pubo, PyObject *topic, long long delta) {
    PublisherObject *pub = (PublisherObject *)pubo;
    pub->state->in_flight += delta;
    return pub_tif(pub, topic, delta);
}

int kds_pub_sync(PyObject *pubo) { return pub_sync((PublisherObject *)pubo); }

/* 1: the exception set is one the produce call hands back (a full queue, the client's local error) */
int kds_pub_refused(PyObject *pubo) { return PyErr_ExceptionMatches(((PublisherObject *)pubo)->refused); }

/* 1: a success report is plain (no target troubled, the broker up, `store` still the stores map's
 * under `key`), 0: the reference decides, -1: error */
int kds_pub_plain(PyObject *pubo, PyObject *key, PyObject *store) {
    PublishStateObject *ps = ((PublisherObject *)pubo)->state;
    PyObject *troubled = ps_field(ps->troubled, "troubled"), *stores = ps_field(ps->stores, "stores");
    if (!troubled || !stores) return -1;
    if (!PyDict_Check(troubled) || PyDict_GET_SIZE(troubled) || !ps->broker_up || !PyDict_Check(stores)) return 0;
    PyObject *current = PyDict_GetItemWithError(stores, key);
    if (!current && PyErr_Occurred()) return -1;
    return current == store;
}

/* the same from its delivery time t (ms) */
int kds_pub_lateness_at(PyObject *pubo, long long t, long long due, PyObject *lateness) {
    return lateness_at(((PublisherObject *)pubo)->state, t, due, lateness);
}

/* a delivered record's lateness recorded (report_lateness) */
int kds_pub_lateness(PyObject *pubo, PyObject *msg, long long due, PyObject *lateness) {
    return report_lateness(((PublisherObject *)pubo)->state, msg, due, lateness);
}

/* delivery_headers(rec, source_topic)'s headers for the native producer's entry: fctx is {rec, topic} */
static int rec_fill(void *fctx, kds_hadd add, void *actx) {
    PyObject **a = fctx;
    return kds_delivery_headers_each(a[0], a[1], add, actx);
}

/* Produce one due record with a Delivery as its report callable: through the native producer's C
 * entry (np not NULL; the headers straight into librdkafka's) or the client's produce, positional
 * in its order (topic, value, key, partition, callback, on_delivery (unused), timestamp (0: now),
 * headers). fired: a firing's headers (a list, consumed), else NULL. None, or NULL with what the
 * produce raised. */
static PyObject *produce_record(PublisherObject *pub, PyObject *np, PyObject *produce, PyObject *ref, PyObject *recobj,
                                PyObject *store, PyObject *topic, PyObject *topic_bytes, PyObject *partition,
                                PyObject *lateness, PyObject *fired) {
    RecordObject *rec = (RecordObject *)recobj;
    PyObject *hargs[2] = {recobj, topic_bytes};
    int c_send = np && !fired; /* a firing's headers are a list already */
    PyObject *headers = c_send ? NULL : fired ? fired : kds_delivery_headers(NULL, hargs, 2);
    DeliveryObject *cb = c_send || headers ? PyObject_New(DeliveryObject, &DeliveryType) : NULL;
    PyObject *tp = cb && !c_send ? PyLong_FromLong(rec->target_partition) : NULL;
    PyObject *res = NULL;
    if (cb) {
        cb->vectorcall = Delivery_vectorcall;
        cb->pub = (PublisherObject *)Py_NewRef(pub);
        cb->ref = Py_NewRef(ref);
        cb->rec = Py_NewRef(recobj);
        cb->store = Py_NewRef(store);
        cb->topic = Py_NewRef(topic);
        cb->partition = Py_NewRef(partition);
        cb->lateness = Py_NewRef(lateness);
    }
    if (cb && c_send) {
        if (kds_np_send(np, topic, rec->value, rec->key, rec->target_partition, (PyObject *)cb, rec_fill, hargs) == 0)
            res = Py_NewRef(Py_None);
    } else if (tp) {
        PyObject *zero = PyLong_FromLong(0);
        Py_DECREF(zero); /* a cached small int: stays alive */
        PyObject *a[8] = {topic, rec->value, rec->key, tp, (PyObject *)cb, Py_None, zero, headers};
        res = PyObject_Vectorcall(produce, a, 8, NULL);
    }
    Py_XDECREF(tp);
    Py_XDECREF((PyObject *)cb);
    Py_XDECREF(headers);
    return res;
}

/* publish_due(pub, produce, batch, i, store, now) -> (j, refused)
 *
 * Produces batch[i:] ((ref, Record) pairs from the scheduler's due) while each is plain: due at
 * ``now`` (re-checked here, never early) and no target troubled. Stops at the first record that is
 * not (j: the caller runs Publishing._produce on it) or whose produce raised one of ``refused``
 * (returned, j: that record; nothing was counted for it); j == len(batch) when all went. */
static PyObject *native_publish_due(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyObject_TypeCheck(args[0], &PublisherType) || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "publish_due(pub: Publisher, produce, batch: list, i, store, now)");
        return NULL;
    }
    PublisherObject *pub = (PublisherObject *)args[0];
    PyObject *produce = args[1], *batch = args[2], *store = args[4];
    PublishStateObject *ps = pub->state;
    Py_ssize_t i = PyLong_AsSsize_t(args[3]);
    long long now = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (kds_codec_ready() < 0) return NULL;
    if (pub_sync(pub) < 0) return NULL;
    PyObject *topic_bytes = PyObject_GetAttr(store, S_topic_bytes);
    if (!topic_bytes) return NULL;
    /* the key the stores map holds the store under (store.key: engine/stores.py StoreKey's fields) */
    PyObject *partition = PyObject_GetAttr(store, S_key), *refused = NULL;
    PyObject *lateness = partition ? PyObject_GetAttr(store, S_lateness) : NULL;
    if (!lateness || !PyBytes_Check(topic_bytes)) {
        if (lateness) PyErr_SetString(PyExc_TypeError, "store.topic_bytes is not bytes");
        goto fail;
    }
    PyObject *np = kds_native_producer(produce);
    for (; i < PyList_GET_SIZE(batch); i++) {
        PyObject *pair = PyList_GET_ITEM(batch, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "publish_due: batch items are (ref, Record) pairs");
            goto fail;
        }
        PyObject *ref = PyTuple_GET_ITEM(pair, 0), *recobj = PyTuple_GET_ITEM(pair, 1);
        if (!PyObject_TypeCheck(recobj, &kds_RecordType)) break;
        RecordObject *rec = (RecordObject *)recobj;
        if (rec->due_ms > now || !PyBytes_Check(rec->topic)) break;
        PyObject *troubled = ps_field(ps->troubled, "troubled");
        if (!troubled) goto fail;
        if (!PyDict_Check(troubled) || PyDict_GET_SIZE(troubled)) break;
        /* a recurring schedule's firing: its headers and decision from firing.c, or from Python
         * (sidecar/store/firings.py) for any case that code leaves to it */
        PyObject *fired = rec->rtype == REC_RECURRING ? kds_fire(store, ref, recobj, now, topic_bytes) : NULL;
        if (rec->rtype == REC_RECURRING && !fired) {
            if (PyErr_Occurred()) goto fail;
            break;
        }
        PyObject *topic = topic_str(pub, rec->topic);
        if (!topic) {
            Py_XDECREF(fired);
            goto fail;
        }
        PyObject *res = produce_record(pub, np, produce, ref, recobj, store, topic, topic_bytes, partition, lateness,
                                       fired);
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
        ps->in_flight++;
        int rc = pub_tif(pub, topic, 1);
        Py_DECREF(topic);
        if (rc < 0) goto fail;
    }
    Py_DECREF(topic_bytes);
    Py_DECREF(partition);
    Py_DECREF(lateness);
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
    Py_XDECREF(lateness);
    { /* the records produced before the failure are in flight: their topic counts too */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (pub_sync(pub) < 0) PyErr_Clear();
        PyErr_Restore(et, ev, tb);
    }
    return NULL;
}

int kds_publish_init(PyObject *m) {
    static const char *names[] = {"early", "acked", "topic_bytes", "key", "lateness"};
    PyObject **slots[] = {&S_early, &S_acked, &S_topic_bytes, &S_key, &S_lateness};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (!(*slots[k] = PyUnicode_InternFromString(names[k]))) return -1;
    PyTypeObject *types[] = {&PublishStateType, &PublisherType, &DeliveryType};
    const char *type_names[] = {"PublishState", "Publisher", "Delivery"};
    return kds_add_types(m, types, type_names, sizeof types / sizeof types[0]);
}

PyMethodDef kds_publish_methods[] = {
    {"publish_due", (PyCFunction)(void (*)(void))native_publish_due, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}};
