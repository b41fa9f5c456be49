/* The safetensors header reader of _stheader.c, registered by _jsonfast.c. */
#ifndef NINFER_STHEADER_H
#define NINFER_STHEADER_H
#include <Python.h>

PyObject *stheader_safetensors(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
