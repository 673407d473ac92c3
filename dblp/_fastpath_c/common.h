/* What the files of the C helper share. They build ONE extension module,
 * dblp._fastpath (setup.py lists them; dblp/_fastpath.pyi is its typed
 * surface):
 *
 *   crc32c.c   CRC-32C (SSE 4.2 in three streams, slicing-by-8, bytewise), crc_rows, use
 *   wire.c     the data datagram of dblp/wire.py: encode_rows, encode_headers, scatter_rows
 *   sockets.c  batches to and from a UDP socket: send_chunks (GSO), recv_rows (GRO / recvmmsg)
 *   place.c    receiving payloads straight into the tensor: recv_place, crc_placed
 *   mac.c      the authenticated datagram (version 2): AES-GMAC tags, mac_rows
 *   reduce.c   the server's fused, threaded mean and norm: mean_into
 *   fluid.c    the simulator's switch port: its queue profile, a pass's waits and drops and its arrivals,
 *              fluid_profile, fluid_outcome, fluid_arrivals; pcg64_seed (a pass's stream of draws)
 *   module.c   the method table and the module's start-up
 *   buffers.h  taking and giving back the Python buffers an entry point works on
 *
 * Every .c file includes this header first (_GNU_SOURCE must precede the
 * system headers). Names shared between files are hidden from the dynamic
 * symbol table, so the calls between files cost what they cost when all of
 * this was one file of static functions; only PyInit__fastpath is exported. */
#ifndef DBLP_FASTPATH_COMMON_H
#define DBLP_FASTPATH_COMMON_H

#define _GNU_SOURCE /* recvmmsg, sendmmsg */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility push(hidden)
#endif

/* The data datagram of dblp/wire.py (the reference): a 24-byte header - magic
 * 0xDB1F, version, kind, the CRC-32C at byte 4 covering byte 8 to the end -
 * then the chunk's float32 payload. */
#define HEADER_BYTES 24
#define CRC_START 8
/* Wire version 2 (authenticated, dblp/auth.py): the same 24 bytes with version 2 and the CRC field
 * zero, then a 16-byte AES-GMAC tag (mac.c); the payload follows at byte 40. An entry point that
 * takes a key works on version 2 when the key is 16 bytes, on version 1 when it is empty. */
#define TAG_BYTES 16
#define AUTH_HEADER_BYTES (HEADER_BYTES + TAG_BYTES)
#define UDP_MAX_PAYLOAD 65507

static inline void put_be16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static inline void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static inline uint32_t get_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Chunks of a tensor of `elements` floats cut into chunks of `cf` (0 when cf <= 0), and the floats
 * in chunk s: cf, except the last, which holds the rest. */
static inline Py_ssize_t chunk_count(Py_ssize_t elements, Py_ssize_t cf) {
    return cf > 0 ? (elements + cf - 1) / cf : 0;
}
static inline Py_ssize_t chunk_floats(int64_t s, Py_ssize_t chunks, Py_ssize_t elements, Py_ssize_t cf) {
    return (s == chunks - 1) ? elements - s * cf : cf;
}

/* CRC-32C (crc32c.c). crc_impl continues a CRC - crc_impl(crc_impl(0, a), b) == crc_impl(0, a || b) -
 * and is the fastest implementation this CPU has unless a test switched it with use(). */
typedef uint32_t (*crc_fn)(uint32_t, const uint8_t *, size_t);
extern crc_fn crc_impl;
extern const char *crc_name;
void crc_init(void); /* tables, then the best implementation; crc_name becomes the module's BEST */

/* AES-GMAC of one datagram (mac.c): mac_open takes a 16-byte key (-1 otherwise), mac_tag writes the
 * tag of header bytes 8..24 + payload (nonce: the header's sender, round, seq), mac_check compares
 * it in constant time with the tag at hdr + 24. One mac_ctx per thread; mac_close wipes the key. */
#define MAC_BATCH 64
typedef struct {
    /* Intel's ipsec-mb key data (GCM's expanded key and powers of H), when that backend is in use */
    unsigned char imb[1024] __attribute__((aligned(64)));
    int use_imb;
    unsigned char aes[512] __attribute__((aligned(16))); /* an AES_KEY, opaque here (mac.c asserts the size) */
    void *gcm, *ecb;
    uint8_t j0[16 * MAC_BATCH], ek[16 * MAC_BATCH]; /* a batch of GCM's J0 blocks and their encryptions */
    Py_ssize_t ek_count, ek_next;
} mac_ctx;
int mac_open(mac_ctx *m, const uint8_t *key, Py_ssize_t key_len);
/* An entry point's key argument, released here: *mp = NULL for an empty key (wire version 1), else mc
 * opened (version 2); -1 with ValueError for any other length. */
int mac_take_key(Py_buffer *key, mac_ctx *mc, mac_ctx **mp);
void mac_close(mac_ctx *m);
/* The GMAC implementation: Intel's ipsec-mb (multi-buffer crypto, AVX-512/VAES where the CPU has
 * it) when built with it and the CPU runs it, else OpenSSL's GCM; mac_name says which. */
void mac_init(void);
extern const char *mac_name;
PyObject *fp_use_mac(PyObject *self, PyObject *args);
/* Encrypt the J0 blocks of the next n (<= MAC_BATCH) headers at hdr0 + i * stride in one AES-NI call;
 * tags taken in that order then skip one table-AES block each (any other order still works). */
void mac_prepare(mac_ctx *m, const uint8_t *hdr0, Py_ssize_t stride, Py_ssize_t n);
void mac_tag(mac_ctx *m, const uint8_t *hdr, const uint8_t *payload, size_t n, uint8_t *tag);
int mac_check(mac_ctx *m, const uint8_t *hdr, const uint8_t *payload, size_t n);

/* The entry points (METH_VARARGS), one home each; module.c lists them. */
PyObject *fp_crc_rows(PyObject *self, PyObject *args);
PyObject *fp_use(PyObject *self, PyObject *args);
PyObject *fp_encode_rows(PyObject *self, PyObject *args);
PyObject *fp_encode_headers(PyObject *self, PyObject *args);
PyObject *fp_scatter_rows(PyObject *self, PyObject *args);
PyObject *fp_send_chunks(PyObject *self, PyObject *args);
PyObject *fp_recv_rows(PyObject *self, PyObject *args);
PyObject *fp_recv_place(PyObject *self, PyObject *args);
PyObject *fp_crc_placed(PyObject *self, PyObject *args);
PyObject *fp_mean_into(PyObject *self, PyObject *args);
PyObject *fp_mac_rows(PyObject *self, PyObject *args);
PyObject *fp_fluid_outcome(PyObject *self, PyObject *args);
PyObject *fp_fluid_profile(PyObject *self, PyObject *args);
PyObject *fp_fluid_arrivals(PyObject *self, PyObject *args);
PyObject *fp_pcg64_seed(PyObject *self, PyObject *args);

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility pop
#endif

#endif
