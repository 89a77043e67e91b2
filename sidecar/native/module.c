/* sidecar._native: the hot path's per-record loops, in C.
 *
 * The loop thread's hot paths run here: the intake of the common consumed record (ingest_run:
 * parse, store, schedule, index, one C loop per consumer batch), the schedulers' per-entry walks
 * over their mmapped files (the wheel's wl_*, the levels' lv_*), the publish of a due batch and
 * its delivery reports (publish_due, Delivery), the changelog's puts, tombstones and their reports
 * (mirror_puts, mirror_tombstones, MirrorReport), and the byte work under all of them (the record
 * codec with its CRC32C, the header blob, the id hash and the id index's probes). Every path
 * keeps a Python reference that decides everything the C path does not take: the C code handles
 * only the plain case, checks it before its first write, and hands any other record back (the
 * intake to PartitionStore.ingest_fields, the publish to Publishing._produce / _on_delivery, a
 * changelog write to StoreMirror.put / remove / _on_delivery), so
 * both paths leave the same bytes and the same state; where the extension is not built (or
 * KDS_PURE_PYTHON=1) the Python twins run everything. The twins are tested against this code
 * record for record (tests/unit/test_native*.py, test_ingest_fast.py, test_publish_path.py).
 *
 * One translation unit per core, compiled on its own (native.h declares what they share):
 *   hash.c     CRC32C, BLAKE2b-64                    (twins: crc32c, hashlib)
 *   codec.c    Record, encode/append/decode, headers (sidecar/store/codec.py)
 *   idindex.c  the id index's probes and rehash      (sidecar/store/idindex.py)
 *   merge.c    the id index's merge pass in slot order (the staged index)
 *   pages.c    a mapping's pages faulted in ahead of the loop (sidecar/store/log.py)
 *   parse.c    the common ingress request            (sidecar/headers.py)
 *   wheel.c    the timer wheel's file walks          (sidecar/wheel/layout.py)
 *   levels.c   the delay levels' queue walks         (sidecar/levels/queue.py)
 *   intake.c   ingest_run, the intake fast path      (PartitionStore.ingest_fields)
 *   publish.c  PublishState, Publisher, Delivery     (sidecar/engine/publish_state.py, loop.py)
 *   mirror.c   MirrorReport, the changelog writes    (sidecar/engine/changelog.py StoreMirror)
 *   direct.c   DirectPort, DirectDelivery: due on arrival, published from the intake (engine/direct.py)
 *   firing.c   a delay.every schedule's firing        (sidecar/store/firings.py)
 *   producer.c NativeProducer: librdkafka's producer bound at run time (rdk.h; engine/native_client.py)
 *   module.c   this file: the module and its init
 * Byte layouts are documented where the Python twins live; the C code follows them byte for byte.
 * Their sizes, states and flags are declared once, in sidecar/store/native_layouts.py, which
 * generates layouts.h (and intake_layout.py the intake state's intake_layout.h, native_args.py
 * the argument structs of the C calls with many arguments, native_args.h).
 */
#define KDS_NATIVE_ARGS_IMPL /* the argument structs' types are defined here, once */
#include "native.h"
#include "intake_layout.h"

/* INTAKE_LAYOUT and LAYOUTS: {macro name: value} of intake_layout.h and layouts.h, as this build
 * compiled them (the tests compare them with their declarations, sidecar/store/intake_layout.py
 * and native_layouts.py) */
typedef struct {
    const char *name;
    long long value;
} NameValue;
#define KDS_NAME_VALUE(name) {#name, (long long)(name)},
static const NameValue intake_names[] = {KDS_INTAKE_LAYOUT(KDS_NAME_VALUE)};
static const NameValue layout_names[] = {KDS_LAYOUTS(KDS_NAME_VALUE)};
#undef KDS_NAME_VALUE

static int add_names(PyObject *m, const char *attr, const NameValue *names, size_t n) {
    PyObject *d = PyDict_New();
    if (!d) return -1;
    for (size_t k = 0; k < n; k++) {
        PyObject *v = PyLong_FromLongLong(names[k].value);
        int rc = v ? PyDict_SetItemString(d, names[k].name, v) : -1;
        Py_XDECREF(v);
        if (rc < 0) {
            Py_DECREF(d);
            return -1;
        }
    }
    if (PyModule_AddObject(m, attr, d) < 0) {
        Py_DECREF(d);
        return -1;
    }
    return 0;
}

int kds_add_types(PyObject *m, PyTypeObject **types, const char **names, size_t n) {
    for (size_t k = 0; k < n; k++) {
        if (PyType_Ready(types[k]) < 0) return -1;
        Py_INCREF(types[k]);
        if (PyModule_AddObject(m, names[k], (PyObject *)types[k]) < 0) {
            Py_DECREF(types[k]);
            return -1;
        }
    }
    return 0;
}

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "sidecar._native",
                                       "The hot path's per-record loops in C (see sidecar/native/module.c).", -1,
                                       NULL};

PyMODINIT_FUNC PyInit__native(void) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "sidecar._native needs a little-endian host");
        return NULL;
    }
    kds_crc_init();
    if (PyType_Ready(&kds_RecordType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    PyMethodDef *tables[] = {kds_codec_methods, kds_hash_methods, kds_idindex_methods, kds_merge_methods, kds_pages_methods,
                             kds_parse_methods,
                             kds_wheel_methods, kds_levels_methods, kds_intake_methods, kds_publish_methods,
                             kds_mirror_methods, kds_firing_methods, kds_producer_methods};
    for (size_t k = 0; k < sizeof tables / sizeof tables[0]; k++)
        if (PyModule_AddFunctions(m, tables[k]) < 0) goto fail;
    Py_INCREF(&kds_RecordType);
    if (PyModule_AddObject(m, "Record", (PyObject *)&kds_RecordType) < 0) {
        Py_DECREF(&kds_RecordType);
        goto fail;
    }
    if (kds_publish_init(m) < 0) goto fail;
    if (kds_mirror_init(m) < 0) goto fail;
    if (kds_direct_init(m) < 0) goto fail;
    if (kds_producer_init(m) < 0) goto fail;
#define KDS_ADD_ARGS_TYPE(name) \
    if (PyType_Ready(&kds_##name##Type) < 0) goto fail; \
    Py_INCREF(&kds_##name##Type); \
    if (PyModule_AddObject(m, #name, (PyObject *)&kds_##name##Type) < 0) { \
        Py_DECREF(&kds_##name##Type); \
        goto fail; \
    }
    KDS_NATIVE_ARGS(KDS_ADD_ARGS_TYPE)
#undef KDS_ADD_ARGS_TYPE
    if (add_names(m, "INTAKE_LAYOUT", intake_names, sizeof intake_names / sizeof intake_names[0]) < 0) goto fail;
    if (add_names(m, "LAYOUTS", layout_names, sizeof layout_names / sizeof layout_names[0]) < 0) goto fail;
    if (PyModule_AddIntConstant(m, "HARDWARE_CRC", kds_have_sse42) < 0) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
