/*
 * The bit fields of the binary floating-point words the C modules read and write: the C twin of
 * ninfer_convert/ieee.py (BinaryFormat), whose masks tests/test_c_sources.py holds these equal
 * to, so no C source writes one as a literal.  Word layout (IEEE 754 interchange): one sign
 * bit, the biased exponent, the trailing fraction; bfloat16 is binary32's high half.
 *
 *   NAME_SIGN  the sign bit                (BinaryFormat.sign_mask)
 *   NAME_EXP   the exponent field in place (exp_mask; also the word of +infinity)
 *   NAME_FRAC  the trailing fraction       (frac_mask)
 *   NAME_MAG   every bit but the sign      (magnitude_mask: word & MAG is the word of |x|)
 *   F16_INF    the word of +infinity (= F16_EXP), the binary16 scale word that overflowed
 *
 * A word is infinite or NaN exactly when (word & NAME_EXP) == NAME_EXP, and for sign-cleared
 * words unsigned order is the order of |x|, with infinity and NaN above every finite value.
 * Also the bit casts between words and floats (memcpy: no aliasing rule is broken).
 */
#ifndef NINFER_IEEE_H
#define NINFER_IEEE_H

#include <stdint.h>
#include <string.h>

#define F32_SIGN 0x80000000u
#define F32_EXP 0x7F800000u
#define F32_FRAC 0x007FFFFFu
#define F32_MAG 0x7FFFFFFFu

#define F16_SIGN 0x8000u
#define F16_EXP 0x7C00u
#define F16_FRAC 0x03FFu
#define F16_MAG 0x7FFFu
#define F16_INF F16_EXP /* the word of +infinity */

#define BF16_SIGN 0x8000u
#define BF16_EXP 0x7F80u
#define BF16_FRAC 0x007Fu
#define BF16_MAG 0x7FFFu

static inline float f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t bits_from_f32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline double f64_from_bits(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }
static inline uint64_t bits_from_f64(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }

#endif
