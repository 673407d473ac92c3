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

PyObject *fp_fluid_outcome(PyObject *self, PyObject *args) {
    PyObject *o[8];
    double cap, qcap, ser;
    if (!PyArg_ParseTuple(args, "OOOdddOOOO", &o[0], &o[1], &o[2], &cap, &qcap, &ser, &o[3], &o[4], &o[5], &o[6]))
        return NULL;
    static const int flags[7] = {BUF_IN, BUF_IN, BUF_IN, BUF_IN, BUF_IN, BUF_OUT, BUF_OUT};
    Py_buffer v[7];
    if (take_buffers(7, v, o, flags) < 0) return NULL;
    Py_ssize_t nb = v[0].len / 8, n = v[3].len / 8;
    if (v[0].itemsize != 8 || v[1].len != v[0].len || v[2].len != v[0].len || nb < 1 || v[3].itemsize != 8 ||
        v[4].len != v[3].len || v[5].len != v[3].len || v[6].len != n || v[6].itemsize != 1) {
        give_back_buffers(7, v);
        return value_error("fluid_outcome: bt, ba, bq: float64 of one length >= 1; arr, u, wait: float64 of one "
                           "length; ovf: bool of that length");
    }
    const double *bt = v[0].buf, *ba = v[1].buf, *bq = v[2].buf, *arr = v[3].buf, *u = v[4].buf;
    double *wait = v[5].buf;
    unsigned char *ovf = v[6].buf;
    int any_wait = 0, any_ovf = 0;
    Py_ssize_t k = 0; /* number of breakpoints <= the current slot's time, kept as the slots advance */
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
