/* fluid_outcome(bt, ba, bq, cap, qcap, ser, arr, u, wait, ovf) -> flags
 *
 * The verdicts of dblp/sim/net.py's FluidQueue.outcome (the reference, which
 * holds the numpy version and calls this one where it is built) for slots
 * reaching a switch port at times arr (non-decreasing, or nearly so): with
 * i the last breakpoint bt[i] <= arr[j] (0 if none), the queue the slot meets
 *     q = min(max((ba[i] - cap) * (arr[j] - bt[i]) + bq[i], 0), qcap),
 * its wait q * ser, and where the queue is full (q >= qcap) the slot is
 * dropped when its uniform draw u[j] < 1 - cap / ba[i] (drop-tail's share
 * of the excess; never where ba[i] <= 0). The same operations in the same
 * order as numpy's elementwise ones, so the same doubles (setup.py builds
 * with -ffp-contract=off: no fused multiply-add).
 *
 * Why C: the round level evaluates every pass at a congested port a few
 * times (a 64-worker incast: ~10,000 evaluations of a few hundred slots in
 * its first iteration); numpy took ~15 calls per evaluation, each paying its
 * dispatch, where one merge of the slots against the breakpoints does it.
 *
 * Writes wait[0..n) and ovf[0..n) (bytes 0/1); returns bit 1 when some wait
 * is not zero, bit 2 when some slot is dropped. */
#include "common.h"

#include "buffers.h"

/* Breakpoints bt[0..m) (sorted) below x - searchsorted(bt, x, "left") - or at most x (side "right"). */
static Py_ssize_t bisect(const double *bt, Py_ssize_t m, double x, int right) {
    Py_ssize_t lo = 0, hi = m;
    while (lo < hi) {
        const Py_ssize_t mid = (lo + hi) / 2;
        if (bt[mid] < x || (right && bt[mid] == x))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}
static Py_ssize_t count_below(const double *bt, Py_ssize_t m, double x) { return bisect(bt, m, x, 0); }
static Py_ssize_t count_at_most(const double *bt, Py_ssize_t m, double x) { return bisect(bt, m, x, 1); }

PyObject *fp_fluid_outcome(PyObject *self, PyObject *args) {
    PyObject *o[8];
    double cap, qcap, ser;
    if (!PyArg_ParseTuple(args, "OOOdddOOOO", &o[0], &o[1], &o[2], &cap, &qcap, &ser, &o[3], &o[4], &o[5], &o[6]))
        return NULL;
    static const int flags[7] = {BUF_IN, BUF_IN, BUF_IN, BUF_IN, BUF_IN, BUF_OUT, BUF_OUT};
    Py_buffer v[7];
    if (take_buffers(7, v, o, flags) < 0) return NULL;
    Py_ssize_t nb = v[0].len / 8, n = v[3].len / 8;
    int ok = nb >= 1 && v[6].len == n && v[6].itemsize == 1;
    for (int k = 0; k < 6; k++) ok = ok && v[k].itemsize == 8 && v[k].len == v[k < 3 ? 0 : 3].len;
    if (!ok) {
        give_back_buffers(7, v);
        return value_error("fluid_outcome: bt, ba, bq: float64 of one length >= 1; arr, u, wait: float64 of one "
                           "length; ovf: bool of that length");
    }
    const double *bt = v[0].buf, *ba = v[1].buf, *bq = v[2].buf, *arr = v[3].buf, *u = v[4].buf;
    double *wait = v[5].buf;
    unsigned char *ovf = v[6].buf;
    int any_wait = 0, any_ovf = 0;
    /* number of breakpoints <= the current slot's time, kept as the slots advance; found by bisection for
     * the first slot (the profile keeps its past: hundreds of breakpoints may lie before the pass) */
    Py_ssize_t k = n > 0 ? count_at_most(bt, nb, arr[0]) : 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        const double x = arr[j];
        while (k < nb && bt[k] <= x) k++;
        while (k > 0 && bt[k - 1] > x) k--; /* a slot a hair earlier than the one before it */
        const Py_ssize_t i = k > 0 ? k - 1 : 0;
        const double a = ba[i];
        double q = a - cap;
        const double dt = x - bt[i];
        q = q * dt;
        q = q + bq[i];
        if (q < 0.0) q = 0.0;
        if (q > qcap) q = qcap;
        unsigned char drop = 0;
        if (q >= qcap && a > 0.0) {
            const double share = 1.0 - cap / a;
            drop = u[j] < share;
        }
        ovf[j] = drop;
        any_ovf |= drop;
        wait[j] = q * ser;
        any_wait |= q != 0.0;
    }
    give_back_buffers(7, v);
    return PyLong_FromLong(any_wait | (any_ovf << 1));
}

/* fluid_profile(ent, t0, q_ref, cap, qcap, bt, ba, bq) -> (m, congested)
 *
 * FluidQueue._rebuild's profile of a congested port from time t0 on (the
 * numpy reference beside it): the passes ent = (lo, hi, rate) * E offer their
 * rates on [lo, hi); the breakpoints bt[0..m) are t0 and every lo, hi after it
 * (sorted, each once), ba the rate offered from each breakpoint on (a
 * difference array summed up), bq the queue at each breakpoint (q_ref at t0,
 * then each segment's excess, held between 0 and qcap: _clamped_walk, the same
 * two formulations for short and long walks so the same doubles). bt, ba, bq
 * need room for 2E + 1. Why C: a congested port rebuilds this at every pass that
 * starts or ends (~3,300 times in a 64-worker incast's first iteration), and
 * numpy took ~20 calls each. */
/* Ascending sort of doubles (no NaN) with the comparison inline: qsort's call per comparison
 * was most of this function at 1024 passes (~2,000 breakpoints sorted at each change of a
 * congested port). Introsort: median-of-three quicksort, heapsort past 2 log2 n levels,
 * insertion sort below 16. Any correct sort gives these doubles in the same order. */
static void sort_insertion(double *a, Py_ssize_t n) {
    for (Py_ssize_t i = 1; i < n; i++) {
        const double x = a[i];
        Py_ssize_t j = i;
        for (; j > 0 && a[j - 1] > x; j--) a[j] = a[j - 1];
        a[j] = x;
    }
}

static void sort_sift(double *a, Py_ssize_t i, Py_ssize_t n) {
    const double x = a[i];
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && a[c + 1] > a[c]) c++;
        if (!(a[c] > x)) break;
        a[i] = a[c];
        i = c;
    }
    a[i] = x;
}

static void sort_heap(double *a, Py_ssize_t n) {
    for (Py_ssize_t i = n / 2; i-- > 0;) sort_sift(a, i, n);
    for (Py_ssize_t e = n - 1; e > 0; e--) {
        const double t = a[0];
        a[0] = a[e];
        a[e] = t;
        sort_sift(a, 0, e);
    }
}

static void sort_intro(double *a, Py_ssize_t n, int depth) {
    while (n > 16) {
        if (depth-- <= 0) {
            sort_heap(a, n);
            return;
        }
        /* median of three to a[0] (the pivot), a[n / 2] <= pivot <= a[n - 1] */
        double *m = a + n / 2, *z = a + n - 1, t;
        if (*m > *z) { t = *m; *m = *z; *z = t; }
        if (a[0] > *z) { t = a[0]; a[0] = *z; *z = t; }
        if (*m > a[0]) { t = *m; *m = a[0]; a[0] = t; }
        const double p = a[0];
        Py_ssize_t i = 0, j = n;
        for (;;) { /* Hoare: a[1..i] <= p <= a[j..n-1]; the sentinels a[n / 2] and a[n - 1] stop the scans */
            do i++; while (a[i] < p);
            do j--; while (a[j] > p);
            if (i >= j) break;
            t = a[i]; a[i] = a[j]; a[j] = t;
        }
        a[0] = a[j];
        a[j] = p;
        /* a[0..j) <= p = a[j] <= a(j..n): the smaller side by recursion, the larger in the loop */
        if (j < n - j - 1) {
            sort_intro(a, j, depth);
            a += j + 1;
            n -= j + 1;
        } else {
            sort_intro(a + j + 1, n - j - 1, depth);
            n = j;
        }
    }
    sort_insertion(a, n);
}

static void sort_doubles(double *a, Py_ssize_t n) {
    int depth = 0;
    for (Py_ssize_t k = n; k > 1; k >>= 1) depth += 2;
    sort_intro(a, n, depth);
}


#define WALK_SHORT 256 /* dblp/sim/net.py _WALK_SHORT: _clamped_walk steps one at a time up to here, sums above */

static void clamped_walk(double q0, const double *inc, Py_ssize_t n, double qcap, double *out) {
    if (n <= WALK_SHORT) {
        double q = q0;
        out[0] = q;
        for (Py_ssize_t k = 0; k < n; k++) {
            q += inc[k];
            if (q < 0.0)
                q = 0.0;
            else if (q > qcap)
                q = qcap;
            out[k + 1] = q;
        }
        return;
    }
    Py_ssize_t i = 0;
    double q = q0;
    for (;;) { /* walk from out[i] = q: s = q + cumsum, less its running minimum below 0 */
        double c = 0.0, run_min = q;
        Py_ssize_t j = -1;
        for (Py_ssize_t k = 0; i + k <= n; k++) {
            double s;
            if (k == 0) {
                s = q;
            } else {
                c = k == 1 ? inc[i] : c + inc[i + k - 1];
                s = c + q;
            }
            if (s < run_min) run_min = s;
            const double walk = s - (run_min <= 0.0 ? run_min : 0.0);
            if (walk > qcap) {
                j = k;
                break;
            }
            out[i + k] = walk;
        }
        if (j < 0) return;
        i += j;
        q = qcap;
        out[i] = qcap;
        if (i == n) return;
    }
}

PyObject *fp_fluid_profile(PyObject *self, PyObject *args) {
    PyObject *o[4];
    double t0, q_ref, cap, qcap;
    if (!PyArg_ParseTuple(args, "OddddOOO", &o[0], &t0, &q_ref, &cap, &qcap, &o[1], &o[2], &o[3])) return NULL;
    static const int flags[4] = {BUF_IN, BUF_OUT, BUF_OUT, BUF_OUT};
    Py_buffer v[4];
    if (take_buffers(4, v, o, flags) < 0) return NULL;
    const Py_ssize_t e = v[0].len / 24, room = 2 * e + 1;
    if (v[0].itemsize != 8 || v[0].len % 24 || v[1].itemsize != 8 || v[1].len / 8 < room || v[2].itemsize != 8 ||
        v[2].len != v[1].len || v[3].itemsize != 8 || v[3].len != v[1].len) {
        give_back_buffers(4, v);
        return value_error("fluid_profile: ent: float64 (lo, hi, rate) triples; bt, ba, bq: float64 with room for "
                           "2 * passes + 1");
    }
    const double *ent = v[0].buf;
    double *bt = v[1].buf, *ba = v[2].buf, *bq = v[3].buf;
    double *d = PyMem_Malloc(sizeof(double) * (size_t)(2 * (room + 1)));
    if (d == NULL) {
        give_back_buffers(4, v);
        return PyErr_NoMemory();
    }
    double *d1 = d + room + 1;
    /* breakpoints: t0 and every lo, hi after it, sorted, each once */
    Py_ssize_t m = 0;
    bt[m++] = t0;
    for (Py_ssize_t k = 0; k < e; k++)
        if (ent[3 * k] > t0) bt[m++] = ent[3 * k];
    for (Py_ssize_t k = 0; k < e; k++)
        if (ent[3 * k + 1] > t0) bt[m++] = ent[3 * k + 1];
    sort_doubles(bt, m);
    Py_ssize_t u = 1;
    for (Py_ssize_t k = 1; k < m; k++)
        if (bt[k] != bt[k - 1]) bt[u++] = bt[k];
    m = u;
    /* offered rate: +rate from lo's breakpoint, -rate from hi's (two sums, as two bincounts), summed up */
    for (Py_ssize_t k = 0; k <= m; k++) d[k] = d1[k] = 0.0;
    for (Py_ssize_t k = 0; k < e; k++) {
        d[count_below(bt, m, ent[3 * k] - 1e-15)] += ent[3 * k + 2];
        d1[count_below(bt, m, ent[3 * k + 1])] += ent[3 * k + 2];
    }
    int congested = 0;
    const double over = cap * (1 + 1e-9);
    for (Py_ssize_t k = 0; k < m; k++) {
        const double dk = d[k] - d1[k];
        ba[k] = k ? ba[k - 1] + dk : dk;
        congested |= ba[k] > over;
    }
    /* the queue: each segment's excess, walked from q_ref (d reused for the increments) */
    for (Py_ssize_t k = 0; k + 1 < m; k++) d[k] = (ba[k] - cap) * (bt[k + 1] - bt[k]);
    clamped_walk(q_ref, d, m - 1, qcap, bq);
    for (Py_ssize_t k = 0; k < m && !congested; k++) congested = bq[k] > 0;
    PyMem_Free(d);
    give_back_buffers(4, v);
    return Py_BuildValue("(ni)", m, congested);
}

/* fluid_arrivals(leave, b, limit, c, lossdrop, ovf, wait, floor, idx, t) -> m
 *
 * dblp/sim/fast.py's RoundFlow.port_refresh (the numpy reference beside it):
 * the slots b..limit-1 of a pass that reach the receiver - neither lost
 * (lossdrop) nor dropped at the port (ovf; either may be None) - in idx[0..m),
 * and their arrival times leave + c (+ wait, may be None) in t[0..m), never
 * before the one ahead of them nor before floor (FIFO). idx and t need room
 * for limit - b. Why C: a pass at a congested or lossy port is re-evaluated a
 * few times, and each rebuild of its arrivals took ~10 numpy calls. */
PyObject *fp_fluid_arrivals(PyObject *self, PyObject *args) {
    PyObject *o[6];
    Py_ssize_t b, limit;
    double c, floor_t;
    if (!PyArg_ParseTuple(args, "OnndOOOdOO", &o[0], &b, &limit, &c, &o[1], &o[2], &o[3], &floor_t, &o[4], &o[5]))
        return NULL;
    static const int flags[6] = {BUF_IN, BUF_IN | BUF_OPTIONAL, BUF_IN | BUF_OPTIONAL, BUF_IN | BUF_OPTIONAL,
                                 BUF_OUT, BUF_OUT};
    Py_buffer v[6];
    if (take_buffers(6, v, o, flags) < 0) return NULL;
    const Py_ssize_t n = v[0].len / 8;
    if (v[0].itemsize != 8 || b < 0 || limit < b || limit > n || (v[1].buf && (v[1].itemsize != 1 || v[1].len < limit)) ||
        (v[2].buf && (v[2].itemsize != 1 || v[2].len < limit)) || (v[3].buf && (v[3].itemsize != 8 || v[3].len / 8 < limit)) ||
        v[4].itemsize != 8 || v[4].len / 8 < limit - b || v[5].itemsize != 8 || v[5].len / 8 < limit - b) {
        give_back_buffers(6, v);
        return value_error("fluid_arrivals: leave float64; 0 <= b <= limit <= its length; lossdrop, ovf: bool and "
                           "wait: float64 of at least limit (or None); idx int64, t float64 with room for limit - b");
    }
    const double *leave = v[0].buf, *wait = v[3].buf;
    const unsigned char *lost = v[1].buf, *ovf = v[2].buf;
    int64_t *idx = v[4].buf;
    double *t = v[5].buf;
    Py_ssize_t m = 0;
    double run = floor_t;
    for (Py_ssize_t s = b; s < limit; s++) {
        if ((lost && lost[s]) || (ovf && ovf[s])) continue;
        double x = leave[s] + c;
        if (wait) x = x + wait[s];
        if (x < run) x = run;
        run = x;
        idx[m] = s;
        t[m++] = x;
    }
    give_back_buffers(6, v);
    return PyLong_FromSsize_t(m);
}

/* pcg64_seed(entropy) -> (state, inc)
 *
 * The state of np.random.PCG64(np.random.SeedSequence(entropy)) (numpy's SeedSequence: the
 * entropy words hashed into a pool of four, two uint64 words each for the seed and the increment,
 * then PCG's set-seq seeding), for entropy of at most 2**31 uint32 words, as the two 128-bit
 * integers of PCG64's state dict. Why: the round level draws each pass's uniforms from a stream
 * of its own (seed, direction, worker, round, pass), and building the SeedSequence and the PCG64
 * in numpy cost ~25 us a pass, as much as the draws (~1,400 passes an iteration at 1024 workers
 * paced). dblp/sim/fast.py's _uniforms is held to numpy's generator by tests. */
#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_L 0xca01f9ddu
#define SS_MIX_R 0x4973f715u

static uint32_t ss_hashmix(uint32_t v, uint32_t *h) {
    v ^= *h;
    *h *= SS_MULT_A;
    v *= *h;
    v ^= v >> 16;
    return v;
}

static uint32_t ss_mix(uint32_t x, uint32_t y) {
    uint32_t r = SS_MIX_L * x - SS_MIX_R * y;
    return r ^ (r >> 16);
}

PyObject *fp_pcg64_seed(PyObject *self, PyObject *args) {
    PyObject *o[1];
    if (!PyArg_ParseTuple(args, "O", &o[0])) return NULL;
    static const int flags[1] = {BUF_IN};
    Py_buffer v[1];
    if (take_buffers(1, v, o, flags) < 0) return NULL;
    if (v[0].itemsize != 4 || v[0].len % 4) {
        give_back_buffers(1, v);
        return value_error("pcg64_seed: entropy: uint32 words");
    }
    const uint32_t *ent = v[0].buf;
    const Py_ssize_t n = v[0].len / 4;
    uint32_t pool[4], h = SS_INIT_A;
    for (int i = 0; i < 4; i++) pool[i] = ss_hashmix(i < n ? ent[i] : 0u, &h);
    for (int s = 0; s < 4; s++)
        for (int d = 0; d < 4; d++)
            if (s != d) pool[d] = ss_mix(pool[d], ss_hashmix(pool[s], &h));
    for (Py_ssize_t s = 4; s < n; s++)
        for (int d = 0; d < 4; d++) pool[d] = ss_mix(pool[d], ss_hashmix(ent[s], &h));
    give_back_buffers(1, v);
    uint32_t w[8], hb = SS_INIT_B;
    for (int i = 0; i < 8; i++) {
        uint32_t x = pool[i % 4];
        x ^= hb;
        hb *= SS_MULT_B;
        x *= hb;
        x ^= x >> 16;
        w[i] = x;
    }
    uint64_t q[4]; /* generate_state(4, uint64): the uint32 words in pairs, little-endian */
    for (int i = 0; i < 4; i++) q[i] = (uint64_t)w[2 * i] | ((uint64_t)w[2 * i + 1] << 32);
    const unsigned __int128 mult = ((unsigned __int128)0x2360ED051FC65DA4ULL << 64) | 0x4385DF649FCCF645ULL;
    const unsigned __int128 seed = ((unsigned __int128)q[0] << 64) | q[1];
    const unsigned __int128 inc = ((((unsigned __int128)q[2] << 64) | q[3]) << 1) | 1u;
    unsigned __int128 st = 0;
    st = st * mult + inc;
    st += seed;
    st = st * mult + inc;
    return Py_BuildValue("(KKKK)", (unsigned long long)(st >> 64), (unsigned long long)st,
                         (unsigned long long)(inc >> 64), (unsigned long long)inc);
}
