/*
 * safetensors(raw, data_start, data_len, dtypes, bits, make, file): the tensor entries of a
 * safetensors header, checked in one pass over its bytes, or None.
 *
 * None means "declined": anything this reader does not handle exactly as the reference
 * (source/header.py: loads_strict_json, then _entry per tensor and the tile check), and
 * everything the reference refuses.  The caller then runs the reference, which accepts the
 * header with the same entries or refuses it with its own message.  So this reader only ever
 * has to be right about headers it accepts:
 *
 *   - the text is JSON whitespace, one object, JSON whitespace (nothing else);
 *   - its keys are distinct strings without an escape, a raw control byte or DEL; a key of
 *     1..4096 code points (UTF-8 decoded strictly), other than "__metadata__", is a tensor;
 *   - "__metadata__" (once at most) is null or an object whose members are strings (escapes
 *     allowed): its byte span is returned, and the caller checks it with the reference JSON
 *     reader (duplicates, surrogates, UTF-8, string values);
 *   - each tensor's value is an object with exactly the keys dtype, shape and data_offsets
 *     (each once, any order): dtype one of `dtypes` (whose widths in bits are `bits`), shape
 *     at most 64 unsigned integers, data_offsets two (no sign, no leading zero, no fraction or
 *     exponent, at most 18 digits); the extent (product of the non-zero dimensions times the
 *     item size) at most 2**63 - 1, numel * bits a multiple of 8 and end - begin equal to
 *     numel * bits / 8 (any overflow declines);
 *   - in file order the tensors tile [0, data_len) exactly (an unsorted header declines, and
 *     so does a data_start or data_len that is negative or past 64 bits).
 *
 * Each tensor is built by one call of `make`: make(name, dtype, shape, begin, end) with
 * absolute offsets (data_start added) when `file` is None, else
 * make(name, dtype, shape, file, end - begin, begin).  Returns (tensors, span): tensors maps
 * each name to what make returned, in file order; span is (start, stop) of the metadata
 * object in `raw`, or None (no metadata, or null).  Whatever
 * `make` raises, and MemoryError, propagates (references released); nothing else raises.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_stheader.h"

#define MAX_NDIM 64
#define MAX_NAME_CHARS 4096
#define MAX_DIGITS 18 /* below 10**18: every value and offset sum fits in int64 */
#define DEL 127       /* U+007F: a control character in a tensor name (names.py) */

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} Cur;

static inline void
ws(Cur *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) {
        c->p++;
    }
}

static inline int
eat(Cur *c, unsigned char ch)
{
    ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A string without escapes at c->p: its bytes (between the quotes), 1; or 0. */
static int
plain_string(Cur *c, const unsigned char **start, Py_ssize_t *len)
{
    ws(c);
    if (c->p >= c->end || *c->p != '"') {
        return 0;
    }
    const unsigned char *q = ++c->p;
    while (q < c->end && *q != '"') {
        if (*q < 0x20 || *q == '\\' || *q == DEL) {
            return 0;
        }
        q++;
    }
    if (q >= c->end) {
        return 0;
    }
    *start = c->p;
    *len = q - c->p;
    c->p = q + 1;
    return 1;
}

/* Skips a string literal that may hold escapes (checked later by the reference reader). */
static int
skip_string(Cur *c)
{
    ws(c);
    if (c->p >= c->end || *c->p != '"') {
        return 0;
    }
    const unsigned char *q = c->p + 1;
    while (q < c->end && *q != '"') {
        if (*q < 0x20) {
            return 0;
        }
        if (*q == '\\') {
            q++;
        }
        q++;
    }
    if (q >= c->end) {
        return 0;
    }
    c->p = q + 1;
    return 1;
}

/* An unsigned JSON integer of at most MAX_DIGITS digits: 1 and its value, or 0. */
static int
uint_value(Cur *c, uint64_t *out)
{
    ws(c);
    const unsigned char *q = c->p;
    if (q >= c->end || *q < '0' || *q > '9') {
        return 0;
    }
    uint64_t v = 0;
    int n = 0;
    if (*q == '0') {
        q++;
        n = 1;
    }
    else {
        while (q < c->end && *q >= '0' && *q <= '9') {
            if (++n > MAX_DIGITS) {
                return 0;
            }
            v = v * 10 + (uint64_t)(*q - '0');
            q++;
        }
    }
    if (q < c->end && (*q == '.' || *q == 'e' || *q == 'E' || (*q >= '0' && *q <= '9'))) {
        return 0;
    }
    c->p = q;
    *out = v;
    return 1;
}

static int
key_is(const unsigned char *k, Py_ssize_t n, const char *word)
{
    size_t w = strlen(word);
    return (size_t)n == w && memcmp(k, word, w) == 0;
}

/* The metadata value: null (span stays unset) or an object of string members (skipped; the
   span covers it).  1, or 0 (declined). */
static int
metadata_value(Cur *c, const unsigned char *raw, Py_ssize_t *a, Py_ssize_t *b, int *has)
{
    ws(c);
    if ((size_t)(c->end - c->p) >= 4 && memcmp(c->p, "null", 4) == 0) {
        c->p += 4;
        *has = 0;
        return 1;
    }
    if (c->p >= c->end || *c->p != '{') {
        return 0;
    }
    *a = c->p - raw;
    c->p++;
    if (!eat(c, '}')) {
        for (;;) {
            if (!skip_string(c) || !eat(c, ':') || !skip_string(c)) {
                return 0;
            }
            if (eat(c, '}')) {
                break;
            }
            if (!eat(c, ',')) {
                return 0;
            }
        }
    }
    *b = c->p - raw;
    *has = 1;
    return 1;
}

#define MAX_DTYPES 32

typedef struct {
    PyObject *dtypes; /* tuple of str */
    int ndtypes;
    const char *dtype_text[MAX_DTYPES];
    Py_ssize_t dtype_len[MAX_DTYPES];
    long dtype_bits[MAX_DTYPES]; /* 1..64 */
    PyObject *make;
    PyObject *file; /* NULL: the (name, dtype, shape, begin, end) form */
    int64_t data_start;
    /* The previous shape's text and tuple: neighbouring tensors often share a shape. */
    const unsigned char *shape_text;
    Py_ssize_t shape_len;
    PyObject *shape;
} Ctx;

/* One tensor entry's value at c->p; *obj is what make returned.  1, 0 (declined) or -1. */
static int
tensor_value(Cur *c, Ctx *x, PyObject *name, int64_t *expected, PyObject **obj)
{
    if (!eat(c, '{')) {
        return 0;
    }
    unsigned seen = 0;
    PyObject *dtype = NULL;
    long bits = 0;
    uint64_t dims[MAX_NDIM];
    int ndim = 0;
    uint64_t off[2] = {0, 0};
    const unsigned char *shape_text = NULL;
    Py_ssize_t shape_len = 0;
    for (int member = 0; member < 3; member++) {
        const unsigned char *k;
        Py_ssize_t kn;
        if (member > 0 && !eat(c, ',')) {
            return 0;
        }
        if (!plain_string(c, &k, &kn) || !eat(c, ':')) {
            return 0;
        }
        if (key_is(k, kn, "dtype") && !(seen & 1)) {
            seen |= 1;
            const unsigned char *d;
            Py_ssize_t dn;
            if (!plain_string(c, &d, &dn)) {
                return 0;
            }
            for (int i = 0; i < x->ndtypes; i++) {
                if (x->dtype_len[i] == dn && memcmp(x->dtype_text[i], d, (size_t)dn) == 0) {
                    dtype = PyTuple_GET_ITEM(x->dtypes, i);
                    bits = x->dtype_bits[i];
                    break;
                }
            }
            if (dtype == NULL) {
                return 0;
            }
        }
        else if (key_is(k, kn, "shape") && !(seen & 2)) {
            seen |= 2;
            if (!eat(c, '[')) {
                return 0;
            }
            shape_text = c->p;
            if (!eat(c, ']')) {
                for (;;) {
                    if (ndim == MAX_NDIM || !uint_value(c, &dims[ndim])) {
                        return 0;
                    }
                    ndim++;
                    if (eat(c, ']')) {
                        break;
                    }
                    if (!eat(c, ',')) {
                        return 0;
                    }
                }
            }
            shape_len = c->p - shape_text;
        }
        else if (key_is(k, kn, "data_offsets") && !(seen & 4)) {
            seen |= 4;
            if (!eat(c, '[') || !uint_value(c, &off[0]) || !eat(c, ',') ||
                !uint_value(c, &off[1]) || !eat(c, ']')) {
                return 0;
            }
        }
        else {
            return 0; /* another key, or one repeated */
        }
    }
    if (!eat(c, '}')) {
        return 0;
    }
    /* The reference's arithmetic, in 64 bits: any overflow declines. */
    uint64_t extent = 1, numel = 1, item = (uint64_t)((bits + 7) / 8), total, nbits;
    for (int i = 0; i < ndim; i++) {
        if (__builtin_mul_overflow(extent, dims[i] ? dims[i] : 1, &extent)) {
            return 0;
        }
        numel *= dims[i]; /* at most extent: no overflow */
    }
    if (__builtin_mul_overflow(extent, item, &total) || total > (uint64_t)INT64_MAX) {
        return 0;
    }
    if (__builtin_mul_overflow(numel, (uint64_t)bits, &nbits) || nbits % 8) {
        return 0;
    }
    if (off[0] > off[1] || off[1] - off[0] != nbits / 8 || (int64_t)off[0] != *expected) {
        return 0;
    }
    *expected = (int64_t)off[1];

    PyObject *shape;
    if (x->shape != NULL && x->shape_len == shape_len &&
        memcmp(x->shape_text, shape_text, (size_t)shape_len) == 0) {
        shape = Py_NewRef(x->shape);
    }
    else {
        shape = PyTuple_New(ndim);
        if (shape == NULL) {
            return -1;
        }
        for (int i = 0; i < ndim; i++) {
            PyObject *d = PyLong_FromUnsignedLongLong(dims[i]);
            if (d == NULL) {
                Py_DECREF(shape);
                return -1;
            }
            PyTuple_SET_ITEM(shape, i, d);
        }
        Py_XSETREF(x->shape, Py_NewRef(shape));
        x->shape_text = shape_text;
        x->shape_len = shape_len;
    }
    PyObject *begin = PyLong_FromLongLong(x->data_start + (int64_t)off[0]);
    PyObject *tail = x->file == NULL ? PyLong_FromLongLong(x->data_start + (int64_t)off[1])
                                     : PyLong_FromUnsignedLongLong(off[1] - off[0]);
    if (begin == NULL || tail == NULL) {
        Py_XDECREF(begin);
        Py_XDECREF(tail);
        Py_DECREF(shape);
        return -1;
    }
    if (x->file == NULL) {
        PyObject *args[5] = {name, dtype, shape, begin, tail};
        *obj = PyObject_Vectorcall(x->make, args, 5, NULL);
    }
    else {
        PyObject *args[6] = {name, dtype, shape, x->file, tail, begin};
        *obj = PyObject_Vectorcall(x->make, args, 6, NULL);
    }
    Py_DECREF(begin);
    Py_DECREF(tail);
    Py_DECREF(shape);
    return *obj == NULL ? -1 : 1;
}

/* The whole header: 1 (tensors filled, the span set), 0 (declined) or -1. */
static int
header(Cur *c, Ctx *x, const unsigned char *raw, int64_t data_len, PyObject *tensors,
       Py_ssize_t span[2], int *has_meta)
{
    int meta_seen = 0;
    int64_t expected = 0;
    if (!eat(c, '{')) {
        return 0;
    }
    if (!eat(c, '}')) {
        for (;;) {
            const unsigned char *k;
            Py_ssize_t kn;
            if (!plain_string(c, &k, &kn) || !eat(c, ':')) {
                return 0;
            }
            if (key_is(k, kn, "__metadata__")) {
                if (meta_seen || !metadata_value(c, raw, &span[0], &span[1], has_meta)) {
                    return 0;
                }
                meta_seen = 1;
            }
            else {
                Py_ssize_t chars = 0;
                for (Py_ssize_t i = 0; i < kn; i++) {
                    chars += (k[i] & 0xC0) != 0x80;
                }
                if (chars < 1 || chars > MAX_NAME_CHARS) {
                    return 0;
                }
                PyObject *name = PyUnicode_DecodeUTF8((const char *)k, kn, "strict");
                if (name == NULL) {
                    if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                        PyErr_Clear();
                        return 0;
                    }
                    return -1;
                }
                /* The code points counted above are the str's: strict UTF-8 decoded. */
                /* A repeated name declines (dup 1); -1 is an error. */
                int r = PyDict_Contains(tensors, name);
                r = r == 0 ? 1 : (r == 1 ? 0 : -1);
                PyObject *obj = NULL;
                if (r == 1) {
                    r = tensor_value(c, x, name, &expected, &obj);
                }
                if (r == 1) {
                    r = PyDict_SetItem(tensors, name, obj) < 0 ? -1 : 1;
                    Py_DECREF(obj);
                }
                Py_DECREF(name);
                if (r != 1) {
                    return r;
                }
            }
            if (eat(c, '}')) {
                break;
            }
            if (!eat(c, ',')) {
                return 0;
            }
        }
    }
    ws(c);
    return c->p == c->end && expected == data_len;
}

PyObject *
stheader_safetensors(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 7 || !PyBytes_Check(args[0]) || !PyLong_Check(args[1]) ||
        !PyLong_Check(args[2]) || !PyTuple_Check(args[3]) || !PyTuple_Check(args[4]) ||
        PyTuple_GET_SIZE(args[3]) != PyTuple_GET_SIZE(args[4]) || !PyCallable_Check(args[5]) ||
        (args[6] != Py_None && !PyUnicode_Check(args[6]))) {
        PyErr_SetString(PyExc_TypeError,
                        "safetensors(raw: bytes, data_start: int, data_len: int, "
                        "dtypes: tuple[str, ...], bits: tuple[int, ...], make, file: str | None)");
        return NULL;
    }
    Ctx x = {.dtypes = args[3], .make = args[5], .file = args[6] == Py_None ? NULL : args[6]};
    if (PyTuple_GET_SIZE(args[3]) > MAX_DTYPES) {
        PyErr_SetString(PyExc_ValueError, "safetensors: too many dtypes");
        return NULL;
    }
    x.ndtypes = (int)PyTuple_GET_SIZE(args[3]);
    for (int i = 0; i < x.ndtypes; i++) {
        PyObject *name = PyTuple_GET_ITEM(args[3], i), *width = PyTuple_GET_ITEM(args[4], i);
        if (!PyUnicode_Check(name) || !PyLong_Check(width)) {
            PyErr_SetString(PyExc_TypeError, "safetensors: dtypes are str, bits are int");
            return NULL;
        }
        x.dtype_text[i] = PyUnicode_AsUTF8AndSize(name, &x.dtype_len[i]);
        x.dtype_bits[i] = PyLong_AsLong(width);
        if (x.dtype_text[i] == NULL || (x.dtype_bits[i] == -1 && PyErr_Occurred())) {
            return NULL;
        }
        if (x.dtype_bits[i] < 1 || x.dtype_bits[i] > 64) {
            PyErr_SetString(PyExc_ValueError, "safetensors: a dtype width is not 1..64 bits");
            return NULL;
        }
    }
    long long data_start = PyLong_AsLongLong(args[1]);
    long long data_len = PyLong_AsLongLong(args[2]);
    if ((data_start == -1 || data_len == -1) && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            return NULL;
        }
        /* A region past 64 bits (a file size no file has, from a record): declined, and
           the reference refuses it with its own message. */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    const unsigned char *raw = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Cur c = {raw, raw + PyBytes_GET_SIZE(args[0])};
    x.data_start = data_start;
    PyObject *tensors = PyDict_New();
    if (tensors == NULL) {
        return NULL;
    }
    Py_ssize_t span[2] = {0, 0};
    int has_meta = 0;
    int r = data_start < 0 || data_len < 0
                ? 0
                : header(&c, &x, raw, data_len, tensors, span, &has_meta);
    Py_XDECREF(x.shape);
    if (r != 1) {
        Py_DECREF(tensors);
        if (r == 0) {
            Py_RETURN_NONE;
        }
        return NULL;
    }
    PyObject *meta = has_meta ? Py_BuildValue("(nn)", span[0], span[1]) : Py_NewRef(Py_None);
    if (meta == NULL) {
        Py_DECREF(tensors);
        return NULL;
    }
    return Py_BuildValue("(NN)", tensors, meta);
}
