/* The schema-directed header parser of _jsondecode.c, registered by _jsonfast.c. */
#ifndef NINFER_JSONDECODE_H
#define NINFER_JSONDECODE_H
#include <Python.h>

PyObject *jsonfast_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
