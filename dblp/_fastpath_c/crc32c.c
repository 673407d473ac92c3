/* CRC-32C (Castagnoli), the checksum of every datagram of dblp/wire.py.
 *
 * Why C: the crc32c package computes one buffer per Python call, so a
 * 25M-element round (69,061 datagrams per worker at MTU 1500) paid ~1 us of
 * Python call and slicing overhead per datagram - more than the CRC itself.
 * Here one call covers a whole (k, stride) row matrix; with SSE 4.2 the CRC
 * instruction runs 8 bytes at a time in three streams. Where the extension
 * is not built, dblp/wire.py falls back to the crc32c package; both give
 * identical values (tests/test_fastpath.py).
 *
 * Three implementations, all continuing a CRC (crc(crc(0, a), b) ==
 * crc(0, a || b)): SSE 4.2, portable slicing-by-8 (little-endian hosts) and
 * bytewise. crc_init picks the best; use() switches for tests. */
#include "common.h"

#include "buffers.h"

static uint32_t table[8][256];

static void init_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int j = 0; j < 8; j++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
}

/* Portable slicing-by-8. */
static uint32_t crc_sw(uint32_t crc, const uint8_t *p, size_t n) {
    uint32_t c = crc ^ 0xFFFFFFFFu;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c; /* little-endian hosts; the big-endian fallback below covers the rest */
        c = table[7][w & 0xFF] ^ table[6][(w >> 8) & 0xFF] ^ table[5][(w >> 16) & 0xFF] ^
            table[4][(w >> 24) & 0xFF] ^ table[3][(w >> 32) & 0xFF] ^ table[2][(w >> 40) & 0xFF] ^
            table[1][(w >> 48) & 0xFF] ^ table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) c = (c >> 8) ^ table[0][(c ^ *p++) & 0xFF];
    return c ^ 0xFFFFFFFFu;
}

static uint32_t crc_bytewise(uint32_t crc, const uint8_t *p, size_t n) {
    uint32_t c = crc ^ 0xFFFFFFFFu;
    while (n--) c = (c >> 8) ^ table[0][(c ^ *p++) & 0xFF];
    return c ^ 0xFFFFFFFFu;
}

/* Three streams at once: the CRC instruction has a latency of 3 cycles but a
 * throughput of 1 per cycle, so one dependent chain leaves two thirds of it
 * idle. Blocks of LONG bytes run as three independent CRCs, combined by
 * shifting a register over LONG zero bytes (a table: the CRC register is
 * linear over GF(2)). The method of Mark Adler's crc32c.c. */
#define LONG 480
static uint32_t long_zeros[4][256];

static uint32_t raw_zeros(uint32_t c, size_t n) { /* the register after n zero bytes */
    while (n--) c = (c >> 8) ^ table[0][c & 0xFF];
    return c;
}

static void init_zeros(void) {
    for (int k = 0; k < 4; k++)
        for (uint32_t n = 0; n < 256; n++) long_zeros[k][n] = raw_zeros(n << (8 * k), LONG);
}

static inline uint32_t shift_long(uint32_t c) {
    return long_zeros[0][c & 0xFF] ^ long_zeros[1][(c >> 8) & 0xFF] ^ long_zeros[2][(c >> 16) & 0xFF] ^
           long_zeros[3][c >> 24];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = crc ^ 0xFFFFFFFFu;
    while (n >= 3 * LONG) {
        uint64_t c1 = 0, c2 = 0;
        const uint8_t *end = p + LONG;
        do {
            uint64_t w0, w1, w2;
            memcpy(&w0, p, 8);
            memcpy(&w1, p + LONG, 8);
            memcpy(&w2, p + 2 * LONG, 8);
            c = _mm_crc32_u64(c, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
            p += 8;
        } while (p < end);
        c = shift_long((uint32_t)c) ^ (uint32_t)c1;
        c = shift_long((uint32_t)c) ^ (uint32_t)c2;
        p += 2 * LONG;
        n -= 3 * LONG;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return c32 ^ 0xFFFFFFFFu;
}
#define HAVE_HW 1
#else
#define HAVE_HW 0
#endif

crc_fn crc_impl = crc_bytewise;
const char *crc_name = "bytewise";

static int little_endian(void) {
    int little = 1;
    return *(char *)&little == 1;
}

void crc_init(void) {
    init_table();
    init_zeros();
    if (little_endian()) {
        crc_impl = crc_sw;
        crc_name = "slicing-by-8";
    }
#if HAVE_HW
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        crc_impl = crc_hw;
        crc_name = "sse4.2";
    }
#endif
}

/* use(name): switch the CRC implementation ("sse4.2", "slicing-by-8", "bytewise");
 * for tests that compare them. Returns the previous name. */
PyObject *fp_use(PyObject *self, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    const char *prev = crc_name;
    if (strcmp(name, "bytewise") == 0) {
        crc_impl = crc_bytewise;
        crc_name = "bytewise";
    } else if (strcmp(name, "slicing-by-8") == 0) {
        if (!little_endian()) return value_error("slicing-by-8 needs a little-endian host");
        crc_impl = crc_sw;
        crc_name = "slicing-by-8";
#if HAVE_HW
    } else if (strcmp(name, "sse4.2") == 0 && __builtin_cpu_supports("sse4.2")) {
        crc_impl = crc_hw;
        crc_name = "sse4.2";
#endif
    } else {
        PyErr_Format(PyExc_ValueError, "unknown or unsupported CRC implementation %s", name);
        return NULL;
    }
    return PyUnicode_FromString(prev);
}

/* crc_rows(rows, lengths, out, start)
 *   rows    C-contiguous uint8 buffer of k rows of `stride` bytes (2-D)
 *   lengths int64 buffer of k datagram lengths, or None (every row full)
 *   out     writable uint32 buffer of k results
 *   start   first byte covered (8: after the magic/version/kind/crc fields)
 * out[i] = CRC-32C of rows[i, start:lengths[i]], GIL released. */
PyObject *fp_crc_rows(PyObject *self, PyObject *args) {
    PyObject *rows_o, *len_o, *out_o;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "OOOn", &rows_o, &len_o, &out_o, &start)) return NULL;
    Py_buffer b[3]; /* rows, out, lengths */
    if (take_buffers(3, b, (PyObject *[]){rows_o, out_o, len_o}, (int[]){BUF_IN2D, BUF_OUT, BUF_IN | BUF_OPTIONAL}) < 0)
        return NULL;
    const Py_buffer *rows = &b[0], *out = &b[1], *lens = &b[2];
    int have_lens = len_o != Py_None;
    Py_ssize_t k = rows_of(rows), stride = cols_of(rows);
    PyObject *result;
    if (!is_byte_matrix(rows)) {
        result = value_error("rows must be a 2-D uint8 array");
    } else if (out->len < k * 4) {
        result = value_error("out holds fewer than k uint32 values");
    } else if (have_lens && lens->len < k * 8) {
        result = value_error("lengths holds fewer than k int64 values");
    } else if (start < 0 || start > stride) {
        result = value_error("start outside the row");
    } else {
        const uint8_t *base = (const uint8_t *)rows->buf;
        const int64_t *ln = have_lens ? (const int64_t *)lens->buf : NULL;
        uint32_t *dst = (uint32_t *)out->buf;
        int bad = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < k; i++) {
            int64_t n = ln ? ln[i] : stride;
            if (n < start || n > stride) {
                bad = 1;
                break;
            }
            dst[i] = crc_impl(0, base + i * stride + start, (size_t)(n - start));
        }
        Py_END_ALLOW_THREADS
        result = none_unless_bad(bad, "a length is shorter than start or longer than the row");
    }
    give_back_buffers(3, b);
    return result;
}
