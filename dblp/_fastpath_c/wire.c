/* The data datagram of dblp/wire.py, a batch per call: whole datagrams
 * (encode_rows), headers only for the zero-copy send (encode_headers), and
 * the receiver's write of accepted payloads into the tensor (scatter_rows).
 *
 * dblp/wire.py stays the reference and the fallback without this helper;
 * these give the same bytes (tests/test_fastpath.py). Each is one pass over
 * the payload with the GIL released, instead of numpy's gathers into
 * temporaries and its per-call set-up. */
#include "common.h"

#include "buffers.h"

/* The 24-byte header, CRC field left for the caller (zero in version 2). */
static void write_header(uint8_t *r, int version, uint32_t run_id, uint32_t sender, uint32_t plen, uint32_t round_no,
                         uint32_t seq) {
    put_be16(r, 0xDB1F);
    r[2] = (uint8_t)version;
    r[3] = 1; /* kind: data */
    put_be32(r + 8, run_id);
    put_be16(r + 12, sender);
    put_be16(r + 14, plen);
    put_be32(r + 16, round_no);
    put_be32(r + 20, seq);
    if (version == 2) memset(r + 4, 0, 4);
}

/* Version 1: the CRC-32C of bytes 8..24 and the payload into bytes 4..8; version 2 (m not NULL):
 * the AES-GMAC tag of the same bytes into bytes 24..40. */
static void seal(uint8_t *r, mac_ctx *m, const uint8_t *payload, size_t n) {
    if (m) {
        mac_tag(m, r, payload, n, r + HEADER_BYTES);
        return;
    }
    uint32_t c = crc_impl(0, r + CRC_START, HEADER_BYTES - CRC_START);
    put_be32(r + 4, crc_impl(c, payload, n));
}

/* The J0 blocks of datagrams i.. i + MAC_BATCH, from the header fields they will carry (written
 * here into their rows ahead of the loop; the loop writes the same bytes again). */
static void prepare_batch(mac_ctx *m, uint8_t *base, Py_ssize_t stride, Py_ssize_t i, Py_ssize_t k,
                          const int64_t *sq, Py_ssize_t chunks, unsigned int sender, unsigned long round_no) {
    Py_ssize_t n = k - i < MAC_BATCH ? k - i : MAC_BATCH;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t s = sq[i + j];
        if (s < 0 || s >= chunks) {
            n = j;
            break;
        }
        uint8_t *r = base + (i + j) * stride;
        put_be16(r + 12, sender);
        put_be32(r + 16, (uint32_t)round_no);
        put_be32(r + 20, (uint32_t)s);
    }
    mac_prepare(m, base + i * stride, stride, n);
}

/* What is wrong with the output buffer of k datagrams, or NULL: encode_rows' (k, header + 4 * cf)
 * matrix of whole datagrams, or encode_headers' k headers of hb bytes. */
static const char *output_problem(const Py_buffer *out, int whole, Py_ssize_t k, Py_ssize_t cf, Py_ssize_t hb) {
    if (whole) {
        if (!is_byte_matrix(out) || out->shape[0] != k) return "rows must be a (len(seqs), width) uint8 array";
        if (cf <= 0 || cols_of(out) != hb + 4 * cf)
            return "rows width must be the header (24, or 40 with a key) + 4 * chunk_floats";
        return NULL;
    }
    if (out->len != k * hb) return "headers must hold 24 bytes per index (40 with a key)";
    if (cf <= 0) return "chunk_floats must be positive";
    return NULL;
}

/* encode_rows and encode_headers: the same arguments and the same datagrams, `whole` (encode_rows)
 * with each payload copied after its header and sealed there, else only the headers, sealed over
 * the payload where it lies in the tensor. The two entry points pass `whole` as a constant, so the
 * compiler can make a loop of each. */
static inline PyObject *encode(PyObject *args, int whole) {
    PyObject *val_o, *seq_o, *out_o;
    unsigned long run_id, round_no;
    unsigned int sender;
    Py_ssize_t cf;
    Py_buffer key;
    if (!PyArg_ParseTuple(args, "OOOkIkny*", &val_o, &seq_o, &out_o, &run_id, &sender, &round_no, &cf, &key))
        return NULL;
    mac_ctx mc, *m;
    if (mac_take_key(&key, &mc, &m) < 0) return NULL;
    Py_ssize_t hb = m ? AUTH_HEADER_BYTES : HEADER_BYTES;
    int version = m ? 2 : 1;
    Py_buffer b[3]; /* values, seqs, rows or headers */
    int out_flags = whole ? BUF_OUT2D : BUF_OUT;
    if (take_buffers(3, b, (PyObject *[]){val_o, seq_o, out_o}, (int[]){BUF_IN, BUF_IN, out_flags}) < 0) {
        if (m) mac_close(m);
        return NULL;
    }
    const Py_buffer *val = &b[0], *seq = &b[1], *out = &b[2];
    Py_ssize_t k = seq->len / 8, elements = val->len / 4;
    Py_ssize_t chunks = chunk_count(elements, cf);
    Py_ssize_t stride = whole ? cols_of(out) : hb;
    const char *problem = output_problem(out, whole, k, cf, hb);
    PyObject *result;
    if (problem) {
        result = value_error(problem);
    } else {
        const float *v = (const float *)val->buf;
        const int64_t *sq = (const int64_t *)seq->buf;
        uint8_t *base = (uint8_t *)out->buf;
        int bad = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < k; i++) {
            int64_t s = sq[i];
            if (s < 0 || s >= chunks) {
                bad = 1;
                break;
            }
            Py_ssize_t n = chunk_floats(s, chunks, elements, cf);
            uint8_t *r = base + i * stride;
            write_header(r, version, (uint32_t)run_id, sender, (uint32_t)(4 * n), (uint32_t)round_no, (uint32_t)s);
            if (m && i % MAC_BATCH == 0) prepare_batch(m, base, stride, i, k, sq, chunks, sender, round_no);
            if (whole) {
                memcpy(r + hb, v + s * cf, (size_t)(4 * n));
                if (n < cf) memset(r + hb + 4 * n, 0, (size_t)(4 * (cf - n)));
                seal(r, m, r + hb, (size_t)(4 * n));
            } else {
                seal(r, m, (const uint8_t *)(v + s * cf), (size_t)(4 * n));
            }
        }
        Py_END_ALLOW_THREADS
        result = none_unless_bad(bad, "a chunk index is outside the tensor");
    }
    if (m) mac_close(m);
    give_back_buffers(3, b);
    return result;
}

/* encode_rows(values, seqs, rows, run_id, sender, round, chunk_floats, key)
 *
 * The same bytes as dblp.wire.encode_chunks: for each i, header + chunk
 * seqs[i] of the float32 tensor `values` into rows[i], zero padding after a
 * short last chunk, and the CRC-32C of bytes 8..end (key empty) or the
 * version-2 header with its tag (16-byte key). One pass over the payload
 * instead of numpy's gather into a temporary and a strided copy. */
PyObject *fp_encode_rows(PyObject *self, PyObject *args) { return encode(args, 1); }

/* encode_headers(values, seqs, headers, run_id, sender, round, chunk_floats, key)
 *
 * Only the (k, 24) headers of the datagrams of chunks seqs, CRC included
 * (it covers header bytes 8..24 and the payload, read in place from
 * `values`) - or (k, 40) version-2 headers with their tags when the key is
 * 16 bytes. With send_chunks the payload then goes from the tensor to the
 * kernel with no copy in between. */
PyObject *fp_encode_headers(PyObject *self, PyObject *args) { return encode(args, 0); }

/* scatter_rows(rows, seqs, out, nbytes, chunk_bytes, offset)
 *
 * Payload bytes offset..offset+nbytes of rows[i] (offset: the header, 24 or 40) to byte seqs[i] * chunk_bytes of
 * `out`: the receiver's write of accepted chunks (numpy's fancy assignment
 * from a strided view, without its per-call set-up). */
PyObject *fp_scatter_rows(PyObject *self, PyObject *args) {
    PyObject *rows_o, *seq_o, *out_o;
    Py_ssize_t nbytes, chunk_bytes, offset;
    if (!PyArg_ParseTuple(args, "OOOnnn", &rows_o, &seq_o, &out_o, &nbytes, &chunk_bytes, &offset)) return NULL;
    Py_buffer b[3]; /* rows, seqs, out */
    if (take_buffers(3, b, (PyObject *[]){rows_o, seq_o, out_o}, (int[]){BUF_IN2D, BUF_IN, BUF_OUT}) < 0) return NULL;
    const Py_buffer *rows = &b[0], *seq = &b[1], *out = &b[2];
    Py_ssize_t k = seq->len / 8;
    Py_ssize_t width = cols_of(rows);
    PyObject *result;
    if (!is_byte_matrix(rows) || rows->shape[0] < k) {
        result = value_error("rows must be a 2-D uint8 array with a row per index");
    } else if (nbytes < 0 || offset < 0 || offset + nbytes > width || chunk_bytes <= 0) {
        result = value_error("payload size does not fit the rows");
    } else {
        const uint8_t *base = (const uint8_t *)rows->buf;
        const int64_t *sq = (const int64_t *)seq->buf;
        uint8_t *dst = (uint8_t *)out->buf;
        Py_ssize_t out_len = out->len;
        int bad = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < k; i++) {
            int64_t s = sq[i];
            if (s < 0 || s * chunk_bytes + nbytes > out_len) {
                bad = 1;
                break;
            }
            memcpy(dst + s * chunk_bytes, base + i * width + offset, (size_t)nbytes);
        }
        Py_END_ALLOW_THREADS
        result = none_unless_bad(bad, "a chunk index is outside the output");
    }
    give_back_buffers(3, b);
    return result;
}
