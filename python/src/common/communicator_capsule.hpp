// A tutti.Communicator handed from one extension module to another. The modules may be built
// against different pybind11s (the torch-facing ones against torch's, python/torch_pybind11.cmake),
// so they cannot share the class itself; they share libtutti_native.so, so a Communicator is the
// same C++ object in each. Communicator._capsule() wraps a copy (a reference to the same group) in
// a PyCapsule named "tutti.Communicator"; from_capsule() takes it back out.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "tutti/tutti.hpp"

namespace tutti_python {

inline constexpr const char* communicator_capsule_name = "tutti.Communicator";

inline pybind11::capsule to_capsule(const tutti::Communicator& comm) {
  return pybind11::capsule(new tutti::Communicator(comm), communicator_capsule_name, [](PyObject* capsule) {
    delete static_cast<tutti::Communicator*>(PyCapsule_GetPointer(capsule, communicator_capsule_name));
  });
}

/// The Communicator of `object`: a tutti.Communicator (through its _capsule()) or such a capsule.
/// Error(invalid_argument) naming `what` for anything else, or for an empty communicator.
inline tutti::Communicator from_capsule(const pybind11::handle& object, const std::string& what) {
  pybind11::object capsule = pybind11::reinterpret_borrow<pybind11::object>(object);
  if (pybind11::hasattr(capsule, "_capsule")) capsule = capsule.attr("_capsule")();
  if (!PyCapsule_IsValid(capsule.ptr(), communicator_capsule_name))
    throw tutti::Error(tutti::ErrorCode::invalid_argument,
                       what + ": expected a tutti.Communicator, got " +
                           pybind11::str(pybind11::type::handle_of(object)).cast<std::string>());
  const auto* comm = static_cast<tutti::Communicator*>(PyCapsule_GetPointer(capsule.ptr(), communicator_capsule_name));
  if (comm->size() <= 0)
    throw tutti::Error(tutti::ErrorCode::invalid_argument, what + ": the communicator is empty (a negative color)");
  return *comm;
}

}  // namespace tutti_python
