/*
 * decode(raw, plan, memo, limit, json_depth): the header (or index) in the UTF-8 bytes `raw`
 * as schema objects, built while the text is parsed (no intermediate dicts), or None.
 *
 * None means "declined": anything this reader does not handle exactly as the reference reader
 * (container/typed_json.py: json.loads, then the field specs' checks) does, and anything the
 * reference refuses.  The caller then runs the reference, which accepts the document with the
 * same typed value or refuses it with its own message.  So this reader only ever has to be
 * right about documents it accepts: valid JSON (RFC 8259, whitespace allowed), no repeated key
 * in any object, no NaN/Infinity, finite floats, no lone surrogate escape, bracket nesting at
 * most `limit`, free-form JSON at most `json_depth` levels below its root (jsonfields.values.
 * json_value), and every value what its spec says.
 *
 * `raw` must be valid UTF-8 (the caller checks; the strings are decoded with CPython's strict
 * decoder, and a failure there declines too).  `plan` is made by jsonfields/direct.py from the
 * field specs; its nodes are tuples (kinds below).  `memo` is the per-header dict that interns
 * strings and shares equal instances of a shared class, as the reference's memo does.
 *
 * Memory safety against hostile bytes: every read is bounded by the end of `raw`; recursion
 * follows the plan (finite) and, inside free-form JSON, stops at `json_depth`.  A failing
 * allocation or a plan that is not well formed raises (MemoryError, TypeError), and so does
 * whatever a Python callback it makes raises (a class constructor, a pattern match, a signal
 * handler run inside one: KeyboardInterrupt); every such exception propagates with the
 * references taken so far released.  Nothing else raises.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_jsondecode.h"

/* Plan node kinds (jsonfields/direct.py writes the same numbers). */
enum { N_STR = 0, N_INT = 1, N_BOOL = 2, N_OPT = 3, N_SEQ = 4, N_MAP = 5, N_JSON = 6, N_OBJ = 7 };
#define MAX_KEYS 64 /* keys of one object node: a bit each in a uint64_t */
#define INTERN_SLOTS 1024

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
    Py_ssize_t level; /* open brackets */
    Py_ssize_t limit;
    Py_ssize_t json_depth;
    PyObject *memo;
    /* Interned strings by a hash of their UTF-8 bytes: a repeated value (a format, a dtype, a
       file name) is found without making and hashing a new str.  Each entry is the memo's own
       value for its text (memo.setdefault never replaces one), so a hit gives what
       memo.setdefault would. */
    PyObject *interned[INTERN_SLOTS];
} St;

/* NULL without an exception set: declined. */
#define DECLINE NULL

static int
bad_plan(void)
{
    PyErr_SetString(PyExc_TypeError, "_jsonfast.decode: malformed plan");
    return -1;
}

static PyObject *
item(PyObject *t, Py_ssize_t i)
{
    if (!PyTuple_Check(t) || i >= PyTuple_GET_SIZE(t)) {
        bad_plan();
        return NULL;
    }
    return PyTuple_GET_ITEM(t, i);
}

static int
int_item(PyObject *t, Py_ssize_t i, long long *out)
{
    PyObject *v = item(t, i);
    if (v == NULL) {
        return -1;
    }
    if (!PyLong_Check(v)) {
        return bad_plan();
    }
    *out = PyLong_AsLongLong(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* The fixed-size C struct packed (struct.pack) into the bytes item i of a plan node. */
static int
packed_item(PyObject *t, Py_ssize_t i, void *out, size_t size)
{
    PyObject *v = item(t, i);
    if (v == NULL) {
        return -1;
    }
    if (!PyBytes_Check(v) || (size_t)PyBytes_GET_SIZE(v) != size) {
        return bad_plan();
    }
    memcpy(out, PyBytes_AS_STRING(v), size);
    return 0;
}

static inline void
skip_ws(St *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) {
        s->p++;
    }
}

/* Whether the next byte (after whitespace) is `c`; consumes it when it is. */
static inline int
eat(St *s, unsigned char c)
{
    skip_ws(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return 1;
    }
    return 0;
}

static inline int
literal(St *s, const char *word, size_t n)
{
    if ((size_t)(s->end - s->p) >= n && memcmp(s->p, word, n) == 0) {
        s->p += n;
        return 1;
    }
    return 0;
}

static inline int
open_bracket(St *s)
{
    s->level++;
    return s->level <= s->limit;
}

/* ------------------------------------------------------------------------------------------ */
/* strings */

static int
hex4(const unsigned char *q, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = q[i];
        v <<= 4;
        if (c >= '0' && c <= '9') {
            v |= (unsigned)(c - '0');
        }
        else if (c >= 'a' && c <= 'f') {
            v |= (unsigned)(c - 'a' + 10);
        }
        else if (c >= 'A' && c <= 'F') {
            v |= (unsigned)(c - 'A' + 10);
        }
        else {
            return 0;
        }
    }
    *out = v;
    return 1;
}

static size_t
put_utf8(unsigned char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The string literal at s->p (its opening quote) as UTF-8 bytes: *out, *len point into the
   text when it holds no escape, else into *buf (PyMem_Malloc'd, the caller frees it).
   Returns 1, or 0 (declined: not a valid JSON string, or a lone surrogate escape), or -1 with
   MemoryError. */
static int
string_bytes(St *s, const unsigned char **out, Py_ssize_t *len, unsigned char **buf)
{
    *buf = NULL;
    if (s->p >= s->end || *s->p != '"') {
        return 0;
    }
    const unsigned char *start = ++s->p;
    const unsigned char *q = start;
    int escaped = 0;
    while (q < s->end && *q != '"') {
        if (*q < 0x20) {
            return 0; /* a raw control character: the parser (strict) refuses it */
        }
        if (*q == '\\') {
            escaped = 1;
            q++;
            if (q >= s->end) {
                return 0;
            }
        }
        q++;
    }
    if (q >= s->end) {
        return 0;
    }
    s->p = q + 1;
    if (!escaped) {
        *out = start;
        *len = q - start;
        return 1;
    }
    /* Decoded text is never longer than its literal (an escape of n bytes gives at most n
       UTF-8 bytes; a surrogate pair of 12 gives 4). */
    unsigned char *o = PyMem_Malloc((size_t)(q - start) + 1);
    if (o == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *buf = o;
    size_t n = 0;
    for (const unsigned char *r = start; r < q;) {
        if (*r != '\\') {
            o[n++] = *r++;
            continue;
        }
        r++; /* r < q: the scan above skipped the escaped byte, so q is after it */
        unsigned char e = *r++;
        switch (e) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (q - r < 4 || !hex4(r, &cp)) {
                goto invalid;
            }
            r += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                goto invalid; /* a lone low surrogate */
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (q - r < 6 || r[0] != '\\' || r[1] != 'u' || !hex4(r + 2, &lo) ||
                    lo < 0xDC00 || lo > 0xDFFF) {
                    goto invalid; /* a lone high surrogate */
                }
                r += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            n += put_utf8(o + n, cp);
            break;
        }
        default:
            goto invalid;
        }
    }
    *out = o;
    *len = (Py_ssize_t)n;
    return 1;
invalid:
    PyMem_Free(o);
    *buf = NULL;
    return 0;
}

/* The string literal at s->p as a str, or DECLINE / NULL with an exception. */
static PyObject *
string_value(St *s)
{
    const unsigned char *b;
    Py_ssize_t n;
    unsigned char *buf;
    int r = string_bytes(s, &b, &n, &buf);
    if (r <= 0) {
        return NULL;
    }
    PyObject *v = PyUnicode_DecodeUTF8((const char *)b, n, "strict");
    PyMem_Free(buf);
    if (v == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear(); /* the caller promised valid UTF-8; decline rather than trust it */
    }
    return v;
}

/* ------------------------------------------------------------------------------------------ */
/* numbers */

/* The digits of a JSON integer part at s->p (after an optional '-'): 1 and the span, or 0. */
static int
int_digits(St *s, const unsigned char **first, Py_ssize_t *count)
{
    const unsigned char *q = s->p;
    if (q < s->end && *q == '-') {
        q++;
    }
    const unsigned char *d = q;
    if (q >= s->end || *q < '0' || *q > '9') {
        return 0;
    }
    if (*q == '0') {
        q++;
    }
    else {
        while (q < s->end && *q >= '0' && *q <= '9') {
            q++;
        }
    }
    *first = d;
    *count = q - d;
    s->p = q;
    return 1;
}

static inline int
number_continues(St *s)
{
    return s->p < s->end && (*s->p == '.' || *s->p == 'e' || *s->p == 'E' ||
                             (*s->p >= '0' && *s->p <= '9'));
}

/* A JSON integer (not a float literal) in [lo, hi], or DECLINE. */
static PyObject *
int_value(St *s, long long lo, long long hi, long long *got)
{
    const unsigned char *d;
    Py_ssize_t n;
    int neg = s->p < s->end && *s->p == '-';
    if (!int_digits(s, &d, &n) || number_continues(s) || n > 19) {
        return DECLINE;
    }
    unsigned long long v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned digit = (unsigned)(d[i] - '0');
        if (v > (ULLONG_MAX - digit) / 10) {
            return DECLINE;
        }
        v = v * 10 + digit;
    }
    long long x;
    if (neg) {
        if (v > (unsigned long long)LLONG_MAX + 1) {
            return DECLINE;
        }
        x = v == (unsigned long long)LLONG_MAX + 1 ? LLONG_MIN : -(long long)v;
    }
    else {
        if (v > (unsigned long long)LLONG_MAX) {
            return DECLINE;
        }
        x = (long long)v;
    }
    if (x < lo || x > hi) {
        return DECLINE;
    }
    *got = x;
    return PyLong_FromLongLong(x);
}

/* Any JSON number of free-form JSON: an int, or a finite float (float() of the literal, as
   the reference's parse_float does), or DECLINE. */
static PyObject *
number_value(St *s)
{
    const unsigned char *start = s->p, *d;
    Py_ssize_t n;
    if (!int_digits(s, &d, &n)) {
        return DECLINE;
    }
    int is_float = 0;
    if (s->p < s->end && *s->p == '.') {
        s->p++;
        if (s->p >= s->end || *s->p < '0' || *s->p > '9') {
            return DECLINE;
        }
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
            s->p++;
        }
        is_float = 1;
    }
    if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
        s->p++;
        if (s->p < s->end && (*s->p == '+' || *s->p == '-')) {
            s->p++;
        }
        if (s->p >= s->end || *s->p < '0' || *s->p > '9') {
            return DECLINE;
        }
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
            s->p++;
        }
        is_float = 1;
    }
    if (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        return DECLINE; /* "01" */
    }
    size_t len = (size_t)(s->p - start);
    if (len > 4000) {
        return DECLINE; /* the reference's integer digit limit and float() are left to it */
    }
    char *text = PyMem_Malloc(len + 1);
    if (text == NULL) {
        return PyErr_NoMemory();
    }
    memcpy(text, start, len);
    text[len] = '\0';
    PyObject *v = NULL;
    if (is_float) {
        char *stop;
        double x = PyOS_string_to_double(text, &stop, NULL);
        if (x == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
        }
        else if (stop == text + len && isfinite(x)) {
            v = PyFloat_FromDouble(x);
        }
    }
    else {
        v = PyLong_FromString(text, NULL, 10);
        if (v == NULL && PyErr_ExceptionMatches(PyExc_ValueError)) {
            PyErr_Clear();
        }
    }
    PyMem_Free(text);
    return v;
}

/* ------------------------------------------------------------------------------------------ */
/* growable item arrays */

typedef struct {
    PyObject **items;
    Py_ssize_t n, cap;
    PyObject *small[16];
} Items;

static void
items_init(Items *a)
{
    a->items = a->small;
    a->n = 0;
    a->cap = 16;
}

static int
items_push(Items *a, PyObject *v)
{
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap * 2;
        PyObject **grown = PyMem_Malloc((size_t)cap * sizeof(PyObject *));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(grown, a->items, (size_t)a->n * sizeof(PyObject *));
        if (a->items != a->small) {
            PyMem_Free(a->items);
        }
        a->items = grown;
        a->cap = cap;
    }
    a->items[a->n++] = v;
    return 0;
}

static void
items_free(Items *a)
{
    for (Py_ssize_t i = 0; i < a->n; i++) {
        Py_DECREF(a->items[i]);
    }
    if (a->items != a->small) {
        PyMem_Free(a->items);
    }
    a->n = 0;
}

/* The items as a new tuple (the references move into it); untracked by the collector when
   no item is tracked, as CPython itself untracks such tuples on its next pass. */
static PyObject *
items_tuple(Items *a)
{
    PyObject *t = PyTuple_New(a->n);
    if (t == NULL) {
        items_free(a);
        return NULL;
    }
    int acyclic = 1;
    for (Py_ssize_t i = 0; i < a->n; i++) {
        PyObject *v = a->items[i];
        if (PyObject_IS_GC(v) && PyObject_GC_IsTracked(v)) {
            acyclic = 0;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    a->n = 0;
    items_free(a);
    if (acyclic && PyObject_GC_IsTracked(t)) {
        PyObject_GC_UnTrack(t);
    }
    return t;
}

/* ------------------------------------------------------------------------------------------ */
/* free-form JSON (the Json spec: jsonfields.values.json_value's rules) */

static PyObject *generic(St *s, Py_ssize_t depth);

static PyObject *
generic_object(St *s, Py_ssize_t depth)
{
    if (!open_bracket(s)) {
        return DECLINE;
    }
    PyObject *d = PyDict_New();
    if (d == NULL) {
        return NULL;
    }
    if (eat(s, '}')) {
        s->level--;
        return d;
    }
    do {
        skip_ws(s);
        PyObject *k = string_value(s);
        if (k == NULL) {
            goto fail;
        }
        if (!eat(s, ':')) {
            Py_DECREF(k);
            goto fail;
        }
        skip_ws(s);
        PyObject *v = generic(s, depth + 1);
        if (v == NULL) {
            Py_DECREF(k);
            goto fail;
        }
        int had = PyDict_Contains(d, k);
        int bad = had != 0 || PyDict_SetItem(d, k, v) < 0; /* a repeated key declines */
        Py_DECREF(k);
        Py_DECREF(v);
        if (bad) {
            goto fail;
        }
    } while (eat(s, ','));
    if (!eat(s, '}')) {
        goto fail;
    }
    s->level--;
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

static PyObject *
generic_array(St *s, Py_ssize_t depth)
{
    if (!open_bracket(s)) {
        return DECLINE;
    }
    PyObject *list = PyList_New(0);
    if (list == NULL) {
        return NULL;
    }
    if (eat(s, ']')) {
        s->level--;
        return list;
    }
    do {
        skip_ws(s);
        PyObject *v = generic(s, depth + 1);
        if (v == NULL) {
            goto fail;
        }
        int bad = PyList_Append(list, v) < 0;
        Py_DECREF(v);
        if (bad) {
            goto fail;
        }
    } while (eat(s, ','));
    if (!eat(s, ']')) {
        goto fail;
    }
    s->level--;
    return list;
fail:
    Py_DECREF(list);
    return NULL;
}

/* One free-form value at s->p (whitespace skipped) at json_value depth `depth`. */
static PyObject *
generic(St *s, Py_ssize_t depth)
{
    if (depth > s->json_depth || s->p >= s->end) {
        return DECLINE;
    }
    switch (*s->p) {
    case '{':
        s->p++;
        return generic_object(s, depth);
    case '[':
        s->p++;
        return generic_array(s, depth);
    case '"':
        return string_value(s);
    case 't':
        return literal(s, "true", 4) ? Py_NewRef(Py_True) : DECLINE;
    case 'f':
        return literal(s, "false", 5) ? Py_NewRef(Py_False) : DECLINE;
    case 'n':
        return literal(s, "null", 4) ? Py_NewRef(Py_None) : DECLINE;
    default:
        return number_value(s);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* typed values */

static PyObject *typed(St *s, PyObject *node);
static PyObject *typed_obj(St *s, PyObject *node);

static PyObject *
typed_str(St *s, PyObject *node)
{
    long long nonempty, intern, hexlen;
    PyObject *match = item(node, 4);
    if (match == NULL || int_item(node, 1, &nonempty) || int_item(node, 2, &intern) ||
        int_item(node, 3, &hexlen)) {
        return NULL;
    }
    const unsigned char *b;
    Py_ssize_t n;
    unsigned char *buf;
    int r = string_bytes(s, &b, &n, &buf);
    if (r <= 0) {
        return NULL;
    }
    int ok = !(nonempty && n == 0);
    if (ok && hexlen > 0) {
        /* Str(pattern=[0-9a-f]{hexlen}): all ASCII, so bytes are code points */
        ok = n == hexlen;
        for (Py_ssize_t i = 0; ok && i < n; i++) {
            ok = (b[i] >= '0' && b[i] <= '9') || (b[i] >= 'a' && b[i] <= 'f');
        }
    }
    PyObject **slot = NULL;
    if (ok && intern && match == Py_None) {
        /* Only after this spec's own checks: the slot may hold a text another spec accepted. */
        uint64_t h = 1469598103934665603ULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            h = (h ^ b[i]) * 1099511628211ULL; /* FNV-1a */
        }
        slot = &s->interned[h % INTERN_SLOTS];
        PyObject *known = *slot;
        if (known != NULL && PyUnicode_IS_COMPACT_ASCII(known) &&
            PyUnicode_GET_LENGTH(known) == n && memcmp(PyUnicode_1BYTE_DATA(known), b, n) == 0) {
            PyMem_Free(buf);
            return Py_NewRef(known);
        }
    }
    PyObject *v = ok ? PyUnicode_DecodeUTF8((const char *)b, n, "strict") : NULL;
    PyMem_Free(buf);
    if (v == NULL) {
        if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
        }
        return NULL;
    }
    if (match != Py_None) {
        PyObject *m = PyObject_CallOneArg(match, v);
        if (m == NULL || m == Py_None) {
            Py_XDECREF(m);
            Py_DECREF(v);
            return NULL;
        }
        Py_DECREF(m);
    }
    if (intern) {
        PyObject *shared = PyDict_SetDefault(s->memo, v, v);
        Py_XINCREF(shared);
        Py_DECREF(v);
        v = shared;
        if (v != NULL && slot != NULL) {
            Py_XSETREF(*slot, Py_NewRef(v));
        }
    }
    return v;
}

static PyObject *
typed_seq(St *s, PyObject *inner)
{
    if (!eat(s, '[') || !open_bracket(s)) {
        return DECLINE;
    }
    Items a;
    items_init(&a);
    if (!eat(s, ']')) {
        do {
            skip_ws(s);
            PyObject *v = typed(s, inner);
            if (v == NULL || items_push(&a, v) < 0) {
                Py_XDECREF(v);
                items_free(&a);
                return NULL;
            }
        } while (eat(s, ','));
        if (!eat(s, ']')) {
            items_free(&a);
            return DECLINE;
        }
    }
    s->level--;
    return items_tuple(&a);
}

static PyObject *
typed_map(St *s, PyObject *inner)
{
    if (!eat(s, '{') || !open_bracket(s)) {
        return DECLINE;
    }
    PyObject *d = PyDict_New();
    if (d == NULL) {
        return NULL;
    }
    if (!eat(s, '}')) {
        do {
            skip_ws(s);
            PyObject *k = string_value(s);
            if (k == NULL) {
                goto fail;
            }
            PyObject *v = NULL;
            if (eat(s, ':')) {
                skip_ws(s);
                v = typed(s, inner);
            }
            int bad = v == NULL || PyDict_Contains(d, k) != 0 || PyDict_SetItem(d, k, v) < 0;
            Py_DECREF(k);
            Py_XDECREF(v);
            if (bad) {
                goto fail;
            }
        } while (eat(s, ','));
        if (!eat(s, '}')) {
            goto fail;
        }
    }
    s->level--;
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

/* The instance of one variant of typed_obj from its parsed values, or DECLINE. */
static PyObject *
build_variant(St *s, PyObject *var, PyObject **values, PyObject **argv, Py_ssize_t nkeys,
              uint64_t seen)
{
    PyObject *build = item(var, 0), *cls = item(var, 1), *check = item(var, 3);
    PyObject *args = item(var, 5), *bounds = item(var, 8);
    uint64_t flags[3]; /* (shared, allowed, required), packed */
    if (build == NULL || cls == NULL || check == NULL || args == NULL || bounds == NULL ||
        packed_item(var, 9, flags, sizeof flags) || !PyTuple_Check(args) ||
        !PyTuple_Check(bounds) || PyTuple_GET_SIZE(args) > MAX_KEYS) {
        if (!PyErr_Occurred()) {
            bad_plan();
        }
        return NULL;
    }
    uint64_t shared = flags[0], allowed = flags[1], required = flags[2];
    if ((seen & ~allowed) || (required & ~seen)) {
        return DECLINE; /* an unknown or a missing key for this class */
    }
    for (Py_ssize_t b = 0; b < PyTuple_GET_SIZE(bounds); b++) {
        long long k, hi;
        PyObject *pair = PyTuple_GET_ITEM(bounds, b);
        if (int_item(pair, 0, &k) || int_item(pair, 1, &hi)) {
            return NULL;
        }
        if (k < 0 || hi < 0 || k >= nkeys || hi >= nkeys) {
            bad_plan();
            return NULL;
        }
        if (values[k] == NULL) {
            continue; /* an absent optional field has no bound to meet */
        }
        if (values[hi] == NULL || !PyLong_CheckExact(values[k]) || !PyLong_CheckExact(values[hi])) {
            return DECLINE;
        }
        int le = PyObject_RichCompareBool(values[k], values[hi], Py_LE);
        if (le <= 0) {
            return NULL; /* -1 raised, 0 declines */
        }
    }
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    for (Py_ssize_t a = 0; a < nargs; a++) {
        long long k;
        PyObject *spec = PyTuple_GET_ITEM(args, a);
        PyObject *dflt = item(spec, 1);
        if (dflt == NULL || int_item(spec, 0, &k)) {
            return NULL;
        }
        if (k < 0 || k >= nkeys) {
            bad_plan();
            return NULL;
        }
        argv[a] = values[k] != NULL ? values[k] : dflt;
    }
    PyObject *obj = PyObject_Vectorcall(build, argv, (size_t)nargs, NULL);
    if (obj == NULL) {
        return NULL;
    }
    if (check != Py_None) {
        PyObject *problem = PyObject_CallOneArg(check, obj);
        if (problem == NULL || problem != Py_None) {
            Py_XDECREF(problem);
            Py_DECREF(obj);
            return NULL;
        }
        Py_DECREF(problem);
    }
    if (shared) {
        PyObject *key = PyTuple_New(nargs + 1);
        if (key == NULL) {
            Py_DECREF(obj);
            return NULL;
        }
        PyTuple_SET_ITEM(key, 0, Py_NewRef(cls));
        for (Py_ssize_t a = 0; a < nargs; a++) {
            PyTuple_SET_ITEM(key, a + 1, Py_NewRef(argv[a]));
        }
        PyObject *one = PyDict_SetDefault(s->memo, key, obj);
        Py_XINCREF(one);
        Py_DECREF(key);
        Py_DECREF(obj);
        return one;
    }
    return obj;
}

/* An object of a schema class (or of one of several, told apart by their constants):
   node = (N_OBJ, keys, specs, variants), keys the UTF-8 bytes of every key any variant has,
   specs their value nodes, and each variant (build, cls, shared, check, consts, args, allowed,
   required, bounds): build(*args) makes the instance; consts ((key index, str), ...) select the
   variant; args ((key index, default), ...) in the class's field order, the default used when
   the key is absent; allowed and required are key-index bit masks; bounds ((key index, index of
   the key whose value is its upper bound), ...); shared: equal instances are one per memo
   (key (cls, *args), as the reference's memo); check: None or the class's whole-value check. */
static PyObject *
typed_obj(St *s, PyObject *node)
{
    PyObject *keys = item(node, 1), *specs = item(node, 2), *variants = item(node, 3);
    if (keys == NULL || specs == NULL || variants == NULL || !PyTuple_Check(keys) ||
        !PyTuple_Check(specs) || !PyTuple_Check(variants)) {
        bad_plan();
        return NULL;
    }
    Py_ssize_t nkeys = PyTuple_GET_SIZE(keys);
    if (nkeys > MAX_KEYS || PyTuple_GET_SIZE(specs) != nkeys) {
        bad_plan();
        return NULL;
    }
    if (!eat(s, '{') || !open_bracket(s)) {
        return DECLINE;
    }
    PyObject *values[MAX_KEYS] = {NULL};
    PyObject *argv[MAX_KEYS];
    uint64_t seen = 0;
    PyObject *out = NULL;
    if (!eat(s, '}')) {
        do {
            skip_ws(s);
            const unsigned char *b;
            Py_ssize_t n;
            unsigned char *buf;
            int r = string_bytes(s, &b, &n, &buf);
            if (r <= 0) {
                goto done;
            }
            Py_ssize_t k = 0;
            for (; k < nkeys; k++) {
                PyObject *key = PyTuple_GET_ITEM(keys, k);
                if (PyBytes_Check(key) && PyBytes_GET_SIZE(key) == n &&
                    memcmp(PyBytes_AS_STRING(key), b, (size_t)n) == 0) {
                    break;
                }
            }
            PyMem_Free(buf);
            if (k == nkeys || (seen >> k) & 1 || !eat(s, ':')) {
                goto done; /* an unknown or repeated key, or not JSON */
            }
            values[k] = typed(s, PyTuple_GET_ITEM(specs, k));
            if (values[k] == NULL) {
                goto done;
            }
            seen |= (uint64_t)1 << k;
        } while (eat(s, ','));
        if (!eat(s, '}')) {
            goto done;
        }
    }
    s->level--;
    for (Py_ssize_t vi = 0; vi < PyTuple_GET_SIZE(variants); vi++) {
        PyObject *var = PyTuple_GET_ITEM(variants, vi);
        PyObject *consts = item(var, 4);
        if (consts == NULL || !PyTuple_Check(consts)) {
            bad_plan();
            goto done;
        }
        int match = 1;
        for (Py_ssize_t c = 0; match && c < PyTuple_GET_SIZE(consts); c++) {
            long long k;
            PyObject *want = item(PyTuple_GET_ITEM(consts, c), 1);
            if (want == NULL || int_item(PyTuple_GET_ITEM(consts, c), 0, &k) || k < 0 ||
                k >= nkeys) {
                if (!PyErr_Occurred()) {
                    bad_plan();
                }
                goto done;
            }
            match = values[k] != NULL && PyUnicode_CheckExact(values[k]) &&
                    PyUnicode_Compare(values[k], want) == 0;
        }
        if (match) {
            out = build_variant(s, var, values, argv, nkeys, seen);
            goto done;
        }
    }
done:
    for (Py_ssize_t k = 0; k < nkeys; k++) {
        Py_XDECREF(values[k]);
    }
    return out;
}


static PyObject *
typed(St *s, PyObject *node)
{
    long long kind;
    if (int_item(node, 0, &kind)) {
        return NULL;
    }
    skip_ws(s);
    switch (kind) {
    case N_STR:
        return typed_str(s, node);
    case N_INT: {
        long long range[2], got; /* (lo, hi), packed: hi is 2^63 - 1, a slow PyLong to read */
        if (packed_item(node, 3, range, sizeof range)) {
            return NULL;
        }
        return int_value(s, range[0], range[1], &got);
    }
    case N_BOOL:
        if (literal(s, "true", 4)) {
            return Py_NewRef(Py_True);
        }
        return literal(s, "false", 5) ? Py_NewRef(Py_False) : DECLINE;
    case N_OPT: {
        PyObject *inner = item(node, 1);
        if (inner == NULL) {
            return NULL;
        }
        return literal(s, "null", 4) ? Py_NewRef(Py_None) : typed(s, inner);
    }
    case N_SEQ: {
        PyObject *inner = item(node, 1);
        return inner == NULL ? NULL : typed_seq(s, inner);
    }
    case N_MAP: {
        PyObject *inner = item(node, 1);
        return inner == NULL ? NULL : typed_map(s, inner);
    }
    case N_JSON:
        if (literal(s, "null", 4)) {
            return Py_NewRef(Py_None);
        }
        return (s->p < s->end && *s->p == '{') ? generic(s, 0) : DECLINE;
    case N_OBJ:
        return typed_obj(s, node);
    default:
        bad_plan();
        return NULL;
    }
}

/* ------------------------------------------------------------------------------------------ */

PyObject *
jsonfast_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5 || !PyBytes_Check(args[0]) || !PyTuple_Check(args[1]) ||
        !PyDict_Check(args[2]) || !PyLong_Check(args[3]) || !PyLong_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "decode(raw: bytes, plan: tuple, memo: dict, limit: int, json_depth: int)");
        return NULL;
    }
    St s;
    s.p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    s.end = s.p + PyBytes_GET_SIZE(args[0]);
    s.level = 0;
    s.limit = PyLong_AsSsize_t(args[3]);
    s.json_depth = PyLong_AsSsize_t(args[4]);
    s.memo = args[2];
    memset(s.interned, 0, sizeof s.interned);
    if ((s.limit == -1 || s.json_depth == -1) && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *v = typed(&s, args[1]);
    for (Py_ssize_t i = 0; i < INTERN_SLOTS; i++) {
        Py_XDECREF(s.interned[i]);
    }
    if (v != NULL) {
        skip_ws(&s);
        if (s.p != s.end) {
            Py_CLEAR(v); /* extra data after the document */
        }
    }
    if (v == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return v;
}
