/*
 * What the two encoder kernels' encode_rows (_hostkernel.c, _msekernel.c) share at the Python
 * boundary: the first argument checks, made before anything is read, and the result.
 *
 * check_block(source, n, k, group, qmin, qmax, &sizes) checks the block's shape and source
 * (1 <= group, 0 <= n, 1 <= k; source 0 BF16, 1 binary32 or 2 binary16) and the code bounds
 * (-128 <= qmin < 0 < qmax <= 127: codes are int8, and the clamp bounds must be exact floats),
 * then computes the sizes that follow with overflow-checked multiplication (no signed overflow).
 * It returns NULL, or the ValueError message; each kernel then adds its own checks (its scratch
 * sizes, with BLOCK_OVERFLOWS as their message, then the buffers' lengths and alignment).
 *
 * block_result(kind, row, col, raw) is encode_rows' value: None (kind 0), or the first refusal
 * in row-major order, ("nonfinite", row, column) (kind 1) or ("overflow", row, group,
 * raw_scale) (kind 2); the caller words the error.
 */
#ifndef NINFER_ENCODE_ARGS_H
#define NINFER_ENCODE_ARGS_H

#include <Python.h>

#define BLOCK_OVERFLOWS "encode_rows: n, k and group give a buffer size that overflows"

/* a * b into *out when it fits a non-negative Py_ssize_t (both non-negative), else 0. */
static int mul_size(Py_ssize_t a, Py_ssize_t b, Py_ssize_t *out) {
    if (a < 0 || b < 0) return 0;
    if (b != 0 && a > PY_SSIZE_T_MAX / b) return 0;
    *out = a * b;
    return 1;
}

typedef struct {
    Py_ssize_t wsize;  /* bytes per source word: 4 for binary32, else 2 */
    Py_ssize_t groups; /* scales per row: ceil(k / group) */
    Py_ssize_t cells;  /* codes: n * k */
    Py_ssize_t wbytes; /* source bytes: n * k * wsize */
    Py_ssize_t sbytes; /* scale bytes: n * groups * 2 */
} block_sizes;

static const char *check_block(int source, Py_ssize_t n, Py_ssize_t k, int group, int qmin,
                               int qmax, block_sizes *b) {
    b->wsize = source == 1 ? 4 : 2;
    b->groups = b->cells = b->wbytes = b->sbytes = 0;
    if (group <= 0 || n < 0 || k <= 0 || source < 0 || source > 2)
        return "encode_rows: need group >= 1, n >= 0, k >= 1 and source 0 (BF16), 1 (binary32) "
               "or 2 (binary16)";
    if (qmin < -128 || qmin >= 0 || qmax <= 0 || qmax > 127)
        return "encode_rows: need -128 <= qmin < 0 < qmax <= 127";
    b->groups = k / group + (k % group != 0); /* no k + group - 1: it could overflow */
    if (!mul_size(n, k, &b->cells) || !mul_size(b->cells, b->wsize, &b->wbytes) ||
        !mul_size(n, b->groups, &b->sbytes) || !mul_size(b->sbytes, 2, &b->sbytes))
        return BLOCK_OVERFLOWS;
    return NULL;
}

static PyObject *block_result(int kind, Py_ssize_t row, Py_ssize_t col, float raw) {
    if (kind == 1) return Py_BuildValue("(snn)", "nonfinite", row, col);
    if (kind == 2) return Py_BuildValue("(snnd)", "overflow", row, col, (double)raw);
    Py_RETURN_NONE;
}

#endif
