/* Receiving payloads straight into their place in the tensor (core rule
 * R10): recv_place, and crc_placed for the CRC of a datagram received so.
 *
 * recv_place(fd, rows, lengths, srcs, aims, out, mask, claim, order, pos, cursor, crcs, chunk_bytes, gro,
 *            max_calls, key) -> (k, calls, placed)
 *
 * key: empty for wire version 1 (rows of 24 + chunk_bytes columns), 16
 * bytes for version 2 (40 + chunk_bytes: the header with its tag).
 *
 * recv_rows (sockets.c), but a datagram's payload is received straight into
 * its place in the tensor when it is the one expected next, saving the copy
 * from a row into the tensor (on the server, the whole tensor once per
 * worker per round).
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
 * CRC-32C of a placed datagram (header from byte 8, then its slot) - or, in
 * version 2, 1 when its tag is valid and 0 when not - computed right after
 * its system call while the bytes are still in cache: read again later from
 * a 100 MB tensor, they cost more than the copy saved. */
#include "common.h"

#include "buffers.h"
#include "sockets.h"

#define PLACE_MAX_SEGS 64
#define PLACE_SCAN 4096

typedef struct {
    uint8_t *base;
    Py_ssize_t width, hb, cb, chunks; /* hb: the header's bytes, 24 or 40 (version 2) */
    uint8_t *out;
    const uint8_t *mask;
    uint8_t *claim;
    const int64_t *order, *pos;
    int64_t cursor;
    uint32_t *crcs;
    mac_ctx *mac; /* version 2: the run's key; NULL in version 1 */
} place_ctx;

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
    iov[0].iov_len = (size_t)c->hb;
    iov[1].iov_base = aim >= 0 ? c->out + aim * c->cb : r + c->hb;
    iov[1].iov_len = (size_t)(aim >= 0 ? c->cb : c->width - c->hb);
}

/* A received datagram of n bytes in row `row` (header) and its aim's slot:
 * keep it in place if it is the aimed chunk, else move its payload to the row. */
static int settle(place_ctx *c, Py_ssize_t row, int64_t *aim, Py_ssize_t n) {
    uint8_t *r = c->base + row * c->width;
    int64_t a = *aim;
    if (a < 0) return 0;
    if (n == c->width && (int64_t)get_be32(r + 20) == a) {
        const uint8_t *slot = c->out + a * c->cb;
        c->crcs[row] = c->mac ? (uint32_t)mac_check(c->mac, r, slot, (size_t)c->cb)
                              : crc_impl(crc_impl(0, r + CRC_START, HEADER_BYTES - CRC_START), slot, (size_t)c->cb);
        return 1;
    }
    if (n > c->width) n = c->width; /* a truncated datagram: its row holds width bytes */
    if (n > c->hb) memcpy(r + c->hb, c->out + a * c->cb, (size_t)(n - c->hb));
    c->claim[a] = 0;
    *aim = -1;
    return 0;
}

/* The sender's position after the datagram in `row`: where the next predictions start. */
static void resync(place_ctx *c, Py_ssize_t row, Py_ssize_t n) {
    if (n < c->hb) return;
    uint32_t s = get_be32(c->base + row * c->width + 20);
    if ((int64_t)s < c->chunks) c->cursor = c->pos[s] + 1;
}

PyObject *fp_recv_place(PyObject *self, PyObject *args) {
    int fd, gro;
    PyObject *o[11];
    Py_ssize_t cb, max_calls;
    Py_buffer key;
    if (!PyArg_ParseTuple(args, "iOOOOOOOOOOOniny*", &fd, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                          &o[8], &o[9], &o[10], &cb, &gro, &max_calls, &key))
        return NULL;
    mac_ctx mc, *m;
    if (mac_take_key(&key, &mc, &m) < 0) return NULL;
    Py_ssize_t hb = m ? AUTH_HEADER_BYTES : HEADER_BYTES;
    Py_buffer b[11]; /* rows, lengths, srcs, aims, out, mask, claim, order, pos, cursor, crcs */
    static const int flags[11] = {BUF_OUT2D, BUF_OUT, BUF_OUT, BUF_OUT, BUF_OUT, BUF_IN,
                                  BUF_OUT,   BUF_IN,  BUF_IN,  BUF_OUT, BUF_OUT};
    if (take_buffers(11, b, o, flags) < 0) {
        if (m) mac_close(m);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t K = rows_of(&b[0]), width = cols_of(&b[0]);
    Py_ssize_t chunks = b[5].len;
    if (!is_byte_matrix(&b[0]) || cb <= 0 || width != hb + cb) {
        value_error("rows must be a 2-D uint8 array of header (24, or 40 with a key) + chunk_bytes columns");
    } else if (b[1].len < K * 8 || b[2].len < K * 8 || b[3].len < K * 8 || b[10].len < K * 4) {
        value_error("lengths, srcs and aims need an int64 per row, crcs a uint32");
    } else if (chunks < 2 || b[6].len != chunks || b[7].len != chunks * 8 || b[8].len != chunks * 8 ||
               b[9].len < 8 || b[4].len < (chunks - 1) * cb) {
        value_error("mask, claim, order, pos and out must describe the same chunks");
    } else {
        place_ctx c = {(uint8_t *)b[0].buf, width, hb, cb, chunks, (uint8_t *)b[4].buf, (const uint8_t *)b[5].buf,
                       (uint8_t *)b[6].buf, (const int64_t *)b[7].buf, (const int64_t *)b[8].buf,
                       ((int64_t *)b[9].buf)[0], (uint32_t *)b[10].buf, m};
        /* order/pos only steer predictions: every index taken from them is bounds-checked, so a
         * wrong order costs copies, never memory safety (no O(chunks) check per call) */
        int64_t *ln = (int64_t *)b[1].buf, *sk = (int64_t *)b[2].buf, *aims = (int64_t *)b[3].buf;
        int64_t *cursor_out = (int64_t *)b[9].buf;
        Py_ssize_t k = 0, calls = 0, placed = 0;
        int err = 0;
        uint8_t *tmp = NULL;
        Py_BEGIN_ALLOW_THREADS
        if (gro) {
            struct iovec iov[2 * PLACE_MAX_SEGS];
            while (calls < max_calls) {
                Py_ssize_t r = K - k < PLACE_MAX_SEGS ? K - k : PLACE_MAX_SEGS, seg = 0;
                if (r * width < UDP_MAX_PAYLOAD) break; /* a full coalesced run might not fit */
                plan_aims(&c, aims + k, r);
                for (Py_ssize_t j = 0; j < r; j++) set_iov(&c, iov + 2 * j, k + j, aims[k + j]);
                struct sockaddr_storage src;
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
                        if (c.mac) mac_prepare(c.mac, c.base + k * width, width, used);
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
                            memcpy(c.base + (k + used) * width, tmp + off, (size_t)(piece > width ? width : piece));
                            ln[k + used] = piece > width ? width + 1 : piece; /* truncated: R4 counts it */
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
            struct sockaddr_storage addrs[MMSG_BATCH];
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
                if (c.mac && got > 0) mac_prepare(c.mac, c.base + k * width, width, got);
                for (int j = 0; j < got; j++) {
                    /* a truncated datagram gets width + 1: never placed, and R4 counts it wrong_length */
                    Py_ssize_t len = (msgs[j].msg_hdr.msg_flags & MSG_TRUNC) ? width + 1 : (Py_ssize_t)msgs[j].msg_len;
                    ln[k + j] = len;
                    sk[k + j] = src_key(&addrs[j]);
                    placed += settle(&c, k + j, &aims[k + j], len);
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
        cursor_out[0] = c.cursor;
        free(tmp);
        Py_END_ALLOW_THREADS
        if (err) {
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
        } else
            result = Py_BuildValue("nnn", k, calls, placed);
    }
    if (m) mac_close(m);
    give_back_buffers(11, b);
    return result;
}

/* crc_placed(rows, out, aims, chunk_bytes, res, key): for each i with aims[i] >= 0,
 * res[i] = CRC-32C of rows[i, 8:24] followed by the payload slot of chunk
 * aims[i] in out - the datagram's CRC as the sender computed it, for a
 * datagram recv_place received in place; with a 16-byte key (version 2),
 * res[i] = 1 when the tag in rows[i, 24:40] is valid for them, else 0.
 * Other entries are left alone. */
PyObject *fp_crc_placed(PyObject *self, PyObject *args) {
    PyObject *o[4];
    Py_ssize_t cb;
    Py_buffer key;
    if (!PyArg_ParseTuple(args, "OOOnOy*", &o[0], &o[1], &o[2], &cb, &o[3], &key)) return NULL;
    mac_ctx mc, *m;
    if (mac_take_key(&key, &mc, &m) < 0) return NULL;
    Py_ssize_t hb = m ? AUTH_HEADER_BYTES : HEADER_BYTES;
    Py_buffer b[4]; /* rows, out, aims, res */
    static const int flags[4] = {BUF_IN2D, BUF_IN, BUF_IN, BUF_OUT};
    if (take_buffers(4, b, o, flags) < 0) {
        if (m) mac_close(m);
        return NULL;
    }
    PyObject *result;
    Py_ssize_t k = b[0].ndim == 2 ? b[0].shape[0] : -1, w = cols_of(&b[0]);
    if (k < 0 || w < hb || b[0].itemsize != 1 || cb <= 0 || b[2].len < k * 8 || b[3].len < k * 4) {
        result = value_error("rows (k, >= header bytes) uint8, aims k int64, res k uint32 expected");
    } else {
        const uint8_t *rows = (const uint8_t *)b[0].buf, *out = (const uint8_t *)b[1].buf;
        const int64_t *aims = (const int64_t *)b[2].buf;
        uint32_t *res = (uint32_t *)b[3].buf;
        Py_ssize_t out_len = b[1].len;
        int bad = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < k; i++) {
            int64_t a = aims[i];
            if (a < 0) continue;
            if ((a + 1) * cb > out_len) {
                bad = 1;
                break;
            }
            const uint8_t *r = rows + i * w;
            res[i] = m ? (uint32_t)mac_check(m, r, out + a * cb, (size_t)cb)
                            : crc_impl(crc_impl(0, r + CRC_START, HEADER_BYTES - CRC_START), out + a * cb, (size_t)cb);
        }
        Py_END_ALLOW_THREADS
        result = none_unless_bad(bad, "a chunk index is outside the output");
    }
    if (m) mac_close(m);
    give_back_buffers(4, b);
    return result;
}
