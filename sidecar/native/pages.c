/* sidecar._native, pages: a mapping's pages faulted in by a helper thread, ahead of the loop, and
 * unmapped by it once the loop is done with them (sidecar/store/mapped.py, PageWorker).
 *
 * The loop appends every record into a mapped, sparse segment file (sidecar/store/log.py), so the
 * first write to each page takes a fault that allocates a page-cache page, zeroes it and reserves
 * its block: ~64 faults per 1,000 records of 260 bytes. Usually 10-30 us each; but on a VM whose
 * host reclaims the guest's free memory (free page reporting) a freshly allocated page may first
 * need the host to back it, and in the 100M scale runs the turns that ingested a batch took 50-99 ms
 * for those faults (the thread's user and system time a few ms: the vCPU waited on the host).
 * ``populate`` takes those faults on the caller's thread instead, with the GIL released:
 * ``MADV_POPULATE_WRITE`` (Linux 5.14) write-faults every page of the range as a store would,
 * without changing a byte, so a concurrent append to the same pages is safe.
 *
 * ``drop`` is ``mmap.madvise(MADV_DONTNEED)`` on a whole trim's ranges, the GIL released once, in
 * steps: the trim that unmaps the stores' pages took the loop 55-78 ms of system time every 3.2 s at
 * 100M pending (the id tables' random pages), and the helper thread that does it instead must not
 * hold the GIL, nor the mmap_lock for that long. */
#define _GNU_SOURCE
#include "native.h"

#include <errno.h>
#include <sys/mman.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
/* The advice holds the process's mmap_lock (read) while it faults its range; a thread that maps or
 * unmaps anything (the loop opening a file, malloc's large blocks) waits for it, and every fault
 * waits behind that writer. So the range goes in steps of 64 pages, each its own call. */
#define POPULATE_STEP ((uintptr_t)256 << 10)

/* The same reason as POPULATE_STEP: a step's zapping holds the mmap_lock (read). 2 MiB (one page
 * table) of resident pages takes ~0.2 ms; a step of nothing resident, a few us. */
#define DROP_STEP ((uintptr_t)2 << 20)

/* [*lo, *hi): bytes [start, start + length) of the buffer, clipped to it, the start aligned down
 * to its page (empty when nothing of the buffer is in the range). */
static void page_range(const Py_buffer *v, long long start, long long length, uintptr_t *lo, uintptr_t *hi) {
    if (start < 0) start = 0;
    if (start > v->len) start = v->len;
    if (length > v->len - start) length = v->len - start;
    if (length < 0) length = 0;
    uintptr_t from = (uintptr_t)v->buf + (uintptr_t)start;
    *lo = length > 0 ? from - from % (uintptr_t)sysconf(_SC_PAGESIZE) : from;
    *hi = from + (uintptr_t)length;
}

/* madvise(advice) on [lo, hi) in steps of `step` bytes (without the GIL): 0, or the errno of the
 * first step the kernel refused (the rest is not tried). */
static int advise_steps(uintptr_t lo, uintptr_t hi, int advice, uintptr_t step) {
    for (uintptr_t at = lo; at < hi; at += step) {
        uintptr_t n = hi - at < step ? hi - at : step;
        if (madvise((void *)at, n, advice) != 0) return errno;
    }
    return 0;
}

/* populate(buffer, start, length) -> 0, or the errno the kernel refused it with (EINVAL: a kernel
 * without MADV_POPULATE_WRITE). The buffer (a writable mmap) stays exported while the pages are
 * faulted. */
static PyObject *native_populate(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "populate(buffer, start, length)");
        return NULL;
    }
    long long start = PyLong_AsLongLong(args[1]), length = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) return NULL;
    uintptr_t lo, hi;
    page_range(&view, start, length, &lo, &hi);
    int err;
    Py_BEGIN_ALLOW_THREADS;
    err = advise_steps(lo, hi, MADV_POPULATE_WRITE, POPULATE_STEP);
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&view);
    return PyLong_FromLong(err);
}

/* drop([(buffer, start, length), ...]) -> 0, or the errno of the first step the kernel refused
 * (EINVAL for locked pages; that range's rest is not tried, the other ranges are): MADV_DONTNEED on
 * each range, clipped to its buffer, aligned outward to pages. A buffer that cannot be exported (an
 * mmap closed meanwhile) is skipped. All the ranges in one call, the GIL released once: a trim hands
 * over a range per file, and the helper thread must not take the GIL back between them (each time
 * it does, a busy loop may have to hand it over). The data stays in the page cache (shared file
 * mappings), dirty pages included. */
static PyObject *native_drop(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "drop([(buffer, start, length), ...])");
        return NULL;
    }
    PyObject *list = args[0];
    Py_ssize_t n = PyList_GET_SIZE(list), got = 0;
    Py_buffer *views = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof(Py_buffer));
    uintptr_t *lo = PyMem_Calloc((size_t)(n > 0 ? n : 1), 2 * sizeof(uintptr_t));
    if (views == NULL || lo == NULL) {
        PyMem_Free(views);
        PyMem_Free(lo);
        return PyErr_NoMemory();
    }
    PyObject *failed = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(list, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3) {
            PyErr_SetString(PyExc_TypeError, "drop: each range is (buffer, start, length)");
            failed = t;
            break;
        }
        long long start = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 1));
        long long length = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 2));
        if (PyErr_Occurred()) {
            failed = t;
            break;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, 0), &views[got], PyBUF_SIMPLE) < 0) {
            PyErr_Clear(); /* closed meanwhile: nothing of it is mapped any more */
            continue;
        }
        page_range(&views[got], start, length, &lo[2 * got], &lo[2 * got + 1]);
        got++;
    }
    int err = 0;
    if (failed == NULL) {
        Py_BEGIN_ALLOW_THREADS;
        for (Py_ssize_t i = 0; i < got; i++) {
            int e = advise_steps(lo[2 * i], lo[2 * i + 1], MADV_DONTNEED, DROP_STEP);
            if (e && !err) err = e;
        }
        Py_END_ALLOW_THREADS;
    }
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(lo);
    return failed != NULL ? NULL : PyLong_FromLong(err);
}

PyMethodDef kds_pages_methods[] = {
    {"populate", (PyCFunction)(void (*)(void))native_populate, METH_FASTCALL, NULL},
    {"drop", (PyCFunction)(void (*)(void))native_drop, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}};
