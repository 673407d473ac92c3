/* dblp._fastpath: the per-datagram loops of the fast path in C, with the
 * GIL released. This file is only the module: its method table and its
 * start-up (the CRC tables, the best CRC implementation as BEST, the GMAC's as MAC). The
 * functions live in purpose-named files (common.h lists them);
 * dblp/_fastpath.pyi gives their typed signatures. Optional: without a
 * compiler dblp/wire.py, dblp/udp.py and dblp/reduce.py run their numpy /
 * crc32c paths, byte-identical on the wire. */
#include "common.h"

static PyMethodDef methods[] = {
    {"recv_rows", fp_recv_rows, METH_VARARGS, "Queued datagrams into rows (GRO runs or recvmmsg); (k, calls)."},
    {"encode_headers", fp_encode_headers, METH_VARARGS, "Headers (CRC included) of chunks seqs of a float32 tensor."},
    {"send_chunks", fp_send_chunks, METH_VARARGS, "sendmsg header + chunk pairs, GSO runs; (sent, lost, calls, errno)."},
    {"encode_rows", fp_encode_rows, METH_VARARGS, "Datagrams of chunks seqs of a float32 tensor, as wire.encode_chunks."},
    {"scatter_rows", fp_scatter_rows, METH_VARARGS, "Payloads of rows to out at seqs[i] * chunk_bytes."},
    {"recv_place", fp_recv_place, METH_VARARGS,
     "recv_rows with payloads received in place when predicted; (k, calls, placed)."},
    {"crc_placed", fp_crc_placed, METH_VARARGS, "CRC-32C of header rows followed by their payload slots in out."},
    {"mean_into", fp_mean_into, METH_VARARGS, "out = sum(bufs) * scale in one threaded pass; returns sum(out**2) (and each buffer's sum of squares into sumsq)."},
    {"mac_rows", fp_mac_rows, METH_VARARGS, "1 where rows[i, :lengths[i]] carries a valid AES-GMAC tag (wire v2), else 0."},
    {"use", fp_use, METH_VARARGS, "Switch the CRC implementation; returns the previous one."},
    {"use_mac", fp_use_mac, METH_VARARGS, "Switch the GMAC implementation (ipsec-mb, openssl); returns the previous one."},
    {"fluid_outcome", fp_fluid_outcome, METH_VARARGS,
     "Waits and overflow drops of slots at a fluid switch port (dblp.sim.net.FluidQueue.outcome); flags."},
    {"fluid_profile", fp_fluid_profile, METH_VARARGS,
     "A congested fluid switch port's profile (dblp.sim.net.FluidQueue._rebuild); (breakpoints, congested)."},
    {"pcg64_seed", fp_pcg64_seed, METH_VARARGS,
     "np.random.PCG64(np.random.SeedSequence(uint32 entropy))'s state: (state high, low, inc high, low)."},
    {"fluid_arrivals", fp_fluid_arrivals, METH_VARARGS,
     "The slots of a pass that reach the receiver and when (dblp.sim.fast.RoundFlow.port_refresh); their count."},
    {"crc_rows", fp_crc_rows, METH_VARARGS, "CRC-32C of rows[i, start:lengths[i]] into out[i], GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastpath(void) {
    crc_init();
    mac_init();
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddStringConstant(m, "BEST", crc_name) < 0 || PyModule_AddStringConstant(m, "MAC", mac_name) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
