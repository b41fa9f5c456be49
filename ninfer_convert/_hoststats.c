/*
 * Error statistics of encoded blocks for `ninfer verify` (information, never a check).
 *
 * error_stats(words, source, n, k, group, codes, scales) -> (max |e|, sum e^2, sum x^2) for an
 * [n, k] block of BF16 (source 0) or binary32 (source 1) source words and its grouped codes and
 * binary16 scales, where e = x - s32 * q.
 *
 * This file is compiled on its own with -ffast-math (pyproject.toml, ext-modules) so that the sums and the maximum
 * vectorise: reassociating them changes the last bits of a statistic, never a code, a scale or
 * a verification result.  The encoder (_hostkernel.c) is built without it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline float f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static float f16_to_f32(uint16_t h) { /* finite non-negative binary16, exact */
    if ((h >> 10) == 0) return (float)h * 5.9604644775390625e-08f;
    return f32_from_bits(((uint32_t)h << 13) + (112u << 23));
}

#define STATS_GROUP(NAME, WORD, SHIFT)                                                         \
    static void NAME(const WORD *p, const int8_t *c, Py_ssize_t len, float s32, float *gmax,  \
                     double *ge, double *gx) {                                                 \
        float m = 0.0f, se = 0.0f, sx = 0.0f;                                                  \
        for (Py_ssize_t i = 0; i < len; i++) {                                                 \
            float x = f32_from_bits((uint32_t)p[i] << SHIFT);                                  \
            float e = x - s32 * (float)c[i];                                                   \
            float ae = e < 0.0f ? -e : e;                                                      \
            m = ae > m ? ae : m;                                                               \
            se += e * e;                                                                       \
            sx += x * x;                                                                       \
        }                                                                                      \
        *gmax = m > *gmax ? m : *gmax;                                                         \
        *ge += (double)se;                                                                     \
        *gx += (double)sx;                                                                     \
    }

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
STATS_GROUP(stats_group_bf16, uint16_t, 16)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
STATS_GROUP(stats_group_f32, uint32_t, 0)

static PyObject *error_stats(PyObject *self, PyObject *args) {
    Py_buffer words, codes, scales;
    int source, group;
    Py_ssize_t n, k;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*inniy*y*", &words, &source, &n, &k, &group, &codes,
                          &scales))
        return NULL;
    Py_ssize_t groups = group > 0 ? (k + group - 1) / group : 0;
    size_t wsize = source == 0 ? 2 : 4;
    if (group <= 0 || n < 0 || k <= 0 || (source != 0 && source != 1) ||
        words.len < (Py_ssize_t)(n * k * (Py_ssize_t)wsize) || codes.len < n * k ||
        scales.len < n * groups * 2) {
        PyBuffer_Release(&words); PyBuffer_Release(&codes); PyBuffer_Release(&scales);
        PyErr_SetString(PyExc_ValueError, "error_stats: inconsistent buffer sizes");
        return NULL;
    }
    const uint16_t *w16 = (const uint16_t *)words.buf;
    const uint32_t *w32 = (const uint32_t *)words.buf;
    const int8_t *q = (const int8_t *)codes.buf;
    const uint16_t *sc = (const uint16_t *)scales.buf;
    float me = 0.0f;
    double se = 0.0, sx = 0.0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < n; r++) {
        for (Py_ssize_t g = 0; g < groups; g++) {
            Py_ssize_t a = g * group, b = a + group < k ? a + group : k;
            float s32 = f16_to_f32(sc[r * groups + g]);
            if (source == 0)
                stats_group_bf16(w16 + r * k + a, q + r * k + a, b - a, s32, &me, &se, &sx);
            else
                stats_group_f32(w32 + r * k + a, q + r * k + a, b - a, s32, &me, &se, &sx);
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&words); PyBuffer_Release(&codes); PyBuffer_Release(&scales);
    return Py_BuildValue("(ddd)", (double)me, se, sx);
}

static PyMethodDef methods[] = {
    {"error_stats", error_stats, METH_VARARGS, "(max |e|, sum e^2, sum x^2) of an encoded block."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hoststats", "Error statistics of encoded blocks (see the C source).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__hoststats(void) { return PyModule_Create(&module); }
