/* Taking and giving back the Python buffers (numpy arrays, bytearrays) an
 * entry point works on, and the two ways it ends: None or a ValueError.
 *
 * Why: every entry point takes two to eleven buffers, and each failure
 * must give back exactly those already taken. Written out per function that
 * was a ladder of releases which grew with every argument; here it is one
 * loop. The flags are fixed per argument, the checks of shapes and lengths
 * stay with each entry point (they are what it documents). */
#ifndef DBLP_FASTPATH_BUFFERS_H
#define DBLP_FASTPATH_BUFFERS_H

#include "common.h"

/* What an entry point needs of a buffer; all are C-contiguous. */
#define BUF_IN PyBUF_C_CONTIGUOUS
#define BUF_IN2D (PyBUF_C_CONTIGUOUS | PyBUF_ND) /* a matrix: shape[] filled in */
#define BUF_OUT (PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
#define BUF_OUT2D (PyBUF_C_CONTIGUOUS | PyBUF_ND | PyBUF_WRITABLE)
#define BUF_OPTIONAL 0x40000000 /* or'ed in: None is accepted, as an empty view (buf NULL, len 0) */

/* Gives back views[0..n) (empty views from BUF_OPTIONAL are skipped). */
static inline void give_back_buffers(int n, Py_buffer *views) {
    for (int i = 0; i < n; i++)
        if (views[i].obj != NULL) PyBuffer_Release(&views[i]);
}

/* Takes views[i] of objs[i] with flags[i], in order. On a failure gives back those
 * already taken and returns -1 with the exception set; else 0. */
static inline int take_buffers(int n, Py_buffer *views, PyObject *const *objs, const int *flags) {
    for (int i = 0; i < n; i++) {
        if ((flags[i] & BUF_OPTIONAL) && objs[i] == Py_None) {
            memset(&views[i], 0, sizeof views[i]);
            continue;
        }
        if (PyObject_GetBuffer(objs[i], &views[i], flags[i] & ~BUF_OPTIONAL) < 0) {
            give_back_buffers(i, views);
            return -1;
        }
    }
    return 0;
}

/* A 2-D matrix of bytes (rows of datagrams): rows_of and cols_of are its shape, 0 otherwise. */
static inline int is_byte_matrix(const Py_buffer *b) { return b->ndim == 2 && b->itemsize == 1; }
static inline Py_ssize_t rows_of(const Py_buffer *b) { return b->ndim == 2 ? b->shape[0] : 0; }
static inline Py_ssize_t cols_of(const Py_buffer *b) { return b->ndim == 2 ? b->shape[1] : 0; }

static inline PyObject *value_error(const char *msg) {
    PyErr_SetString(PyExc_ValueError, msg);
    return NULL;
}

/* The end of a loop run without the GIL: None, or ValueError(msg) when it stopped at a bad index. */
static inline PyObject *none_unless_bad(int bad, const char *msg) {
    if (bad) return value_error(msg);
    Py_RETURN_NONE;
}

#endif
