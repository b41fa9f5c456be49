/*
 * Native packer for the row-split-k128-v1 layout (docs/layouts.md; the numpy reference is
 * RowSplitK128._pack in layouts/row_split.py, and the tests hold the two byte-identical).
 *
 * Contract: pack_rows(codes, scales, n, k, group, bits, qmin, qmax, planes, compare) takes an
 * [n, k] block of int8 codes and its [n, ceil(k/group)] binary16 scale words (native uint16)
 * and either writes the block's rows of every plane (compare = 0) into `planes`, one writable
 * buffer per plane in layout order, or compares them with those buffers (compare = 1).  It
 * returns 0 (written, or every byte equal), 1 (compare only: some byte differs) or 2 (the
 * values break Section 5/6.1: a code outside [qmin, qmax], a scale that is not +0 or finite
 * positive, or a non-zero code under a +0 scale; what was written is then undefined and the
 * caller reports the problem with validate.grouped_problems).  The value check is the same
 * rule grouped_problems applies, so the fused path needs no second pass over the codes.
 *
 * Why C: in numpy the packing is several whole-block passes plus about 20 Python-level calls
 * per block, all holding the GIL, and with two encoding threads the GIL became the limit.
 * Here one call per block does the check, the packing and the store or comparison, and the
 * GIL is released for all of it.
 *
 * Plane bytes per row, Kp = ceil(k/128)*128, u = code & (2^bits - 1), u = 0 at padding:
 *   bits 4: codes[Kp/2]: u[2j] | u[2j+1] << 4
 *   bits 5: lo4[Kp/2] as above on u & 15; hi1[Kp/8]: bit i of byte j = bit 4 of u[8j+i]
 *   bits 6: lo4[Kp/2]; hi2[Kp/4]: bits 2i..2i+1 of byte j = bits 4-5 of u[4j+i]
 *   bits 8: codes[Kp]: u[j]
 *   all:    scales[2*Kp/group]: little-endian words, slots >= ceil(k/group) are +0
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_ieee.h"

#define K_ALIGN 128
#define MAX_PLANES 3

/* The bit gathers below read 8 or 4 code bytes as one little-endian integer. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "_rowsplit.c assumes a little-endian host; the build skips it and numpy packs instead"
#endif

/* Compiled for AVX2 and baseline x86-64 and picked at load time: signed byte min/max and the
 * strided nibble loads only vectorise well with AVX2 (SSE2 lacks signed byte min/max). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

/* Section 5/6.1 on one row: legal codes, +0 or finite positive scales, zero codes under +0. */
CLONES static int row_valid(const int8_t *c, const uint16_t *s, Py_ssize_t k, Py_ssize_t groups,
                     int group, int qmin, int qmax) {
    int8_t lo = 127, hi = -128;
    for (Py_ssize_t j = 0; j < k; j++) {
        lo = c[j] < lo ? c[j] : lo;
        hi = c[j] > hi ? c[j] : hi;
    }
    if (lo < qmin || hi > qmax) return 0;
    for (Py_ssize_t g = 0; g < groups; g++) {
        const uint16_t w = s[g];
        if ((w & F16_SIGN) || (w & F16_EXP) == F16_EXP) return 0;
        if (w == 0) {
            const Py_ssize_t a = g * group, b = a + group < k ? a + group : k;
            uint8_t any = 0;
            for (Py_ssize_t j = a; j < b; j++) any |= (uint8_t)c[j];
            if (any) return 0;
        }
    }
    return 1;
}

static inline uint64_t load64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t load32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* One row of every plane, plane i into dst[i].  `u` is the row's Kp code bytes with zero
 * padding.  The int8 code bytes serve as u without masking: each field below takes only bits
 * of a code below its width b (bits 0-3, bit 4 for Q5, bits 4-5 for Q6, all 8 for W8), and
 * the low b bits of the two's-complement byte are u = q mod 2^b. */
CLONES static void pack_row(const uint8_t *u, Py_ssize_t kp, const uint16_t *s,
                            Py_ssize_t groups, Py_ssize_t gp, int bits, uint8_t *const *dst) {
    int p = 0;
    if (bits == 8) {
        memcpy(dst[p++], u, (size_t)kp);
    } else {
        uint8_t *o = dst[p++];
        for (Py_ssize_t j = 0; j < kp / 2; j++) /* the shift drops bits 4-7 of the odd code */
            o[j] = (uint8_t)((u[2 * j] & 15u) | (uint8_t)(u[2 * j + 1] << 4));
        if (bits == 5) {
            /* Bit 4 of each of 8 bytes, gathered by one multiply: byte i's bit sits at 8i and
             * the factor's term 2^(56-7i) moves it to 56+i; every other partial product lands
             * at a distinct position below 56 or above 63, so nothing carries into the top byte. */
            o = dst[p++];
            for (Py_ssize_t j = 0; j < kp / 8; j++)
                o[j] = (uint8_t)((((load64(u + 8 * j) >> 4) & 0x0101010101010101u) *
                                  0x0102040810204080u) >> 56);
        } else if (bits == 6) {
            /* Bits 4-5 of each of 4 bytes: field i at 8i moves to 24+2i with the factor's term
             * 2^(24-6i); the other partial products are 2-bit fields at 6, 12, 14, 18, 20, 22
             * (no overlap, no carry) or beyond bit 31, which the 32-bit product drops. */
            o = dst[p++];
            for (Py_ssize_t j = 0; j < kp / 4; j++)
                o[j] = (uint8_t)((uint32_t)(((load32(u + 4 * j) >> 4) & 0x03030303u) *
                                            0x01041040u) >> 24);
        }
    }
    uint8_t *o = dst[p];
    for (Py_ssize_t g = 0; g < gp; g++) { /* little-endian whatever the host */
        const uint16_t w = g < groups ? s[g] : 0;
        o[2 * g] = (uint8_t)(w & 0xFFu);
        o[2 * g + 1] = (uint8_t)(w >> 8);
    }
}

static PyObject *pack_rows(PyObject *self, PyObject *args) {
    Py_buffer codes, scales, planes[MAX_PLANES + 1];
    PyObject *plane_seq;
    Py_ssize_t n, k;
    int group, bits, qmin, qmax, compare;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*nniiiiOp", &codes, &scales, &n, &k, &group, &bits, &qmin,
                          &qmax, &plane_seq, &compare))
        return NULL;
    const int nplanes = bits == 4 || bits == 8 ? 2 : 3;
    Py_ssize_t groups = 0, kp = 0, gp = 0, strides[MAX_PLANES] = {0};
    /* Bounds first, so that no size below can overflow: every plane row is at most 2 * Kp
     * bytes (scales: 2 * Kp / group), so 4 * Kp bounds a row of all planes together. */
    int ok = (bits == 4 || bits == 5 || bits == 6 || bits == 8) && n >= 0 && k > 0 &&
             k <= PY_SSIZE_T_MAX / 8 - K_ALIGN && group > 0 && K_ALIGN % group == 0 &&
             qmin >= -128 && qmax <= 127;
    if (ok) {
        groups = (k + group - 1) / group;
        kp = (k + K_ALIGN - 1) / K_ALIGN * K_ALIGN;
        gp = kp / group;
        ok = n <= PY_SSIZE_T_MAX / (4 * kp);
    }
    if (ok) {
        strides[0] = bits == 8 ? kp : kp / 2;
        if (nplanes == 3) strides[1] = bits == 5 ? kp / 8 : kp / 4;
        strides[nplanes - 1] = 2 * gp;
        ok = codes.len == n * k && scales.len == n * groups * 2 && PyTuple_Check(plane_seq) &&
             PyTuple_GET_SIZE(plane_seq) == nplanes;
    }
    int got = 0;
    for (; ok && got < nplanes; got++) {
        PyObject *p = PyTuple_GET_ITEM(plane_seq, got);
        int flags = compare ? PyBUF_SIMPLE : PyBUF_WRITABLE;
        if (PyObject_GetBuffer(p, &planes[got], flags | PyBUF_C_CONTIGUOUS) < 0) break;
        ok = planes[got].len == n * strides[got];
    }
    if (!ok || got < nplanes) {
        for (int i = 0; i < got; i++) PyBuffer_Release(&planes[i]);
        PyBuffer_Release(&codes);
        PyBuffer_Release(&scales);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError,
                            "pack_rows: inconsistent arguments (planes: a tuple of one buffer "
                            "per plane, each exactly n rows of the layout's row stride)");
        return NULL;
    }
    Py_ssize_t row_bytes = 0;
    for (int i = 0; i < nplanes; i++) row_bytes += strides[i];
    /* u for rows with padding (K < Kp), then one packed row for the comparison. */
    uint8_t *scratch = (uint8_t *)PyMem_Malloc((size_t)(kp + row_bytes));
    if (scratch == NULL) {
        for (int i = 0; i < nplanes; i++) PyBuffer_Release(&planes[i]);
        PyBuffer_Release(&codes);
        PyBuffer_Release(&scales);
        return PyErr_NoMemory();
    }
    const int8_t *cb = (const int8_t *)codes.buf;
    const uint16_t *sb = (const uint16_t *)scales.buf;
    int result = 0;

    Py_BEGIN_ALLOW_THREADS
    memset(scratch + k, 0, (size_t)(kp - k)); /* the padding of u, zero for every row */
    uint8_t *dst[MAX_PLANES];
    for (Py_ssize_t r = 0; r < n; r++) {
        const int8_t *c = cb + r * k;
        const uint16_t *s = sb + r * groups;
        if (!row_valid(c, s, k, groups, group, qmin, qmax)) {
            result = 2;
            break;
        }
        if (result == 1) continue; /* already different: only the value check is left */
        const uint8_t *u = (const uint8_t *)c;
        if (k < kp) {
            memcpy(scratch, c, (size_t)k);
            u = scratch;
        }
        uint8_t *row = scratch + kp;
        for (int i = 0; i < nplanes; i++) {
            dst[i] = compare ? row : (uint8_t *)planes[i].buf + r * strides[i];
            row += strides[i];
        }
        pack_row(u, kp, s, groups, gp, bits, dst);
        if (compare)
            for (int i = 0; i < nplanes && result == 0; i++)
                if (memcmp((const uint8_t *)planes[i].buf + r * strides[i], dst[i],
                           (size_t)strides[i]) != 0)
                    result = 1;
    }
    Py_END_ALLOW_THREADS

    PyMem_Free(scratch);
    for (int i = 0; i < nplanes; i++) PyBuffer_Release(&planes[i]);
    PyBuffer_Release(&codes);
    PyBuffer_Release(&scales);
    return PyLong_FromLong(result);
}

static PyMethodDef methods[] = {
    {"pack_rows", pack_rows, METH_VARARGS,
     "Check, then pack or compare a block of rows in row-split-k128-v1 (see module docs)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rowsplit",
    "Native packer for row-split-k128-v1 (see the C source's header).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rowsplit(void) { return PyModule_Create(&module); }
