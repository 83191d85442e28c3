// Python objects as Tutti buffers: anything with the buffer protocol (NumPy arrays, bytearray,
// memoryview) or DLPack (torch CPU tensors through __dlpack__, DLPack capsules).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <string>

#include "tutti/tutti.hpp"

namespace tutti_python {

namespace py = pybind11;

/// Which argument of which call a buffer is, for the messages of the errors it raises.
struct Role {
  const char* operation;  // "allreduce"
  const char* argument;   // "recv"
  int rank;               // the caller's rank in the communicator
  bool output;            // written by the call: must be writable
};

/// A contiguous host buffer some Python object exposes. `owner` (a memoryview, a DLPack capsule,
/// or for a torch tensor the capsule and a pin on the tensor's storage) keeps the memory, and its
/// export, alive: drop it only with the GIL held, and only once the call that uses the buffer
/// completed.
struct Buffer {
  py::object owner;
  void* data = nullptr;
  std::size_t count = 0;  // elements
  tutti::DataType type = tutti::DataType::u8;
};

/// The buffer `object` exposes, through the buffer protocol if it has it, else DLPack.
/// Raises tutti::Error(invalid_argument), naming the operation, argument and rank, when the object
/// exposes neither, its element type has no DataType, it is not C-contiguous, it is not in host
/// memory, or it is read-only while `role.output`.
Buffer buffer_of(py::handle object, const Role& role);

/// Raises invalid_argument unless `buffer` holds `expected` elements; `why` says where the
/// expectation comes from ("the count of send").
void expect_count(const Buffer& buffer, std::size_t expected, const Role& role, const std::string& why);

/// Raises invalid_argument unless `buffer` has the element type of `reference` (named `reference_name`).
void expect_type(const Buffer& buffer, const Buffer& reference, const Role& role, const char* reference_name);

/// "allreduce (rank 1): " — the prefix of every message about a call's arguments.
std::string prefix(const Role& role);

/// Throws tutti::Error(invalid_argument) with `message` (translated to tutti.InvalidArgument).
[[noreturn]] void invalid(const std::string& message);

}  // namespace tutti_python
