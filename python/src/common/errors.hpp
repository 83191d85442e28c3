// Translation of tutti::Error into the package's Python exceptions (python/tutti/_errors.py), shared
// by every extension module so that each C++ ErrorCode raises the same Python class everywhere.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <string>

#include "tutti/types.hpp"

namespace tutti_python {

/// Registers, for the module being initialized, a translator that raises tutti._errors.BY_CODE[code]
/// with the C++ message for every tutti::Error escaping a bound function.
inline void register_error_translator() {
  namespace py = pybind11;
  // Kept alive for the interpreter's lifetime (leaked on purpose: translators run until exit, and
  // destroying a py::object after the interpreter finalized would crash).
  static auto* by_code = new py::object(py::module_::import("tutti._errors").attr("BY_CODE"));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tutti::Error& e) {
      py::object cls = (*by_code)[py::str(std::string(tutti::to_string(e.code())))];
      PyErr_SetString(cls.ptr(), e.what());
    }
  });
}

}  // namespace tutti_python
