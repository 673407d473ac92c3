/* mean_into(out, bufs, scale, threads[, sumsq]) -> sum of squares of out (float)
 *
 * sumsq (optional): a float64 array of len(bufs) that receives each buffer's
 * own sum of squares (in double), taken in the same pass from the block just
 * read (in cache): the per-worker norms of the aggregation guard
 * (dblp/reduce.py) at no extra pass over memory.
 *
 * out[i] = (bufs[0][i] + bufs[1][i] + ...) * scale, summed left to right in
 * float32 exactly as numpy's add-then-multiply does (bit-identical means),
 * and the squares of the result summed in double for the norm. Why C: the
 * server's reduce sits between its upstream and downstream passes, on every
 * round's critical path; numpy made four passes over memory (add, add, scale,
 * norm), this makes one, block by block in cache, and splits the tensor over
 * `threads` threads (the workers are idle while the server reduces).
 * dblp/reduce.py calls it and holds the numpy fallback. */
#include "common.h"

#include <math.h>
#include <pthread.h>

#include "buffers.h"

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
    double *src_sumsq; /* per source, or NULL */
} mean_job;

/* A block's sum of squares: 16 float32 lanes (vectorised; the block is in cache), added in double.
 * Finite float32 squares overflow past ~1.8e19 per element: such a block (or one with a NaN or inf,
 * whose sum stays non-finite) is summed again in double, so the guard's norm is finite exactly when
 * the values are, and named right (1e30 -> 1e30, not inf). */
static double block_sumsq(const float *a, Py_ssize_t n) {
    float acc[16] = {0};
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * a[i + l];
    double sum = 0.0;
    for (int l = 0; l < 16; l++) sum += (double)acc[l];
    for (; i < n; i++) sum += (double)a[i] * (double)a[i];
    if (isfinite(sum)) return sum;
    double d = 0.0;
    for (i = 0; i < n; i++) d += (double)a[i] * (double)a[i];
    return d;
}

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
        if (j->src_sumsq != NULL)
            for (int k = 0; k < j->nsrc; k++) j->src_sumsq[k] += block_sumsq(j->src[k] + b, n);
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

static int is_float32(const Py_buffer *b) { return b->format != NULL && strcmp(b->format, "f") == 0; }

PyObject *fp_mean_into(PyObject *self, PyObject *args) {
    PyObject *out_o, *bufs_o, *sumsq_o = Py_None;
    double scale;
    int threads;
    if (!PyArg_ParseTuple(args, "OOdi|O", &out_o, &bufs_o, &scale, &threads, &sumsq_o)) return NULL;
    PyObject *seq = PySequence_Fast(bufs_o, "bufs must be a sequence of float32 arrays");
    if (seq == NULL) return NULL;
    Py_ssize_t nsrc = PySequence_Fast_GET_SIZE(seq);
    Py_buffer out, src[MEAN_MAX_SRC], sq;
    int have_sq = 0;
    Py_ssize_t got = 0;
    PyObject *result = NULL;
    if (nsrc < 1 || nsrc > MEAN_MAX_SRC) {
        PyErr_Format(PyExc_ValueError, "need 1 to %d buffers, got %zd", MEAN_MAX_SRC, nsrc);
        Py_DECREF(seq);
        return NULL;
    }
    if (PyObject_GetBuffer(out_o, &out, BUF_OUT | PyBUF_FORMAT) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    const float *ptrs[MEAN_MAX_SRC];
    int ok = out.itemsize == 4 && is_float32(&out);
    if (!ok) value_error("out must be a C-contiguous float32 array");
    for (; ok && got < nsrc; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &src[got], BUF_IN | PyBUF_FORMAT) < 0) {
            ok = 0;
            break;
        }
        if (src[got].len != out.len || !is_float32(&src[got])) {
            PyErr_Format(PyExc_ValueError, "buffer %zd is not a C-contiguous float32 array of out's size", got);
            got++;
            ok = 0;
            break;
        }
        ptrs[got] = (const float *)src[got].buf;
    }
    if (ok && sumsq_o != Py_None) {
        if (PyObject_GetBuffer(sumsq_o, &sq, BUF_OUT | PyBUF_FORMAT) < 0) {
            ok = 0;
        } else {
            have_sq = 1;
            if (sq.itemsize != 8 || sq.format == NULL || strcmp(sq.format, "d") != 0 || sq.len != nsrc * 8) {
                PyErr_Format(PyExc_ValueError, "sumsq must be a C-contiguous float64 array of %zd elements", nsrc);
                ok = 0;
            }
        }
    }
    double part[MEAN_MAX_THREADS][MEAN_MAX_SRC];
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
            if (have_sq) memset(part[k], 0, sizeof(double) * (size_t)nsrc);
            jobs[k] = (mean_job){(float *)out.buf, ptrs, (int)nsrc, lo < n ? lo : n, hi < n ? hi : n, (float)scale, 0.0,
                                 have_sq ? part[k] : NULL};
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
        if (have_sq) {
            double *dst = (double *)sq.buf;
            for (Py_ssize_t i = 0; i < nsrc; i++) {
                double v = 0.0;
                for (int k = 0; k < t; k++) v += part[k][i];
                dst[i] = v;
            }
        }
        result = PyFloat_FromDouble(total);
    }
    if (have_sq) PyBuffer_Release(&sq);
    give_back_buffers((int)got, src);
    PyBuffer_Release(&out);
    Py_DECREF(seq);
    return result;
}
