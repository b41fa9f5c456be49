/*
 * Native helpers of the container header reader (a 100,000-tensor header is ~60 MB of JSON
 * and ~500,000 schema objects; the pure-Python paths they replace give the same answers).
 *
 * scan(text, limit) -> (deep, members): ninfer_convert.jsonlimits.scan in one pass over the
 * code points.  `deep` is the offset of the first '[' or '{' that opens a level deeper than
 * `limit` (or None), `members` the colons outside string literals; brackets and colons inside
 * string literals do not count, escapes inside strings are honoured.  The Python reference
 * recognises string literals with a regular expression, so a quote whose string never ends
 * (end of text inside it) is an ordinary character there and the text after it is scanned as
 * if it held no strings at all: this scan rewinds to just after such a quote and does the
 * same.  A text without any '[' or '{' (anywhere) has no object, so members is 0.
 *
 * decode(raw, plan, memo, limit, json_depth): _jsondecode.c (the header as schema objects,
 * built while it is parsed, or None to leave it to the reference reader).
 *
 * dict_values(value, keys) -> the values of `keys` (a tuple of distinct strings), in order, when
 * `value` is exactly a dict holding exactly those keys, else None: a compiled decoder's key
 * check and field reads in one call.
 *
 * slot_maker(cls, names) -> maker: maker(*values) is a new instance of the slotted class
 * `cls` with the slot names[i] holding values[i], without calling __init__ (a frozen
 * dataclass's __init__ is one object.__setattr__ call per field, most of the cost of
 * decoding a header entry).  An instance whose values are all untracked by the cyclic
 * collector (strings, numbers, None, tuples of those, instances made here) is untracked
 * too, as CPython untracks such tuples and dicts: the classes are frozen, so it cannot
 * become part of a cycle through its fields.  Each name must be a writable object slot (member descriptor)
 * of `cls`; the caller (jsonfields.objects) uses it only for classes whose __init__ does
 * nothing but store every field.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_jsondecode.h"
#include "_stheader.h"

/* ------------------------------------------------------------------------------------------ */
/* scan */

typedef struct {
    Py_ssize_t depth;
    Py_ssize_t members;
    Py_ssize_t deep; /* -1: none yet */
} ScanState;

static inline void
outside(ScanState *s, Py_UCS4 c, Py_ssize_t i, Py_ssize_t limit)
{
    if (c == '[' || c == '{') {
        s->depth++;
        if (s->depth > limit && s->deep < 0) {
            s->deep = i;
        }
    }
    else if (c == ']' || c == '}') {
        s->depth--;
    }
    else if (c == ':') {
        s->members++;
    }
}

static PyObject *
scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "scan(text: str, limit: int)");
        return NULL;
    }
    PyObject *text = args[0];
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (PyUnicode_READY(text) < 0) {
        return NULL;
    }
    const int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    const Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    ScanState s = {0, 0, -1};
    int any_bracket = 0;
    Py_ssize_t i = 0;
    while (i < n) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c != '"') {
            if (c == '[' || c == '{') {
                any_bracket = 1;
            }
            outside(&s, c, i, limit);
            i++;
            continue;
        }
        /* A string literal from the quote at i: find its closing quote. */
        Py_ssize_t j = i + 1;
        int closed = 0;
        while (j < n) {
            Py_UCS4 d = PyUnicode_READ(kind, data, j);
            if (d == '"') {
                closed = 1;
                break;
            }
            if (d == '\\') {
                if (j + 1 < n) {
                    Py_UCS4 e = PyUnicode_READ(kind, data, j + 1);
                    if (e == '[' || e == '{') {
                        any_bracket = 1;
                    }
                }
                j += 2; /* the escaped character, whatever it is */
                continue;
            }
            if (d == '[' || d == '{') {
                any_bracket = 1;
            }
            j++;
        }
        if (closed) {
            i = j + 1;
            continue;
        }
        /* Unterminated: the quote is an ordinary character, and so is every later quote
           (each of their strings would end where this one does not). */
        for (Py_ssize_t k = i + 1; k < n; k++) {
            Py_UCS4 d = PyUnicode_READ(kind, data, k);
            if (d == '[' || d == '{') {
                any_bracket = 1;
            }
            outside(&s, d, k, limit);
        }
        break;
    }
    if (!any_bracket) {
        return Py_BuildValue("(On)", Py_None, (Py_ssize_t)0);
    }
    if (s.deep < 0) {
        return Py_BuildValue("(On)", Py_None, s.members);
    }
    return Py_BuildValue("(nn)", s.deep, s.members);
}

/* ------------------------------------------------------------------------------------------ */
/* slot_maker */

typedef struct {
    PyObject_VAR_HEAD
    PyTypeObject *cls;
    Py_ssize_t count;
    vectorcallfunc vectorcall;
    Py_ssize_t offsets[1]; /* count entries */
} SlotMaker;

/* Whether `v` cannot reach a reference cycle: it is not tracked by the collector (atoms such
   as str and int, None, instances untracked here), or it is an exact tuple of such values,
   which is then untracked as the collector itself would untrack it on its next pass. */
static int
untrack_if_acyclic(PyObject *v)
{
    if (!PyObject_IS_GC(v) || !PyObject_GC_IsTracked(v)) {
        return 1;
    }
    if (!PyTuple_CheckExact(v)) {
        return 0;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(v);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(v, i);
        if (PyObject_IS_GC(item) && PyObject_GC_IsTracked(item)) {
            return 0;
        }
    }
    PyObject_GC_UnTrack(v);
    return 1;
}

static PyObject *
maker_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    SlotMaker *m = (SlotMaker *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        PyErr_SetString(PyExc_TypeError, "slot maker takes positional arguments only");
        return NULL;
    }
    if (nargs != m->count) {
        PyErr_Format(PyExc_TypeError, "%s maker takes %zd arguments, got %zd", m->cls->tp_name,
                     m->count, nargs);
        return NULL;
    }
    PyObject *obj = m->cls->tp_alloc(m->cls, 0);
    if (obj == NULL) {
        return NULL;
    }
    int acyclic = 1;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyObject **slot = (PyObject **)((char *)obj + m->offsets[i]);
        PyObject *old = *slot;
        Py_INCREF(args[i]);
        *slot = args[i];
        Py_XDECREF(old);
        if (!untrack_if_acyclic(args[i])) {
            acyclic = 0;
        }
    }
    /* An instance whose values cannot reach a cycle cannot be in one (the class is frozen):
       the collector has nothing to find in it, and a large header holds ~1,000,000 of them
       (the first collection after the open walked them all). */
    if (acyclic && PyObject_GC_IsTracked(obj)) {
        PyObject_GC_UnTrack(obj);
    }
    return obj;
}

static int
maker_traverse(SlotMaker *m, visitproc visit, void *arg)
{
    Py_VISIT(m->cls);
    return 0;
}

static int
maker_clear(SlotMaker *m)
{
    Py_CLEAR(m->cls);
    return 0;
}

static void
maker_dealloc(SlotMaker *m)
{
    PyObject_GC_UnTrack(m);
    maker_clear(m);
    PyObject_GC_Del(m);
}

static PyTypeObject SlotMakerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ninfer_convert._jsonfast.SlotMaker",
    .tp_basicsize = sizeof(SlotMaker) - sizeof(Py_ssize_t),
    .tp_itemsize = sizeof(Py_ssize_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(SlotMaker, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_traverse = (traverseproc)maker_traverse,
    .tp_clear = (inquiry)maker_clear,
    .tp_dealloc = (destructor)maker_dealloc,
    .tp_doc = "maker(*values): a new instance of its class with its slots set to values.",
};

static PyObject *
slot_maker(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2 || !PyType_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "slot_maker(cls: type, names: tuple[str, ...])");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    PyObject *names = args[1];
    Py_ssize_t count = PyTuple_GET_SIZE(names);
    if (!(cls->tp_flags & Py_TPFLAGS_HEAPTYPE) || cls->tp_alloc == NULL) {
        PyErr_Format(PyExc_TypeError, "%s is not a class defined in Python", cls->tp_name);
        return NULL;
    }
    SlotMaker *m = PyObject_GC_NewVar(SlotMaker, &SlotMakerType, count);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(cls);
    m->cls = cls;
    m->count = count;
    m->vectorcall = maker_vectorcall;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (!PyUnicode_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "slot names must be strings");
            goto fail;
        }
        /* The descriptor the class itself resolves the name to (its MRO, not an instance). */
        PyObject *descr = _PyType_Lookup(cls, name);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "%s.%U is not a slot", cls->tp_name, name);
            goto fail;
        }
        PyMemberDescrObject *md = (PyMemberDescrObject *)descr;
        PyMemberDef *def = md->d_member;
        if (def->type != T_OBJECT_EX || (def->flags & READONLY) ||
            !PyType_IsSubtype(cls, PyDescr_TYPE(md))) {
            PyErr_Format(PyExc_TypeError, "%s.%U is not a writable object slot", cls->tp_name,
                         name);
            goto fail;
        }
        m->offsets[i] = def->offset;
    }
    PyObject_GC_Track(m);
    return (PyObject *)m;
fail:
    Py_DECREF(m);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* dict_maker */

typedef struct {
    PyObject_VAR_HEAD
    PyTypeObject *cls;
    Py_ssize_t count;
    vectorcallfunc vectorcall;
    PyObject *names[1]; /* count entries */
} DictMaker;

static PyObject *
dmaker_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    DictMaker *m = (DictMaker *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if ((kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) || nargs != m->count) {
        PyErr_Format(PyExc_TypeError, "%s maker takes %zd positional arguments",
                     m->cls->tp_name, m->count);
        return NULL;
    }
    /* object.__new__(cls) (the class's own tp_new, checked when the maker was made): it also
       sets up the instance's inline attribute values, which tp_alloc alone does not. */
    PyObject *empty = PyTuple_New(0);
    if (empty == NULL) {
        return NULL;
    }
    PyObject *obj = m->cls->tp_new(m->cls, empty, NULL);
    Py_DECREF(empty);
    if (obj == NULL) {
        return NULL;
    }
    /* object.__setattr__(obj, name, value) per field, as a frozen __init__ does, without its
       Python-level calls: the instance keeps the class's shared-key attribute layout. */
    for (Py_ssize_t i = 0; i < nargs; i++) {
        if (PyObject_GenericSetAttr(obj, m->names[i], args[i]) < 0) {
            Py_DECREF(obj);
            return NULL;
        }
    }
    return obj;
}

static int
dmaker_traverse(DictMaker *m, visitproc visit, void *arg)
{
    Py_VISIT(m->cls);
    return 0;
}

static int
dmaker_clear(DictMaker *m)
{
    Py_CLEAR(m->cls);
    for (Py_ssize_t i = 0; i < m->count; i++) {
        Py_CLEAR(m->names[i]);
    }
    return 0;
}

static void
dmaker_dealloc(DictMaker *m)
{
    PyObject_GC_UnTrack(m);
    dmaker_clear(m);
    PyObject_GC_Del(m);
}

static PyTypeObject DictMakerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ninfer_convert._jsonfast.DictMaker",
    .tp_basicsize = sizeof(DictMaker) - sizeof(PyObject *),
    .tp_itemsize = sizeof(PyObject *),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(DictMaker, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_traverse = (traverseproc)dmaker_traverse,
    .tp_clear = (inquiry)dmaker_clear,
    .tp_dealloc = (destructor)dmaker_dealloc,
    .tp_doc = "maker(*values): a new instance of its class with its attributes (names) set to "
              "values.",
};

static PyObject *
dict_maker(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2 || !PyType_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "dict_maker(cls: type, names: tuple[str, ...])");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    PyObject *names = args[1];
    Py_ssize_t count = PyTuple_GET_SIZE(names);
    if (!(cls->tp_flags & Py_TPFLAGS_HEAPTYPE) || cls->tp_alloc == NULL ||
        cls->tp_new != PyBaseObject_Type.tp_new) {
        PyErr_Format(PyExc_TypeError, "%s is not a plain class defined in Python", cls->tp_name);
        return NULL;
    }
    DictMaker *m = PyObject_GC_NewVar(DictMaker, &DictMakerType, count);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(cls);
    m->cls = cls;
    m->count = count;
    m->vectorcall = dmaker_vectorcall;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (!PyUnicode_CheckExact(name)) {
            for (Py_ssize_t j = i; j < count; j++) {
                m->names[j] = NULL;
            }
            PyErr_SetString(PyExc_TypeError, "field names must be strings");
            Py_DECREF(m);
            return NULL;
        }
        m->names[i] = Py_NewRef(name);
    }
    PyObject_GC_Track(m);
    return (PyObject *)m;
}

/* ------------------------------------------------------------------------------------------ */
/* dict_values */

static PyObject *
dict_values(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2 || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "dict_values(value: object, keys: tuple[str, ...])");
        return NULL;
    }
    PyObject *value = args[0], *keys = args[1];
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    if (!PyDict_CheckExact(value) || PyDict_GET_SIZE(value) != n) {
        Py_RETURN_NONE;
    }
    PyObject *out = PyTuple_New(n);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyDict_GetItemWithError(value, PyTuple_GET_ITEM(keys, i));
        if (item == NULL) {
            Py_DECREF(out);
            if (PyErr_Occurred()) {
                return NULL;
            }
            Py_RETURN_NONE;
        }
        Py_INCREF(item);
        PyTuple_SET_ITEM(out, i, item);
    }
    return out;
}

/* ------------------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"decode", (PyCFunction)(void (*)(void))jsonfast_decode, METH_FASTCALL,
     "decode(raw, plan, memo, limit, json_depth) -> the document as schema objects, built "
     "while parsing, or None (declined: the reference reader decides)"},
    {"dict_maker", (PyCFunction)(void (*)(void))dict_maker, METH_FASTCALL,
     "dict_maker(cls, names) -> maker(*values): instances of cls with those attributes set"},
    {"dict_values", (PyCFunction)(void (*)(void))dict_values, METH_FASTCALL,
     "dict_values(value, keys) -> the values of keys if value is a dict with exactly those "
     "keys (distinct), else None"},
    {"safetensors", (PyCFunction)(void (*)(void))stheader_safetensors, METH_FASTCALL,
     "safetensors(raw, data_start, data_len, dtypes, bits, make, file) -> (tensors, "
     "metadata span) of a safetensors header, or None (declined: the reference "
     "reader decides)"},
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(text, limit) -> (offset of the first bracket deeper than limit or None, members)"},
    {"slot_maker", (PyCFunction)(void (*)(void))slot_maker, METH_FASTCALL,
     "slot_maker(cls, names) -> maker(*values): instances of cls with those slots set"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jsonfast", "Native helpers of the container header reader.", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__jsonfast(void)
{
    if (PyType_Ready(&SlotMakerType) < 0 || PyType_Ready(&DictMakerType) < 0) {
        return NULL;
    }
    return PyModule_Create(&module);
}
