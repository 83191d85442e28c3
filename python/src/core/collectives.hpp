// The collectives of tutti.Communicator and their i… twins (collectives.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include "tutti/tutti.hpp"

namespace tutti_python {

/// Adds every collective, its nonblocking twin, and send/recv to the Communicator class.
/// Needs ReduceOp bound first (the default op).
void bind_collectives(pybind11::class_<tutti::Communicator>& cls);

}  // namespace tutti_python
