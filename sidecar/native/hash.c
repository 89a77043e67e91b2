/* sidecar._native, hash core: CRC32C (the records' checksum) and BLAKE2b-64 (the id index's hash).
 * Twins: crc32c (the package, the reference of the tests) and hashlib.blake2b (idprobe.py). */
#include "native.h"

/* ---------------------------------------------------------------------------------------------
 * CRC32C (Castagnoli): SSE4.2's crc32 instruction where the CPU has it, else a table. */

static uint32_t crc_table[8][256];
int kds_have_sse42 = 0;

void kds_crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    kds_have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
}

uint32_t kds_crc32c_sw(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^ crc_table[5][(w >> 16) & 0xff] ^
              crc_table[4][(w >> 24) & 0xff] ^ crc_table[3][(w >> 32) & 0xff] ^ crc_table[2][(w >> 40) & 0xff] ^
              crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = ~crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}
#endif

uint32_t kds_crc32c(const uint8_t *p, size_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (kds_have_sse42) return crc_hw(0, p, n);
#endif
    return kds_crc32c_sw(0, p, n);
}

/* ---------------------------------------------------------------------------------------------
 * BLAKE2b with an 8-byte digest and no key (RFC 7693): the id index's hash, the same value as
 * hashlib.blake2b(rid, digest_size=8) read little-endian. */

static const uint64_t b2_iv[8] = {
    0x6A09E667F3BCC908ULL, 0xBB67AE8584CAA73BULL, 0x3C6EF372FE94F82BULL, 0xA54FF53A5F1D36F1ULL,
    0x510E527FADE682D1ULL, 0x9B05688C2B3E6C1FULL, 0x1F83D9ABFB41BD6BULL, 0x5BE0CD19137E2179ULL};
static const uint8_t b2_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

#define ROTR64(x, y) (((x) >> (y)) | ((x) << (64 - (y))))
#define B2G(a, b, c, d, x, y)                \
    do {                                     \
        v[a] = v[a] + v[b] + (x);            \
        v[d] = ROTR64(v[d] ^ v[a], 32);      \
        v[c] = v[c] + v[d];                  \
        v[b] = ROTR64(v[b] ^ v[c], 24);      \
        v[a] = v[a] + v[b] + (y);            \
        v[d] = ROTR64(v[d] ^ v[a], 16);      \
        v[c] = v[c] + v[d];                  \
        v[b] = ROTR64(v[b] ^ v[c], 63);      \
    } while (0)

#define B2ROUND(r)                                                                  \
    do {                                                                            \
        B2G(0, 4, 8, 12, m[b2_sigma[r][0]], m[b2_sigma[r][1]]);                     \
        B2G(1, 5, 9, 13, m[b2_sigma[r][2]], m[b2_sigma[r][3]]);                     \
        B2G(2, 6, 10, 14, m[b2_sigma[r][4]], m[b2_sigma[r][5]]);                    \
        B2G(3, 7, 11, 15, m[b2_sigma[r][6]], m[b2_sigma[r][7]]);                    \
        B2G(0, 5, 10, 15, m[b2_sigma[r][8]], m[b2_sigma[r][9]]);                    \
        B2G(1, 6, 11, 12, m[b2_sigma[r][10]], m[b2_sigma[r][11]]);                  \
        B2G(2, 7, 8, 13, m[b2_sigma[r][12]], m[b2_sigma[r][13]]);                   \
        B2G(3, 4, 9, 14, m[b2_sigma[r][14]], m[b2_sigma[r][15]]);                   \
    } while (0)

static inline uint64_t ld64(const uint8_t *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return w; /* little-endian hosts only: see the check in PyInit__native (module.c) */
}

static void b2_compress(uint64_t h[8], const uint8_t *block, uint64_t t, int last) {
    uint64_t v[16], m[16];
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = b2_iv[i];
    }
    v[12] ^= t;
    if (last) v[14] = ~v[14];
    for (int i = 0; i < 16; i++) m[i] = ld64(block + 8 * i);
    /* The twelve rounds written out (as RFC 7693's reference code does): with a constant round
     * number every message index is a constant, so m[] stays in registers; a loop over r reads
     * the schedule from memory and ran about twice as slow (gcc -O2 does not unroll it). */
    B2ROUND(0);
    B2ROUND(1);
    B2ROUND(2);
    B2ROUND(3);
    B2ROUND(4);
    B2ROUND(5);
    B2ROUND(6);
    B2ROUND(7);
    B2ROUND(8);
    B2ROUND(9);
    B2ROUND(10);
    B2ROUND(11);
    for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
}

uint64_t kds_blake2b64(const uint8_t *in, size_t n) {
    uint64_t h[8];
    memcpy(h, b2_iv, sizeof h);
    h[0] ^= 0x01010000ULL ^ 8; /* fanout 1, depth 1, no key, 8-byte digest */
    uint64_t t = 0;
    while (n > 128) { /* the last block, even a full one, is compressed as the final one */
        t += 128;
        b2_compress(h, in, t, 0);
        in += 128;
        n -= 128;
    }
    uint8_t block[128];
    memset(block, 0, sizeof block);
    if (n) memcpy(block, in, n);
    t += n;
    b2_compress(h, block, t, 1);
    return h[0];
}

/* crc32c(data) -> int: exposed for the tests (the same checksum the records carry). */
static PyObject *native_crc32c(PyObject *self, PyObject *data) {
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c = kds_crc32c((const uint8_t *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

/* crc32c_software(data) -> int: the table path, whatever the CPU (for the tests). */
static PyObject *native_crc32c_software(PyObject *self, PyObject *data) {
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c = kds_crc32c_sw(0, (const uint8_t *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}


PyMethodDef kds_hash_methods[] = {
    {"crc32c", native_crc32c, METH_O, NULL},
    {"crc32c_software", native_crc32c_software, METH_O, NULL},
    {NULL, NULL, 0, NULL}};
