/* The authenticated datagram (wire version 2): an AES-128-GMAC tag per
 * datagram, computed and checked with OpenSSL's GCM (a maintained library;
 * its GHASH uses the CPU's carry-less multiply).
 *
 * Why GMAC: it is the cheapest keyed MAC a maintained library offers for
 * datagrams of this size. Two implementations, the same tag bytes: Intel's
 * ipsec-mb (the multi-buffer crypto library DPDK uses; its GCM runs on
 * VAES/VPCLMULQDQ with AVX-512 where the CPU has them, AVX2/SSE otherwise),
 * ~65 ns per 1,448-byte tag in cache on this project's VM, and OpenSSL's
 * CRYPTO_gcm128 (GHASH with PCLMULQDQ; OpenSSL 3.0 has no wider path),
 * ~275 ns - the fallback where ipsec-mb is not installed or the CPU lacks
 * AES-NI. HMAC-SHA256 costs 2.4 us, SipHash 1.2 us, Poly1305 via EVP
 * 1.4 us (tools measured side by side; the round-level cost is printed by
 * scenarios/bench_auth.py and the benchmark's gso-crc path).
 *
 * The tag (bytes 24..40 of the v2 header) authenticates header bytes 8..24
 * (run id, sender, length, round, seq) and the payload. Its nonce is the
 * header's sender, round and seq, so it is unique per datagram content
 * within a run: a sender puts one content under one (round, seq) - a
 * retransmission repeats the same bytes, hence the same tag - and the key
 * is per run (derived from the run's secret and its run id, dblp/auth.py).
 *
 * mac_rows(rows, lengths, out, key): out[i] (uint32) = 1 when rows[i,
 * :lengths[i]] carries a valid tag, else 0. */
#include "common.h"

#include "buffers.h"

#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/aes.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/modes.h>

#ifdef DBLP_IPSEC_MB
#include <intel-ipsec-mb.h>
_Static_assert(sizeof(struct gcm_key_data) <= sizeof(((mac_ctx *)0)->imb), "mac_ctx.imb holds ipsec-mb's key data");
/* One manager for the process: the direct GCM API reads only its function table, so threads share it. */
static IMB_MGR *imb_mgr;
#endif

_Static_assert(sizeof(AES_KEY) <= sizeof(((mac_ctx *)0)->aes), "mac_ctx.aes holds an AES_KEY");

const char *mac_name = "openssl";

void mac_init(void) {
#ifdef DBLP_IPSEC_MB
    IMB_MGR *mgr = alloc_mb_mgr(0);
    if (mgr) init_mb_mgr_auto(mgr, NULL);
    if (mgr && imb_get_errno(mgr) == 0) {
        imb_mgr = mgr;
        const char *want = getenv("DBLP_GMAC"); /* "openssl": the fallback, for a side-by-side measurement */
        mac_name = want && strcmp(want, "openssl") == 0 ? "openssl" : "ipsec-mb";
    } else if (mgr) {
        free_mb_mgr(mgr); /* no AES-NI, or an older library: OpenSSL's GCM */
    }
#endif
}

/* use_mac(name): switch the GMAC implementation ("ipsec-mb", "openssl"), for tests that compare
 * them and for the benchmark; returns the previous name. */
PyObject *fp_use_mac(PyObject *self, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    const char *prev = mac_name;
    if (strcmp(name, "openssl") == 0) {
        mac_name = "openssl";
#ifdef DBLP_IPSEC_MB
    } else if (strcmp(name, "ipsec-mb") == 0 && imb_mgr) {
        mac_name = "ipsec-mb";
#endif
    } else {
        PyErr_Format(PyExc_ValueError, "unknown or unavailable GMAC implementation %s", name);
        return NULL;
    }
    return PyUnicode_FromString(prev);
}

/* GCM's block function. GCM encrypts one block per tag, E_K(J0) (J0: the nonce and a counter of
 * 1); mac_prepare encrypts a batch of them with AES-NI through EVP (one call, pipelined) and the
 * block function hands them out in order - about a third of a tag's cost saved against OpenSSL's
 * table AES_encrypt per datagram. Any other block (GCM's H at start-up) goes to AES_encrypt. */
static void mac_block(const unsigned char in[16], unsigned char out[16], const void *key) {
    mac_ctx *m = (mac_ctx *)key;
    for (Py_ssize_t i = m->ek_next; i < m->ek_count; i++) { /* in order; datagrams not tagged are skipped */
        if (memcmp(in, m->j0 + 16 * i, 16) == 0) {
            memcpy(out, m->ek + 16 * i, 16);
            m->ek_next = i + 1;
            return;
        }
    }
    AES_encrypt(in, out, (const AES_KEY *)m->aes);
}

int mac_open(mac_ctx *m, const uint8_t *key, Py_ssize_t key_len) {
    m->gcm = NULL;
    m->ecb = NULL;
    m->ek_count = m->ek_next = 0;
    m->use_imb = 0;
    if (key_len != TAG_BYTES) return -1;
#ifdef DBLP_IPSEC_MB
    if (imb_mgr && strcmp(mac_name, "ipsec-mb") == 0) {
        IMB_AES128_GCM_PRE(imb_mgr, key, (struct gcm_key_data *)m->imb);
        m->use_imb = 1;
        return 0;
    }
#endif
    if (AES_set_encrypt_key(key, 128, (AES_KEY *)m->aes) != 0) return -1;
    EVP_CIPHER_CTX *e = EVP_CIPHER_CTX_new();
    if (!e || EVP_EncryptInit_ex(e, EVP_aes_128_ecb(), NULL, key, NULL) != 1) {
        EVP_CIPHER_CTX_free(e);
        return -1;
    }
    EVP_CIPHER_CTX_set_padding(e, 0);
    m->ecb = e;
    m->gcm = CRYPTO_gcm128_new(m, mac_block);
    return m->gcm ? 0 : -1;
}

int mac_take_key(Py_buffer *key, mac_ctx *mc, mac_ctx **mp) {
    int bad = key->len != 0 && mac_open(mc, (const uint8_t *)key->buf, key->len) < 0;
    *mp = key->len != 0 && !bad ? mc : NULL;
    PyBuffer_Release(key);
    if (bad) {
        value_error("key must be empty (wire version 1) or 16 bytes (version 2)");
        return -1;
    }
    return 0;
}

void mac_close(mac_ctx *m) {
    if (m->gcm) CRYPTO_gcm128_release((GCM128_CONTEXT *)m->gcm);
    if (m->ecb) EVP_CIPHER_CTX_free((EVP_CIPHER_CTX *)m->ecb);
    m->gcm = m->ecb = NULL;
    if (m->use_imb) OPENSSL_cleanse(m->imb, sizeof m->imb);
    m->use_imb = 0;
    OPENSSL_cleanse(m->aes, sizeof m->aes);
    OPENSSL_cleanse(m->ek, sizeof m->ek);
}

static void nonce_of(const uint8_t *hdr, uint8_t *iv) {
    memset(iv, 0, 12);
    memcpy(iv, hdr + 12, 2);     /* sender */
    memcpy(iv + 2, hdr + 16, 8); /* round, seq */
}

void mac_prepare(mac_ctx *m, const uint8_t *hdr0, Py_ssize_t stride, Py_ssize_t n) {
    m->ek_count = m->ek_next = 0;
    if (m->use_imb) return; /* ipsec-mb encrypts J0 inside its GMAC */
    if (n > MAC_BATCH) n = MAC_BATCH;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t *j = m->j0 + 16 * i;
        nonce_of(hdr0 + i * stride, j);
        j[12] = j[13] = j[14] = 0;
        j[15] = 1;
    }
    int outl = 0;
    if (n > 0 && EVP_EncryptUpdate((EVP_CIPHER_CTX *)m->ecb, m->ek, &outl, m->j0, (int)(16 * n)) == 1 && outl == 16 * n)
        m->ek_count = n;
}

void mac_tag(mac_ctx *m, const uint8_t *hdr, const uint8_t *payload, size_t n, uint8_t *tag) {
    uint8_t iv[12];
    nonce_of(hdr, iv);
#ifdef DBLP_IPSEC_MB
    if (m->use_imb) {
        const struct gcm_key_data *kd = (const struct gcm_key_data *)m->imb;
        struct gcm_context_data ctx;
        IMB_AES128_GMAC_INIT(imb_mgr, kd, &ctx, iv, sizeof iv);
        IMB_AES128_GMAC_UPDATE(imb_mgr, kd, &ctx, hdr + CRC_START, HEADER_BYTES - CRC_START);
        if (n) IMB_AES128_GMAC_UPDATE(imb_mgr, kd, &ctx, payload, n);
        IMB_AES128_GMAC_FINALIZE(imb_mgr, kd, &ctx, tag, TAG_BYTES);
        return;
    }
#endif
    GCM128_CONTEXT *g = (GCM128_CONTEXT *)m->gcm;
    CRYPTO_gcm128_setiv(g, iv, sizeof iv);
    CRYPTO_gcm128_aad(g, hdr + CRC_START, HEADER_BYTES - CRC_START);
    if (n) CRYPTO_gcm128_aad(g, payload, n);
    CRYPTO_gcm128_tag(g, tag, TAG_BYTES);
}

int mac_check(mac_ctx *m, const uint8_t *hdr, const uint8_t *payload, size_t n) {
    uint8_t tag[TAG_BYTES];
    mac_tag(m, hdr, payload, n, tag);
    return CRYPTO_memcmp(tag, hdr + HEADER_BYTES, TAG_BYTES) == 0;
}

PyObject *fp_mac_rows(PyObject *self, PyObject *args) {
    PyObject *rows_o, *len_o, *out_o;
    Py_buffer key;
    if (!PyArg_ParseTuple(args, "OOOy*", &rows_o, &len_o, &out_o, &key)) return NULL;
    Py_buffer b[3]; /* rows, out, lengths */
    if (take_buffers(3, b, (PyObject *[]){rows_o, out_o, len_o}, (int[]){BUF_IN2D, BUF_OUT, BUF_IN | BUF_OPTIONAL}) < 0) {
        PyBuffer_Release(&key);
        return NULL;
    }
    Py_ssize_t k = rows_of(&b[0]), w = cols_of(&b[0]);
    PyObject *result = NULL;
    mac_ctx m;
    if (!is_byte_matrix(&b[0]) || b[1].len < k * 4 || (b[2].buf && b[2].len < k * 8)) {
        value_error("rows (k, width) uint8, out k uint32, lengths k int64 or None expected");
    } else if (mac_open(&m, (const uint8_t *)key.buf, key.len) < 0) {
        value_error("key must be 16 bytes");
    } else {
        const uint8_t *base = (const uint8_t *)b[0].buf;
        const int64_t *ln = (const int64_t *)b[2].buf;
        uint32_t *out = (uint32_t *)b[1].buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < k; i++) {
            if (i % MAC_BATCH == 0) mac_prepare(&m, base + i * w, w, k - i);
            Py_ssize_t n = ln ? (Py_ssize_t)ln[i] : w;
            const uint8_t *r = base + i * w;
            out[i] = (n >= AUTH_HEADER_BYTES && n <= w) ? (uint32_t)mac_check(&m, r, r + AUTH_HEADER_BYTES,
                                                                              (size_t)(n - AUTH_HEADER_BYTES))
                                                        : 0;
        }
        Py_END_ALLOW_THREADS
        mac_close(&m);
        result = Py_None;
        Py_INCREF(result);
    }
    give_back_buffers(3, b);
    PyBuffer_Release(&key);
    return result;
}
