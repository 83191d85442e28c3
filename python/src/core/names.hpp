// Reduce ops and algorithms given from Python: the enum (tutti.ReduceOp.sum) or its name ("sum").
#pragma once

#include <pybind11/pybind11.h>

#include "tutti/tutti.hpp"

namespace tutti_python {

namespace py = pybind11;

/// `op` as a ReduceOp: a tutti.ReduceOp or its name. Raises invalid_argument naming `operation`.
tutti::ReduceOp reduce_op_of(const py::handle& op, const char* operation);
/// The per-call options: `algorithm` (a tutti.Algorithm, its name or None for automatic) and
/// `timeout` (seconds or a timedelta; None for the communicator's default).
tutti::Options options_of(const py::handle& algorithm, const py::handle& timeout, const char* operation);

}  // namespace tutti_python
