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
 * f64_to_f16_words(values, out[, lanes]) for the binary16 rounding of the candidates (scalar
 * or four-lane), f16_to_f64_words(words, out) for their four-lane widening,
 * kernel_path([name]) for running the search on each of its vector paths (below), and
 * pruned_errors(x, qmin, qmax, out) for the 16 lane errors of one group as the pruned search
 * leaves them (+inf where it skipped a lane), for any format.
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
 * the vector code does not depend on the auto-vectoriser; the path is picked at load time,
 * below).  encode_block is cloned for x86-64-v4, AVX2 and baseline (an ifunc picks one), so
 * the per-group scalar loops around the search may be auto-vectorised: they are element-wise
 * conversions, compares and integer maxima, and no floating-point reduction is reordered
 * (GCC does not reassociate binary64 sums without -fassociative-math, refused below).
 * Each lane is its own sequential sum in index order; the lanes never mix.
 *
 * The sign of x: the search works on |x| and the bound b(x) = qmax for x >= 0 (and -0), -qmin
 * for x < 0, and forms |code| = min(round_half_even(RN64(|x| * r)), b(x)) and the step
 * d' = RN64(|x| - |code| * s), t = RN64(d' * d'), which is the document's t bit for bit:
 * RN64(|x| * r) = |RN64(x * r)| and round half to even is odd-symmetric, so for x < 0 the
 * document's max(round(y), qmin) (its min with qmax is idle: round(y) <= 0) is
 * -min(round(|y|), -qmin); for x >= 0 the max with qmin is idle (round(y) >= 0 > qmin); then
 * d = x - code * s is -d' or d' (RN64 is odd-symmetric) and d * d = d' * d'; for x = +-0 both
 * give t = +0.  So one clamp instruction per lane instead of two; the bound is a per-value
 * splat (an embedded broadcast on AVX-512, below).  The stored codes keep the signed form.
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
 * |x - s * code| = s / 2, so d * d, and every sum after it, is the same.  The stored codes
 * (group_codes; qmax < PRUNE_QMAX, W8 divides, measured faster) come from the same product,
 * and a vector with a value where |x - code * s| = s / 2 exactly (x / s a half-integer; d is
 * exact, docs/encoder-profiles.md) is redone with the true division, so they are
 * clamp(round_half_even(x / s)) bit for bit.  (Multiplying and correcting every code to the
 * right neighbour was measured slower than the division, on AMD Zen 4: the correction is what
 * cost; the check for an exact tie costs less than the division on Intel Sapphire Rapids.)
 * Replacing the division by a binary32 division was exact too and slower (79 against 102 M
 * values/s), so was an 8-lane binary32 one (the widening of the codes back to binary64 costs
 * more than the cheaper division saves).
 *
 * Exact pruning (errors_pruned; unweighted, formats with qmax >= PRUNE_QMAX, i.e. W8): lanes
 * 0..7 (candidates 0..7) are searched first, over the whole group; their smallest error B is a
 * complete error of a candidate (a lane that is no usable candidate has candidate 0's).  For
 * each of candidates 8..13 a lower bound L of its error is the largest value's own step, with
 * the bound max(qmax, -qmin) in place of the value's: its |code| lies between the value's
 * clamped code and the nearest one, where |amax - c * s| is at most the clamped code's (a convex
 * function of c, smallest at the nearest code), so L <= t of that value; and the error is at
 * least every one of its terms (acc = RN64(acc + t) >= RN64(t) = t for acc >= 0, and RN64
 * addition of non-negative terms never decreases acc).  Where L > B for all six, none of them
 * can be chosen (its error is above B, so above the minimum), whatever their indices: lanes
 * 8..15 get +inf and are not searched; otherwise they are searched as usual.  (L >= B would be
 * as safe here, all six indices being above 0..7, but the rule is written for any order; the
 * tests hold it to the strict form.)  Below PRUNE_QMAX the bound never removed a candidate on
 * Gaussian groups, so the one search of 16 lanes stays.
 *
 * The binary32 screen (unweighted, qmax < PRUNE_QMAX, groups of at most SCREEN_VALUES values;
 * docs/encoder-profiles.md "The binary32 screen" has the proof): every lane's error F is first
 * computed in binary32, 16 lanes to an AVX-512 vector (screen_*; binary32 FMA on AVX-512, the
 * one place the module uses FMA); F is within a relative delta = (16 (bmax + 1) + 2 (n + 3))
 * 2^-24 and an absolute 2^-100 of the exact error, and the binary64 error within 2^-40 of it,
 * so every lane with F above (min F + eta) K + eta has a binary64 error strictly above the
 * smallest (screen_choice).  Where the remaining lanes all have one scale, the first of them is
 * the profile's choice and the binary64 search is skipped; else the group is searched as
 * usual.  Nothing the screen computes is stored.
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
#include <math.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#endif

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

/* GCC vector extensions: W binary64 lanes per vector, LANES / W vectors per group.  Three
 * paths, each compiled only for the targets it suits and picked at load time (PyInit):
 * W = 8 (one AVX-512 register) where the CPU has x86-64-v4, W = 4 with AVX2 (one register),
 * and W = 4 on baseline x86-64 (two SSE2 registers; 8-lane vectors are several times slower
 * where GCC has to split them).  The paths run the same operations on every lane and differ
 * only in how a lane's code is formed from y = RN64(|x| * r) in the search (|code| in [0, b],
 * mag_* below) or from y = RN64(x / s) for the stored codes (code in [qmin, qmax], code_*):
 *
 * - baseline: clamp with compare-and-select (SEL picks by an all-ones / all-zeros lane mask,
 *   on the bits; a macro: no vector ABI), then round half to even with the 1.5 * 2^52 trick
 *   (MAGIC above);
 * - AVX2 and AVX-512: one vroundpd / vrndscalepd in round-to-nearest-even mode (the same RNE
 *   integer as the trick: both are the one correctly rounded integer of y), then vminpd with
 *   b (search), or vmaxpd with qmin and vminpd with qmax (stored codes).  Rounding first and
 *   clamping after gives the same integer: rounding is monotone and the bounds are integers.
 *   vmaxpd / vminpd differ from max / min only for NaN or for two zeros of opposite sign; y is
 *   never NaN and the bounds are not zero.  A stored-code lane of -0 (from -1/2 <= y < 0)
 *   becomes the int8 0.
 *
 * Two instructions per lane vector in the search where the trick with compare-and-select
 * takes five (seven for the signed clamp). */
typedef double vd4 __attribute__((vector_size(32)));
typedef int64_t vi4 __attribute__((vector_size(32)));
typedef double vd8 __attribute__((vector_size(64)));
#define SEL(VI, VD, m, a, b) ((VD)(((VI)(a) & (m)) | ((VI)(b) & ~(m))))

/* The code of y as an integer in [lov, hiv] (splats of qmin, qmax), one helper per path. */
#define RNE_NO_EXC (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define INLINE static inline __attribute__((always_inline))
/* Baseline: a macro, not a function (a 32-byte vector argument has no baseline ABI); the
 * repeated operands are pure and computed once. */
static const vd4 MAGIC4 = {MAGIC, MAGIC, MAGIC, MAGIC};
#define CLAMP_LO4(y, lov) SEL(vi4, vd4, (y) < (lov), (lov), (y))
#define code_sse2(y, lov, hiv)                                                               \
    ((SEL(vi4, vd4, CLAMP_LO4(y, lov) > (hiv), (hiv), CLAMP_LO4(y, lov)) + MAGIC4) - MAGIC4)
/* The search's |code| of y >= 0 under the value's bound *bp: min(y, b), then the trick. */
#define mag_sse2(y, bp)                                                                      \
    ((SEL(vi4, vd4, (y) > (*(bp) - (vd4){0}), (*(bp) - (vd4){0}), (y)) + MAGIC4) - MAGIC4)
/* W integral codes in [-128, 127] (a VD) -> W int8 at p (exact conversions). */
#define store_sse2(p, c)                                                                     \
    do {                                                                                     \
        double t_[4];                                                                        \
        const vd4 c_ = (c);                                                                  \
        memcpy(t_, &c_, sizeof t_);                                                          \
        for (int l_ = 0; l_ < 4; l_++) (p)[l_] = (int8_t)t_[l_];                             \
    } while (0)
#define TARGET_AVX2 __attribute__((target("avx2")))
#define TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HAVE_SIMD 1
INLINE TARGET_AVX2 vd4 code_avx2(vd4 y, vd4 lov, vd4 hiv) {
    return (vd4)_mm256_min_pd(_mm256_max_pd(_mm256_round_pd((__m256d)y, RNE_NO_EXC),
                                            (__m256d)lov), (__m256d)hiv);
}
INLINE TARGET_AVX2 vd4 mag_avx2(vd4 y, const double *bp) {
    return (vd4)_mm256_min_pd(_mm256_round_pd((__m256d)y, RNE_NO_EXC), _mm256_broadcast_sd(bp));
}
INLINE TARGET_AVX2 void store_avx2(int8_t *p, vd4 c) {
    const __m128i i32 = _mm256_cvtpd_epi32((__m256d)c); /* integral: exact in any mode */
    const __m128i i8 = _mm_packs_epi16(_mm_packs_epi32(i32, i32), _mm_setzero_si128());
    const int32_t four = _mm_cvtsi128_si32(i8);
    memcpy(p, &four, 4);
}
INLINE TARGET_AVX512 void store_avx512(int8_t *p, vd8 c) {
    const __m128i i8 = _mm512_cvtepi32_epi8(_mm512_castsi256_si512(_mm512_cvtpd_epi32((__m512d)c)));
    const int64_t eight = _mm_cvtsi128_si64(i8);
    memcpy(p, &eight, 8);
}
INLINE TARGET_AVX512 vd8 code_avx512(vd8 y, vd8 lov, vd8 hiv) {
    return (vd8)_mm512_min_pd(_mm512_max_pd(_mm512_roundscale_pd((__m512d)y, RNE_NO_EXC),
                                            (__m512d)lov), (__m512d)hiv);
}
/* vminpd with the bound as an embedded broadcast ({1to8}) of its memory word: the same
 * min(round(y), b) as _mm512_min_pd(rounded, splat(b)) (dst = rounded < b ? rounded : b), but
 * GCC keeps a splat used twice in a register (one vbroadcastsd per value), which measured
 * 9.5 against 7.7 cycles per value for the whole step on AMD Zen 4 (the notes in
 * docs/performance.md), so this one instruction is written out. */
INLINE TARGET_AVX512 vd8 mag_avx512(vd8 y, const double *bp) {
    const __m512d rounded = _mm512_roundscale_pd((__m512d)y, RNE_NO_EXC);
    __m512d c;
    __asm__("vminpd %2%{1to8%}, %1, %0" : "=v"(c) : "v"(rounded), "m"(*bp));
    return (vd8)c;
}
#else
#define HAVE_SIMD 0
#endif

/* The error of every lane's scale s[l] over the group's n values x (binary64, exact copies of
 * binary32 values), weighted by w[i] when `weighted`: out[l] = acc as documented above.  Every
 * lane runs the document's statements for its own scale, in index order i = 0, 1, ...; the
 * vector only puts W such sequential sums side by side, so the width changes no operation.
 * ax[i] - zero is ax[i] itself (a splat, no instruction). */
/* One value's step for every lane vector v, its code formed by CEXPR (of y = RN64(|x| * r) and
 * the value's bound b: qmax for x >= 0, -qmin for x < 0; see "the sign of x" above). */
#define LANE_STEP(VD, CEXPR)                                                                 \
    for (int v = 0; v < NV; v++) {                                                           \
        const VD y = axv * rv[v];      /* a half-integer's side only (above) */              \
        const VD c = CEXPR;            /* |code| in [0, b] */                                \
        const VD d = axv - c * sv[v];  /* c * s exact; d = -+RN64(x - r) */                  \
        VD t = d * d;                  /* t = RN64(d * d) */                                 \
        if (weighted) t = wv * t;      /* u = RN64(w * t) */                                 \
        acc[v] = acc[v] + t;           /* acc = RN64(acc + t) */                             \
    }

#define DEFINE_LANE_ERRORS_IMPL(NAME, VD, W, CODE, TARGET, L)                                \
    INLINE TARGET void NAME(                                                                 \
        const double *ax, const double *bq, const double *w, Py_ssize_t n, const double *s,  \
        const double *r, double *out, const int weighted) {                                  \
        enum { NV = (L) / (W) };                                                             \
        VD acc[NV], sv[NV], rv[NV];                                                          \
        const VD zero = {0};                                                                 \
        for (int v = 0; v < NV; v++) {                                                       \
            memcpy(&sv[v], s + v * (W), sizeof sv[v]);                                       \
            memcpy(&rv[v], r + v * (W), sizeof rv[v]); /* RN64(1 / s) */                     \
            acc[v] = zero;                              /* +0 */                             \
        }                                                                                    \
        for (Py_ssize_t i = 0; i < n; i++) {                                                 \
            const VD axv = ax[i] - zero; /* a splat (x - 0 is x) */                          \
            const VD wv = zero + (weighted ? w[i] : 1.0);                                    \
            LANE_STEP(VD, CODE(y, bq + i))                                                   \
        }                                                                                    \
        for (int v = 0; v < NV; v++) memcpy(out + v * (W), &acc[v], sizeof acc[v]);         \
    }

/* The stored codes of a group for its chosen scale sb: clamp(round_half_even(x / sb)), W values
 * at a time from y = RN64(x * rb), rb = RN64(1 / sb), where that is exact (the header's "stored
 * codes"): a vector with a lane where |x - code * sb| = sb / 2 (x / sb a half-integer, where y
 * may have rounded to the odd neighbour) is redone with the true division RN64(x / sb); the
 * tail one value at a time with the division.  |d| = sb / 2 is compared on the bits (both are
 * finite and non-negative, so equal values have equal bits). */
static const int64_t MAG64 = 0x7FFFFFFFFFFFFFFF;
static const double HALF = 0x1p-1; /* 0.5 */
#define ANY_sse2(t) (((t)[0] | (t)[1] | (t)[2] | (t)[3]) != 0)
#define ANY_avx2(t) (_mm256_movemask_pd((__m256d)(t)) != 0)
#define ANY_avx512(t) (_mm512_test_epi64_mask((__m512i)(t), (__m512i)(t)) != 0)
#define DEFINE_GROUP_CODES(NAME, VD, VI, W, CODE, STORE, ANY, TARGET)                        \
    TARGET static void NAME(const double *x, Py_ssize_t n, double sb, double rb, double lo,  \
                            double hi, int8_t *codes) {                                      \
        const VD zero = {0};                                                                 \
        const VD lov = zero + lo, hiv = zero + hi, sv = zero + sb, rv = zero + rb;           \
        const VI half = (VI)(zero + sb * HALF), mag = (VI){0} + MAG64; /* sb / 2: exact */  \
        Py_ssize_t i = 0;                                                                    \
        for (; i + (W) <= n; i += (W)) {                                                     \
            VD xv;                                                                           \
            memcpy(&xv, x + i, sizeof xv);                                                   \
            VD c;                                                                            \
            if (rb != 0.0) {                                                                 \
                c = CODE(xv * rv, lov, hiv);                                                 \
                const VD d = xv - c * sv; /* exact (the header) */                           \
                const VI tie = ((VI)d & mag) == half;                                        \
                if (ANY(tie)) c = CODE(xv / sv, lov, hiv);                                   \
            } else {                                                                         \
                c = CODE(xv / sv, lov, hiv);                                                 \
            }                                                                                \
            STORE(codes + i, c);                                                             \
        }                                                                                    \
        for (; i < n; i++) {                                                                 \
            double y = x[i] / sb;                                                            \
            y = y < lo ? lo : y;                                                             \
            y = y > hi ? hi : y;                                                             \
            codes[i] = (int8_t)((y + MAGIC) - MAGIC);                                        \
        }                                                                                    \
    }

/* Per path: the unweighted and the weighted search, and the codes of the chosen scale. */
#define DEFINE_PATH(SUFFIX, VD, VI, W, TARGET)                                                 \
    DEFINE_LANE_ERRORS_IMPL(lane_errors_impl_##SUFFIX, VD, W, mag_##SUFFIX, TARGET, LANES)   \
    DEFINE_LANE_ERRORS_IMPL(half_errors_impl_##SUFFIX, VD, W, mag_##SUFFIX, TARGET, LANES / 2) \
    TARGET static void half_errors_##SUFFIX(const double *ax, const double *bq, Py_ssize_t n, \
                                            const double *s, const double *r, double *out) { \
        half_errors_impl_##SUFFIX(ax, bq, NULL, n, s, r, out, 0);                            \
    }                                                                                        \
    TARGET static void lane_errors_##SUFFIX(const double *ax, const double *bq,              \
                                            const double *w, Py_ssize_t n,                   \
                                            const double *s, const double *r,                \
                                            double *out) {                                   \
        if (w == NULL) lane_errors_impl_##SUFFIX(ax, bq, NULL, n, s, r, out, 0);             \
        else lane_errors_impl_##SUFFIX(ax, bq, w, n, s, r, out, 1);                          \
    }                                                                                        \
    DEFINE_GROUP_CODES(group_codes_##SUFFIX, VD, VI, W, code_##SUFFIX, store_##SUFFIX,         \
                       ANY_##SUFFIX, TARGET)

DEFINE_PATH(sse2, vd4, vi4, 4, )

#if HAVE_SIMD
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define CLONES
#endif

#if HAVE_SIMD
/* Compiled for these targets only, called only where PyInit found them (contraction stays
 * off, so the FMA units that x86-64-v4 brings are not used: the build test checks it). */
DEFINE_PATH(avx2, vd4, vi4, 4, TARGET_AVX2)
typedef int64_t vi8 __attribute__((vector_size(64)));
DEFINE_PATH(avx512, vd8, vi8, 8, TARGET_AVX512)
#endif

/* The binary32 screen (errors_screened): every lane's approximate error F in binary32, W lanes
 * to a vector, LANES / W vectors: y = RN32(|x| * r32), |code| = RNE(min(y, b)) by the
 * 1.5 * 2^23 trick (exact for 0 <= y <= 128: y + 1.5 * 2^23 has a unit ulp, so the addition
 * rounds to the integer, half to even, and the subtraction is exact), d = RN32(|x| - code * s)
 * (code * s exact: 8 bits times 11), acc = RN32(acc + RN32(d * d)).  Its bound on |F - error|
 * is in the header and in docs/encoder-profiles.md; nothing here needs to be exact. */
typedef float vf4 __attribute__((vector_size(16)));
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf16 __attribute__((vector_size(64)));
typedef int32_t vj4 __attribute__((vector_size(16)));
typedef int32_t vj8 __attribute__((vector_size(32)));
typedef int32_t vj16 __attribute__((vector_size(64)));
static const float MAGIC32 = 0x1.8p+23f; /* 12582912 */
/* The screen's |code| of y >= 0 under the bound *bp: min(y, b), then the trick; minps(y, b) is
 * y < b ? y : b, as the baseline's select. */
#define SMIN_sse2(VJ, VF, y, bp) SEL(VJ, VF, (y) < (*(bp) - (VF){0}), (y), (*(bp) - (VF){0}))
#if HAVE_SIMD
#define SMIN_avx2(VJ, VF, y, bp) ((VF)_mm256_min_ps((__m256)(y), _mm256_broadcast_ss(bp)))
#define SMIN_avx512(VJ, VF, y, bp) ((VF)_mm512_min_ps((__m512)(y), _mm512_set1_ps(*(bp))))
#endif
/* Two accumulators per lane vector, even and odd values, added at the end: the bound holds for
 * any order of the binary32 additions, and two chains halve the wait on the adder. */
/* d = RN32(|x| - code * s) and acc = RN32(acc + RN32(d * d)); on AVX-512 (which has FMA)
 * the first is one fused operation, the same value (code * s is exact), and the second
 * RN32(acc + d * d), one rounding fewer: the screen's bound covers both. */
#define SD_plain(VF, axv, c, sv) ((axv) - (c) * (sv))
#define SACC_plain(VF, acc, d) ((acc) + (d) * (d))
#if HAVE_SIMD
#define SD_fused(VF, axv, c, sv) ((VF)_mm512_fnmadd_ps((__m512)(c), (__m512)(sv), (__m512)(axv)))
#define SACC_fused(VF, acc, d) ((VF)_mm512_fmadd_ps((__m512)(d), (__m512)(d), (__m512)(acc)))
#endif
#define SCREEN_STEP(VF, VJ, SMIN, SD, SACC, ACC, I)                                          \
    {                                                                                        \
        const VF axv = ax[I] - zero; /* a splat (x - 0 is x) */                              \
        for (int v = 0; v < NV; v++) {                                                       \
            const VF y = axv * rv[v];                                                        \
            const VF c = (SMIN(VJ, VF, y, bq + (I)) + MAGIC32) - MAGIC32;                    \
            const VF d = SD(VF, axv, c, sv[v]);                                              \
            (ACC)[v] = SACC(VF, (ACC)[v], d);                                                \
        }                                                                                    \
    }
#define DEFINE_SCREEN(NAME, VF, VJ, W, SMIN, SD, SACC, TARGET)                           \
    TARGET static void NAME(const float *ax, const float *bq, Py_ssize_t n, const float *s,  \
                            const float *r, float *out) {                                    \
        enum { NV = LANES / (W) };                                                           \
        VF acc[2][NV], sv[NV], rv[NV];                                                       \
        const VF zero = {0};                                                                 \
        for (int v = 0; v < NV; v++) {                                                       \
            memcpy(&sv[v], s + v * (W), sizeof sv[v]);                                       \
            memcpy(&rv[v], r + v * (W), sizeof rv[v]);                                       \
            acc[0][v] = acc[1][v] = zero;                                                    \
        }                                                                                    \
        Py_ssize_t i = 0;                                                                    \
        for (; i + 1 < n; i += 2) {                                                          \
            SCREEN_STEP(VF, VJ, SMIN, SD, SACC, acc[0], i)                                         \
            SCREEN_STEP(VF, VJ, SMIN, SD, SACC, acc[1], i + 1)                                     \
        }                                                                                    \
        if (i < n) { SCREEN_STEP(VF, VJ, SMIN, SD, SACC, acc[0], i) }                              \
        for (int v = 0; v < NV; v++) {                                                       \
            const VF sum = acc[0][v] + acc[1][v];                                            \
            memcpy(out + v * (W), &sum, sizeof sum);                                         \
        }                                                                                    \
    }
DEFINE_SCREEN(screen_sse2, vf4, vj4, 4, SMIN_sse2, SD_plain, SACC_plain, )
#if HAVE_SIMD
DEFINE_SCREEN(screen_avx2, vf8, vj8, 8, SMIN_avx2, SD_plain, SACC_plain, TARGET_AVX2)
DEFINE_SCREEN(screen_avx512, vf16, vj16, 16, SMIN_avx512, SD_fused, SACC_fused,  \
              TARGET_AVX512)
#endif

enum { PATH_SSE2, PATH_AVX2, PATH_AVX512 };
static const char *const PATH_NAMES[] = {"sse2", "avx2", "avx512"};
static int path = PATH_SSE2; /* set once by PyInit, before any call */
static int use_screen = 1;    /* the binary32 screen on (test hook screen(); not while encoding) */

/* Whether this CPU can run path p. */
static int path_available(int p) {
#if HAVE_SIMD
    if (p == PATH_AVX512) return __builtin_cpu_supports("x86-64-v4") != 0;
    if (p == PATH_AVX2) return __builtin_cpu_supports("avx2") != 0;
#endif
    return p == PATH_SSE2;
}

/* The search over one group: ax, bq from split_values, s and r = RN64(1 / s) per lane. */
static void errors_for(const double *ax, const double *bq, const double *w, Py_ssize_t n,
                       const double *s, const double *r, double *out) {
#if HAVE_SIMD
    if (path == PATH_AVX512) { lane_errors_avx512(ax, bq, w, n, s, r, out); return; }
    if (path == PATH_AVX2) { lane_errors_avx2(ax, bq, w, n, s, r, out); return; }
#endif
    lane_errors_sse2(ax, bq, w, n, s, r, out);
}

static void half_errors_for(const double *ax, const double *bq, Py_ssize_t n, const double *s,
                            const double *r, double *out) {
#if HAVE_SIMD
    if (path == PATH_AVX512) { half_errors_avx512(ax, bq, n, s, r, out); return; }
    if (path == PATH_AVX2) { half_errors_avx2(ax, bq, n, s, r, out); return; }
#endif
    half_errors_sse2(ax, bq, n, s, r, out);
}

static void screen_for(const float *ax, const float *bq, Py_ssize_t n, const float *s,
                       const float *r, float *out) {
#if HAVE_SIMD
    if (path == PATH_AVX512) { screen_avx512(ax, bq, n, s, r, out); return; }
    if (path == PATH_AVX2) { screen_avx2(ax, bq, n, s, r, out); return; }
#endif
    screen_sse2(ax, bq, n, s, r, out);
}

/* The unweighted search with the exact pruning of PRUNE_QMAX below: lanes 0..7 (candidates
 * 0..7) first; then lanes 8..13 (candidates 8..13) only if one of them may still win. */
static void errors_pruned(const double *ax, const double *bq, Py_ssize_t n, const double *s,
                          const double *r, double amax, double bmax, double *out) {
    half_errors_for(ax, bq, n, s, r, out);
    double best = out[0];
    for (int l = 1; l < LANES / 2; l++) best = out[l] < best ? out[l] : best;
    int all_above = 1;
    for (int l = LANES / 2; l < CANDIDATES; l++) {
        double c = amax * r[l]; /* the amax value's step with the larger bound bmax */
        c = ((c < bmax ? c : bmax) + MAGIC) - MAGIC;
        const double d = amax - c * s[l];
        all_above &= d * d > best;
    }
    if (all_above) {
        for (int l = LANES / 2; l < LANES; l++) out[l] = (double)INFINITY;
        return;
    }
    half_errors_for(ax, bq, n, s + LANES / 2, r + LANES / 2, out + LANES / 2);
}

/* |x[i]| and the bound of its code's magnitude, qmax for x[i] >= 0 (and -0), -qmin for x[i] < 0
 * (the search's inputs; the sign of x is explained in the header). */
static inline void split_values(const double *x, Py_ssize_t n, double lo, double hi, double *ax,
                                double *bq) {
    for (Py_ssize_t i = 0; i < n; i++) {
        ax[i] = fabs(x[i]);
        bq[i] = x[i] < 0 ? -lo : hi;
    }
}

/* The same for the binary32 screen: |x[i]| (exact: x[i] is a binary32 value) and its bound. */
static inline void split_values32(const double *x, Py_ssize_t n, int qmin, int qmax, float *ax,
                                  float *bq) {
    for (Py_ssize_t i = 0; i < n; i++) {
        ax[i] = (float)fabs(x[i]);
        bq[i] = x[i] < 0 ? (float)-qmin : (float)qmax;
    }
}

/* n BF16 words -> their binary64 values x (exact) and the screen's inputs (split_values32),
 * in one pass; blo = -qmin and bhi = qmax as binary32. */
static inline void widen_bf16(const uint16_t *restrict p, Py_ssize_t n, float blo, float bhi,
                              double *restrict x, float *restrict ax, float *restrict bq) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const float v = f32_from_bits((uint32_t)p[i] << 16);
        x[i] = (double)v;
        ax[i] = fabsf(v);
        bq[i] = v < 0 ? blo : bhi;
    }
}

static void codes_for(const double *x, Py_ssize_t n, double sb, double rb, double lo, double hi,
                      int8_t *codes) {
#if HAVE_SIMD
    if (path == PATH_AVX512) { group_codes_avx512(x, n, sb, rb, lo, hi, codes); return; }
    if (path == PATH_AVX2) { group_codes_avx2(x, n, sb, rb, lo, hi, codes); return; }
#endif
    group_codes_sse2(x, n, sb, rb, lo, hi, codes);
}

typedef uint64_t vu4 __attribute__((vector_size(32)));

/* f64_to_f16_rne and f16_to_f64 on four lanes at once, the same bit operations (finite
 * non-negative input; a compare gives an all-ones lane mask).  The subnormal branch reads the
 * integer out of the 1.5 * 2^52 trick's bits (MAGIC + k has k in its low significand bits for
 * 0 <= k < 2^51), and widens a 10-bit integer f by the same trick in reverse: both exact. */
static const uint64_t MAGIC_BITS = 0x4338000000000000u; /* bits of MAGIC */
INLINE vu4 f64_to_f16_rne4(vd4 v) {
    const vu4 b = (vu4)v, one = {1, 1, 1, 1};
    const vu4 r = b - ((uint64_t)1008 << 52);
    const vu4 normal = (r + ((one << 41) - one) + ((r >> 42) & one)) >> 42;
    const vu4 sub = (vu4)((v * 0x1p+24) + MAGIC) - MAGIC_BITS; /* 2^24 = 16777216 */
    vu4 h = (vu4)SEL(vi4, vd4, v >= 0x1p-14, normal, sub); /* 2^-14 = 6.103515625e-05 */
    return (vu4)SEL(vi4, vd4, v >= 0x1.ffep+15, (one * F16_INF), h); /* 65520 */
}
INLINE vd4 f16_to_f64_4(vu4 h) {
    const vu4 e = (h >> 10) & 0x1Fu, f = h & F16_FRAC;
    const vd4 normal = (vd4)(((e + 1008) << 52) | (f << 42));
    const vd4 sub = (((vd4)(f | MAGIC_BITS)) - MAGIC) * 0x1p-24; /* 5.9604644775390625e-08 */
    return SEL(vi4, vd4, (vi4)e == 0, sub, normal);
}

/* A group's candidates: their binary16 words, binary64 values and reciprocals RN64(1 / s) per
 * lane (the search's), and the search's error sums.  A lane that is not a usable candidate
 * (the padding lanes 14 and 15, an infinite candidate) searches candidate 0's scale, so its
 * error equals lane 0's and, with a larger index, it loses every tie: it is never chosen. */
typedef struct {
    double s[LANES], r[LANES];
    float s32[LANES], r32[LANES]; /* the screen's: s exactly, RN32(1 / s) */
    uint16_t s16[LANES];
    double err[LANES]; /* last: CANDIDATE_BYTES are the fields that depend on amax only */
} candidates;
#define CANDIDATE_BYTES offsetof(candidates, err)

/* Candidates already formed in this block, by the binary32 bits of amax (qmin and qmax are the
 * block's): a group's candidates are a function of those bits alone, so a group whose amax was
 * seen before copies them instead of forming them again, the same bytes.  Direct-mapped by a
 * multiplicative hash; key 0 is an empty slot (an all-zero group never asks), and only groups
 * whose canonical scale is finite are stored, so an overflowing one always forms (and refuses)
 * its own.  Used for BF16 and binary16 sources, whose maxima repeat (a BF16 binade has 128
 * values); binary32 maxima rarely do. */
#define MEMO_BITS 8
typedef struct {
    uint32_t key[1 << MEMO_BITS];
    candidates c[1 << MEMO_BITS];
} candidate_memo;

/* The candidates of a finite group whose largest magnitude is the binary32 amaxf > 0; returns 2
 * (and the raw binary32 scale) where the canonical scale overflows binary16, else 0.  They are
 * formed four lanes at a time: lane j divides num[j] by den[j], the same binary64 division as
 * the scalar expressions of the document (candidate 0: the binary32 quotient over 1, exact;
 * candidate 1: amax / |qmin|; 2..13: (amax * 32) / (qmax * c); lanes 14 and 15 copy lane 0). */
INLINE int group_candidates(float amaxf, int qmin, int qmax, candidates *cd, float *raw_out) {
    const float raw = amaxf / (float)qmax; /* Section 7: one binary32 division */
    const uint16_t h0 = f64_to_f16_rne((double)raw);
    if (h0 == F16_INF) { *raw_out = raw; return 2; }
    const double amax = (double)amaxf, a32 = amax * 32.0, r0 = (double)raw;
    const double num[LANES] = {r0, amax, a32, a32, a32, a32, a32, a32,
                               a32, a32, a32, a32, a32, a32, r0, r0};
    double den[LANES];
    den[0] = den[14] = den[15] = 1.0;
    den[1] = (double)(-qmin);
    for (int j = 2; j < CANDIDATES; j++) den[j] = (double)(qmax * (27 + j)); /* c = 29..40 */
    for (int v = 0; v < LANES / 4; v++) {
        vd4 nv, dv;
        memcpy(&nv, num + 4 * v, sizeof nv);
        memcpy(&dv, den + 4 * v, sizeof dv);
        vu4 h = f64_to_f16_rne4(nv / dv);
        h = (vu4)SEL(vi4, vd4, (vi4)h == 0, ((vu4){1, 1, 1, 1}), h); /* the 2^-24 rescue */
        const vd4 sv = f16_to_f64_4(h);
        for (int l = 0; l < 4; l++) cd->s16[4 * v + l] = (uint16_t)h[l];
        memcpy(cd->s + 4 * v, &sv, sizeof sv);
    }
    const double s0 = cd->s[0];
    for (int j = 0; j < LANES; j++)
        if (cd->s16[j] == F16_INF) cd->s[j] = s0; /* never chosen (above) */
    for (int v = 0; v < LANES / 4; v++) {
        vd4 sv;
        memcpy(&sv, cd->s + 4 * v, sizeof sv);
        const vd4 rv = ((vd4){1.0, 1.0, 1.0, 1.0}) / sv; /* RN64(1 / s) */
        memcpy(cd->r + 4 * v, &rv, sizeof rv);
    }
    for (int j = 0; j < LANES; j++) {
        cd->s32[j] = (float)cd->s[j]; /* exact: a binary16 value */
        cd->r32[j] = 1.0f / cd->s32[j]; /* RN32(1 / s) */
    }
    return 0;
}

/* The exact choice from the binary32 screen, or -1 (the header's "binary32 screen"): with F the
 * screen's lane errors of a group of n <= SCREEN_VALUES values and bmax = max(qmax, -qmin),
 * every lane with F > T = (min F + ETA) * K + ETA has a binary64 error strictly above the
 * smallest one, so the chosen candidate is among the others (the survivors); where they all
 * have one scale (so one binary64 error, the smallest), it is the first of them.  Else -1:
 * the binary64 search decides. */
#define SCREEN_VALUES 1024
#define SCREEN_ETA 0x1p-100 /* 7.888609052210118e-31: every underflow, even flushed, is below */
INLINE int screen_choice(const float *f, const float *s32, Py_ssize_t n, double bmax) {
    /* delta = (16 (bmax + 1) + 2 (n + 3)) 2^-24 bounds the screen's relative error, and
     * K = 1 + 4 delta + 2^-30 the ratio (1 + delta)(1 + gamma) / ((1 - delta)(1 - gamma)) of
     * the bounds, gamma <= 2^-40 the binary64 sum's, with room for T's own roundings. */
    const double u = 0x1p-24;         /* 5.9604644775390625e-08 */
    const double slack = 0x1p-30;     /* 9.313225746154785e-10 */
    const double delta = (16.0 * (bmax + 1.0) + 2.0 * ((double)n + 3.0)) * u;
    const double kk = 1.0 + 4.0 * delta + slack;
    /* The smallest F by a tree of minima (the minimum does not depend on the order). */
    vf8 h[2];
    memcpy(h, f, sizeof h);
    const vf8 m8 = SEL(vj8, vf8, h[0] < h[1], h[0], h[1]);
    vf4 q[2];
    memcpy(q, &m8, sizeof q);
    const vf4 m4 = SEL(vj4, vf4, q[0] < q[1], q[0], q[1]);
    const float ma = m4[0] < m4[1] ? m4[0] : m4[1], mb = m4[2] < m4[3] ? m4[2] : m4[3];
    const double th = ((double)(ma < mb ? ma : mb) + SCREEN_ETA) * kk + SCREEN_ETA;
    /* T as binary32, rounded up (th > 0): F <= T in binary32 exactly where F <= T. */
    float thf = (float)th;
    if ((double)thf < th) thf = f32_from_bits(bits_from_f32(thf) + 1u);
    unsigned hits = 0;
    for (int l = 0; l < LANES; l++) hits |= (unsigned)(f[l] <= thf) << l;
    const int first = __builtin_ctz(hits); /* the smallest F is at most T */
    for (unsigned rest = hits & (hits - 1); rest != 0; rest &= rest - 1)
        if (s32[__builtin_ctz(rest)] != s32[first]) return -1;
    return first;
}

/* The unweighted search prunes (errors_pruned) for formats with at least this qmax: there the
 * bound removes candidates 8..13 in every Gaussian group measured (W8G32_F16S), while below it
 * it removed none (Q4..Q6) and the split search only costs. */
#define PRUNE_QMAX 64

/* The choice among a searched group's candidates (all LANES errors). */
INLINE int search_choice(const double *e) {
    /* The smallest error among the candidates, and the first index that has it (the document's
     * rule: a later candidate must be strictly smaller), by a tree of minima and a bit mask
     * instead of one long chain of compares: the minimum of a set does not depend on the order
     * it is taken in, and errors are never NaN.  The lanes that are no usable candidate have
     * lane 0's error (see `candidates`), so the first index never lands on one. */
    double m = e[0];
    {
        vd4 e4[4];
        memcpy(e4, e, sizeof e4);
        const vd4 m01 = SEL(vi4, vd4, e4[1] < e4[0], e4[1], e4[0]);
        const vd4 m23 = SEL(vi4, vd4, e4[3] < e4[2], e4[3], e4[2]);
        const vd4 m4 = SEL(vi4, vd4, m23 < m01, m23, m01);
        const double ma = m4[1] < m4[0] ? m4[1] : m4[0], mb = m4[3] < m4[2] ? m4[3] : m4[2];
        m = mb < ma ? mb : ma;
    }
    unsigned hits = 0;
    for (int j = 0; j < LANES; j++) hits |= (unsigned)(e[j] == m) << j;
    return __builtin_ctz(hits); /* hits != 0: m is one of the errors */
}

/* A group's stored codes and scale word for its chosen candidate (the screen's, or -1 for
 * the search's choice), and verify's statistics (st, when not NULL). */
INLINE void finish_group(const double *x, Py_ssize_t n, const candidates *cd, int chosen,
                         int qmin, int qmax, uint16_t *scale_out, int8_t *codes, double *st) {
    const int best = chosen >= 0 ? chosen : search_choice(cd->err);
    const double sb = cd->s[best];
    codes_for(x, n, sb, qmax >= PRUNE_QMAX ? 0.0 : cd->r[best], (double)qmin, (double)qmax, codes);
    if (st != NULL) { /* verify's statistics: e = x - s * q is exact (see the contract) */
        double mx = st[0], se = st[1], sx = st[2];
        for (Py_ssize_t i = 0; i < n; i++) {
            const double ei = x[i] - (double)codes[i] * sb, ae = ei < 0 ? -ei : ei;
            mx = ae > mx ? ae : mx;
            se = se + ei * ei;
            sx = sx + x[i] * x[i];
        }
        st[0] = mx; st[1] = se; st[2] = sx;
    }
    *scale_out = cd->s16[best];
}

/* Groups handled together by encode_block's three phases (where a group has at most
 * CHUNK_VALUES values; one at a time above). */
#define CHUNK 8
#define CHUNK_VALUES 1024

/* The whole block, without the GIL.  xd: 4 * chunk * min(group, k) doubles of scratch; wd: k
 * widened weights or NULL.  Returns 0, 1 (non-finite at bad_row, bad_col) or 2 (overflow at
 * bad_row, group bad_col, raw scale bad_raw).
 *
 * A row's groups go `chunk` at a time through three phases: (1) in group order, read and check
 * the values (the first refusal in row-major order is returned before anything after it is
 * looked at) and form the candidates; (2) the search of each group; (3) in group order, the
 * choice, the stored codes and the statistics (so their sums keep row and index order).  Every
 * group's arithmetic is the same as one group at a time; the phases only let the processor
 * overlap one group's chain of dependent steps around the search (the maximum, the candidate
 * divisions and roundings, the reciprocals; the choice and the codes' divisions) with the
 * next group's, which the search's long loop in between kept apart. */
CLONES static int encode_block(const void *wbuf, int source, Py_ssize_t n, Py_ssize_t k, int group,
                        Py_ssize_t groups, int chunk, int qmin, int qmax, const double *wd,
                        double *xd, candidate_memo *memo, int8_t *out, uint16_t *sc,
                        Py_ssize_t *bad_row, Py_ssize_t *bad_col, float *bad_raw, double *st) {
    const uint16_t *w16 = (const uint16_t *)wbuf;
    const uint32_t *w32 = (const uint32_t *)wbuf;
    const Py_ssize_t gs = group < k ? group : k; /* scratch values per group */
    double *const axd = xd + chunk * gs, *const bqd = axd + chunk * gs;
    float *const ax32 = (float *)(void *)(bqd + chunk * gs), *const bq32 = ax32 + chunk * gs;
    const double lo = (double)qmin, hi = (double)qmax;
    const float flo = (float)-qmin, fhi = (float)qmax;
    candidates cd[CHUNK];
    int live[CHUNK], chosen[CHUNK];
    double amaxd[CHUNK];
    const int prune = wd == NULL && qmax >= PRUNE_QMAX;
    const int screen = wd == NULL && !prune && use_screen; /* W8: the pruned search is cheaper */
    const double bmax = qmax > -qmin ? hi : -lo;
    for (Py_ssize_t r = 0; r < n; r++) {
        for (Py_ssize_t g0 = 0; g0 < groups; g0 += chunk) {
            const Py_ssize_t g1 = groups - g0 < chunk ? groups : g0 + chunk;
            for (Py_ssize_t g = g0; g < g1; g++) { /* phase 1 */
                const Py_ssize_t j = g - g0, a = g * group, b = a + group < k ? a + group : k;
                double *const x = xd + j * gs;
                live[j] = 0;
                /* Sign-cleared words: unsigned order is the order of |x|, inf/NaN above all. */
                uint32_t amax_bits = 0; /* binary32 bits of the largest |x| */
                if (source == 1) {
                    const uint32_t *p = w32 + r * k;
                    uint32_t m = 0;
                    for (Py_ssize_t i = a; i < b; i++) {
                        uint32_t v = p[i] & F32_MAG;
                        m = v > m ? v : m;
                        x[i - a] = (double)f32_from_bits(p[i]);
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
                    if (source == 0 && screen) { /* widened and split (split_values32) */
                        widen_bf16(p + a, b - a, flo, fhi, x, ax32 + j * gs, bq32 + j * gs);
                        amax_bits = m << 16;
                    } else if (source == 0) { /* widened and split (split_values) */
                        double *const ax = axd + j * gs, *const bq = bqd + j * gs;
                        for (Py_ssize_t i = a; i < b; i++) {
                            const double v = (double)f32_from_bits((uint32_t)p[i] << 16);
                            x[i - a] = v;
                            ax[i - a] = fabs(v);
                            bq[i - a] = v < 0 ? -lo : hi;
                        }
                        amax_bits = m << 16;
                    } else {
                        for (Py_ssize_t i = a; i < b; i++) x[i - a] = f16w_to_f64(p[i]);
                        double am = f16_to_f64((uint16_t)m);
                        float amf = (float)am; /* exact: binary16 values are binary32 values */
                        memcpy(&amax_bits, &amf, 4);
                    }
                }
                if (amax_bits == 0) { /* all-zero group: +0 scale, zero codes, zero error */
                    sc[r * groups + g] = 0;
                    memset(out + r * k + a, 0, (size_t)(b - a));
                    continue;
                }
                const uint32_t slot = (amax_bits * 0x9E3779B1u) >> (32 - MEMO_BITS);
                if (memo != NULL && memo->key[slot] == amax_bits) {
                    memcpy(&cd[j], &memo->c[slot], CANDIDATE_BYTES);
                } else {
                    float raw = 0.0f;
                    if (group_candidates(f32_from_bits(amax_bits), qmin, qmax, &cd[j], &raw)) {
                        *bad_row = r; *bad_col = g; *bad_raw = raw;
                        return 2;
                    }
                    if (memo != NULL) {
                        memo->key[slot] = amax_bits;
                        memcpy(&memo->c[slot], &cd[j], CANDIDATE_BYTES);
                    }
                }
                if (source != 0 && screen)
                    split_values32(x, b - a, qmin, qmax, ax32 + j * gs, bq32 + j * gs);
                else if (source != 0)
                    split_values(x, b - a, lo, hi, axd + j * gs, bqd + j * gs);
                amaxd[j] = (double)f32_from_bits(amax_bits);
                live[j] = 1;
            }
            for (Py_ssize_t g = g0; g < g1; g++) { /* phase 2 */
                const Py_ssize_t j = g - g0, a = g * group, b = a + group < k ? a + group : k;
                chosen[j] = -1;
                if (!live[j]) continue;
                if (screen && b - a <= SCREEN_VALUES) {
                    float f[LANES];
                    screen_for(ax32 + j * gs, bq32 + j * gs, b - a, cd[j].s32, cd[j].r32, f);
                    chosen[j] = screen_choice(f, cd[j].s32, b - a, bmax);
                    if (chosen[j] >= 0) continue;
                }
                /* The binary64 search, on |x| and the bounds in binary64 (split in phase 1
                 * where there is no screen, which decides most groups without them). */
                if (screen) split_values(xd + j * gs, b - a, lo, hi, axd + j * gs, bqd + j * gs);
                if (prune)
                    errors_pruned(axd + j * gs, bqd + j * gs, b - a, cd[j].s, cd[j].r,
                                  amaxd[j], bmax, cd[j].err);
                else
                    errors_for(axd + j * gs, bqd + j * gs, wd != NULL ? wd + a : NULL, b - a,
                               cd[j].s, cd[j].r, cd[j].err);
            }
            for (Py_ssize_t g = g0; g < g1; g++) { /* phase 3 */
                const Py_ssize_t j = g - g0, a = g * group, b = a + group < k ? a + group : k;
                if (live[j])
                    finish_group(xd + j * gs, b - a, &cd[j], chosen[j], qmin, qmax,
                                 &sc[r * groups + g],
                                 out + r * k + a, st);
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
    /* Scratch (allocated with the GIL, as PyMem_Malloc requires): a chunk of groups' values,
     * their magnitudes and bounds and, after them, the candidate memo (encode_block), the
     * widened weights, and an aligned copy of a misaligned input. */
    double *xd = NULL, *wd = NULL;
    void *aligned = NULL;
    const Py_ssize_t gs = group < k ? group : k;
    const int chunk = gs <= CHUNK_VALUES ? CHUNK : 1;
    if (why == NULL) {
        xd = (double *)PyMem_Malloc((size_t)4 * (size_t)chunk * (size_t)gs * sizeof(double) +
                                    (source != 1 ? sizeof(candidate_memo) : 0));
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
    candidate_memo *memo = NULL; /* BF16 and binary16 only (candidate_memo) */
    if (source != 1) {
        memo = (candidate_memo *)(void *)(xd + (size_t)4 * (size_t)chunk * (size_t)gs);
        memset(memo->key, 0, sizeof memo->key);
    }
    int kind;
    Py_ssize_t bad_row = 0, bad_col = 0;
    float bad_raw = 0.0f;
    double st[3] = {0.0, 0.0, 0.0};
    Py_BEGIN_ALLOW_THREADS
    kind = encode_block(wbuf, source, n, k, group, b.groups, chunk, qmin, qmax, wd, xd, memo,
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
        xd = (double *)PyMem_Malloc((size_t)3 * (size_t)n * sizeof(double));
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
        double s[LANES], rs[LANES], err[LANES];
        double *const ax = xd + n, *const bq = ax + n;
        split_values(xd, n, (double)qmin, (double)qmax, ax, bq);
        for (Py_ssize_t j0 = 0; j0 < m; j0 += LANES) {
            for (int l = 0; l < LANES; l++) {
                uint16_t h;
                memcpy(&h, (const unsigned char *)scales.buf + 2 * (j0 + (j0 + l < m ? l : 0)), 2);
                s[l] = f16_to_f64(h);
                rs[l] = 1.0 / s[l]; /* RN64(1 / s), as group_candidates */
            }
            errors_for(ax, bq, wd, n, s, rs, err);
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

static PyObject *pruned_errors(PyObject *self, PyObject *args) {
    /* Test hook: the 16 lane errors of one group (n finite binary32 words, not all zero) as
     * errors_pruned leaves them, whatever the format: +inf for the lanes it skipped. */
    Py_buffer x, out;
    int qmin, qmax;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iiw*", &x, &qmin, &qmax, &out)) return NULL;
    const Py_ssize_t n = x.len / 4;
    const char *why = NULL;
    double *xd = NULL;
    if (x.len % 4 || n < 1 || out.len != 8 * LANES)
        why = "pruned_errors: need n >= 1 binary32 values and 16 float64 outputs";
    else if (qmin < -128 || qmin >= 0 || qmax <= 0 || qmax > 127)
        why = "pruned_errors: need -128 <= qmin < 0 < qmax <= 127";
    else if ((xd = (double *)PyMem_Malloc((size_t)3 * (size_t)n * sizeof(double))) == NULL) {
        PyBuffer_Release(&x); PyBuffer_Release(&out);
        return PyErr_NoMemory();
    }
    uint32_t m = 0;
    for (Py_ssize_t i = 0; i < n && why == NULL; i++) {
        uint32_t u;
        memcpy(&u, (const unsigned char *)x.buf + 4 * i, 4);
        if ((u & F32_EXP) == F32_EXP) why = "pruned_errors: values must be finite";
        xd[i] = (double)f32_from_bits(u);
        m = (u & F32_MAG) > m ? (u & F32_MAG) : m;
    }
    candidates cd;
    float raw = 0.0f;
    if (why == NULL && m == 0) why = "pruned_errors: the group must not be all zero";
    if (why == NULL && group_candidates(f32_from_bits(m), qmin, qmax, &cd, &raw))
        why = "pruned_errors: the canonical scale overflows binary16";
    if (why == NULL) {
        const double lo = (double)qmin, hi = (double)qmax;
        split_values(xd, n, lo, hi, xd + n, xd + 2 * n);
        errors_pruned(xd + n, xd + 2 * n, n, cd.s, cd.r, (double)f32_from_bits(m),
                      qmax > -qmin ? hi : -lo, cd.err);
        memcpy(out.buf, cd.err, sizeof cd.err);
    }
    PyMem_Free(xd);
    PyBuffer_Release(&x); PyBuffer_Release(&out);
    if (why != NULL) {
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *screen_errors(PyObject *self, PyObject *args) {
    /* Test hook: the binary32 screen of one group (1 <= n <= SCREEN_VALUES finite binary32
     * words, not all zero): its 16 lane errors F (float32, written to out) and its choice, the
     * candidate index or -1 where the binary64 search must decide. */
    Py_buffer x, out;
    int qmin, qmax;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iiw*", &x, &qmin, &qmax, &out)) return NULL;
    const Py_ssize_t n = x.len / 4;
    const char *why = NULL;
    double *xd = NULL;
    if (x.len % 4 || n < 1 || n > SCREEN_VALUES || out.len != 4 * LANES)
        why = "screen_errors: need 1 to 1024 binary32 values and 16 float32 outputs";
    else if (qmin < -128 || qmin >= 0 || qmax <= 0 || qmax > 127)
        why = "screen_errors: need -128 <= qmin < 0 < qmax <= 127";
    else if ((xd = (double *)PyMem_Malloc((size_t)2 * (size_t)n * sizeof(double))) == NULL) {
        PyBuffer_Release(&x); PyBuffer_Release(&out);
        return PyErr_NoMemory();
    }
    uint32_t m = 0;
    for (Py_ssize_t i = 0; i < n && why == NULL; i++) {
        uint32_t u;
        memcpy(&u, (const unsigned char *)x.buf + 4 * i, 4);
        if ((u & F32_EXP) == F32_EXP) why = "screen_errors: values must be finite";
        xd[i] = (double)f32_from_bits(u);
        m = (u & F32_MAG) > m ? (u & F32_MAG) : m;
    }
    candidates cd;
    float raw = 0.0f, f[LANES];
    int chosen = -1;
    if (why == NULL && m == 0) why = "screen_errors: the group must not be all zero";
    if (why == NULL && group_candidates(f32_from_bits(m), qmin, qmax, &cd, &raw))
        why = "screen_errors: the canonical scale overflows binary16";
    if (why == NULL) {
        float *const ax = (float *)(void *)(xd + n), *const bq = ax + n;
        split_values32(xd, n, qmin, qmax, ax, bq);
        screen_for(ax, bq, n, cd.s32, cd.r32, f);
        chosen = screen_choice(f, cd.s32, n, qmax > -qmin ? (double)qmax : (double)-qmin);
        memcpy(out.buf, f, sizeof f);
    }
    PyMem_Free(xd);
    PyBuffer_Release(&x); PyBuffer_Release(&out);
    if (why != NULL) {
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    return PyLong_FromLong(chosen);
}

/* Test hook: screen_rule(f, scales, n, bmax) is screen_choice on given lane errors f (16
 * finite float32 >= 0) and lane scales (16 binary16 words, finite and > 0) of a group of n
 * values: the rule alone, so its margin can be held to the document's. */
static PyObject *screen_rule(PyObject *self, PyObject *args) {
    Py_buffer fb, sb;
    Py_ssize_t n;
    int bmax;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*ni", &fb, &sb, &n, &bmax)) return NULL;
    const char *why = NULL;
    float f[LANES], s32[LANES];
    if (fb.len != 4 * LANES || sb.len != 2 * LANES || n < 1 || n > SCREEN_VALUES || bmax < 1 ||
        bmax > 128)
        why = "screen_rule: need 16 float32, 16 binary16 words, 1 <= n <= 1024, 1 <= bmax <= 128";
    for (int l = 0; l < LANES && why == NULL; l++) {
        uint16_t h;
        memcpy(&f[l], (const unsigned char *)fb.buf + 4 * l, 4);
        memcpy(&h, (const unsigned char *)sb.buf + 2 * l, 2);
        if (!(f[l] >= 0.0f && f[l] <= FLT_MAX) || h == 0 || h >= F16_INF)
            why = "screen_rule: errors must be finite and >= 0, scales finite and > 0";
        else
            s32[l] = (float)f16_to_f64(h);
    }
    PyBuffer_Release(&fb); PyBuffer_Release(&sb);
    if (why != NULL) {
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    return PyLong_FromLong(screen_choice(f, s32, n, (double)bmax));
}

/* Test hook: screen() is whether encode_rows runs the binary32 screen; screen(flag) sets it
 * (off: every group takes the binary64 search, the kernel before the screen).  Not for use
 * while another thread encodes. */
static PyObject *screen(PyObject *self, PyObject *args) {
    int flag = -1;
    (void)self;
    if (!PyArg_ParseTuple(args, "|p", &flag)) return NULL;
    if (flag >= 0) use_screen = flag;
    return PyBool_FromLong(use_screen);
}

static PyObject *f64_to_f16_words(PyObject *self, PyObject *args) {
    /* Test hook: finite non-negative binary64 values -> binary16 words, the kernel's rounding:
     * the scalar f64_to_f16_rne (lanes 1) or the four-lane one of the candidates (lanes 4). */
    Py_buffer in, out;
    int lanes = 1;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*|i", &in, &out, &lanes)) return NULL;
    const Py_ssize_t count = in.len / 8;
    const char *why = NULL;
    if (in.len % 8 || out.len != 2 * count) why = "f64_to_f16_words: need n float64 and n uint16";
    else if (lanes != 1 && lanes != 4) why = "f64_to_f16_words: lanes must be 1 or 4";
    for (Py_ssize_t i = 0; i < count && why == NULL; i++) {
        double v;
        memcpy(&v, (const unsigned char *)in.buf + 8 * i, 8);
        if (!(v >= 0.0 && v <= DBL_MAX)) {
            why = "f64_to_f16_words: values must be finite and >= 0";
            break;
        }
    }
    for (Py_ssize_t i = 0; i < count && why == NULL; i += lanes) {
        double v[4] = {0.0, 0.0, 0.0, 0.0};
        uint16_t h[4];
        const Py_ssize_t m = count - i < lanes ? count - i : lanes;
        memcpy(v, (const unsigned char *)in.buf + 8 * i, (size_t)m * 8);
        if (lanes == 1) {
            h[0] = f64_to_f16_rne(v[0]);
        } else {
            vd4 vv;
            memcpy(&vv, v, sizeof vv);
            const vu4 hv = f64_to_f16_rne4(vv);
            for (int l = 0; l < 4; l++) h[l] = (uint16_t)hv[l];
        }
        memcpy((unsigned char *)out.buf + 2 * i, h, (size_t)m * 2);
    }
    PyBuffer_Release(&in); PyBuffer_Release(&out);
    if (why != NULL) {
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *f16_to_f64_words(PyObject *self, PyObject *args) {
    /* Test hook: finite non-negative binary16 words -> binary64, the candidates' four-lane
     * widening. */
    Py_buffer in, out;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*", &in, &out)) return NULL;
    const Py_ssize_t count = in.len / 2;
    const char *why = NULL;
    if (in.len % 2 || out.len != 8 * count) why = "f16_to_f64_words: need n uint16 and n float64";
    for (Py_ssize_t i = 0; i < count && why == NULL; i++) {
        uint16_t h;
        memcpy(&h, (const unsigned char *)in.buf + 2 * i, 2);
        if (h >= F16_INF) why = "f16_to_f64_words: words must be finite and >= 0";
    }
    for (Py_ssize_t i = 0; i < count && why == NULL; i += 4) {
        uint16_t h[4] = {0, 0, 0, 0};
        const Py_ssize_t m = count - i < 4 ? count - i : 4;
        memcpy(h, (const unsigned char *)in.buf + 2 * i, (size_t)m * 2);
        const vu4 hv = {h[0], h[1], h[2], h[3]};
        const vd4 v = f16_to_f64_4(hv);
        memcpy((unsigned char *)out.buf + 8 * i, &v, (size_t)m * 8);
    }
    PyBuffer_Release(&in); PyBuffer_Release(&out);
    if (why != NULL) {
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Test hook: kernel_path() is the name of the search's path ("avx512", "avx2" or "sse2");
 * kernel_path(name) selects it where the CPU can run it, so the tests run every path this
 * machine has.  Not for use while another thread encodes. */
static PyObject *kernel_path(PyObject *self, PyObject *args) {
    const char *want = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "|s", &want)) return NULL;
    if (want != NULL) {
        int p = -1;
        for (int i = 0; i < 3; i++)
            if (strcmp(want, PATH_NAMES[i]) == 0 && path_available(i)) p = i;
        if (p < 0) {
            PyErr_SetString(PyExc_ValueError,
                            "kernel_path: avx512, avx2 or sse2, one this CPU can run");
            return NULL;
        }
        path = p;
    }
    return PyUnicode_FromString(PATH_NAMES[path]);
}

static PyMethodDef methods[] = {
    {"kernel_path", kernel_path, METH_VARARGS, "The search's path; selects one (test hook)."},
    {"encode_rows", encode_rows, METH_VARARGS, "Encode a block of rows (see module docs)."},
    {"group_errors", group_errors, METH_VARARGS, "Errors of one group for given scales (test hook)."},
    {"pruned_errors", pruned_errors, METH_VARARGS, "A group's lane errors after pruning (test hook)."},
    {"screen_errors", screen_errors, METH_VARARGS, "A group's binary32 screen (test hook)."},
    {"screen_rule", screen_rule, METH_VARARGS, "The screen's choice rule alone (test hook)."},
    {"screen", screen, METH_VARARGS, "Whether encode_rows screens; sets it (test hook)."},
    {"f64_to_f16_words", f64_to_f16_words, METH_VARARGS, "binary64 -> binary16 RNE (test hook)."},
    {"f16_to_f64_words", f16_to_f64_words, METH_VARARGS, "binary16 -> binary64 (test hook)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_msekernel",
    "Host kernel for MSE_F16_SEARCH_V1 (see the C source's header).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__msekernel(void) {
#if HAVE_SIMD
    __builtin_cpu_init();
#endif
    path = path_available(PATH_AVX512) ? PATH_AVX512
           : path_available(PATH_AVX2) ? PATH_AVX2 : PATH_SSE2;
    return PyModule_Create(&module);
}
