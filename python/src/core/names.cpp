#include "core/names.hpp"

#include <string>

#include "core/buffer.hpp"
#include "core/call.hpp"

namespace tutti_python {

namespace {

// The enum value of type E that `value` is or names; E's values are 0..last, named by to_string.
template <class E>
E enum_of(const py::handle& value, E last, const char* what, const char* operation) {
  if (py::isinstance<py::str>(value)) {
    const std::string name = value.cast<std::string>();
    std::string names;
    for (int i = 0; i <= static_cast<int>(last); ++i) {
      const auto e = static_cast<E>(i);
      if (tutti::to_string(e) == name) return e;
      names += (i ? ", " : "") + std::string(tutti::to_string(e));
    }
    invalid(std::string(operation) + ": '" + name + "' is not a " + what + " (" + names + ")");
  }
  try {
    return value.cast<E>();
  } catch (const py::cast_error&) {
    invalid(std::string(operation) + ": expected a tutti." + what + " or its name, not " +
            std::string(py::str(py::type::of(value).attr("__name__"))));
  }
}

}  // namespace

tutti::ReduceOp reduce_op_of(const py::handle& op, const char* operation) {
  return enum_of(op, tutti::ReduceOp::avg, "ReduceOp", operation);
}

tutti::Options options_of(const py::handle& algorithm, const py::handle& timeout, const char* operation) {
  tutti::Options options;
  if (!algorithm.is_none()) options.algorithm = enum_of(algorithm, tutti::Algorithm::mpi, "Algorithm", operation);
  options.timeout = milliseconds_of(timeout, operation);
  return options;
}

}  // namespace tutti_python
