/* The id index's write path at GiB sizes, outside the sidecar (docs/benchmarks.md, issue 25).
 *
 * A table file of TABLE_MIB, written beforehand (no sparse blocks), takes random 16 B inserts at
 * a paced 40,000/s in turns of 1,000 on the "loop" thread; each insert first reads its slot (the
 * probe). A flusher thread trims the mapping (MADV_DONTNEED) every TRIM_MS, as the store does to
 * bound RSS. The modes differ in who writes the table and when it is synced:
 *
 *   map    the loop writes through the shared mapping; fdatasync every SYNC_MS (the store today)
 *   drain  the loop only reads; a writer thread pwrite()s each insert; fdatasync every SYNC_MS
 *   stage  the loop only reads and appends each insert to a journal (16 B, fdatasync'ed every
 *          second); every MERGE_MS a merger thread sorts the inserts since the last pass and
 *          rewrites the table in ascending 1 MiB chunks (pread, merge, pwrite), starting each
 *          chunk's writeback with sync_file_range and waiting for the one 8 MiB behind it, then
 *          fdatasyncs (SFR=0 in the environment: no sync_file_range, one fdatasync at the end)
 *
 * It prints the loop's turn times, the loop thread's CPU, the process's CPU (writeback done in
 * fdatasync and sync_file_range is counted there), and the sync and merge times.
 *
 *   cc -O2 -o /tmp/index_io bench/micro/index_io.c -lpthread
 *   /tmp/index_io FILE TABLE_MIB MODE SYNC_MS TRIM_MS TURNS [MERGE_MS]
 *   e.g. /tmp/index_io /var/tmp/t.tbl 2048 stage 0 3000 2400 10000
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { MAP, DRAIN, STAGE };
#define QN (1u << 22)
#define CHUNK (1u << 20)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static int fd, jfd, mode, sync_ms, trim_ms, merge_ms = 10000, sfr = 1;
static size_t size;
static uint8_t *mm;
static atomic_int stop;
static uint64_t q[QN]; /* inserts (byte offsets) not yet written: one producer, one consumer */
static atomic_ulong qh, qt;
static double sync_max, sync_sum, merge_max, merge_sum;
static int syncs, merges;

static void *flusher(void *arg) {
    double last = now(), lastj = now(), lastt = now();
    while (!stop) {
        usleep(10000);
        double t = now();
        if (mode != STAGE && (t - last) * 1e3 >= sync_ms) {
            double s = now();
            fdatasync(fd);
            s = now() - s;
            if (s > sync_max) sync_max = s;
            sync_sum += s, syncs++, last = t;
        }
        if (mode == STAGE && t - lastj >= 1.0) fdatasync(jfd), lastj = t;
        if ((t - lastt) * 1e3 >= trim_ms) madvise(mm, size, MADV_DONTNEED), lastt = t;
    }
    return NULL;
}

static void *drainer(void *arg) {
    uint8_t rec[16];
    memset(rec, 'y', 16);
    while (!stop || atomic_load(&qt) != atomic_load(&qh)) {
        unsigned long t = atomic_load(&qt), h = atomic_load(&qh);
        if (t == h) {
            usleep(1000);
            continue;
        }
        for (; t != h; t++) pwrite(fd, rec, 16, q[t % QN]);
        atomic_store(&qt, t);
    }
    return NULL;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void *merger(void *arg) {
    static uint8_t chunk[CHUNK];
    double last = now();
    while (!stop) {
        usleep(10000);
        if ((now() - last) * 1e3 < merge_ms) continue;
        double s = last = now();
        unsigned long t = atomic_load(&qt), h = atomic_load(&qh), n = h - t, i = 0;
        uint64_t *b = malloc(n * 8 + 8);
        for (unsigned long k = 0; k < n; k++) b[k] = q[(t + k) % QN];
        qsort(b, n, 8, cmp_u64);
        for (size_t off = 0; off < size; off += CHUNK) {
            if (i >= n || b[i] >= off + CHUNK) continue;
            pread(fd, chunk, CHUNK, off);
            for (; i < n && b[i] < off + CHUNK; i++) memset(chunk + (b[i] - off), 'y', 16);
            pwrite(fd, chunk, CHUNK, off);
            if (!sfr) continue;
            /* start this chunk's writeback now, and wait for the one 8 MiB behind: the pass never
             * leaves more than ~8 MiB dirty for the final fdatasync to write at once */
            sync_file_range(fd, off, CHUNK, SYNC_FILE_RANGE_WRITE);
            if (off >= 8 * CHUNK)
                sync_file_range(fd, off - 8 * CHUNK, CHUNK,
                                SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
        }
        fdatasync(fd);
        atomic_store(&qt, h);
        free(b);
        s = now() - s;
        if (s > merge_max) merge_max = s;
        merge_sum += s, merges++;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s FILE TABLE_MIB map|drain|stage SYNC_MS TRIM_MS TURNS [MERGE_MS]\n", argv[0]);
        return 2;
    }
    size = (size_t)atol(argv[2]) << 20;
    mode = !strcmp(argv[3], "map") ? MAP : !strcmp(argv[3], "drain") ? DRAIN : !strcmp(argv[3], "stage") ? STAGE : -1;
    if (mode < 0) {
        fprintf(stderr, "mode: map, drain or stage, not %s\n", argv[3]);
        return 2;
    }
    sync_ms = atoi(argv[4]), trim_ms = atoi(argv[5]);
    int turns = atoi(argv[6]);
    if (argc > 7) merge_ms = atoi(argv[7]);
    if (getenv("SFR") && !strcmp(getenv("SFR"), "0")) sfr = 0;
    fd = open(argv[1], O_RDWR | O_CREAT, 0644);
    struct stat st;
    fstat(fd, &st);
    if ((size_t)st.st_size != size) { /* written, not sparse: its blocks allocated beforehand */
        ftruncate(fd, 0);
        uint8_t *z = calloc(1, CHUNK);
        for (size_t o = 0; o < size; o += CHUNK) pwrite(fd, z, CHUNK, o);
        fsync(fd);
        free(z);
    }
    char jpath[4096];
    snprintf(jpath, sizeof jpath, "%s.journal", argv[1]);
    jfd = open(jpath, O_RDWR | O_CREAT | O_TRUNC | O_APPEND, 0644);
    mm = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    pthread_t f, w;
    pthread_create(&f, NULL, flusher, NULL);
    if (mode != MAP) pthread_create(&w, NULL, mode == DRAIN ? drainer : merger, NULL);
    double *bt = malloc(sizeof(double) * turns);
    uint64_t slots = size / 16, x = 88172645463325252ULL, probe_sum = 0;
    uint8_t jbuf[16000] = {0};
    struct rusage r0, r1, p0, p1;
    getrusage(RUSAGE_THREAD, &r0);
    getrusage(RUSAGE_SELF, &p0);
    double t0 = now();
    long n = 0;
    int over50 = 0;
    for (int b = 0; b < turns; b++) {
        double t = now();
        for (int i = 0; i < 1000; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            uint64_t off = (x % slots) * 16;
            probe_sum += mm[off];
            if (mode == MAP) {
                memset(mm + off, 'y', 16);
            } else {
                unsigned long h = atomic_load(&qh);
                q[h % QN] = off;
                atomic_store(&qh, h + 1);
            }
        }
        if (mode == STAGE) write(jfd, jbuf, sizeof jbuf);
        bt[b] = now() - t;
        if (bt[b] > 0.05) over50++;
        n += 1000;
        double wait = t0 + n / 40000.0 - now();
        if (wait > 0) usleep(wait * 1e6);
    }
    getrusage(RUSAGE_THREAD, &r1);
    double el = now() - t0;
    stop = 1;
    pthread_join(f, NULL);
    if (mode != MAP) pthread_join(w, NULL);
    getrusage(RUSAGE_SELF, &p1);
    qsort(bt, turns, sizeof(double), cmp_double);
#define TV(a) ((a).tv_sec + (a).tv_usec * 1e-6)
    printf("%s %zu MiB sync %d trim %d merge %d sfr %d: %ld inserts in %.1f s (paced for %.1f s); turn p50 %.2f p99 %.1f "
           "p99.9 %.1f max %.1f ms, %d over 50 ms; loop thread cpu %.2f s (sys %.2f); process cpu %.2f s; "
           "fdatasync avg %.0f max %.0f ms; merge pass avg %.0f max %.0f ms (%d)%s\n",
           argv[3], size >> 20, sync_ms, trim_ms, merge_ms, sfr, n, el, n / 40000.0, bt[turns / 2] * 1e3,
           bt[turns * 99 / 100] * 1e3, bt[turns * 999 / 1000] * 1e3, bt[turns - 1] * 1e3, over50,
           TV(r1.ru_utime) - TV(r0.ru_utime) + TV(r1.ru_stime) - TV(r0.ru_stime), TV(r1.ru_stime) - TV(r0.ru_stime),
           TV(p1.ru_utime) - TV(p0.ru_utime) + TV(p1.ru_stime) - TV(p0.ru_stime), syncs ? sync_sum / syncs * 1e3 : 0,
           sync_max * 1e3, merges ? merge_sum / merges * 1e3 : 0, merge_max * 1e3, merges, probe_sum == 1 ? " " : "");
    return 0;
}
