/*
 * Single-pass host kernel for MAXABS_F16_RECIP_RNE_V1 (spec Section 7).
 *
 * Contract: encode_rows(words, source, n, k, group, qmin, qmax, codes, scales) encodes an
 * [n, k] block of BF16 (source 0, uint16 words), binary32 (source 1, uint32 words) or binary16
 * (source 2, uint16 words) values into int8 codes [n, k] and binary16 scale words
 * [n, ceil(k/group)], bit-identical to the oracle in encoder/oracle.py.  A binary16 row is
 * widened exactly to binary32 (w_f16_to_f32, every word tested) into a one-row buffer that
 * stays in L1, then encoded as binary32: one pass over the source, no block-sized copy.  It
 * returns None, or a tuple describing the first refusal in row-major order: ("nonfinite", row,
 * column) or ("overflow", row, group, raw_scale).
 *
 * Why the arithmetic is exactly Section 7: on x86-64 (and AArch64) C float arithmetic is
 * IEEE binary32 with FLT_EVAL_METHOD 0 (SSE/NEON, no x87 excess precision); the build passes
 * -ffp-contract=off and never -ffast-math, so `a / b` and `a * b` are each one correctly
 * rounded operation in the default round-to-nearest-even mode and nothing is fused or
 * reassociated.  The two conversions the spec needs are written out on the bits below
 * (binary32 -> binary16 RNE with subnormals and overflow; binary16 -> binary32 exact), and the
 * integral rounding uses the 1.5 * 2^23 trick, exact for |q| < 2^22 (q is already clamped).
 * The GIL is released for the whole block, so two threads encode two blocks at once.
 *
 * The build refuses (#error, so the optional extension is skipped and the numpy path runs) a
 * compiler that would break that arithmetic: -ffast-math or its parts that GCC announces
 * (__FAST_MATH__, __FINITE_MATH_ONLY__, __RECIPROCAL_MATH__ -- which would turn `amax / qmax`
 * into a multiplication --, __ASSOCIATIVE_MATH__, __NO_SIGNED_ZEROS__), or excess precision
 * (FLT_EVAL_METHOD != 0, e.g. x87 -mfpmath=387).
 *
 * Arguments are checked before anything is read: 1 <= group, 0 <= n, 1 <= k, source 0-2,
 * -128 <= qmin < 0 < qmax <= 127 (codes are int8, and the clamp bounds must be exact floats),
 * and every buffer size is computed with overflow-checked multiplication (no signed
 * overflow); the checks _msekernel.c makes too are _encode_args.h's.  The input may sit at
 * any address (a BF16 tensor at an odd offset of a memory mapped file): an input not aligned
 * to its word size is copied to an aligned scratch block first, so every typed access below
 * is aligned; the outputs must be aligned (ValueError).
 *
 * With a `stats` buffer (three float64, or None) the same pass also returns verify's error
 * statistics of the block: (max |e|, sum e^2, sum x^2) with e = x - s32 * q, the exact
 * reconstruction error of every value (s32 * q is exact: an 8-bit integer times an 11-bit
 * significand).  The codes are computed by the same statements either way; the statistics
 * only add operations after them, in one pass over each encoded row (ROW_STATS).  Each row is
 * scaled by a power of two that brings its largest |x| to [1, 2), so that binary32 squares
 * neither underflow nor overflow; the squares are summed in LANES independent binary32
 * accumulators, added into binary64 every STATS_FLUSH steps and unscaled exactly at the end of
 * the row.  That is a fixed order of IEEE operations, so it vectorises without -ffast-math and
 * is reproducible; each binary32 partial sum is within a relative 64 x 2^-24 (4e-6) of exact.
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
#error "_hostkernel needs IEEE arithmetic: build without -ffast-math or its parts"
#endif
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "_hostkernel needs FLT_EVAL_METHOD == 0 (binary32 evaluated as binary32, no x87)"
#endif

/* binary32 -> binary16, round to nearest, ties to even; finite non-negative input. */
static uint16_t f32_to_f16_rne(float f) {
    uint32_t ax = bits_from_f32(f) & F32_MAG;
    if (ax >= 0x477FF000u) return F16_INF; /* >= 65520 = halfway above 65504: rounds to inf */
    if (ax >= 0x38800000u) {               /* >= 2^-14: a normal binary16 */
        /* Rebias the exponent (127 - 15 = 112) and round away the low 13 fraction bits:
         * adding 0xFFF plus the last kept bit carries exactly when the dropped part is above
         * half, or equal to half with an odd kept part; a carry may bump the exponent. */
        uint32_t r = ax - (112u << 23);
        return (uint16_t)((r + 0x0FFFu + ((r >> 13) & 1u)) >> 13);
    }
    uint32_t e = ax >> 23;
    if (e == 0) return 0; /* binary32 subnormals are far below half of 2^-24 */
    /* value = m * 2^(e - 150); in units of 2^-24 that is m >> (126 - e), rounded RNE. */
    uint32_t m = (ax & F32_FRAC) | (1u << 23);
    uint32_t shift = 126u - e; /* >= 14 here */
    if (shift > 24u) return 0; /* below 2^-25 (m < 2^24): rounds to zero */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q += 1u;
    return (uint16_t)q; /* q == 0x400 is the smallest normal, encoded by the same bits */
}

/* Exact powers of two: 2^k in binary32 for -149 <= k <= 127, in binary64 for |k| <= 1022. */
static inline float pow2f(int k) {
    return k >= -126 ? f32_from_bits((uint32_t)(k + 127) << 23) : f32_from_bits(1u << (k + 149));
}
static inline double pow2d(int k) {
    uint64_t u = (uint64_t)(k + 1023) << 52;
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* Exact binary16 -> binary32 for finite non-negative words. */
static float f16_to_f32(uint16_t h) {
    if ((h >> 10) == 0) return (float)h * 0x1p-24f; /* h * 2^-24 (5.9604644775390625e-08), exact */
    return f32_from_bits(((uint32_t)h << 13) + (112u << 23));
}

/* Branch-free selects (masks), so that GCC vectorises every loop below. */
static inline uint32_t pick(uint32_t cond, uint32_t a, uint32_t b) {
    uint32_t m = 0u - cond; /* cond is 0 or 1 */
    return (a & m) | (b & ~m);
}

static inline uint32_t w_f16_to_f32(uint32_t h) {
    /* The fraction and exponent move into place together (o); normals are rebiased by
     * 127 - 15, inf/NaN by twice that (exponent field 255, payload kept), and a subnormal
     * f * 2^-24 is (2^-14 + f * 2^-24) - 2^-14: one exact binary32 subtraction (both operands
     * normal, the difference representable). */
    uint32_t o = (h & F16_MAG) << 13, e = o & (F16_EXP << 13);
    uint32_t normal = o + (112u << 23), special = o + (224u << 23);
    uint32_t sub = bits_from_f32(f32_from_bits(o + (113u << 23)) - f32_from_bits(113u << 23));
    uint32_t mag = pick(e == (F16_EXP << 13), special, pick(e == 0, sub, normal));
    return mag | ((h & F16_SIGN) << 16);
}

/* One binary16 row widened to binary32 words, exactly (a row of a source-2 block). */
typedef void (*widen_fn)(const uint16_t *h, uint32_t *out, Py_ssize_t k);

static void widen_row(const uint16_t *h, uint32_t *out, Py_ssize_t k) {
    for (Py_ssize_t i = 0; i < k; i++) out[i] = w_f16_to_f32(h[i]);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
/* The same words by the F16C instruction (8 per vcvtph2ps, against about 15 operations per 8
 * in the branch-free loop above): every finite binary16 value is exact in binary32, so
 * both give the same words; they differ only on a signalling NaN (quieted here), which the
 * encoder refuses either way.  Picked at run time when the CPU has F16C. */
__attribute__((target("avx,f16c"))) static void widen_row_f16c(const uint16_t *h, uint32_t *out,
                                                              Py_ssize_t k) {
    Py_ssize_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(h + i));
        _mm256_storeu_si256((__m256i *)(void *)(out + i), _mm256_castps_si256(_mm256_cvtph_ps(v)));
    }
    for (; i < k; i++) out[i] = w_f16_to_f32(h[i]);
}

static widen_fn pick_widen(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("f16c") ? widen_row_f16c : widen_row;
}
#else
static widen_fn pick_widen(void) { return widen_row; }
#endif

/* One value of a group: multiply by the reciprocal, clamp, round half to even (|q| <= 127 after
 * the clamp, far inside the trick's exact range), store the code; then THEN (a statement that
 * may use q: QUANT_KEEP keeps the rounded code as binary32 in a row buffer for the statistics). */
#define QUANT_THEN(X, THEN)                                                                    \
    do {                                                                                       \
        float q = (X) * inv;                                                                   \
        q = q < lo ? lo : (q > hi ? hi : q);                                                   \
        q = (q + magic) - magic;                                                               \
        c[i] = (int8_t)(int)q;                                                                 \
        THEN;                                                                                  \
    } while (0)
#define QUANT(X) QUANT_THEN(X, (void)0)
#define QUANT_KEEP(X) QUANT_THEN(X, qf[i] = q)

/* Statistics of one encoded row: e = x - s32 * q for every value, from the row's rounded codes
 * (qf, binary32) and group scales (sf, binary32; 0 for an all-zero group, whose qf are 0).
 * Written with GCC vector extensions so that it is vector code without -ffast-math: every
 * lane is its own sequence of IEEE operations (no reassociation is needed), and the maximum
 * is taken on the bits of |e| (for non-negative binary32 values, integer order is numeric
 * order), which needs no NaN or signed-zero assumptions.  With G a multiple of LANES no
 * 8-value step straddles two groups; otherwise every value takes the one-lane path. */
#define LANES 8
#define STATS_FLUSH 64 /* 8-value steps summed in binary32 lanes before binary64 */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef float v4f __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));

/* acc[0..1] += the 8 binary32 lanes of V widened to binary64, one 4-lane half at a time (a
 * 64-byte vector type would be emulated through memory on AVX2). */
#define WIDEN_ADD(ACC, V)                                                                      \
    do {                                                                                       \
        v4f half_;                                                                             \
        memcpy(&half_, &(V), sizeof half_);                                                    \
        (ACC)[0] += __builtin_convertvector(half_, v4d);                                       \
        memcpy(&half_, (const char *)&(V) + sizeof half_, sizeof half_);                       \
        (ACC)[1] += __builtin_convertvector(half_, v4d);                                       \
    } while (0)

#define ROW_STATS(LOAD8, LOAD1)                                                                \
    do {                                                                                       \
        Py_ssize_t j = 0, gi = 0, gend = group;                                                \
        v8f s8 = sf[0] + (v8f){0};                                                             \
        const v8f up8 = up + (v8f){0};                                                         \
        v4d rse[2] = {{0}}, rsx[2] = {{0}};                                                    \
        const Py_ssize_t vec_end = group % LANES == 0 ? k - k % LANES : 0;                     \
        while (j < vec_end) {                                                                  \
            v8f se8 = {0}, sx8 = {0};                                                          \
            for (int step = 0; step < STATS_FLUSH && j < vec_end; step++, j += LANES) {        \
                if (j >= gend) {                                                               \
                    gi++;                                                                      \
                    gend += group;                                                             \
                    s8 = sf[gi] + (v8f){0};                                                    \
                }                                                                              \
                v8f x, q8;                                                                     \
                LOAD8;                                                                         \
                memcpy(&q8, qf + j, sizeof q8);                                                \
                v8f e = x - s8 * q8;                                                           \
                v8i ae = (v8i)e & (int32_t)F32_MAG;                                            \
                v8i more = ae > gmax;                                                          \
                gmax = (ae & more) | (gmax & ~more);                                           \
                v8f es = e * up8, xs = x * up8; /* exact: a power of two, no overflow */       \
                se8 += es * es;                                                                \
                sx8 += xs * xs;                                                                \
            }                                                                                  \
            WIDEN_ADD(rse, se8);                                                               \
            WIDEN_ADD(rsx, sx8);                                                               \
        }                                                                                      \
        for (; j < k; j++) { /* the rest, in lane 0 */                                         \
            if (j >= gend) {                                                                   \
                gi = j / group;                                                                \
                gend = (gi + 1) * group;                                                       \
            }                                                                                  \
            float x1 = LOAD1;                                                                  \
            float e1 = x1 - sf[gi] * qf[j];                                                    \
            int32_t ae1 = (int32_t)(bits_from_f32(e1) & F32_MAG);                              \
            gmax[0] = ae1 > gmax[0] ? ae1 : gmax[0];                                           \
            float es1 = e1 * up, xs1 = x1 * up;                                                \
            rse[0][0] += (double)(es1 * es1);                                                  \
            rsx[0][0] += (double)(xs1 * xs1);                                                  \
        }                                                                                      \
        for (int h_ = 0; h_ < 2; h_++) { /* undo the scaling: exact in binary64 */             \
            dse[h_] += rse[h_] * down2;                                                        \
            dsx[h_] += rsx[h_] * down2;                                                        \
        }                                                                                      \
    } while (0)

/* The whole block, without the GIL.  Compiled twice (AVX2 and baseline x86-64) and picked at
 * load time by the CPU: the vector instructions change nothing in the arithmetic, since every
 * operation is still one IEEE binary32 operation (no FMA: contraction is off). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static int encode_block(const uint16_t *w16, const uint32_t *w32, int source, Py_ssize_t n,
                        Py_ssize_t k, int group, Py_ssize_t groups, float lo, float hi,
                        float qmaxf, int8_t *out, uint16_t *sc, Py_ssize_t *bad_row_out,
                        Py_ssize_t *bad_col_out, float *bad_raw_out, double *stats, float *qf,
                        float *sf, uint32_t *wide, widen_fn widen) {
    const float magic = 0x1.8p+23f; /* 1.5 * 2^23 (12582912) */
    int kind = 0; /* 0 ok, 1 non-finite, 2 overflow */
    v8i gmax = {0}; /* bits of the largest |e| per lane */
    v4d dse[2] = {{0}}, dsx[2] = {{0}}; /* binary64 sums of squares, 8 lanes */
    Py_ssize_t bad_row = 0, bad_col = 0;
    float bad_raw = 0.0f;
    for (Py_ssize_t r = 0; r < n && !kind; r++) {
        uint32_t row_amax = 0; /* binary32 bits of the row's largest |x| */
        const uint32_t *row32 = wide; /* the row as binary32 words (sources 1 and 2) */
        if (source == 1) {
            row32 = w32 + r * k;
        } else if (source == 2) { /* binary16: widened exactly, inf/NaN stay inf/NaN */
            widen(w16 + r * k, wide, k);
        }
        for (Py_ssize_t g = 0; g < groups; g++) {
            Py_ssize_t a = g * group, b = a + group < k ? a + group : k;
            uint32_t amax_bits = 0; /* sign-cleared word: unsigned order = order of |x| */
            if (source == 0) {
                const uint16_t *p = w16 + r * k;
                int16_t m16 = 0; /* sign-cleared BF16 words fit a signed 16-bit max */
                for (Py_ssize_t i = a; i < b; i++) {
                    int16_t v = (int16_t)(p[i] & BF16_MAG);
                    m16 = v > m16 ? v : m16;
                }
                amax_bits = (uint32_t)m16;
                if (amax_bits >= BF16_EXP) { /* inf or NaN somewhere in this group */
                    for (Py_ssize_t i = a; i < b; i++)
                        if ((p[i] & BF16_EXP) == BF16_EXP) { bad_col = i; break; }
                    kind = 1; bad_row = r; break;
                }
                amax_bits <<= 16;
            } else {
                const uint32_t *p = row32;
                int32_t m32 = 0; /* sign-cleared binary32 words fit a signed 32-bit max */
                for (Py_ssize_t i = a; i < b; i++) {
                    int32_t v = (int32_t)(p[i] & F32_MAG);
                    m32 = v > m32 ? v : m32;
                }
                amax_bits = (uint32_t)m32;
                if (amax_bits >= F32_EXP) {
                    for (Py_ssize_t i = a; i < b; i++)
                        if ((p[i] & F32_EXP) == F32_EXP) { bad_col = i; break; }
                    kind = 1; bad_row = r; break;
                }
            }
            int8_t *c = out + r * k;
            row_amax = amax_bits > row_amax ? amax_bits : row_amax;
            if (amax_bits == 0) { /* all-zero group: +0 scale, zero codes */
                sc[r * groups + g] = 0;
                memset(c + a, 0, (size_t)(b - a));
                if (stats != NULL) {
                    sf[g] = 0.0f;
                    memset(qf + a, 0, (size_t)(b - a) * sizeof(float));
                }
                continue;
            }
            float raw = f32_from_bits(amax_bits) / qmaxf;
            uint16_t s16 = f32_to_f16_rne(raw);
            if (s16 == 0) s16 = 1; /* 2^-24 underflow rescue */
            if (s16 == F16_INF) { kind = 2; bad_row = r; bad_col = g; bad_raw = raw; break; }
            sc[r * groups + g] = s16;
            const float s32 = f16_to_f32(s16);
            const float inv = 1.0f / s32;
            if (stats == NULL && source == 0) {
                const uint16_t *p = w16 + r * k;
                for (Py_ssize_t i = a; i < b; i++) QUANT(f32_from_bits((uint32_t)p[i] << 16));
            } else if (stats == NULL) {
                const uint32_t *p = row32;
                for (Py_ssize_t i = a; i < b; i++) QUANT(f32_from_bits(p[i]));
            } else if (source == 0) {
                const uint16_t *p = w16 + r * k;
                for (Py_ssize_t i = a; i < b; i++) QUANT_KEEP(f32_from_bits((uint32_t)p[i] << 16));
                sf[g] = s32;
            } else {
                const uint32_t *p = row32;
                for (Py_ssize_t i = a; i < b; i++) QUANT_KEEP(f32_from_bits(p[i]));
                sf[g] = s32;
            }
        }
        if (stats == NULL || kind || row_amax == 0) continue; /* a zero row adds nothing */
        /* Scale the row by 2^sh so that its largest |x| lies in [1, 2) (or just below for a
         * subnormal maximum): the binary32 squares and sums then neither overflow nor
         * underflow for any value within 2^-60 of the row's maximum, and smaller values
         * contribute less than 2^-120 of the largest square each.  Scaling by a power of two
         * is exact, and so is undoing it on the binary64 sums. */
        const int ex = (int)(row_amax >> 23);
        const int sh = ex > 0 ? 127 - ex : 127;
        const float up = pow2f(sh);
        const v4d down2 = pow2d(-2 * sh) + (v4d){0};
        if (source == 0) {
            const uint16_t *p = w16 + r * k;
            ROW_STATS(v8u16 h; memcpy(&h, p + j, sizeof h);
                      x = (v8f)(__builtin_convertvector(h, v8u) << 16),
                      f32_from_bits((uint32_t)p[j] << 16));
        } else {
            const uint32_t *p = row32;
            ROW_STATS(memcpy(&x, p + j, sizeof x), f32_from_bits(p[j]));
        }
    }
    if (stats != NULL) {
        int32_t m = 0;
        double se = 0.0, sx = 0.0;
        for (int l = 0; l < LANES; l++) {
            m = gmax[l] > m ? gmax[l] : m;
            se += dse[l / 4][l % 4];
            sx += dsx[l / 4][l % 4];
        }
        stats[0] = (double)f32_from_bits((uint32_t)m); stats[1] = se; stats[2] = sx;
    }
    *bad_row_out = bad_row;
    *bad_col_out = bad_col;
    *bad_raw_out = bad_raw;
    return kind;
}

static PyObject *encode_rows(PyObject *self, PyObject *args) {
    Py_buffer words, codes, scales, stats = {0};
    PyObject *stats_obj = Py_None;
    int source, group, qmin, qmax;
    Py_ssize_t n, k;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*innii" "iw*w*|O", &words, &source, &n, &k, &group, &qmin,
                          &qmax, &codes, &scales, &stats_obj))
        return NULL;
    const int have_stats = stats_obj != Py_None;
    if (have_stats && PyObject_GetBuffer(stats_obj, &stats,
                                         PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&words); PyBuffer_Release(&codes); PyBuffer_Release(&scales);
        return NULL;
    }
    block_sizes b;
    Py_ssize_t scratch = 0;
    const char *why = check_block(source, n, k, group, qmin, qmax, &b);
    if (why == NULL) {
        if (k > PY_SSIZE_T_MAX - b.groups ||
            !mul_size(k + b.groups, (Py_ssize_t)sizeof(float), &scratch))
            why = BLOCK_OVERFLOWS;
        else if (words.len < b.wbytes || codes.len < b.cells || scales.len < b.sbytes ||
                 (have_stats && (stats.len < 3 * (Py_ssize_t)sizeof(double) ||
                                 stats.itemsize != (Py_ssize_t)sizeof(double) ||
                                 stats.format == NULL || strcmp(stats.format, "d") != 0)))
            why = "encode_rows: inconsistent buffer sizes (stats: three float64)";
        else if ((uintptr_t)scales.buf % sizeof(uint16_t) != 0 ||
                 (have_stats && (uintptr_t)stats.buf % sizeof(double) != 0))
            why = "encode_rows: the scales and stats buffers must be aligned to their words";
    }
    if (why != NULL) {
        PyBuffer_Release(&words); PyBuffer_Release(&codes); PyBuffer_Release(&scales);
        if (have_stats) PyBuffer_Release(&stats);
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    double *st = have_stats ? (double *)stats.buf : NULL;
    /* An input at an address that is not a multiple of its word size: copy it once to an
     * aligned block (PyMem_Malloc returns memory aligned for any type), so that every typed
     * load below is a defined, aligned access. */
    void *aligned = NULL;
    const void *wbuf = words.buf;
    if ((uintptr_t)words.buf % (uintptr_t)b.wsize != 0) {
        aligned = PyMem_Malloc(b.wbytes > 0 ? (size_t)b.wbytes : 1);
        if (aligned == NULL) {
            PyBuffer_Release(&words); PyBuffer_Release(&codes); PyBuffer_Release(&scales);
            if (have_stats) PyBuffer_Release(&stats);
            return PyErr_NoMemory();
        }
        memcpy(aligned, words.buf, (size_t)b.wbytes);
        wbuf = aligned;
    }
    /* One row's rounded codes and group scales as binary32, for the statistics, and one
     * widened binary16 row (allocated while holding the GIL, as PyMem_Malloc requires; k
     * words fit: scratch is (k + groups) * 4 bytes). */
    float *qf = st != NULL ? (float *)PyMem_Malloc((size_t)scratch) : NULL;
    float *sf = qf != NULL ? qf + k : NULL;
    uint32_t *wide = source == 2 ? (uint32_t *)PyMem_Malloc((size_t)scratch) : NULL;
    if ((st != NULL && qf == NULL) || (source == 2 && wide == NULL)) {
        PyBuffer_Release(&words); PyBuffer_Release(&codes); PyBuffer_Release(&scales);
        if (have_stats) PyBuffer_Release(&stats);
        PyMem_Free(qf);
        PyMem_Free(aligned);
        return PyErr_NoMemory();
    }
    const uint16_t *w16 = (const uint16_t *)wbuf;
    const uint32_t *w32 = (const uint32_t *)wbuf;
    int8_t *out = (int8_t *)codes.buf;
    uint16_t *sc = (uint16_t *)scales.buf;
    const float lo = (float)qmin, hi = (float)qmax, qmaxf = (float)qmax;
    const widen_fn widen = source == 2 ? pick_widen() : widen_row;
    int kind;
    Py_ssize_t bad_row = 0, bad_col = 0;
    float bad_raw = 0.0f;

    Py_BEGIN_ALLOW_THREADS
    kind = encode_block(w16, w32, source, n, k, group, b.groups, lo, hi, qmaxf, out, sc, &bad_row,
                        &bad_col, &bad_raw, st, qf, sf, wide, widen);
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&words); PyBuffer_Release(&codes); PyBuffer_Release(&scales);
    if (have_stats) PyBuffer_Release(&stats);
    PyMem_Free(qf);
    PyMem_Free(wide);
    PyMem_Free(aligned);
    return block_result(kind, bad_row, bad_col, bad_raw);
}

static PyObject *f32_to_f16_words(PyObject *self, PyObject *args) {
    /* Test hook: binary32 words -> binary16 words with the kernel's own conversion. */
    Py_buffer in, out;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*", &in, &out)) return NULL;
    Py_ssize_t count = in.len / 4;
    if (out.len < count * 2) {
        PyBuffer_Release(&in); PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "f32_to_f16_words: output too small");
        return NULL;
    }
    const uint32_t *src = (const uint32_t *)in.buf;
    uint16_t *dst = (uint16_t *)out.buf;
    for (Py_ssize_t i = 0; i < count; i++) dst[i] = f32_to_f16_rne(f32_from_bits(src[i]));
    PyBuffer_Release(&in); PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/*
 * Exact word conversions of the recipe (words.py is the reference; tests compare every
 * binary16 word and random binary32 words), one block per call, without the GIL:
 *
 *   op 0  binary16 -> binary32 (exact; NaN payloads kept, no quieting)     u16 -> u32
 *   op 1  BF16 -> binary32 (the word becomes the high half)                 u16 -> u32
 *   op 2  binary32 -> BF16, round to nearest even; inf and NaN pass through with their top
 *         bits, NaN with the quiet bit forced (words.f32_to_bf16_rne(keep_nonfinite=True))
 *                                                                           u32 -> u16
 *   op 3  binary16 -> BF16 (op 0 then op 2, per word)                       u16 -> u16
 *
 * convert_words(op, in, out) returns (first non-finite input, first finite input that rounds
 * to infinity), each an element index or -1, so the caller refuses them with its own message
 * (it re-runs the block through words.py to word it).  Integer operations only, except the
 * binary16 subnormals: (float)f * 2^-24 for an integer f < 1024 is exact (no rounding, and
 * neither operand nor result is subnormal, so FTZ/DAZ could not change it).
 */
/* binary32 -> BF16 RNE; inf/NaN pass through with their top bits, NaN with the quiet bit. */
static inline uint32_t w_f32_to_bf16(uint32_t w) {
    uint32_t nonfinite = (w & F32_EXP) == F32_EXP;
    uint32_t rounded = (w + ((1u << 15) - 1u) + ((w >> 16) & 1u)) >> 16; /* 2^15 - 1: half less 1 */
    uint32_t pass = (w >> 16) | pick((w & F32_FRAC) != 0, 0x40u, 0u);
    return pick(nonfinite, pass, rounded);
}

static inline uint32_t w_overflows(uint32_t w, uint32_t bf) {
    /* a finite binary32 whose BF16 rounding is infinite */
    return ((w & F32_EXP) != F32_EXP) & ((bf & BF16_EXP) == BF16_EXP);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static int convert_block(int op, const void *in, void *out, Py_ssize_t count) {
    /* Returns bit 0: some input is non-finite, bit 1: some finite input overflowed. */
    uint32_t nonfinite = 0, overflow = 0;
    if (op == 0) {
        const uint16_t *src = (const uint16_t *)in;
        uint32_t *dst = (uint32_t *)out;
        for (Py_ssize_t i = 0; i < count; i++) {
            uint32_t h = src[i];
            nonfinite |= (h & F16_EXP) == F16_EXP;
            dst[i] = w_f16_to_f32(h);
        }
    } else if (op == 1) {
        const uint16_t *src = (const uint16_t *)in;
        uint32_t *dst = (uint32_t *)out;
        for (Py_ssize_t i = 0; i < count; i++) {
            uint32_t h = src[i];
            nonfinite |= (h & BF16_EXP) == BF16_EXP;
            dst[i] = h << 16;
        }
    } else if (op == 2) {
        const uint32_t *src = (const uint32_t *)in;
        uint16_t *dst = (uint16_t *)out;
        for (Py_ssize_t i = 0; i < count; i++) {
            uint32_t w = src[i], bf = w_f32_to_bf16(w);
            nonfinite |= (w & F32_EXP) == F32_EXP;
            overflow |= w_overflows(w, bf);
            dst[i] = (uint16_t)bf;
        }
    } else {
        const uint16_t *src = (const uint16_t *)in;
        uint16_t *dst = (uint16_t *)out;
        for (Py_ssize_t i = 0; i < count; i++) {
            uint32_t h = src[i], w = w_f16_to_f32(h), bf = w_f32_to_bf16(w);
            nonfinite |= (h & F16_EXP) == F16_EXP;
            overflow |= w_overflows(w, bf);
            dst[i] = (uint16_t)bf;
        }
    }
    return (nonfinite ? 1 : 0) | (overflow ? 2 : 0);
}

static Py_ssize_t first_flagged(int op, const void *in, Py_ssize_t count, int which) {
    /* The first index convert_block flagged (which: 1 non-finite input, 2 overflow). */
    for (Py_ssize_t i = 0; i < count; i++) {
        uint32_t w = (op == 2) ? ((const uint32_t *)in)[i] : ((const uint16_t *)in)[i];
        if (which == 1) {
            uint32_t m = op == 2 ? F32_EXP : (op == 1 ? BF16_EXP : F16_EXP);
            if ((w & m) == m) return i;
        } else {
            uint32_t wide = op == 3 ? w_f16_to_f32(w) : w;
            if (w_overflows(wide, w_f32_to_bf16(wide))) return i;
        }
    }
    return -1;
}

static PyObject *convert_words(PyObject *self, PyObject *args) {
    Py_buffer in, out;
    int op;
    (void)self;
    if (!PyArg_ParseTuple(args, "iy*w*", &op, &in, &out)) return NULL;
    Py_ssize_t in_width = op == 2 ? 4 : 2, out_width = (op == 0 || op == 1) ? 4 : 2;
    Py_ssize_t count = in.len / in_width;
    if (op < 0 || op > 3 || in.len % in_width || out.len < count * out_width) {
        PyBuffer_Release(&in); PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "convert_words: bad op or buffer sizes");
        return NULL;
    }
    int flags;
    Py_ssize_t bad_in = -1, bad_over = -1;
    Py_BEGIN_ALLOW_THREADS
    flags = convert_block(op, in.buf, out.buf, count);
    if (flags & 1) bad_in = first_flagged(op, in.buf, count, 1);
    if (flags & 2) bad_over = first_flagged(op, in.buf, count, 2);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&in); PyBuffer_Release(&out);
    return Py_BuildValue("(nn)", bad_in, bad_over);
}

static PyMethodDef methods[] = {
    {"encode_rows", encode_rows, METH_VARARGS, "Encode a block of rows (see module docs)."},
    {"f32_to_f16_words", f32_to_f16_words, METH_VARARGS, "Non-negative finite binary32 -> binary16 RNE."},
    {"convert_words", convert_words, METH_VARARGS, "Exact recipe word conversions (see above)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hostkernel",
    "Single-pass host kernel for MAXABS_F16_RECIP_RNE_V1 (see the C source's header).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__hostkernel(void) { return PyModule_Create(&module); }
