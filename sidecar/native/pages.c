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
 * ``drop`` is ``mmap.madvise(MADV_DONTNEED)`` with the GIL released and in steps: the trim that
 * unmaps the stores' pages took the loop 55-78 ms of system time every 3.2 s at 100M pending (the
 * id tables' random pages), and the helper thread that does it instead must not hold the GIL, nor
 * the mmap_lock for that long. */
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

/* madvise(advice) on [start, start + length) of the buffer args[0], clipped to it and aligned
 * outward to pages, in steps of `step` bytes, the GIL released; returns 0 or the errno of the first
 * step the kernel refused (the rest is not tried). */
static PyObject *advise_range(PyObject *const *args, Py_ssize_t nargs, const char *usage, int flags, int advice,
                              uintptr_t step) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    long long start = PyLong_AsLongLong(args[1]), length = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, flags) < 0) return NULL;
    if (start < 0) start = 0;
    if (start > view.len) start = view.len;
    if (length > view.len - start) length = view.len - start;
    int err = 0;
    if (length > 0) {
        long page = sysconf(_SC_PAGESIZE);
        uintptr_t lo = (uintptr_t)view.buf + (uintptr_t)start, hi = lo + (uintptr_t)length;
        lo -= lo % (uintptr_t)page;
        Py_BEGIN_ALLOW_THREADS;
        for (uintptr_t at = lo; at < hi && !err; at += step) {
            uintptr_t n = hi - at < step ? hi - at : step;
            if (madvise((void *)at, n, advice) != 0) err = errno;
        }
        Py_END_ALLOW_THREADS;
    }
    PyBuffer_Release(&view);
    return PyLong_FromLong(err);
}

/* populate(buffer, start, length) -> 0, or the errno the kernel refused it with (EINVAL: a kernel
 * without MADV_POPULATE_WRITE). The buffer (a writable mmap) stays exported while the pages are
 * faulted. */
static PyObject *native_populate(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return advise_range(args, nargs, "populate(buffer, start, length)", PyBUF_WRITABLE, MADV_POPULATE_WRITE,
                        POPULATE_STEP);
}

/* drop(buffer, start, length) -> 0, or the errno the kernel refused it with (EINVAL for locked
 * pages): MADV_DONTNEED. The data stays in the page cache (a shared file mapping), dirty pages
 * included. */
static PyObject *native_drop(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return advise_range(args, nargs, "drop(buffer, start, length)", PyBUF_SIMPLE, MADV_DONTNEED, DROP_STEP);
}

PyMethodDef kds_pages_methods[] = {
    {"populate", (PyCFunction)(void (*)(void))native_populate, METH_FASTCALL, NULL},
    {"drop", (PyCFunction)(void (*)(void))native_drop, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}};
