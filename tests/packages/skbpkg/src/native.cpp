// The fixture's C++ extension module: skbpkg._native.twice(x) -> 2 * x.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *twice(PyObject *, PyObject *arg) {
    double x = PyFloat_AsDouble(arg);
    if (x == -1.0 && PyErr_Occurred()) return nullptr;
    return PyFloat_FromDouble(2.0 * x);
}

static PyMethodDef methods[] = {{"twice", twice, METH_O, "2 * x"}, {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", nullptr, -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
