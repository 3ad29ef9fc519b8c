// opforge._C is an empty Python module: importing it loads this shared library, whose static
// initializers register the schemas and kernels with the dispatcher (torch.ops.opforge.*).
// Only the Python build compiles this file; the CMake build (libopforge) leaves it out.
#include <Python.h>

extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT,
                                      "_C",
                                      "opforge's compiled operators",
                                      -1,
                                      nullptr,
                                      nullptr,
                                      nullptr,
                                      nullptr,
                                      nullptr};
  return PyModule_Create(&module);
}
