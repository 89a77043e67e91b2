/* sidecar._native, publish core. The publish fast path (engine/loop.py: Sidecar._produce and
 * Sidecar._on_delivery are the reference). ``publish_due`` produces a due batch with the client's
 * bound ``produce``; each record gets a ``Delivery`` as its delivery-report callable. Both read and
 * write the loop's state where the Python code keeps it, the Sidecar's instance dict (in_flight,
 * topic_in_flight, troubled, broker_up, stores, lateness_batch, counters), so the two paths can
 * interleave record by record. The two in-flight counts are the exception: C keeps its changes to
 * them in the Publisher and adds them to the dict at ``sync`` (a read, a new int and a write per
 * record and count cost about 4 % of the loop thread). ``publish_due`` syncs before it returns, and
 * the loop syncs after every producer poll (Sidecar._poll), so Python reads exact counts everywhere
 * outside a poll; inside one, a delivery report of the reference path subtracts its own record from
 * counts that still include the C reports' records, never reaching zero early. Anything not plain
 * goes back to Python: a record not due yet (the never-early check), a troubled target, a refused
 * produce (BufferError / KafkaException, handed back to the caller), a failed delivery, a revoked
 * partition, the broker marked down. */
#include "native.h"

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
    PyObject *ts = kds_msg_call(msg, M_TIMESTAMP); /* the delivered Message is the consumed ones' type */
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
    if (kds_codec_ready() < 0) return NULL;
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
        if (!PyObject_TypeCheck(recobj, &kds_RecordType)) break;
        RecordObject *rec = (RecordObject *)recobj;
        if (rec->due_ms > now || !PyBytes_Check(rec->topic)) break;
        PyObject *troubled = state_get(state, S_troubled);
        if (!troubled) goto fail;
        if (!PyDict_Check(troubled) || PyDict_GET_SIZE(troubled)) break;
        PyObject *topic = topic_str(pub, rec->topic);
        if (!topic) goto fail;
        PyObject *hargs[2] = {recobj, topic_bytes};
        PyObject *headers = kds_delivery_headers(NULL, hargs, 2);
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

int kds_publish_init(PyObject *m) {
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

PyMethodDef kds_publish_methods[] = {
    {"publish_due", (PyCFunction)(void (*)(void))native_publish_due, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}};
