/*
 * Host kernel for the encoder profile MSE_F16_SEARCH_V1 (docs/encoder-profiles.md), with an
 * optional per-column weight vector for an importance-weighted variant of the same search.
 *
 * Contract:
 *
 *   encode_rows(words, source, n, k, group, qmin, qmax, codes, scales, weights=None,
 *               stats=None)
 *
 * encodes an [n, k] block of BF16 (source 0, uint16 words), binary32 (source 1, uint32 words)
 * or binary16 (source 2, uint16 words) values into int8 codes [n, k] and binary16 scale words
 * [n, ceil(k/group)], bit-identical to encoder/mse_reference.py when weights is None.  It
 * returns None, or the first refusal in row-major order, as _hostkernel does:
 * ("nonfinite", row, column) or ("overflow", row, group, raw_scale) (the canonical profile's
 * refusals; the caller words the error).  weights, when given, is k binary32 words (one per
 * column, finite and >= 0, else ValueError); each squared difference is then multiplied by
 * its column's weight before it is added (below).  The GIL is released for the whole block,
 * so two threads encode two blocks at once.  stats, when given, is three float64 that receive
 * verify's error statistics of the block from the same pass, as _hostkernel returns them:
 * (max |e|, sum e^2, sum x^2) with e = x - s * q of the chosen scale, exact in binary64 (s * q
 * is an 8-bit integer times an 11-bit significand, and x and s * q lie within a small factor of
 * each other unless q = 0, where e = x); the sums are sequential binary64 additions in row
 * and index order (statistics, not checks; reproducible, not bit-specified).  Written only
 * when no value is refused.
 *
 *   group_errors(x, scales, qmin, qmax, out, weights=None)
 *
 * is the error of one group (binary32 words x, finite) for each binary16 scale word in scales
 * (finite, > 0), written to out (float64), computed by the same code as the search: a test
 * hook for comparing the error sums themselves with the exact reference, as is
 * f64_to_f16_words(values, out) for the binary16 rounding of the candidates, and
 * lane_width([w]) for running the search with 4- or 8-lane vectors (below).
 *
 * The error of a candidate scale s (docs/encoder-profiles.md "Error of a candidate"): acc = +0;
 * for i = 0, 1, ... in index order: d = RN64(x[i] - s * code[i]), t = RN64(d * d), [weighted:
 * u = RN64(w[col] * t), with w the exact binary64 widening of the binary32 weight], acc =
 * RN64(acc + t or u).  Without weights the multiply is skipped, not done by 1.0.
 *
 * Why the arithmetic is exactly the document's:
 *
 * - C double arithmetic is IEEE binary64 with FLT_EVAL_METHOD 0 (SSE2/AVX, no x87 excess
 *   precision: checked below), round to nearest even.  The build passes -ffp-contract=off and
 *   never -ffast-math (refused below), so each `*`, `/`, `+`, `-` is one correctly rounded
 *   operation and nothing is fused into an FMA or reassociated (tests/test_encoder_mse_native.py
 *   disassembles the module and fails on any FMA instruction).
 * - Candidate scales: binary64(amax) * 32 is exact; the division by the integer qmax * c (or
 *   |qmin|) is one binary64 rounding, which never lands on or crosses a binary16 rounding
 *   boundary (the document's "Why the numpy backend is exact" proves it), and f64_to_f16_rne
 *   below is one correct RNE rounding on the bits, so the result is the single rounding of the
 *   exact rational.  Candidate 0 is Section 7's binary32 division amax / qmax, then the same
 *   conversion (binary32 -> binary64 is exact, so converting from binary64 rounds the same).
 * - Codes: y = RN64(x / s) with a true division.  By the document's argument the binary64
 *   quotient is never moved onto or across a half-integer below 2^9, so clamping y to
 *   [qmin, qmax] and rounding it half to even with the 1.5 * 2^52 trick ((y + M) - M, exact
 *   for |y| < 2^51, and |y| <= 128 after the clamp) gives clamp(round_half_even(x / s)):
 *   rounding is monotone and the bounds are integers, so clamping before or after is the same.
 * - s * code is exact (an integer of at most 8 bits times an 11-bit significand), and so is
 *   the document's r.  Each error step is then one binary64 operation as written.  Binary64
 *   neither overflows nor underflows here (the document's bounds; a weight below 2^128 adds at
 *   most 128 to the exponents, and a weighted product below 2^-1074 could only come from a
 *   weight below 2^-776, which binary32 does not have).
 *
 * Vectorised across candidates: one group is read once, and for each value every one of the 14
 * candidates (padded to LANES with copies of candidate 0, which never win a tie against it) is
 * advanced by the same statements, eight or four lanes to a vector (GCC vector extensions, so
 * the vector code does not depend on the auto-vectoriser; the width is picked at load time).
 * Each lane is its own sequential sum in index order; the lanes never mix.
 *
 * The search multiplies by r = RN64(1 / s) instead of dividing (the division was three
 * quarters of the time), and that changes no error sum.  y = RN64(x * r) is within a relative
 * 2^-52 of x / s, while a half-integer h (|h| < 2^8 is all the clamp leaves) that x / s is
 * not equal to is at least a relative 2^-24 away from it: x / s - h = (x - h s) / s, and
 * x - h s is a nonzero multiple of 2^min(ex, es - 1) (ex, es: the exponents of the last
 * significand bits of x and s), so |x / s - h| / |x / s| >= 2^min(ex, es - 1) / |x|, and |x| <
 * 2^(ex + 24), |x| < 2^9 s < 2^(es + 20).  So y lies on the same side of every such h as
 * x / s, and clamp-then-round-half-even gives the document's code, except where x / s is a
 * half-integer exactly: then y may round to the other neighbour, but both neighbours leave
 * |x - s * code| = s / 2, so d * d, and every sum after it, is the same.  The codes that are
 * stored come from the final pass of encode_group, with the true division.  (Multiplying and
 * correcting every code to the right neighbour was measured slower than the division: the
 * correction is what cost.)  Replacing the division by a binary32 division was exact too and
 * slower (79 against 102 M values/s), so was an 8-lane binary32 one (the widening of the codes
 * back to binary64 costs more than the cheaper division saves).
 *
 * Duplicate candidate words are evaluated anyway (their lanes are free in the vector) and lose
 * the tie to the earlier index, as the document's choice rule says.
 *
 * Arguments are checked before anything is read (sizes with overflow-checked multiplication;
 * -128 <= qmin < 0 < qmax <= 127; the checks _hostkernel.c makes too are _encode_args.h's);
 * an input not aligned to its word size is copied to an aligned block first; the scales output
 * must be aligned (ValueError).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <stdint.h>
#include <string.h>

#include "_encode_args.h"
#include "_ieee.h"

#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__) ||   \
    defined(__RECIPROCAL_MATH__) || defined(__ASSOCIATIVE_MATH__) || defined(__NO_SIGNED_ZEROS__)
#error "_msekernel needs IEEE arithmetic: build without -ffast-math or its parts"
#endif
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "_msekernel needs FLT_EVAL_METHOD == 0 (binary64 evaluated as binary64, no x87)"
#endif

#define LANES 16      /* candidates evaluated together: 14 used, 2 copies of candidate 0 */
#define CANDIDATES 14 /* candidate 0 (canonical), 1 (|qmin|), 2..13 (c = 29..40) */

/* Round half to even of |y| < 2^51: adding and removing 1.5 * 2^52 leaves the integer that
 * the addition rounded to (one RNE rounding; the subtraction is exact). */
static const double MAGIC = 0x1.8p+52; /* 6755399441055744 */

/* binary64 -> binary16, round to nearest, ties to even; finite non-negative input. */
static uint16_t f64_to_f16_rne(double v) {
    if (v >= 0x1.ffep+15) return F16_INF; /* 65520, halfway above 65504, and beyond: +inf */
    if (v >= 0x1p-14) { /* >= 2^-14 (6.103515625e-05): a normal binary16 */
        /* Rebias the exponent (1023 - 15 = 1008) and round away the low 42 fraction bits:
         * adding 2^41 - 1 plus the last kept bit carries exactly when the dropped part is
         * above half, or equal to half with an odd kept part; a carry may bump the exponent
         * (to 0x7C00 only from at or above 65520, handled above). */
        uint64_t r = bits_from_f64(v) - ((uint64_t)1008 << 52);
        return (uint16_t)((r + (((uint64_t)1 << 41) - 1) + ((r >> 42) & 1)) >> 42);
    }
    /* Subnormal range: v * 2^24 (exact, a power of two) is below 1024; its RNE integer is the
     * word (1024 is the smallest normal 0x0400, encoded by the same bits). */
    return (uint16_t)((v * 0x1p+24 + MAGIC) - MAGIC); /* 2^24 = 16777216 */
}

/* Exact binary16 -> binary64 of a finite non-negative word. */
static inline double f16_to_f64(uint16_t h) {
    uint32_t e = (uint32_t)(h >> 10) & 0x1Fu, f = h & F16_FRAC;
    if (e == 0) return (double)f * 0x1p-24; /* f * 2^-24 (5.9604644775390625e-08), exact */
    return f64_from_bits(((uint64_t)(e + 1008) << 52) | ((uint64_t)f << 42));
}

/* Exact binary16 word (any sign, finite) -> binary64. */
static inline double f16w_to_f64(uint16_t h) {
    double m = f16_to_f64((uint16_t)(h & F16_MAG));
    return (h & F16_SIGN) ? -m : m;
}

/* GCC vector extensions: W binary64 lanes per vector, LANES / W vectors per group.  W = 8
 * (one AVX-512 register) where the CPU has x86-64-v4, else W = 4 (one AVX2 register, or two
 * SSE2 ones): 8-lane vectors are faster with AVX-512 but several times slower where GCC has to
 * split them for AVX2, so each width is compiled only for the targets it suits and picked at
 * load time (PyInit).  A comparison gives an all-ones / all-zeros lane mask; SEL picks by mask
 * on the bits (a macro: no vector ABI). */
typedef double vd4 __attribute__((vector_size(32)));
typedef int64_t vi4 __attribute__((vector_size(32)));
typedef double vd8 __attribute__((vector_size(64)));
typedef int64_t vi8 __attribute__((vector_size(64)));
#define SEL(VI, VD, m, a, b) ((VD)(((VI)(a) & (m)) | ((VI)(b) & ~(m))))

/* The error of every lane's scale s[l] over the group's n values x (binary64, exact copies of
 * binary32 values), weighted by w[i] when `weighted`: out[l] = acc as documented above.  Every
 * lane runs the document's statements for its own scale, in index order i = 0, 1, ...; the
 * vector only puts W such sequential sums side by side, so the width changes no operation. */
#define DEFINE_LANE_ERRORS_IMPL(NAME, VD, VI, W)                                             \
    static inline __attribute__((always_inline)) void NAME(                                  \
        const double *x, const double *w, Py_ssize_t n, const double *s, double lo,          \
        double hi, double *out, const int weighted) {                                        \
        enum { NV = LANES / (W) };                                                           \
        VD acc[NV], sv[NV], rv[NV];                                                          \
        const VD zero = {0};                                                                 \
        const VD magic = zero + MAGIC, lov = zero + lo, hiv = zero + hi;                     \
        for (int v = 0; v < NV; v++) {                                                       \
            memcpy(&sv[v], s + v * (W), sizeof sv[v]);                                       \
            rv[v] = (zero + 1.0) / sv[v]; /* RN64(1 / s), once per group */                  \
            acc[v] = zero;                /* +0 */                                           \
        }                                                                                    \
        for (Py_ssize_t i = 0; i < n; i++) {                                                 \
            const VD xv = zero + x[i];                                                       \
            const VD wv = zero + (weighted ? w[i] : 1.0);                                    \
            for (int v = 0; v < NV; v++) {                                                   \
                VD y = xv * rv[v];             /* a half-integer's side only (above) */      \
                y = SEL(VI, VD, y < lov, lov, y); /* clamp to [qmin, qmax] ... */            \
                y = SEL(VI, VD, y > hiv, hiv, y);                                            \
                const VD c = (y + magic) - magic; /* ... and round half to even */           \
                const VD d = xv - c * sv[v];   /* c * s exact; d = RN64(x - r) */            \
                VD t = d * d;                  /* t = RN64(d * d) */                         \
                if (weighted) t = wv * t;      /* u = RN64(w * t) */                         \
                acc[v] = acc[v] + t;           /* acc = RN64(acc + t) */                     \
            }                                                                                \
        }                                                                                    \
        for (int v = 0; v < NV; v++) memcpy(out + v * (W), &acc[v], sizeof acc[v]);         \
    }

DEFINE_LANE_ERRORS_IMPL(lane_errors_impl4, vd4, vi4, 4)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HAVE_V4 1
#define CLONES __attribute__((target_clones("avx2", "default")))
DEFINE_LANE_ERRORS_IMPL(lane_errors_impl8, vd8, vi8, 8)
/* Compiled for x86-64-v4 only, called only where PyInit found it (contraction stays off). */
__attribute__((target("arch=x86-64-v4"))) static void lane_errors8(
    const double *x, Py_ssize_t n, const double *s, double lo, double hi, double *out) {
    lane_errors_impl8(x, NULL, n, s, lo, hi, out, 0);
}
__attribute__((target("arch=x86-64-v4"))) static void lane_errors_w8(
    const double *x, const double *w, Py_ssize_t n, const double *s, double lo, double hi,
    double *out) {
    lane_errors_impl8(x, w, n, s, lo, hi, out, 1);
}
#else
#define HAVE_V4 0
#define CLONES
#endif
static int use_v4 = 0; /* set once by PyInit, before any call */

/* Two 4-lane copies (unweighted, weighted), each compiled for AVX2 and baseline x86-64 and
 * picked at load time: wider vectors change no operation (contraction stays off). */
CLONES static void lane_errors(const double *x, Py_ssize_t n, const double *s, double lo,
                               double hi, double *out) {
    lane_errors_impl4(x, NULL, n, s, lo, hi, out, 0);
}
CLONES static void lane_errors_w(const double *x, const double *w, Py_ssize_t n,
                                 const double *s, double lo, double hi, double *out) {
    lane_errors_impl4(x, w, n, s, lo, hi, out, 1);
}

static void errors_for(const double *x, const double *w, Py_ssize_t n, const double *s,
                       double lo, double hi, double *out) {
#if HAVE_V4
    if (use_v4) {
        if (w == NULL) lane_errors8(x, n, s, lo, hi, out);
        else lane_errors_w8(x, w, n, s, lo, hi, out);
        return;
    }
#endif
    if (w == NULL) lane_errors(x, n, s, lo, hi, out);
    else lane_errors_w(x, w, n, s, lo, hi, out);
}

/* One finite group x[0..n) whose largest magnitude is the binary32 amaxf > 0.  Writes the
 * chosen scale word and codes; returns 2 (and the raw binary32 scale) where the canonical
 * scale overflows binary16, else 0. */
static int encode_group(const double *x, const double *w, Py_ssize_t n, float amaxf, int qmin,
                        int qmax, uint16_t *scale_out, int8_t *codes, float *raw_out,
                        double *st) {
    const float raw = amaxf / (float)qmax; /* Section 7: one binary32 division */
    uint16_t s16[CANDIDATES];
    s16[0] = f64_to_f16_rne((double)raw);
    if (s16[0] == 0) s16[0] = 1; /* the 2^-24 rescue */
    if (s16[0] == F16_INF) { *raw_out = raw; return 2; }
    const double amax = (double)amaxf;
    s16[1] = f64_to_f16_rne(amax / (double)(-qmin));
    for (int j = 2; j < CANDIDATES; j++)
        s16[j] = f64_to_f16_rne((amax * 32.0) / (double)(qmax * (27 + j))); /* c = 29..40 */
    double s[LANES];
    int usable[CANDIDATES];
    const double s0 = f16_to_f64(s16[0]);
    for (int j = 0; j < CANDIDATES; j++) {
        if (s16[j] == 0) s16[j] = 1;
        usable[j] = s16[j] != F16_INF;
        s[j] = usable[j] ? f16_to_f64(s16[j]) : s0; /* an infinite candidate is never chosen */
    }
    for (int l = CANDIDATES; l < LANES; l++) s[l] = s0;
    double err[LANES];
    const double lo = (double)qmin, hi = (double)qmax;
    errors_for(x, w, n, s, lo, hi, err);
    int best = 0;
    for (int j = 1; j < CANDIDATES; j++)
        if (usable[j] && err[j] < err[best]) best = j; /* strict: the smallest index wins ties */
    const double sb = s[best];
    for (Py_ssize_t i = 0; i < n; i++) {
        double y = x[i] / sb;
        y = y < lo ? lo : y;
        y = y > hi ? hi : y;
        codes[i] = (int8_t)((y + MAGIC) - MAGIC);
    }
    if (st != NULL) { /* verify's statistics: e = x - s * q is exact (see the contract) */
        double m = st[0], se = st[1], sx = st[2];
        for (Py_ssize_t i = 0; i < n; i++) {
            const double e = x[i] - (double)codes[i] * sb, ae = e < 0 ? -e : e;
            m = ae > m ? ae : m;
            se = se + e * e;
            sx = sx + x[i] * x[i];
        }
        st[0] = m; st[1] = se; st[2] = sx;
    }
    *scale_out = s16[best];
    return 0;
}

/* The whole block, without the GIL.  xd: `group` doubles of scratch; wd: k widened weights or
 * NULL.  Returns 0, 1 (non-finite at bad_row, bad_col) or 2 (overflow at bad_row, group
 * bad_col, raw scale bad_raw). */
static int encode_block(const void *wbuf, int source, Py_ssize_t n, Py_ssize_t k, int group,
                        Py_ssize_t groups, int qmin, int qmax, const double *wd, double *xd,
                        int8_t *out, uint16_t *sc, Py_ssize_t *bad_row, Py_ssize_t *bad_col,
                        float *bad_raw, double *st) {
    const uint16_t *w16 = (const uint16_t *)wbuf;
    const uint32_t *w32 = (const uint32_t *)wbuf;
    for (Py_ssize_t r = 0; r < n; r++) {
        for (Py_ssize_t g = 0; g < groups; g++) {
            const Py_ssize_t a = g * group, b = a + group < k ? a + group : k;
            /* Sign-cleared words: unsigned order is the order of |x|, inf/NaN above all. */
            uint32_t amax_bits = 0; /* binary32 bits of the largest |x| */
            if (source == 1) {
                const uint32_t *p = w32 + r * k;
                uint32_t m = 0;
                for (Py_ssize_t i = a; i < b; i++) {
                    uint32_t v = p[i] & F32_MAG;
                    m = v > m ? v : m;
                    xd[i - a] = (double)f32_from_bits(p[i]);
                }
                if (m >= F32_EXP) {
                    for (Py_ssize_t i = a; i < b; i++)
                        if ((p[i] & F32_EXP) == F32_EXP) { *bad_col = i; break; }
                    *bad_row = r;
                    return 1;
                }
                amax_bits = m;
            } else {
                const uint16_t *p = w16 + r * k;
                const uint32_t inf = source == 0 ? BF16_EXP : F16_EXP;
                uint32_t m = 0;
                for (Py_ssize_t i = a; i < b; i++) {
                    uint32_t v = p[i] & BF16_MAG; /* = F16_MAG */
                    m = v > m ? v : m;
                }
                if (m >= inf) {
                    for (Py_ssize_t i = a; i < b; i++)
                        if ((p[i] & inf) == inf) { *bad_col = i; break; }
                    *bad_row = r;
                    return 1;
                }
                if (source == 0) {
                    for (Py_ssize_t i = a; i < b; i++)
                        xd[i - a] = (double)f32_from_bits((uint32_t)p[i] << 16);
                    amax_bits = m << 16;
                } else {
                    for (Py_ssize_t i = a; i < b; i++) xd[i - a] = f16w_to_f64(p[i]);
                    double am = f16_to_f64((uint16_t)m);
                    float amf = (float)am; /* exact: binary16 values are binary32 values */
                    memcpy(&amax_bits, &amf, 4);
                }
            }
            int8_t *c = out + r * k + a;
            if (amax_bits == 0) { /* all-zero group: +0 scale, zero codes, zero error */
                sc[r * groups + g] = 0;
                memset(c, 0, (size_t)(b - a));
                continue;
            }
            float raw = 0.0f;
            if (encode_group(xd, wd != NULL ? wd + a : NULL, b - a, f32_from_bits(amax_bits),
                             qmin, qmax, &sc[r * groups + g], c, &raw, st)) {
                *bad_row = r; *bad_col = g; *bad_raw = raw;
                return 2;
            }
        }
    }
    return 0;
}

/* k binary32 weight words -> binary64 (exact), or a message when one is not finite and >= 0. */
static const char *widen_weights(const Py_buffer *wb, Py_ssize_t k, double *wd) {
    const unsigned char *p = (const unsigned char *)wb->buf;
    for (Py_ssize_t i = 0; i < k; i++) {
        uint32_t u;
        memcpy(&u, p + 4 * i, 4);
        if ((u & F32_EXP) == F32_EXP || ((u >> 31) && u != F32_SIGN))
            return "encode_rows: every weight must be a finite binary32 word >= 0";
        wd[i] = (double)f32_from_bits(u);
    }
    return NULL;
}

static PyObject *encode_rows(PyObject *self, PyObject *args) {
    Py_buffer words, codes, scales, weights = {0}, stats = {0};
    PyObject *weights_obj = Py_None, *stats_obj = Py_None;
    int source, group, qmin, qmax;
    Py_ssize_t n, k;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*innii" "iw*w*|OO", &words, &source, &n, &k, &group, &qmin,
                          &qmax, &codes, &scales, &weights_obj, &stats_obj))
        return NULL;
    const int have_w = weights_obj != Py_None;
    if (have_w && PyObject_GetBuffer(weights_obj, &weights, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&words); PyBuffer_Release(&codes); PyBuffer_Release(&scales);
        return NULL;
    }
    const int have_st = stats_obj != Py_None;
    if (have_st &&
        PyObject_GetBuffer(stats_obj, &stats, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&words); PyBuffer_Release(&codes); PyBuffer_Release(&scales);
        if (have_w) PyBuffer_Release(&weights);
        return NULL;
    }
    block_sizes b;
    Py_ssize_t kbytes = 0;
    const char *why = check_block(source, n, k, group, qmin, qmax, &b);
    if (why == NULL) {
        if (!mul_size(k, 8, &kbytes))
            why = BLOCK_OVERFLOWS;
        else if (words.len < b.wbytes || codes.len < b.cells || scales.len < b.sbytes ||
                 (have_w && weights.len != 4 * k))
            why = "encode_rows: inconsistent buffer sizes (weights: k binary32 words)";
        else if ((uintptr_t)scales.buf % sizeof(uint16_t) != 0)
            why = "encode_rows: the scales buffer must be aligned to its words";
        else if (have_st && stats.len != 3 * (Py_ssize_t)sizeof(double))
            why = "encode_rows: stats must be three float64 (or None)";
    }
    /* Scratch (allocated with the GIL, as PyMem_Malloc requires): one group of values, the
     * widened weights, and an aligned copy of a misaligned input. */
    double *xd = NULL, *wd = NULL;
    void *aligned = NULL;
    if (why == NULL) {
        xd = (double *)PyMem_Malloc((size_t)group * sizeof(double));
        wd = have_w ? (double *)PyMem_Malloc((size_t)k * sizeof(double)) : NULL;
        if ((uintptr_t)words.buf % (uintptr_t)b.wsize != 0)
            aligned = PyMem_Malloc(b.wbytes > 0 ? (size_t)b.wbytes : 1);
        if (xd == NULL || (have_w && wd == NULL) ||
            ((uintptr_t)words.buf % (uintptr_t)b.wsize != 0 && aligned == NULL)) {
            PyMem_Free(xd); PyMem_Free(wd); PyMem_Free(aligned);
            PyBuffer_Release(&words); PyBuffer_Release(&codes); PyBuffer_Release(&scales);
            if (have_w) PyBuffer_Release(&weights);
            if (have_st) PyBuffer_Release(&stats);
            return PyErr_NoMemory();
        }
        if (have_w) why = widen_weights(&weights, k, wd);
    }
    if (why != NULL) {
        PyMem_Free(xd); PyMem_Free(wd); PyMem_Free(aligned);
        PyBuffer_Release(&words); PyBuffer_Release(&codes); PyBuffer_Release(&scales);
        if (have_w) PyBuffer_Release(&weights);
        if (have_st) PyBuffer_Release(&stats);
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    const void *wbuf = words.buf;
    if (aligned != NULL) {
        memcpy(aligned, words.buf, (size_t)b.wbytes);
        wbuf = aligned;
    }
    int kind;
    Py_ssize_t bad_row = 0, bad_col = 0;
    float bad_raw = 0.0f;
    double st[3] = {0.0, 0.0, 0.0};
    Py_BEGIN_ALLOW_THREADS
    kind = encode_block(wbuf, source, n, k, group, b.groups, qmin, qmax, wd, xd,
                        (int8_t *)codes.buf, (uint16_t *)scales.buf, &bad_row, &bad_col,
                        &bad_raw, have_st ? st : NULL);
    Py_END_ALLOW_THREADS
    if (have_st && kind == 0) memcpy(stats.buf, st, sizeof st);
    PyMem_Free(xd); PyMem_Free(wd); PyMem_Free(aligned);
    PyBuffer_Release(&words); PyBuffer_Release(&codes); PyBuffer_Release(&scales);
    if (have_w) PyBuffer_Release(&weights);
    if (have_st) PyBuffer_Release(&stats);
    return block_result(kind, bad_row, bad_col, bad_raw);
}

static PyObject *group_errors(PyObject *self, PyObject *args) {
    Py_buffer x, scales, out, weights = {0};
    PyObject *weights_obj = Py_None;
    int qmin, qmax;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*iiw*|O", &x, &scales, &qmin, &qmax, &out, &weights_obj))
        return NULL;
    const int have_w = weights_obj != Py_None;
    if (have_w && PyObject_GetBuffer(weights_obj, &weights, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&x); PyBuffer_Release(&scales); PyBuffer_Release(&out);
        return NULL;
    }
    const Py_ssize_t n = x.len / 4, m = scales.len / 2;
    const char *why = NULL;
    double *xd = NULL, *wd = NULL;
    if (x.len % 4 || scales.len % 2 || out.len != 8 * m || n < 1 || (have_w && weights.len != 4 * n))
        why = "group_errors: need n >= 1 binary32 values, m scale words, m float64 outputs "
              "and n weights";
    else if (qmin < -128 || qmin >= 0 || qmax <= 0 || qmax > 127)
        why = "group_errors: need -128 <= qmin < 0 < qmax <= 127";
    else {
        xd = (double *)PyMem_Malloc((size_t)n * sizeof(double));
        wd = have_w ? (double *)PyMem_Malloc((size_t)n * sizeof(double)) : NULL;
        if (xd == NULL || (have_w && wd == NULL)) {
            PyMem_Free(xd); PyMem_Free(wd);
            PyBuffer_Release(&x); PyBuffer_Release(&scales); PyBuffer_Release(&out);
            if (have_w) PyBuffer_Release(&weights);
            return PyErr_NoMemory();
        }
        for (Py_ssize_t i = 0; i < n && why == NULL; i++) {
            uint32_t u;
            memcpy(&u, (const unsigned char *)x.buf + 4 * i, 4);
            if ((u & F32_EXP) == F32_EXP) why = "group_errors: values must be finite";
            xd[i] = (double)f32_from_bits(u);
        }
        for (Py_ssize_t j = 0; j < m && why == NULL; j++) {
            uint16_t h;
            memcpy(&h, (const unsigned char *)scales.buf + 2 * j, 2);
            if (h == 0 || h >= F16_INF) why = "group_errors: scales must be finite and > 0";
        }
        if (have_w && why == NULL) {
            why = widen_weights(&weights, n, wd);
            if (why != NULL) why = "group_errors: every weight must be a finite binary32 word >= 0";
        }
    }
    if (why == NULL) {
        double s[LANES], err[LANES];
        for (Py_ssize_t j0 = 0; j0 < m; j0 += LANES) {
            for (int l = 0; l < LANES; l++) {
                uint16_t h;
                memcpy(&h, (const unsigned char *)scales.buf + 2 * (j0 + (j0 + l < m ? l : 0)), 2);
                s[l] = f16_to_f64(h);
            }
            errors_for(xd, wd, n, s, (double)qmin, (double)qmax, err);
            for (int l = 0; l < LANES && j0 + l < m; l++)
                memcpy((unsigned char *)out.buf + 8 * (j0 + l), &err[l], 8);
        }
    }
    PyMem_Free(xd); PyMem_Free(wd);
    PyBuffer_Release(&x); PyBuffer_Release(&scales); PyBuffer_Release(&out);
    if (have_w) PyBuffer_Release(&weights);
    if (why != NULL) {
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *f64_to_f16_words(PyObject *self, PyObject *args) {
    /* Test hook: finite non-negative binary64 values -> binary16 words, the kernel's rounding. */
    Py_buffer in, out;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*", &in, &out)) return NULL;
    const Py_ssize_t count = in.len / 8;
    const char *why = NULL;
    if (in.len % 8 || out.len != 2 * count) why = "f64_to_f16_words: need n float64 and n uint16";
    for (Py_ssize_t i = 0; i < count && why == NULL; i++) {
        double v;
        memcpy(&v, (const unsigned char *)in.buf + 8 * i, 8);
        if (!(v >= 0.0 && v <= DBL_MAX)) {
            why = "f64_to_f16_words: values must be finite and >= 0";
            break;
        }
        uint16_t h = f64_to_f16_rne(v);
        memcpy((unsigned char *)out.buf + 2 * i, &h, 2);
    }
    PyBuffer_Release(&in); PyBuffer_Release(&out);
    if (why != NULL) {
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Test hook: lane_width() is the search's vector width (8 or 4); lane_width(w) selects it
 * (8 only where the CPU has x86-64-v4), so the tests run both widths on one machine.  Not for
 * use while another thread encodes. */
static PyObject *lane_width(PyObject *self, PyObject *args) {
    int want = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "|i", &want)) return NULL;
    if (want != 0) {
        int ok = want == 4;
#if HAVE_V4
        if (want == 8 && __builtin_cpu_supports("x86-64-v4")) ok = 1;
#endif
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "lane_width: 4, or 8 where the CPU has x86-64-v4");
            return NULL;
        }
        use_v4 = want == 8;
    }
    return PyLong_FromLong(use_v4 ? 8 : 4);
}

static PyMethodDef methods[] = {
    {"lane_width", lane_width, METH_VARARGS, "The search's vector width; sets it (test hook)."},
    {"encode_rows", encode_rows, METH_VARARGS, "Encode a block of rows (see module docs)."},
    {"group_errors", group_errors, METH_VARARGS, "Errors of one group for given scales (test hook)."},
    {"f64_to_f16_words", f64_to_f16_words, METH_VARARGS, "binary64 -> binary16 RNE (test hook)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_msekernel",
    "Host kernel for MSE_F16_SEARCH_V1 (see the C source's header).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__msekernel(void) {
#if HAVE_V4
    __builtin_cpu_init();
    use_v4 = __builtin_cpu_supports("x86-64-v4") != 0;
#endif
    return PyModule_Create(&module);
}
