/* The per-datagram loops of the fast path in C, with the GIL released:
 * CRC-32C of every datagram of a batch, encoding a batch, and writing a
 * batch's payloads into the tensor.
 *
 * Why C: the wire format (dblp/wire.py) carries a CRC-32C per datagram. The
 * crc32c package computes one buffer per Python call, so a 25M-element round
 * (69,061 datagrams per worker at MTU 1500) paid ~1 us of Python call and
 * slicing overhead per datagram - more than the CRC itself. Here one call
 * covers a whole (k, stride) row matrix; with SSE 4.2 the CRC instruction
 * runs 8 bytes at a time. Where the extension is not built, dblp/wire.py
 * falls back to the crc32c package; both give identical values (tested).
 *
 * crc_rows(rows, lengths, out, start)
 *   rows    C-contiguous uint8 buffer of k rows of `stride` bytes (2-D)
 *   lengths int64 buffer of k datagram lengths, or None (every row full)
 *   out     writable uint32 buffer of k results
 *   start   first byte covered (8: after the magic/version/kind/crc fields)
 */
#define _GNU_SOURCE /* recvmmsg */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

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

/* Every implementation continues a CRC: crc(crc(0, a), b) == crc(0, a || b). */

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

typedef uint32_t (*crc_fn)(uint32_t, const uint8_t *, size_t);
static crc_fn crc_impl = crc_bytewise;
static const char *crc_name = "bytewise";

static PyObject *crc_rows(PyObject *self, PyObject *args) {
    PyObject *rows_o, *len_o, *out_o;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "OOOn", &rows_o, &len_o, &out_o, &start)) return NULL;
    Py_buffer rows, lens = {0}, out;
    if (PyObject_GetBuffer(rows_o, &rows, PyBUF_C_CONTIGUOUS | PyBUF_ND) < 0) return NULL;
    if (PyObject_GetBuffer(out_o, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&rows);
        return NULL;
    }
    int have_lens = len_o != Py_None;
    if (have_lens && PyObject_GetBuffer(len_o, &lens, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&rows);
        PyBuffer_Release(&out);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t k = rows.ndim >= 1 ? rows.shape[0] : 0;
    Py_ssize_t stride = (rows.ndim == 2) ? rows.shape[1] : 0;
    if (rows.ndim != 2 || rows.itemsize != 1) {
        PyErr_SetString(PyExc_ValueError, "rows must be a 2-D uint8 array");
    } else if (out.len < k * 4) {
        PyErr_SetString(PyExc_ValueError, "out holds fewer than k uint32 values");
    } else if (have_lens && lens.len < k * 8) {
        PyErr_SetString(PyExc_ValueError, "lengths holds fewer than k int64 values");
    } else if (start < 0 || start > stride) {
        PyErr_SetString(PyExc_ValueError, "start outside the row");
    } else {
        const uint8_t *base = (const uint8_t *)rows.buf;
        const int64_t *ln = have_lens ? (const int64_t *)lens.buf : NULL;
        uint32_t *dst = (uint32_t *)out.buf;
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
        if (bad)
            PyErr_SetString(PyExc_ValueError, "a length is shorter than start or longer than the row");
        else {
            result = Py_None;
            Py_INCREF(result);
        }
    }
    PyBuffer_Release(&rows);
    PyBuffer_Release(&out);
    if (have_lens) PyBuffer_Release(&lens);
    return result;
}

static inline void put_be16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static inline void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

/* The 24-byte header of dblp/wire.py, CRC field left for the caller. */
static void write_header(uint8_t *r, uint32_t run_id, uint32_t sender, uint32_t plen, uint32_t round_no, uint32_t seq) {
    put_be16(r, 0xDB1F);
    r[2] = 1; /* version */
    r[3] = 1; /* kind: data */
    put_be32(r + 8, run_id);
    put_be16(r + 12, sender);
    put_be16(r + 14, plen);
    put_be32(r + 16, round_no);
    put_be32(r + 20, seq);
}

/* encode_rows(values, seqs, rows, run_id, sender, round, chunk_floats)
 *
 * The same bytes as dblp.wire.encode_chunks (the reference, and the fallback
 * without this helper): for each i, header + chunk seqs[i] of the float32
 * tensor `values` into rows[i], zero padding after a short last chunk, and
 * the CRC-32C of bytes 8..end. One pass over the payload instead of numpy's
 * gather into a temporary and a strided copy; GIL released. */
static PyObject *encode_rows(PyObject *self, PyObject *args) {
    PyObject *val_o, *seq_o, *rows_o;
    unsigned long run_id, round_no;
    unsigned int sender;
    Py_ssize_t cf;
    if (!PyArg_ParseTuple(args, "OOOkIkn", &val_o, &seq_o, &rows_o, &run_id, &sender, &round_no, &cf)) return NULL;
    Py_buffer val, seq, rows;
    if (PyObject_GetBuffer(val_o, &val, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(seq_o, &seq, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&val);
        return NULL;
    }
    if (PyObject_GetBuffer(rows_o, &rows, PyBUF_C_CONTIGUOUS | PyBUF_ND | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&val);
        PyBuffer_Release(&seq);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t k = seq.len / 8, elements = val.len / 4;
    Py_ssize_t width = rows.ndim == 2 ? rows.shape[1] : 0;
    Py_ssize_t chunks = cf > 0 ? (elements + cf - 1) / cf : 0;
    if (rows.ndim != 2 || rows.itemsize != 1 || rows.shape[0] != k) {
        PyErr_SetString(PyExc_ValueError, "rows must be a (len(seqs), width) uint8 array");
    } else if (cf <= 0 || width != 24 + 4 * cf) {
        PyErr_SetString(PyExc_ValueError, "rows width must be 24 + 4 * chunk_floats");
    } else {
        const float *v = (const float *)val.buf;
        const int64_t *sq = (const int64_t *)seq.buf;
        uint8_t *base = (uint8_t *)rows.buf;
        int bad = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < k; i++) {
            int64_t s = sq[i];
            if (s < 0 || s >= chunks) {
                bad = 1;
                break;
            }
            Py_ssize_t n = (s == chunks - 1) ? elements - s * cf : cf;
            uint8_t *r = base + i * width;
            write_header(r, (uint32_t)run_id, sender, (uint32_t)(4 * n), (uint32_t)round_no, (uint32_t)s);
            memcpy(r + 24, v + s * cf, (size_t)(4 * n));
            if (n < cf) memset(r + 24 + 4 * n, 0, (size_t)(4 * (cf - n)));
            put_be32(r + 4, crc_impl(0, r + 8, (size_t)(16 + 4 * n)));
        }
        Py_END_ALLOW_THREADS
        if (bad)
            PyErr_SetString(PyExc_ValueError, "a chunk index is outside the tensor");
        else {
            result = Py_None;
            Py_INCREF(result);
        }
    }
    PyBuffer_Release(&val);
    PyBuffer_Release(&seq);
    PyBuffer_Release(&rows);
    return result;
}

/* scatter_rows(rows, seqs, out, nbytes, chunk_bytes)
 *
 * Payload bytes 24..24+nbytes of rows[i] to byte seqs[i] * chunk_bytes of
 * `out`: the receiver's write of accepted chunks (numpy's fancy assignment
 * from a strided view, without its per-call set-up; GIL released). */
static PyObject *scatter_rows(PyObject *self, PyObject *args) {
    PyObject *rows_o, *seq_o, *out_o;
    Py_ssize_t nbytes, chunk_bytes;
    if (!PyArg_ParseTuple(args, "OOOnn", &rows_o, &seq_o, &out_o, &nbytes, &chunk_bytes)) return NULL;
    Py_buffer rows, seq, out;
    if (PyObject_GetBuffer(rows_o, &rows, PyBUF_C_CONTIGUOUS | PyBUF_ND) < 0) return NULL;
    if (PyObject_GetBuffer(seq_o, &seq, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&rows);
        return NULL;
    }
    if (PyObject_GetBuffer(out_o, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&rows);
        PyBuffer_Release(&seq);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t k = seq.len / 8;
    Py_ssize_t width = rows.ndim == 2 ? rows.shape[1] : 0;
    if (rows.ndim != 2 || rows.itemsize != 1 || rows.shape[0] < k) {
        PyErr_SetString(PyExc_ValueError, "rows must be a 2-D uint8 array with a row per index");
    } else if (nbytes < 0 || 24 + nbytes > width || chunk_bytes <= 0) {
        PyErr_SetString(PyExc_ValueError, "payload size does not fit the rows");
    } else {
        const uint8_t *base = (const uint8_t *)rows.buf;
        const int64_t *sq = (const int64_t *)seq.buf;
        uint8_t *dst = (uint8_t *)out.buf;
        int bad = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < k; i++) {
            int64_t s = sq[i];
            if (s < 0 || s * chunk_bytes + nbytes > out.len) {
                bad = 1;
                break;
            }
            memcpy(dst + s * chunk_bytes, base + i * width + 24, (size_t)nbytes);
        }
        Py_END_ALLOW_THREADS
        if (bad)
            PyErr_SetString(PyExc_ValueError, "a chunk index is outside the output");
        else {
            result = Py_None;
            Py_INCREF(result);
        }
    }
    PyBuffer_Release(&rows);
    PyBuffer_Release(&seq);
    PyBuffer_Release(&out);
    return result;
}

/* encode_headers(values, seqs, headers, run_id, sender, round, chunk_floats)
 *
 * Only the (k, 24) headers of the datagrams of chunks seqs, CRC included
 * (it covers header bytes 8..24 and the payload, read in place from
 * `values`). With send_chunks the payload then goes from the tensor to the
 * kernel with no copy in between. */
static PyObject *encode_headers(PyObject *self, PyObject *args) {
    PyObject *val_o, *seq_o, *hdr_o;
    unsigned long run_id, round_no;
    unsigned int sender;
    Py_ssize_t cf;
    if (!PyArg_ParseTuple(args, "OOOkIkn", &val_o, &seq_o, &hdr_o, &run_id, &sender, &round_no, &cf)) return NULL;
    Py_buffer val, seq, hdr;
    if (PyObject_GetBuffer(val_o, &val, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(seq_o, &seq, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&val);
        return NULL;
    }
    if (PyObject_GetBuffer(hdr_o, &hdr, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&val);
        PyBuffer_Release(&seq);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t k = seq.len / 8, elements = val.len / 4;
    Py_ssize_t chunks = cf > 0 ? (elements + cf - 1) / cf : 0;
    if (hdr.len != k * 24) {
        PyErr_SetString(PyExc_ValueError, "headers must hold 24 bytes per index");
    } else if (cf <= 0) {
        PyErr_SetString(PyExc_ValueError, "chunk_floats must be positive");
    } else {
        const uint8_t *v = (const uint8_t *)val.buf;
        const int64_t *sq = (const int64_t *)seq.buf;
        uint8_t *base = (uint8_t *)hdr.buf;
        int bad = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < k; i++) {
            int64_t s = sq[i];
            if (s < 0 || s >= chunks) {
                bad = 1;
                break;
            }
            Py_ssize_t n = (s == chunks - 1) ? elements - s * cf : cf;
            uint8_t *r = base + i * 24;
            write_header(r, (uint32_t)run_id, sender, (uint32_t)(4 * n), (uint32_t)round_no, (uint32_t)s);
            uint32_t c = crc_impl(0, r + 8, 16);
            put_be32(r + 4, crc_impl(c, v + 4 * s * cf, (size_t)(4 * n)));
        }
        Py_END_ALLOW_THREADS
        if (bad)
            PyErr_SetString(PyExc_ValueError, "a chunk index is outside the tensor");
        else {
            result = Py_None;
            Py_INCREF(result);
        }
    }
    PyBuffer_Release(&val);
    PyBuffer_Release(&seq);
    PyBuffer_Release(&hdr);
    return result;
}

/* send_chunks(fd, host, port, headers, values, seqs, chunk_floats, per_call)
 *
 * Puts the datagrams (header i, then chunk seqs[i] of `values`) on the wire
 * with an iovec pair per datagram: the kernel copies the payload straight
 * from the tensor. Runs of full-size datagrams go `per_call` at a time in
 * one sendmsg with a UDP_SEGMENT control message (GSO), a short chunk alone;
 * per_call <= 1 (no GSO) sends one datagram per message, up to 64 messages
 * per sendmmsg. The loop runs without the GIL.
 *
 * Returns (sent, lost, calls, err): datagrams the kernel took; datagrams
 * refused with ECONNREFUSED (ICMP about an earlier one) or EPERM (a local
 * firewall rule) - lost, as on a wire; system calls made; and the errno
 * that stopped the loop early (EAGAIN, ENOBUFS, EINTR: the caller waits and
 * resumes at sent + lost) or 0. Any other error raises OSError. */
#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#define MAX_SEGS 64

static PyObject *send_chunks(PyObject *self, PyObject *args) {
    int fd, port;
    const char *host;
    PyObject *hdr_o, *val_o, *seq_o;
    Py_ssize_t cf, per_call;
    if (!PyArg_ParseTuple(args, "isiOOOnn", &fd, &host, &port, &hdr_o, &val_o, &seq_o, &cf, &per_call)) return NULL;
    struct sockaddr_in dst;
    memset(&dst, 0, sizeof dst);
    dst.sin_family = AF_INET;
    dst.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &dst.sin_addr) != 1) {
        PyErr_Format(PyExc_ValueError, "not an IPv4 address: %s", host);
        return NULL;
    }
    Py_buffer hdr, val, seq;
    if (PyObject_GetBuffer(hdr_o, &hdr, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(val_o, &val, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&hdr);
        return NULL;
    }
    if (PyObject_GetBuffer(seq_o, &seq, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&hdr);
        PyBuffer_Release(&val);
        return NULL;
    }
    Py_ssize_t k = seq.len / 8, elements = val.len / 4;
    Py_ssize_t chunks = cf > 0 ? (elements + cf - 1) / cf : 0;
    Py_ssize_t seg = 24 + 4 * cf;
    if (per_call > MAX_SEGS) per_call = MAX_SEGS;
    if (per_call * seg > 65507) per_call = 65507 / seg;
    if (per_call < 1) per_call = 1;
    PyObject *result = NULL;
    if (hdr.len < k * 24 || cf <= 0) {
        PyErr_SetString(PyExc_ValueError, "headers must hold 24 bytes per index, chunk_floats > 0");
    } else {
        const uint8_t *h = (const uint8_t *)hdr.buf, *v = (const uint8_t *)val.buf;
        const int64_t *sq = (const int64_t *)seq.buf;
        Py_ssize_t i = 0, sent = 0, lost = 0, calls = 0;
        int err = 0, fatal = 0, bad = 0;
        Py_BEGIN_ALLOW_THREADS
        struct iovec iov[2 * MAX_SEGS];
        union {
            char buf[CMSG_SPACE(sizeof(uint16_t))];
            struct cmsghdr align;
        } ctrl;
        if (per_call <= 1) { /* no GSO: one datagram per message, up to MAX_SEGS messages per sendmmsg */
            struct mmsghdr msgs[MAX_SEGS];
            while (i < k) {
                int vlen = 0;
                while (i + vlen < k && vlen < MAX_SEGS) {
                    int64_t s = sq[i + vlen];
                    if (s < 0 || s >= chunks) {
                        bad = 1;
                        break;
                    }
                    Py_ssize_t n = (s == chunks - 1) ? elements - s * cf : cf;
                    iov[2 * vlen].iov_base = (void *)(h + 24 * (i + vlen));
                    iov[2 * vlen].iov_len = 24;
                    iov[2 * vlen + 1].iov_base = (void *)(v + 4 * s * cf);
                    iov[2 * vlen + 1].iov_len = (size_t)(4 * n);
                    memset(&msgs[vlen], 0, sizeof msgs[vlen]);
                    msgs[vlen].msg_hdr.msg_name = &dst;
                    msgs[vlen].msg_hdr.msg_namelen = sizeof dst;
                    msgs[vlen].msg_hdr.msg_iov = &iov[2 * vlen];
                    msgs[vlen].msg_hdr.msg_iovlen = 2;
                    vlen++;
                }
                if (bad || vlen == 0) break;
                calls++;
                int r = sendmmsg(fd, msgs, (unsigned int)vlen, 0);
                if (r < 0) { /* the first message failed */
                    int e = errno;
                    if (e == ECONNREFUSED || e == EPERM) {
                        lost += 1;
                        i += 1;
                        continue;
                    }
                    err = e;
                    fatal = !(e == EAGAIN || e == EWOULDBLOCK || e == ENOBUFS || e == EINTR);
                    break;
                }
                sent += r;
                i += r;
            }
        }
        while (i < k && per_call > 1 && !bad && !err) {
            Py_ssize_t count = 0;
            int full = 1;
            while (i + count < k && count < per_call) {
                int64_t s = sq[i + count];
                if (s < 0 || s >= chunks) {
                    bad = 1;
                    break;
                }
                Py_ssize_t n = (s == chunks - 1) ? elements - s * cf : cf;
                if (n != cf) { /* a short chunk travels alone */
                    if (count > 0) break;
                    full = 0;
                }
                iov[2 * count].iov_base = (void *)(h + 24 * (i + count));
                iov[2 * count].iov_len = 24;
                iov[2 * count + 1].iov_base = (void *)(v + 4 * s * cf);
                iov[2 * count + 1].iov_len = (size_t)(4 * n);
                count++;
                if (!full) break;
            }
            if (bad) break;
            struct msghdr msg;
            memset(&msg, 0, sizeof msg);
            msg.msg_name = &dst;
            msg.msg_namelen = sizeof dst;
            msg.msg_iov = iov;
            msg.msg_iovlen = (size_t)(2 * count);
            if (count > 1) {
                memset(&ctrl, 0, sizeof ctrl);
                msg.msg_control = ctrl.buf;
                msg.msg_controllen = sizeof ctrl.buf;
                struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
                cm->cmsg_level = SOL_UDP;
                cm->cmsg_type = UDP_SEGMENT;
                cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
                uint16_t gso = (uint16_t)seg;
                memcpy(CMSG_DATA(cm), &gso, sizeof gso);
            }
            calls++;
            if (sendmsg(fd, &msg, 0) < 0) {
                int e = errno;
                if (e == ECONNREFUSED || e == EPERM) {
                    lost += count;
                    i += count;
                    continue;
                }
                if (e == EAGAIN || e == EWOULDBLOCK || e == ENOBUFS || e == EINTR) {
                    err = e;
                } else {
                    err = e;
                    fatal = 1;
                }
                break;
            }
            sent += count;
            i += count;
        }
        Py_END_ALLOW_THREADS
        if (bad)
            PyErr_SetString(PyExc_ValueError, "a chunk index is outside the tensor");
        else if (fatal) {
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
        } else
            result = Py_BuildValue("nnni", sent, lost, calls, err);
    }
    PyBuffer_Release(&hdr);
    PyBuffer_Release(&val);
    PyBuffer_Release(&seq);
    return result;
}

/* recv_rows(fd, rows, lengths, srcs, gro, max_calls)
 *
 * Takes queued datagrams into the rows of a (K, width) matrix without
 * blocking, one row per datagram: with `gro`, a coalesced run of
 * width-byte segments lands row by row with no copy (one recvmsg per run);
 * without, recvmmsg takes up to 256 datagrams per system call. lengths[i]
 * gets each datagram's length (truncated to width: such a datagram cannot
 * be a valid chunk and fails its CRC), srcs[i] its source as
 * (IPv4 address << 16) | port. Returns (k, calls). Stops when nothing is
 * queued, the matrix is full or max_calls calls were made. ECONNREFUSED
 * (ICMP about an earlier send) is skipped; other errors raise OSError. */
#define MMSG_BATCH 256
static int gro_segment(struct msghdr *msg, Py_ssize_t n) {
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
        if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == 104 /* UDP_GRO */) {
            if (cm->cmsg_len >= CMSG_LEN(sizeof(int))) {
                int v;
                memcpy(&v, CMSG_DATA(cm), sizeof v);
                return v;
            }
            uint16_t v16;
            memcpy(&v16, CMSG_DATA(cm), sizeof v16);
            return v16;
        }
    }
    return (int)n;
}

/* One non-blocking recvmsg into iov, with room for the UDP_GRO control message; *seg gets the
 * segment size of a coalesced run (n itself for a single datagram). */
static ssize_t recv_gro(int fd, struct iovec *iov, size_t iovlen, struct sockaddr_in *src, Py_ssize_t *seg) {
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctrl;
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_name = src;
    msg.msg_namelen = sizeof *src;
    msg.msg_iov = iov;
    msg.msg_iovlen = iovlen;
    msg.msg_control = ctrl.buf;
    msg.msg_controllen = sizeof ctrl.buf;
    ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT);
    if (n >= 0) *seg = gro_segment(&msg, n);
    return n;
}

static inline int64_t src_key(const struct sockaddr_in *a) {
    return ((int64_t)ntohl(a->sin_addr.s_addr) << 16) | ntohs(a->sin_port);
}

static PyObject *recv_rows(PyObject *self, PyObject *args) {
    int fd, gro;
    PyObject *rows_o, *len_o, *src_o;
    Py_ssize_t max_calls;
    if (!PyArg_ParseTuple(args, "iOOOin", &fd, &rows_o, &len_o, &src_o, &gro, &max_calls)) return NULL;
    Py_buffer rows, lens, srcs;
    if (PyObject_GetBuffer(rows_o, &rows, PyBUF_C_CONTIGUOUS | PyBUF_ND | PyBUF_WRITABLE) < 0) return NULL;
    if (PyObject_GetBuffer(len_o, &lens, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&rows);
        return NULL;
    }
    if (PyObject_GetBuffer(src_o, &srcs, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&rows);
        PyBuffer_Release(&lens);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t K = rows.ndim == 2 ? rows.shape[0] : 0, width = rows.ndim == 2 ? rows.shape[1] : 0;
    if (rows.ndim != 2 || rows.itemsize != 1 || width <= 0) {
        PyErr_SetString(PyExc_ValueError, "rows must be a 2-D uint8 array");
    } else if (lens.len < K * 8 || srcs.len < K * 8) {
        PyErr_SetString(PyExc_ValueError, "lengths and srcs need an int64 per row");
    } else {
        uint8_t *base = (uint8_t *)rows.buf;
        int64_t *ln = (int64_t *)lens.buf, *sk = (int64_t *)srcs.buf;
        Py_ssize_t k = 0, calls = 0;
        int err = 0;
        uint8_t *scratch = NULL;
        Py_BEGIN_ALLOW_THREADS
        if (gro) {
            while (calls < max_calls) {
                Py_ssize_t room = K - k, seg = 0;
                if (room <= 0 || room * width < 65507) break; /* a full coalesced run might not fit */
                struct sockaddr_in src;
                struct iovec iov = {base + k * width, (size_t)(room * width)};
                ssize_t n = recv_gro(fd, &iov, 1, &src, &seg);
                calls++;
                if (n < 0) {
                    if (errno == ECONNREFUSED) continue;
                    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) err = errno;
                    break;
                }
                int64_t key = src_key(&src);
                if (n == 0) { /* an empty datagram: one row of length 0 */
                    ln[k] = 0;
                    sk[k++] = key;
                } else if (n <= width || seg == width) {
                    Py_ssize_t m = (n + width - 1) / width;
                    for (Py_ssize_t j = 0; j < m; j++) {
                        ln[k + j] = width;
                        sk[k + j] = key;
                    }
                    ln[k + m - 1] = n - (m - 1) * width;
                    k += m;
                } else { /* a run of another segment size: re-cut it into rows, truncated to width */
                    if (!scratch) scratch = malloc(65536);
                    if (!scratch) {
                        err = ENOMEM;
                        break;
                    }
                    memcpy(scratch, base + k * width, (size_t)n);
                    for (Py_ssize_t off = 0; off < n && k < K; off += seg) {
                        Py_ssize_t piece = n - off < seg ? n - off : seg;
                        if (piece > width) piece = width;
                        memcpy(base + k * width, scratch + off, (size_t)piece);
                        ln[k] = piece;
                        sk[k++] = key;
                    }
                }
            }
        } else {
            struct mmsghdr msgs[MMSG_BATCH];
            struct iovec iovs[MMSG_BATCH];
            struct sockaddr_in addrs[MMSG_BATCH];
            while (calls < max_calls && k < K) {
                unsigned int vlen = (unsigned int)((K - k) < MMSG_BATCH ? (K - k) : MMSG_BATCH);
                memset(msgs, 0, sizeof(struct mmsghdr) * vlen);
                for (unsigned int j = 0; j < vlen; j++) {
                    iovs[j].iov_base = base + (k + j) * width;
                    iovs[j].iov_len = (size_t)width;
                    msgs[j].msg_hdr.msg_iov = &iovs[j];
                    msgs[j].msg_hdr.msg_iovlen = 1;
                    msgs[j].msg_hdr.msg_name = &addrs[j];
                    msgs[j].msg_hdr.msg_namelen = sizeof addrs[j];
                }
                int r = recvmmsg(fd, msgs, vlen, MSG_DONTWAIT, NULL);
                calls++;
                if (r < 0) {
                    if (errno == ECONNREFUSED) continue;
                    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) err = errno;
                    break;
                }
                for (int j = 0; j < r; j++) {
                    ln[k + j] = msgs[j].msg_len;
                    sk[k + j] = src_key(&addrs[j]);
                }
                k += r;
                if ((unsigned int)r < vlen) break; /* the queue is empty */
            }
        }
        free(scratch);
        Py_END_ALLOW_THREADS
        if (err) {
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
        } else
            result = Py_BuildValue("nn", k, calls);
    }
    PyBuffer_Release(&rows);
    PyBuffer_Release(&lens);
    PyBuffer_Release(&srcs);
    return result;
}

/* recv_place(fd, rows, lengths, srcs, aims, out, mask, claim, order, pos, cursor, crcs, chunk_bytes, gro,
 *            max_calls) -> (k, calls, placed)
 *
 * recv_rows, but a datagram's payload is received straight into its place in
 * the tensor when it is the one expected next, saving the copy from a row
 * into the tensor (on the server, the whole tensor once per worker per round).
 *
 * Why it is safe: before each system call the next datagrams are predicted
 * from the sender's chunk order (`order`, its inverse `pos`, and `cursor`,
 * the position after the last chunk seen), and the kernel is given iovec
 * pairs: the 24-byte header into rows[i], the payload into the tensor slot of
 * the predicted chunk. Only slots whose chunk is not received yet (mask) and
 * not claimed by another pending datagram of this call (claim) are aimed at,
 * never the tensor's last chunk (its short slot would shift every later
 * iovec). So a wrong prediction, a stale, foreign or corrupt datagram can
 * only scribble on a slot whose chunk is still missing: the receiver either
 * accepts a valid copy of that chunk later (overwriting it) or zero-fills it
 * at STOP (R7). The receiver validates every datagram as usual (header
 * fields, CRC over header + slot via crc_placed); this function decides
 * nothing about acceptance.
 *
 * On return, for i < k: aims[i] >= 0 means the header is in rows[i, :24]
 * and the payload in the slot of chunk aims[i] (full length, header seq ==
 * aims[i]); aims[i] == -1 means the whole datagram is in rows[i, :lengths[i]]
 * (payloads that landed in a wrong slot are copied back there). `claim` is
 * all zero again on return; `cursor` is updated. crcs[i] (uint32) gets the
 * CRC-32C of a placed datagram (header from byte 8, then its slot), computed
 * right after its system call while the bytes are still in cache: read
 * again later from a 100 MB tensor, they cost more than the copy saved. */
#define PLACE_MAX_SEGS 64
#define PLACE_SCAN 4096

typedef struct {
    uint8_t *base;
    Py_ssize_t width, cb, chunks;
    uint8_t *out;
    const uint8_t *mask;
    uint8_t *claim;
    const int64_t *order, *pos;
    int64_t cursor;
    uint32_t *crcs;
} place_ctx;

static inline uint32_t get_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Aims for r datagrams: the next missing, unclaimed chunks in the sender's order. */
static void plan_aims(place_ctx *c, int64_t *aims, Py_ssize_t r) {
    Py_ssize_t got = 0;
    int64_t p = c->cursor < 0 ? 0 : c->cursor, lim = p + PLACE_SCAN;
    if (lim > c->chunks) lim = c->chunks;
    for (; p < lim && got < r; p++) {
        int64_t s = c->order[p];
        if (s < 0 || s >= c->chunks || c->mask[s] || c->claim[s]) continue;
        if (s == c->chunks - 1) { /* expected, but its short slot cannot take an iovec: its row does */
            aims[got++] = -1;
            continue;
        }
        aims[got++] = s;
        c->claim[s] = 1;
    }
    for (Py_ssize_t j = got; j < r; j++) aims[j] = -1;
}

static void set_iov(place_ctx *c, struct iovec *iov, Py_ssize_t row, int64_t aim) {
    uint8_t *r = c->base + row * c->width;
    iov[0].iov_base = r;
    iov[0].iov_len = 24;
    iov[1].iov_base = aim >= 0 ? c->out + aim * c->cb : r + 24;
    iov[1].iov_len = (size_t)(aim >= 0 ? c->cb : c->width - 24);
}

/* A received datagram of n bytes in row `row` (header) and its aim's slot:
 * keep it in place if it is the aimed chunk, else move its payload to the row. */
static int settle(place_ctx *c, Py_ssize_t row, int64_t *aim, Py_ssize_t n) {
    uint8_t *r = c->base + row * c->width;
    int64_t a = *aim;
    if (a < 0) return 0;
    if (n == c->width && (int64_t)get_be32(r + 20) == a) {
        c->crcs[row] = crc_impl(crc_impl(0, r + 8, 16), c->out + a * c->cb, (size_t)c->cb);
        return 1;
    }
    if (n > 24) memcpy(r + 24, c->out + a * c->cb, (size_t)(n - 24));
    c->claim[a] = 0;
    *aim = -1;
    return 0;
}

static void resync(place_ctx *c, Py_ssize_t row, Py_ssize_t n) {
    if (n < 24) return;
    uint32_t s = get_be32(c->base + row * c->width + 20);
    if ((int64_t)s < c->chunks) c->cursor = c->pos[s] + 1;
}

static PyObject *recv_place(PyObject *self, PyObject *args) {
    int fd, gro;
    PyObject *o[11];
    Py_ssize_t cb, max_calls;
    if (!PyArg_ParseTuple(args, "iOOOOOOOOOOOnin", &fd, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                          &o[8], &o[9], &o[10], &cb, &gro, &max_calls))
        return NULL;
    /* rows, lengths, srcs, aims, out, mask, claim, order, pos, cursor, crcs */
    Py_buffer b[11];
    int writable[11] = {1, 1, 1, 1, 1, 0, 1, 0, 0, 1, 1};
    int nb = 0;
    for (; nb < 11; nb++) {
        int flags = PyBUF_C_CONTIGUOUS | (nb == 0 ? PyBUF_ND : 0) | (writable[nb] ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(o[nb], &b[nb], flags) < 0) break;
    }
    PyObject *result = NULL;
    if (nb < 11) goto done;
    Py_ssize_t K = b[0].ndim == 2 ? b[0].shape[0] : 0, width = b[0].ndim == 2 ? b[0].shape[1] : 0;
    Py_ssize_t chunks = b[5].len;
    if (b[0].ndim != 2 || b[0].itemsize != 1 || cb <= 0 || width != 24 + cb) {
        PyErr_SetString(PyExc_ValueError, "rows must be a 2-D uint8 array of 24 + chunk_bytes columns");
        goto done;
    }
    if (b[1].len < K * 8 || b[2].len < K * 8 || b[3].len < K * 8 || b[10].len < K * 4) {
        PyErr_SetString(PyExc_ValueError, "lengths, srcs and aims need an int64 per row, crcs a uint32");
        goto done;
    }
    if (chunks < 2 || b[6].len != chunks || b[7].len != chunks * 8 || b[8].len != chunks * 8 || b[9].len < 8 ||
        b[4].len < (chunks - 1) * cb) {
        PyErr_SetString(PyExc_ValueError, "mask, claim, order, pos and out must describe the same chunks");
        goto done;
    }
    {
        place_ctx c = {(uint8_t *)b[0].buf, width, cb, chunks, (uint8_t *)b[4].buf, (const uint8_t *)b[5].buf,
                       (uint8_t *)b[6].buf, (const int64_t *)b[7].buf, (const int64_t *)b[8].buf,
                       ((int64_t *)b[9].buf)[0], (uint32_t *)b[10].buf};
        /* order/pos only steer predictions: every index taken from them is bounds-checked, so a
         * wrong order costs copies, never memory safety (no O(chunks) check per call) */
        int64_t *ln = (int64_t *)b[1].buf, *sk = (int64_t *)b[2].buf, *aims = (int64_t *)b[3].buf;
        Py_ssize_t k = 0, calls = 0, placed = 0;
        int err = 0;
        uint8_t *tmp = NULL;
        Py_BEGIN_ALLOW_THREADS
        if (gro) {
            struct iovec iov[2 * PLACE_MAX_SEGS];
            while (calls < max_calls) {
                Py_ssize_t r = K - k < PLACE_MAX_SEGS ? K - k : PLACE_MAX_SEGS, seg = 0;
                if (r * width < 65507) break; /* a full coalesced run might not fit */
                plan_aims(&c, aims + k, r);
                for (Py_ssize_t j = 0; j < r; j++) set_iov(&c, iov + 2 * j, k + j, aims[k + j]);
                struct sockaddr_in src;
                ssize_t n = recv_gro(fd, iov, (size_t)(2 * r), &src, &seg);
                calls++;
                Py_ssize_t used = 0;
                if (n >= 0) {
                    int64_t key = src_key(&src);
                    if (n == 0) {
                        ln[k] = 0;
                        sk[k] = key;
                        if (aims[k] >= 0) c.claim[aims[k]] = 0;
                        aims[k] = -1;
                        used = 1;
                    } else if (n <= width || seg == width) {
                        used = (n + width - 1) / width;
                        for (Py_ssize_t j = 0; j < used; j++) {
                            Py_ssize_t len = j < used - 1 ? width : n - j * width;
                            ln[k + j] = len;
                            sk[k + j] = key;
                            placed += settle(&c, k + j, &aims[k + j], len);
                        }
                        resync(&c, k + used - 1, ln[k + used - 1]);
                    } else { /* a run of another segment size: gather it, re-cut it into rows */
                        if (!tmp) tmp = malloc((size_t)(PLACE_MAX_SEGS * width));
                        if (!tmp) {
                            err = ENOMEM;
                            break;
                        }
                        Py_ssize_t off = 0;
                        for (Py_ssize_t j = 0; j < 2 * r && off < n; j++) {
                            size_t piece = iov[j].iov_len < (size_t)(n - off) ? iov[j].iov_len : (size_t)(n - off);
                            memcpy(tmp + off, iov[j].iov_base, piece);
                            off += (Py_ssize_t)piece;
                        }
                        for (Py_ssize_t j = 0; j < r; j++) {
                            if (aims[k + j] >= 0) c.claim[aims[k + j]] = 0;
                            aims[k + j] = -1;
                        }
                        for (off = 0; off < n && used < r; off += seg) {
                            Py_ssize_t piece = n - off < seg ? n - off : seg;
                            if (piece > width) piece = width;
                            memcpy(c.base + (k + used) * width, tmp + off, (size_t)piece);
                            ln[k + used] = piece;
                            sk[k + used] = key;
                            used++;
                        }
                    }
                }
                for (Py_ssize_t j = used; j < r; j++) /* planned, not received */
                    if (aims[k + j] >= 0) c.claim[aims[k + j]] = 0;
                k += used;
                if (n < 0) {
                    if (errno == ECONNREFUSED) continue;
                    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) err = errno;
                    break;
                }
            }
        } else {
            struct mmsghdr msgs[MMSG_BATCH];
            struct iovec iovs[2 * MMSG_BATCH];
            struct sockaddr_in addrs[MMSG_BATCH];
            while (calls < max_calls && k < K) {
                unsigned int vlen = (unsigned int)((K - k) < MMSG_BATCH ? (K - k) : MMSG_BATCH);
                plan_aims(&c, aims + k, vlen);
                memset(msgs, 0, sizeof(struct mmsghdr) * vlen);
                for (unsigned int j = 0; j < vlen; j++) {
                    set_iov(&c, iovs + 2 * j, k + j, aims[k + j]);
                    msgs[j].msg_hdr.msg_iov = iovs + 2 * j;
                    msgs[j].msg_hdr.msg_iovlen = 2;
                    msgs[j].msg_hdr.msg_name = &addrs[j];
                    msgs[j].msg_hdr.msg_namelen = sizeof addrs[j];
                }
                int got = recvmmsg(fd, msgs, vlen, MSG_DONTWAIT, NULL);
                calls++;
                for (int j = 0; j < got; j++) {
                    ln[k + j] = msgs[j].msg_len;
                    sk[k + j] = src_key(&addrs[j]);
                    placed += settle(&c, k + j, &aims[k + j], (Py_ssize_t)msgs[j].msg_len);
                }
                if (got > 0) resync(&c, k + got - 1, ln[k + got - 1]);
                for (unsigned int j = got > 0 ? (unsigned int)got : 0; j < vlen; j++)
                    if (aims[k + j] >= 0) c.claim[aims[k + j]] = 0;
                if (got < 0) {
                    if (errno == ECONNREFUSED) continue;
                    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) err = errno;
                    break;
                }
                k += got;
                if ((unsigned int)got < vlen) break; /* the queue is empty */
            }
        }
        for (Py_ssize_t i = 0; i < k; i++) /* claims end here: the receiver's mask takes over */
            if (aims[i] >= 0) c.claim[aims[i]] = 0;
        ((int64_t *)b[9].buf)[0] = c.cursor;
        free(tmp);
        Py_END_ALLOW_THREADS
        if (err) {
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
        } else
            result = Py_BuildValue("nnn", k, calls, placed);
    }
done:
    for (int i = 0; i < nb; i++) PyBuffer_Release(&b[i]);
    return result;
}

/* crc_placed(rows, out, aims, chunk_bytes, res): for each i with aims[i] >= 0,
 * res[i] = CRC-32C of rows[i, 8:24] followed by the payload slot of chunk
 * aims[i] in out - the datagram's CRC as the sender computed it, for a
 * datagram recv_place received in place. Other entries are left alone. */
static PyObject *crc_placed(PyObject *self, PyObject *args) {
    PyObject *o[4];
    Py_ssize_t cb;
    if (!PyArg_ParseTuple(args, "OOOnO", &o[0], &o[1], &o[2], &cb, &o[3])) return NULL;
    Py_buffer b[4];
    int nb = 0;
    for (; nb < 4; nb++) {
        int flags = PyBUF_C_CONTIGUOUS | (nb == 0 ? PyBUF_ND : 0) | (nb == 3 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(o[nb], &b[nb], flags) < 0) break;
    }
    PyObject *result = NULL;
    if (nb == 4) {
        Py_ssize_t k = b[0].ndim == 2 ? b[0].shape[0] : -1, w = b[0].ndim == 2 ? b[0].shape[1] : 0;
        if (k < 0 || w < 24 || b[0].itemsize != 1 || cb <= 0 || b[2].len < k * 8 || b[3].len < k * 4) {
            PyErr_SetString(PyExc_ValueError, "rows (k, >=24) uint8, aims k int64, res k uint32 expected");
        } else {
            const uint8_t *rows = (const uint8_t *)b[0].buf, *out = (const uint8_t *)b[1].buf;
            const int64_t *aims = (const int64_t *)b[2].buf;
            uint32_t *res = (uint32_t *)b[3].buf;
            int bad = 0;
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t i = 0; i < k; i++) {
                int64_t a = aims[i];
                if (a < 0) continue;
                if ((a + 1) * cb > b[1].len) {
                    bad = 1;
                    break;
                }
                res[i] = crc_impl(crc_impl(0, rows + i * w + 8, 16), out + a * cb, (size_t)cb);
            }
            Py_END_ALLOW_THREADS
            if (bad)
                PyErr_SetString(PyExc_ValueError, "a chunk index is outside the output");
            else {
                result = Py_None;
                Py_INCREF(result);
            }
        }
    }
    for (int i = 0; i < nb; i++) PyBuffer_Release(&b[i]);
    return result;
}

/* mean_into(out, bufs, scale, threads) -> sum of squares of out (float)
 *
 * out[i] = (bufs[0][i] + bufs[1][i] + ...) * scale, summed left to right in
 * float32 exactly as numpy's add-then-multiply does (bit-identical means),
 * and the squares of the result summed in double for the norm. Why C: the
 * server's reduce sits between its upstream and downstream passes, on every
 * round's critical path; numpy made four passes over memory (add, add, scale,
 * norm), this makes one, block by block in cache, and splits the tensor over
 * `threads` threads (the workers are idle while the server reduces). */
#include <pthread.h>
#define MEAN_BLOCK 4096
#define MEAN_MAX_SRC 256
#define MEAN_MAX_THREADS 16

typedef struct {
    float *out;
    const float *const *src;
    int nsrc;
    Py_ssize_t lo, hi;
    float scale;
    double sumsq;
} mean_job;

static void *mean_run(void *arg) {
    mean_job *j = (mean_job *)arg;
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (Py_ssize_t b = j->lo; b < j->hi; b += MEAN_BLOCK) {
        Py_ssize_t n = j->hi - b < MEAN_BLOCK ? j->hi - b : MEAN_BLOCK;
        float *o = j->out + b;
        const float *a = j->src[0] + b;
        if (j->nsrc == 1) {
            for (Py_ssize_t i = 0; i < n; i++) o[i] = a[i];
        } else {
            const float *c = j->src[1] + b;
            for (Py_ssize_t i = 0; i < n; i++) o[i] = a[i] + c[i];
        }
        for (int k = 2; k < j->nsrc; k++) {
            const float *c = j->src[k] + b;
            for (Py_ssize_t i = 0; i < n; i++) o[i] += c[i];
        }
        const float s = j->scale;
        for (Py_ssize_t i = 0; i < n; i++) o[i] *= s;
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int l = 0; l < 8; l++) acc[l] += (double)o[i + l] * (double)o[i + l];
        for (; i < n; i++) acc[0] += (double)o[i] * (double)o[i];
    }
    j->sumsq = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    return NULL;
}

static PyObject *mean_into(PyObject *self, PyObject *args) {
    PyObject *out_o, *bufs_o;
    double scale;
    int threads;
    if (!PyArg_ParseTuple(args, "OOdi", &out_o, &bufs_o, &scale, &threads)) return NULL;
    PyObject *seq = PySequence_Fast(bufs_o, "bufs must be a sequence of float32 arrays");
    if (seq == NULL) return NULL;
    Py_ssize_t nsrc = PySequence_Fast_GET_SIZE(seq);
    Py_buffer out, src[MEAN_MAX_SRC];
    Py_ssize_t got = 0;
    PyObject *result = NULL;
    if (nsrc < 1 || nsrc > MEAN_MAX_SRC) {
        PyErr_Format(PyExc_ValueError, "need 1 to %d buffers, got %zd", MEAN_MAX_SRC, nsrc);
        Py_DECREF(seq);
        return NULL;
    }
    if (PyObject_GetBuffer(out_o, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    const float *ptrs[MEAN_MAX_SRC];
    int ok = out.itemsize == 4 && out.format != NULL && strcmp(out.format, "f") == 0;
    if (!ok) PyErr_SetString(PyExc_ValueError, "out must be a C-contiguous float32 array");
    for (; ok && got < nsrc; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &src[got], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            ok = 0;
            break;
        }
        if (src[got].len != out.len || src[got].format == NULL || strcmp(src[got].format, "f") != 0) {
            PyErr_Format(PyExc_ValueError, "buffer %zd is not a C-contiguous float32 array of out's size", got);
            got++;
            ok = 0;
            break;
        }
        ptrs[got] = (const float *)src[got].buf;
    }
    if (ok) {
        Py_ssize_t n = out.len / 4;
        int t = threads < 1 ? 1 : threads > MEAN_MAX_THREADS ? MEAN_MAX_THREADS : threads;
        if (n < (Py_ssize_t)t * 65536) t = 1; /* small tensors: a thread costs more than it saves */
        mean_job jobs[MEAN_MAX_THREADS];
        pthread_t tid[MEAN_MAX_THREADS];
        int started[MEAN_MAX_THREADS] = {0};
        Py_ssize_t per = ((n + t - 1) / t + MEAN_BLOCK - 1) / MEAN_BLOCK * MEAN_BLOCK;
        Py_BEGIN_ALLOW_THREADS
        for (int k = 0; k < t; k++) {
            Py_ssize_t lo = (Py_ssize_t)k * per, hi = lo + per;
            jobs[k] = (mean_job){(float *)out.buf, ptrs, (int)nsrc, lo < n ? lo : n, hi < n ? hi : n, (float)scale, 0.0};
            if (k > 0) started[k] = pthread_create(&tid[k], NULL, mean_run, &jobs[k]) == 0;
        }
        mean_run(&jobs[0]);
        for (int k = 1; k < t; k++) {
            if (started[k])
                pthread_join(tid[k], NULL);
            else
                mean_run(&jobs[k]); /* no thread: do its share here */
        }
        Py_END_ALLOW_THREADS
        double total = 0.0;
        for (int k = 0; k < t; k++) total += jobs[k].sumsq;
        result = PyFloat_FromDouble(total);
    }
    for (Py_ssize_t k = 0; k < got; k++) PyBuffer_Release(&src[k]);
    PyBuffer_Release(&out);
    Py_DECREF(seq);
    return result;
}

/* use(name): switch the CRC implementation ("sse4.2", "slicing-by-8", "bytewise");
 * for tests that compare them. Returns the previous name. */
static PyObject *use(PyObject *self, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    const char *prev = crc_name;
    if (strcmp(name, "bytewise") == 0) {
        crc_impl = crc_bytewise;
        crc_name = "bytewise";
    } else if (strcmp(name, "slicing-by-8") == 0) {
        int little = 1;
        if (*(char *)&little != 1) {
            PyErr_SetString(PyExc_ValueError, "slicing-by-8 needs a little-endian host");
            return NULL;
        }
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

static PyMethodDef methods[] = {
    {"recv_rows", recv_rows, METH_VARARGS, "Queued datagrams into rows (GRO runs or recvmmsg); (k, calls)."},
    {"encode_headers", encode_headers, METH_VARARGS, "Headers (CRC included) of chunks seqs of a float32 tensor."},
    {"send_chunks", send_chunks, METH_VARARGS, "sendmsg header + chunk pairs, GSO runs; (sent, lost, calls, errno)."},
    {"encode_rows", encode_rows, METH_VARARGS, "Datagrams of chunks seqs of a float32 tensor, as wire.encode_chunks."},
    {"scatter_rows", scatter_rows, METH_VARARGS, "Payloads of rows to out at seqs[i] * chunk_bytes."},
    {"recv_place", recv_place, METH_VARARGS, "recv_rows with payloads received in place when predicted; (k, calls, placed)."},
    {"crc_placed", crc_placed, METH_VARARGS, "CRC-32C of header rows followed by their payload slots in out."},
    {"mean_into", mean_into, METH_VARARGS, "out = sum(bufs) * scale in one threaded pass; returns sum(out**2)."},
    {"use", use, METH_VARARGS, "Switch the CRC implementation; returns the previous one."},
    {"crc_rows", crc_rows, METH_VARARGS, "CRC-32C of rows[i, start:lengths[i]] into out[i], GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastpath(void) {
    init_table();
    init_zeros();
    int little = 1;
    if (*(char *)&little == 1) {
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
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddStringConstant(m, "BEST", crc_name) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
