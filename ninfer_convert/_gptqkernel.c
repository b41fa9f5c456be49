/*
 * C kernel of block-compensated encoding (docs/encoder-profiles.md, "Error compensation across
 * columns"): the document's column loop on a chunk of rows, bit-identical to
 * encoder/gptq_reference.py and to the numpy encoder of encoder/gptq.py.  The scale search of
 * each group is not here: encoder/gptq.py runs MSE_F16_SEARCH_V1's own host encoder (its C
 * kernel, _msekernel.c, or its numpy encoder) on the binary32 values this module rounds, so
 * the profile and this encoder share one search.  Per group [g0, g1) of a chunk of n rows:
 *
 *   group_values(w, n, k, g0, group, qmax, failed, reason, v)
 *
 * writes v = RN32(w[:, g0:g1]) as [n, g1 - g0] binary32 words, the values the search sees.  A
 * row whose failed[r] is still -1 and that the search would refuse (a non-finite v, or
 * Section 7's canonical scale RN16(RN32(amax / qmax)) overflowing binary16) gets failed[r] =
 * g0 and reason[r] = 1; the v of every failed row is written as +0 (any finite stand-in: its
 * results are discarded).
 *
 *   group_columns(w, n, k, factor, block, g0, group, qmin, qmax, scales, codes, failed,
 *                 reason, trace=None)
 *
 * then runs the document's inner loop for columns g0 .. g1-1 of every row not failed, with
 * the row's scale word scales[r] (binary16, from the search): the codes go to codes[r, i], the
 * updates to w[r, i+1 .. b1-1] (b1 the end of g0's block), and trace[r, i], when given, gets
 * w[r, i] as the code is chosen.  A row whose w[r, i] is not finite at that moment gets
 * failed[r] = i and reason[r] = 2 and is left (its codes from there on are not written).
 *
 * Buffers: w [n, k] float64 (read, and written by group_columns), factor [k, block] binary32
 * words (the checked factor of gptq.check_factor: this module trusts its rules, reading only
 * entries inside their bounds whatever they hold), v [n, g1 - g0] uint32, scales [n] uint16,
 * codes [n, k] int8, failed [n] int64, reason [n] int8, trace [n, k] float64; C-contiguous,
 * aligned to their words.  The first checks of (n, k, group, qmin, qmax) and their
 * overflow-checked sizes are _encode_args.h's, with its messages; then block (a positive
 * multiple of group), g0 (a group start below k) and every buffer's length and alignment
 * (ValueError before anything is read).  The GIL is released for the loops, so threads encode
 * different chunks at once.
 *
 * Why the arithmetic is exactly the document's:
 *
 * - C double arithmetic is IEEE binary64 with FLT_EVAL_METHOD 0 (SSE2/AVX, no x87 excess
 *   precision: checked below), round to nearest even.  The build passes -ffp-contract=off and
 *   never -ffast-math (refused below), so each `*`, `/`, `-` is one correctly rounded operation,
 *   nothing is fused into an FMA (tests/test_encoder_gptq_native.py disassembles the module)
 *   and nothing is reassociated.  Every RN64 step of the document is one such operation, in
 *   the document's order for each row; the vector loops below only run the SAME operation on
 *   different j (w[j] = RN64(w[j] - RN64(e * u(i, j))) is independent per j) or on different
 *   rows, never changing what is computed for one value.  They defer updates (columns_tile:
 *   w[j] is held in a register while the columns before it update it, in their order), which
 *   changes no operation and no operand either.
 * - A binary32 factor entry widened to binary64 and a binary16 scale word widened to binary64
 *   are exact conversions; a binary64 -> binary32 conversion (float)x is one RNE rounding with
 *   subnormals and overflow to infinity (RN32).
 * - Codes: y = RN64(w / s), clamped to [qmin, qmax] and rounded half to even by the 1.5 * 2^52
 *   trick ((y + M) - M, exact for |y| < 2^51; |y| <= 128 after the clamp).  By the document's
 *   argument ("Why the numpy encoder is exact") the binary64 quotient is never moved onto or
 *   across a half-integer, and rounding is monotone with integer bounds, so this is
 *   clamp(round_half_even(w / s)).  The code is then a double +q (never -0: (y + M) - M of a
 *   y >= -0.5 is +0), so s * q is the reference's exact product, +0 for q = 0.
 * - The canonical scale's overflow test: RN32(amax / qmax) is one binary32 division
 *   (Section 7), and its RN16 is +infinity exactly when it is >= 65520 (halfway between 65504,
 *   the largest binary16, and 2^16, which it rounds to by ties-to-even).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_encode_args.h"
#include "_ieee.h"

#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__) ||   \
    defined(__RECIPROCAL_MATH__) || defined(__ASSOCIATIVE_MATH__) || defined(__NO_SIGNED_ZEROS__)
#error "_gptqkernel needs IEEE arithmetic: build without -ffast-math or its parts"
#endif
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "_gptqkernel needs FLT_EVAL_METHOD == 0 (binary64 evaluated as binary64, no x87)"
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* Cloned for x86-64-v4, AVX2 and baseline (an ifunc picks one at load time): the update
 * loops are element-wise (GCC vector extensions of VW lanes, and loops the auto-vectoriser
 * widens), so each clone runs the same operations per value (contraction stays off, so the
 * FMA units of x86-64-v4 are not used: the build test checks it). */
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define CLONES
#endif

/* Round half to even of |y| < 2^51 (see the contract). */
static const double MAGIC = 0x1.8p+52; /* 6755399441055744 */

/* RN32(amax / qmax) >= this: its binary16 rounding is +infinity. */
static const float F16_OVERFLOW = 0x1.ffep+15f; /* 65520 */

enum { REASON_SEARCH = 1, REASON_NONFINITE = 2 };

/* Exact binary16 -> binary64 of a finite non-negative word. */
static double f16_to_f64(uint16_t h) {
    const uint32_t e = (uint32_t)(h >> 10) & 0x1Fu, f = h & F16_FRAC;
    if (e == 0) return (double)f * 0x1p-24; /* f * 2^-24 (5.9604644775390625e-08), exact */
    return f64_from_bits(((uint64_t)(e + 1008) << 52) | ((uint64_t)f << 42));
}

/* clamp(round_half_even(x / s), lo, hi) for s > 0 finite, as a double (see the contract). */
static inline double nearest_code(double x, double s, double lo, double hi) {
    double y = x / s;
    y = y < lo ? lo : y;
    y = y > hi ? hi : y;
    return (y + MAGIC) - MAGIC;
}

CLONES static void values_block(const double *w, Py_ssize_t n, Py_ssize_t k, Py_ssize_t g0,
                                Py_ssize_t width, int qmax, int64_t *failed, int8_t *reason,
                                uint32_t *v) {
    const float fq = (float)qmax;
    for (Py_ssize_t r = 0; r < n; r++) {
        uint32_t *out = v + r * width;
        if (failed[r] < 0) {
            const double *x = w + r * k + g0;
            uint32_t m = 0;
            for (Py_ssize_t i = 0; i < width; i++) {
                /* RN32: an IEEE conversion (Annex F), overflow to infinity, NaN stays NaN */
                const uint32_t u = bits_from_f32((float)x[i]);
                const uint32_t a = u & F32_MAG;
                out[i] = u;
                m = a > m ? a : m;
            }
            /* Sign-cleared words: unsigned order is the order of |x|, inf/NaN above all. */
            if (m < F32_EXP && f32_from_bits(m) / fq < F16_OVERFLOW) continue;
            failed[r] = g0;
            reason[r] = REASON_SEARCH;
        }
        memset(out, 0, (size_t)width * sizeof(uint32_t));
    }
}

/* Rows per tile: each factor entry is widened once and used by TILE rows, and the deferred
 * updates keep TILE independent chains of subtractions in flight. */
#define TILE 4
#define VW 8 /* binary64 lanes of the deferred update's vectors */
#define SUB 8 /* columns per sub-block inside a group (step 1 below) */

typedef double vd8 __attribute__((vector_size(VW * sizeof(double))));
typedef float vf8 __attribute__((vector_size(VW * sizeof(float))));

/* The deferred updates of columns [j0, j1) by the columns [c0, c1) of the rows wr[0..t):
 * for each j, w[j] = RN64(w[j] - RN64(e(i) * u(i, j))) for i = c0 .. c1-1 in that order, w[j]
 * held in a register meanwhile.  e(i) of row a is e[a * stride + i - e0]; u(i, j) is
 * fb[i * block + j] (fb: the factor shifted by the block start). */
static inline void deferred(double *const *wr, int t, const double *e, Py_ssize_t stride,
                            Py_ssize_t e0, const float *fb, Py_ssize_t block, Py_ssize_t c0,
                            Py_ssize_t c1, Py_ssize_t j0, Py_ssize_t j1) {
    Py_ssize_t j = j0;
    if (t == TILE) {
        const double *x0 = e - e0, *x1 = x0 + stride, *x2 = x1 + stride, *x3 = x2 + stride;
        for (; j + VW <= j1; j += VW) {
            vd8 a0, a1, a2, a3;
            memcpy(&a0, wr[0] + j, sizeof a0);
            memcpy(&a1, wr[1] + j, sizeof a1);
            memcpy(&a2, wr[2] + j, sizeof a2);
            memcpy(&a3, wr[3] + j, sizeof a3);
            for (Py_ssize_t c = c0; c < c1; c++) {
                vf8 uf;
                memcpy(&uf, fb + c * block + j, sizeof uf);
                const vd8 uv = __builtin_convertvector(uf, vd8); /* exact widening */
                a0 = a0 - x0[c] * uv;
                a1 = a1 - x1[c] * uv;
                a2 = a2 - x2[c] * uv;
                a3 = a3 - x3[c] * uv;
            }
            memcpy(wr[0] + j, &a0, sizeof a0);
            memcpy(wr[1] + j, &a1, sizeof a1);
            memcpy(wr[2] + j, &a2, sizeof a2);
            memcpy(wr[3] + j, &a3, sizeof a3);
        }
    }
    for (int a = 0; a < t; a++) {
        const double *xa = e + a * stride - e0;
        Py_ssize_t jj = j;
        for (; jj + VW <= j1; jj += VW) { /* t < TILE: one row at a time */
            vd8 acc;
            memcpy(&acc, wr[a] + jj, sizeof acc);
            for (Py_ssize_t c = c0; c < c1; c++) {
                vf8 uf;
                memcpy(&uf, fb + c * block + jj, sizeof uf);
                acc = acc - xa[c] * __builtin_convertvector(uf, vd8);
            }
            memcpy(wr[a] + jj, &acc, sizeof acc);
        }
        for (; jj < j1; jj++) {
            double acc = wr[a][jj];
            for (Py_ssize_t c = c0; c < c1; c++) acc = acc - xa[c] * (double)fb[c * block + jj];
            wr[a][jj] = acc;
        }
    }
}

/* Columns [g0, g1) of the rows rows[0..t) (t <= TILE, all alive on entry) of the block that
 * ends at b1; e is TILE * (g1 - g0) doubles of scratch.  For each row the document's loop, in
 * sub-blocks of SUB columns:
 *
 * 1. for i in the sub-block: the code and e(i) from w[i], then the updates of the sub-block's
 *    own later columns (they are needed for the next codes); then the deferred updates of the
 *    group's columns after the sub-block by the sub-block's columns;
 * 2. at the end of the group, the deferred updates of the block's columns after the group by
 *    all the group's columns.
 *
 * A value is never read between its updates from column i and from column i + 1 (only a
 * column's own code reads it, after all updates from the columns before it), so deferring
 * updates this way changes no operation and no operand: each w[j] sees exactly the document's
 * sequence of roundings, in its order.  A row that fails keeps e = +0 from its failing column
 * on (its values are discarded). */
static inline void columns_tile(double *w, Py_ssize_t k, const uint32_t *f, Py_ssize_t block,
                                Py_ssize_t b0, Py_ssize_t b1, Py_ssize_t g0, Py_ssize_t g1,
                                double lo, double hi, const Py_ssize_t *rows, int t,
                                const double *s, int8_t *codes, int64_t *failed,
                                int8_t *reason, double *trace, double *e) {
    const Py_ssize_t width = g1 - g0;
    const float *fb = (const float *)f - b0; /* u(i, j) = fb[i * block + j] */
    double *wr[TILE];
    int alive[TILE];
    for (int a = 0; a < TILE; a++) {
        wr[a] = w + rows[a < t ? a : 0] * k; /* lanes past t are never read */
        alive[a] = a < t;
    }
    for (Py_ssize_t c0 = g0; c0 < g1; c0 += SUB) {
        const Py_ssize_t c1 = c0 + SUB < g1 ? c0 + SUB : g1;
        for (Py_ssize_t i = c0; i < c1; i++) {
            const float *fi = fb + i * block;
            const double uii = (double)fi[i];
            for (int a = 0; a < t; a++) {
                double ei = 0.0;
                if (alive[a]) {
                    const Py_ssize_t r = rows[a];
                    const double x = wr[a][i];
                    if (trace != NULL) trace[r * k + i] = x;
                    if (isfinite(x)) {
                        const double q = s[a] > 0.0 ? nearest_code(x, s[a], lo, hi) : 0.0;
                        codes[r * k + i] = (int8_t)q;
                        const double d = x - s[a] * q; /* s * q exact */
                        ei = d / uii;
                    } else {
                        failed[r] = i;
                        reason[r] = REASON_NONFINITE;
                        alive[a] = 0;
                    }
                }
                e[a * width + (i - g0)] = ei;
                double *wa = wr[a];
                for (Py_ssize_t j = i + 1; j < c1; j++) wa[j] = wa[j] - ei * (double)fi[j];
            }
        }
        deferred(wr, t, e, width, g0, fb, block, c0, c1, c1, g1);
    }
    deferred(wr, t, e, width, g0, fb, block, g0, g1, g1, b1);
}

CLONES static void columns_block(double *w, Py_ssize_t n, Py_ssize_t k, const uint32_t *f,
                                 Py_ssize_t block, Py_ssize_t g0, Py_ssize_t group, int qmin,
                                 int qmax, const uint16_t *scales, int8_t *codes,
                                 int64_t *failed, int8_t *reason, double *trace, double *e) {
    const Py_ssize_t b0 = g0 - g0 % block;
    const Py_ssize_t b1 = b0 + block < k ? b0 + block : k;
    const Py_ssize_t g1 = g0 + group < b1 ? g0 + group : b1;
    const double lo = (double)qmin, hi = (double)qmax;
    Py_ssize_t rows[TILE];
    double s[TILE];
    int t = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        if (failed[r] >= 0) continue;
        rows[t] = r;
        s[t] = f16_to_f64(scales[r]);
        if (++t == TILE) {
            columns_tile(w, k, f, block, b0, b1, g0, g1, lo, hi, rows, t, s, codes, failed,
                         reason, trace, e);
            t = 0;
        }
    }
    if (t > 0)
        columns_tile(w, k, f, block, b0, b1, g0, g1, lo, hi, rows, t, s, codes, failed, reason,
                     trace, e);
}

/* Buffer checks shared by both entry points: NULL, or the ValueError message. */
static const char *check_len(const Py_buffer *b, Py_ssize_t want, Py_ssize_t align,
                             const char *msg) {
    if (b->len != want || (uintptr_t)b->buf % (uintptr_t)align != 0) return msg;
    return NULL;
}

static const char *check_group(Py_ssize_t n, Py_ssize_t k, Py_ssize_t g0, int group, int qmin,
                               int qmax, block_sizes *sz) {
    const char *why = check_block(1, n, k, group, qmin, qmax, sz);
    if (why != NULL) return why;
    if (g0 < 0 || g0 >= k || g0 % group != 0)
        return "group_values/group_columns: g0 must be a group start below k";
    return NULL;
}

static PyObject *group_values(PyObject *self, PyObject *args) {
    Py_buffer w, failed, reason, v;
    Py_ssize_t n, k, g0;
    int group, qmax;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nnniiw*w*w*", &w, &n, &k, &g0, &group, &qmax, &failed,
                          &reason, &v))
        return NULL;
    block_sizes sz;
    const char *why = check_group(n, k, g0, group, -1, qmax, &sz);
    Py_ssize_t width = 0, wbytes = 0, vbytes = 0;
    if (why == NULL) {
        width = g0 + group < k ? group : k - g0;
        if (!mul_size(sz.cells, 8, &wbytes) || !mul_size(n, width, &vbytes) ||
            !mul_size(vbytes, 4, &vbytes))
            why = BLOCK_OVERFLOWS;
    }
    const char *size_msg = "group_values: need w [n, k] float64, failed [n] int64, reason [n] "
                           "int8 and v [n, width] uint32, aligned";
    if (why == NULL) why = check_len(&w, wbytes, 8, size_msg);
    if (why == NULL) why = check_len(&failed, 8 * n, 8, size_msg);
    if (why == NULL) why = check_len(&reason, n, 1, size_msg);
    if (why == NULL) why = check_len(&v, vbytes, 4, size_msg);
    if (why == NULL) {
        Py_BEGIN_ALLOW_THREADS
        values_block((const double *)w.buf, n, k, g0, width, qmax, (int64_t *)failed.buf,
                     (int8_t *)reason.buf, (uint32_t *)v.buf);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&w); PyBuffer_Release(&failed); PyBuffer_Release(&reason);
    PyBuffer_Release(&v);
    if (why != NULL) {
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *group_columns(PyObject *self, PyObject *args) {
    Py_buffer w, factor, scales, codes, failed, reason, trace = {0};
    PyObject *trace_obj = Py_None;
    Py_ssize_t n, k, block, g0;
    int group, qmin, qmax;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*nny*nniiiy*w*w*w*|O", &w, &n, &k, &factor, &block, &g0,
                          &group, &qmin, &qmax, &scales, &codes, &failed, &reason, &trace_obj))
        return NULL;
    const int have_t = trace_obj != Py_None;
    if (have_t &&
        PyObject_GetBuffer(trace_obj, &trace, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&w); PyBuffer_Release(&factor); PyBuffer_Release(&scales);
        PyBuffer_Release(&codes); PyBuffer_Release(&failed); PyBuffer_Release(&reason);
        return NULL;
    }
    block_sizes sz;
    const char *why = check_group(n, k, g0, group, qmin, qmax, &sz);
    Py_ssize_t wbytes = 0, fbytes = 0;
    if (why == NULL && (block <= 0 || block % group != 0))
        why = "group_columns: block must be a positive multiple of group";
    if (why == NULL &&
        (!mul_size(sz.cells, 8, &wbytes) || !mul_size(k, block, &fbytes) ||
         !mul_size(fbytes, 4, &fbytes)))
        why = BLOCK_OVERFLOWS;
    const char *size_msg = "group_columns: need w [n, k] float64, factor [k, block] binary32 "
                           "words, scales [n] uint16, codes [n, k] int8, failed [n] int64, "
                           "reason [n] int8 and trace [n, k] float64 or None, aligned";
    if (why == NULL) why = check_len(&w, wbytes, 8, size_msg);
    if (why == NULL) why = check_len(&factor, fbytes, 4, size_msg);
    if (why == NULL) why = check_len(&scales, 2 * n, 2, size_msg);
    if (why == NULL) why = check_len(&codes, sz.cells, 1, size_msg);
    if (why == NULL) why = check_len(&failed, 8 * n, 8, size_msg);
    if (why == NULL) why = check_len(&reason, n, 1, size_msg);
    if (why == NULL && have_t) why = check_len(&trace, wbytes, 8, size_msg);
    /* Scratch (allocated with the GIL, as PyMem_Malloc requires): the group's e per row. */
    double *e = NULL;
    int no_memory = 0;
    if (why == NULL) {
        e = (double *)PyMem_Malloc((size_t)group * TILE * sizeof(double));
        no_memory = e == NULL;
    }
    if (why == NULL && !no_memory) {
        Py_BEGIN_ALLOW_THREADS
        columns_block((double *)w.buf, n, k, (const uint32_t *)factor.buf, block, g0, group,
                      qmin, qmax, (const uint16_t *)scales.buf, (int8_t *)codes.buf,
                      (int64_t *)failed.buf, (int8_t *)reason.buf,
                      have_t ? (double *)trace.buf : NULL, e);
        Py_END_ALLOW_THREADS
    }
    PyMem_Free(e);
    PyBuffer_Release(&w); PyBuffer_Release(&factor); PyBuffer_Release(&scales);
    PyBuffer_Release(&codes); PyBuffer_Release(&failed); PyBuffer_Release(&reason);
    if (have_t) PyBuffer_Release(&trace);
    if (no_memory) return PyErr_NoMemory();
    if (why != NULL) {
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"group_values", group_values, METH_VARARGS, "RN32 values of one group (see module docs)."},
    {"group_columns", group_columns, METH_VARARGS, "Columns of one group (see module docs)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_gptqkernel",
    "C kernel of block-compensated encoding (see the C source's header).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__gptqkernel(void) {
    (void)block_result; /* _encode_args.h's result builder: encode_rows' only */
    return PyModule_Create(&module);
}
