/* Batches of datagrams to and from a UDP socket, the loops without the GIL:
 * send_chunks (header and payload as two iovec pieces, runs coalesced with
 * UDP GSO) and recv_rows (coalesced GRO runs or recvmmsg into a row
 * matrix). recv_place (place.c) is recv_rows with payloads landing in the
 * tensor. dblp/udp.py calls these and holds the Python fallbacks. */
#include "common.h"

#include "buffers.h"
#include "sockets.h"

/* send_chunks(fd, host, port, headers, values, seqs, chunk_floats, per_call, header_bytes)
 *
 * header_bytes: 24 (wire version 1) or 40 (version 2, the tag included).
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
#define MAX_SEGS 64

/* What send_chunks sends: k datagrams, datagram i header i (hb bytes at h + hb * i) and then chunk
 * sq[i] of the float32 tensor at v (`elements` floats in chunks of cf). */
typedef struct {
    const uint8_t *h, *v;
    const int64_t *sq;
    Py_ssize_t k, hb, chunks, elements, cf;
} send_batch;

/* The iovec pairs (header, then the payload where it lies in the tensor: the kernel copies it
 * from there) of datagrams i.. of b, at most max of them, into iov; their count. With
 * `short_alone`, a short chunk travels alone: it ends a run, or is one (GSO cuts a run into
 * equal segments). *bad = 1 at a chunk index outside the tensor (the count then means nothing). */
static inline Py_ssize_t next_datagrams(const send_batch *b, Py_ssize_t i, Py_ssize_t max, int short_alone,
                                        struct iovec *iov, int *bad) {
    Py_ssize_t count = 0;
    while (i + count < b->k && count < max) {
        int64_t s = b->sq[i + count];
        if (s < 0 || s >= b->chunks) {
            *bad = 1;
            break;
        }
        Py_ssize_t n = chunk_floats(s, b->chunks, b->elements, b->cf);
        int alone = short_alone && n != b->cf;
        if (alone && count > 0) break;
        iov[2 * count].iov_base = (void *)(b->h + b->hb * (i + count));
        iov[2 * count].iov_len = (size_t)b->hb;
        iov[2 * count + 1].iov_base = (void *)(b->v + 4 * s * b->cf);
        iov[2 * count + 1].iov_len = (size_t)(4 * n);
        count++;
        if (alone) break;
    }
    return count;
}

/* A send that failed with errno e: 1 when its datagrams count as lost, as on a wire (ECONNREFUSED:
 * ICMP about an earlier one; EPERM: a local firewall rule), and the loop goes on; else 0, with
 * *err = e and *fatal set unless the caller is to wait and resume (EAGAIN, ENOBUFS, EINTR). */
static inline int lost_on_the_wire(int e, int *err, int *fatal) {
    if (e == ECONNREFUSED || e == EPERM) return 1;
    *err = e;
    *fatal = !(e == EAGAIN || e == EWOULDBLOCK || e == ENOBUFS || e == EINTR);
    return 0;
}

PyObject *fp_send_chunks(PyObject *self, PyObject *args) {
    int fd, port;
    const char *host;
    PyObject *hdr_o, *val_o, *seq_o;
    Py_ssize_t cf, per_call, hb;
    if (!PyArg_ParseTuple(args, "isiOOOnnn", &fd, &host, &port, &hdr_o, &val_o, &seq_o, &cf, &per_call, &hb))
        return NULL;
    if (hb != HEADER_BYTES && hb != AUTH_HEADER_BYTES) return value_error("header_bytes must be 24 or 40");
    struct sockaddr_storage dst; /* IPv4 or IPv6, by the address's form */
    socklen_t dst_len;
    memset(&dst, 0, sizeof dst);
    struct sockaddr_in *d4 = (struct sockaddr_in *)&dst;
    struct sockaddr_in6 *d6 = (struct sockaddr_in6 *)&dst;
    if (inet_pton(AF_INET, host, &d4->sin_addr) == 1) {
        d4->sin_family = AF_INET;
        d4->sin_port = htons((uint16_t)port);
        dst_len = sizeof *d4;
    } else if (inet_pton(AF_INET6, host, &d6->sin6_addr) == 1) {
        d6->sin6_family = AF_INET6;
        d6->sin6_port = htons((uint16_t)port);
        dst_len = sizeof *d6;
    } else {
        PyErr_Format(PyExc_ValueError, "not an IPv4 or IPv6 address: %s", host);
        return NULL;
    }
    Py_buffer b[3]; /* headers, values, seqs */
    if (take_buffers(3, b, (PyObject *[]){hdr_o, val_o, seq_o}, (int[]){BUF_IN, BUF_IN, BUF_IN}) < 0) return NULL;
    const Py_buffer *hdr = &b[0], *val = &b[1], *seq = &b[2];
    Py_ssize_t k = seq->len / 8, elements = val->len / 4;
    Py_ssize_t chunks = chunk_count(elements, cf);
    Py_ssize_t seg = hb + 4 * cf;
    if (per_call > MAX_SEGS) per_call = MAX_SEGS;
    if (per_call * seg > UDP_MAX_PAYLOAD) per_call = UDP_MAX_PAYLOAD / seg;
    if (per_call < 1) per_call = 1;
    PyObject *result = NULL;
    if (hdr->len < k * hb || cf <= 0) {
        value_error("headers must hold header_bytes per index, chunk_floats > 0");
    } else {
        const send_batch sb = {(const uint8_t *)hdr->buf, (const uint8_t *)val->buf, (const int64_t *)seq->buf, k, hb,
                               chunks, elements, cf};
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
                int vlen = (int)next_datagrams(&sb, i, MAX_SEGS, 0, iov, &bad);
                if (bad || vlen == 0) break;
                for (int j = 0; j < vlen; j++) {
                    memset(&msgs[j], 0, sizeof msgs[j]);
                    msgs[j].msg_hdr.msg_name = &dst;
                    msgs[j].msg_hdr.msg_namelen = dst_len;
                    msgs[j].msg_hdr.msg_iov = &iov[2 * j];
                    msgs[j].msg_hdr.msg_iovlen = 2;
                }
                calls++;
                int r = sendmmsg(fd, msgs, (unsigned int)vlen, 0);
                if (r < 0) { /* the first message failed */
                    if (!lost_on_the_wire(errno, &err, &fatal)) break;
                    lost += 1;
                    i += 1;
                    continue;
                }
                sent += r;
                i += r;
            }
        }
        while (i < k && per_call > 1 && !bad && !err) {
            Py_ssize_t count = next_datagrams(&sb, i, per_call, 1, iov, &bad);
            if (bad) break;
            struct msghdr msg;
            memset(&msg, 0, sizeof msg);
            msg.msg_name = &dst;
            msg.msg_namelen = dst_len;
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
                if (!lost_on_the_wire(errno, &err, &fatal)) break;
                lost += count;
                i += count;
                continue;
            }
            sent += count;
            i += count;
        }
        Py_END_ALLOW_THREADS
        if (bad)
            value_error("a chunk index is outside the tensor");
        else if (fatal) {
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
        } else
            result = Py_BuildValue("nnni", sent, lost, calls, err);
    }
    give_back_buffers(3, b);
    return result;
}

/* The segment size of a coalesced run from its UDP_GRO control message (n when there is none). */
static int gro_segment(struct msghdr *msg, Py_ssize_t n) {
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
        if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO) {
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

ssize_t recv_gro(int fd, struct iovec *iov, size_t iovlen, struct sockaddr_storage *src, Py_ssize_t *seg) {
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

/* recv_rows(fd, rows, lengths, srcs, gro, max_calls)
 *
 * Takes queued datagrams into the rows of a (K, width) matrix without
 * blocking, one row per datagram: with `gro`, a coalesced run of
 * width-byte segments lands row by row with no copy (one recvmsg per run);
 * without, recvmmsg takes up to 256 datagrams per system call. lengths[i]
 * gets each datagram's length (width + 1 for one longer than width: it is
 * truncated in its row, and the receiver's exact-length rule counts it), srcs[i] its source as
 * (IPv4 address << 16) | port. Returns (k, calls). Stops when nothing is
 * queued, the matrix is full or max_calls calls were made. ECONNREFUSED
 * (ICMP about an earlier send) is skipped; other errors raise OSError. */
PyObject *fp_recv_rows(PyObject *self, PyObject *args) {
    int fd, gro;
    PyObject *rows_o, *len_o, *src_o;
    Py_ssize_t max_calls;
    if (!PyArg_ParseTuple(args, "iOOOin", &fd, &rows_o, &len_o, &src_o, &gro, &max_calls)) return NULL;
    Py_buffer b[3]; /* rows, lengths, srcs */
    if (take_buffers(3, b, (PyObject *[]){rows_o, len_o, src_o}, (int[]){BUF_OUT2D, BUF_OUT, BUF_OUT}) < 0) return NULL;
    const Py_buffer *rows = &b[0], *lens = &b[1], *srcs = &b[2];
    PyObject *result = NULL;
    Py_ssize_t K = rows_of(rows), width = cols_of(rows);
    if (!is_byte_matrix(rows) || width <= 0) {
        value_error("rows must be a 2-D uint8 array");
    } else if (lens->len < K * 8 || srcs->len < K * 8) {
        value_error("lengths and srcs need an int64 per row");
    } else {
        uint8_t *base = (uint8_t *)rows->buf;
        int64_t *ln = (int64_t *)lens->buf, *sk = (int64_t *)srcs->buf;
        Py_ssize_t k = 0, calls = 0;
        int err = 0;
        uint8_t *scratch = NULL;
        Py_BEGIN_ALLOW_THREADS
        if (gro) {
            while (calls < max_calls) {
                Py_ssize_t room = K - k, seg = 0;
                if (room <= 0 || room * width < UDP_MAX_PAYLOAD) break; /* a full coalesced run might not fit */
                struct sockaddr_storage src;
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
                        Py_ssize_t keep = piece > width ? width : piece;
                        memcpy(base + k * width, scratch + off, (size_t)keep);
                        ln[k] = piece > width ? width + 1 : piece; /* truncated: longer than any valid datagram */
                        sk[k++] = key;
                    }
                }
            }
        } else {
            struct mmsghdr msgs[MMSG_BATCH];
            struct iovec iovs[MMSG_BATCH];
            struct sockaddr_storage addrs[MMSG_BATCH];
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
                    /* a truncated datagram gets width + 1: R4's exact-length rule counts it */
                    ln[k + j] = (msgs[j].msg_hdr.msg_flags & MSG_TRUNC) ? width + 1 : (int64_t)msgs[j].msg_len;
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
    give_back_buffers(3, b);
    return result;
}
