#include "core/buffer.hpp"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include <dlpack/dlpack.h>

#include "core/torch_storage.hpp"

namespace tutti_python {

namespace {

// A "dltensor" capsule (torch 1.13 and 2.x, NumPy) holds a DLManagedTensor in the layout of DLPack
// 0.5 and later (1.0 keeps it, and adds a versioned struct under another capsule name): the layout
// the installed dlpack.h (Debian's libdlpack-dev, 0.6) must have on this 64-bit ABI.
static_assert(sizeof(DLDevice) == 8 && sizeof(DLDataType) == 4, "DLPack's DLDevice and DLDataType");
static_assert(offsetof(DLTensor, byte_offset) == 40 && sizeof(DLManagedTensor) == 64, "DLPack's DLManagedTensor");

const char* const supported_types = "int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, float32, float64";

std::optional<tutti::DataType> integer_type(bool is_signed, std::size_t bytes) {
  using tutti::DataType;
  switch (bytes) {
    case 1:
      return is_signed ? DataType::i8 : DataType::u8;
    case 4:
      return is_signed ? DataType::i32 : DataType::u32;
    case 8:
      return is_signed ? DataType::i64 : DataType::u64;
    default:
      return std::nullopt;
  }
}

std::optional<tutti::DataType> float_type(std::size_t bytes) {
  using tutti::DataType;
  switch (bytes) {
    case 2:
      return DataType::f16;
    case 4:
      return DataType::f32;
    case 8:
      return DataType::f64;
    default:
      return std::nullopt;
  }
}

// The DataType of a struct-module format ("<f", "i", "=q", ...) with `itemsize`, if any.
std::optional<tutti::DataType> type_of_format(std::string_view format, std::size_t itemsize) {
  if (format.empty()) format = "B";
  const char order = format.front();
  if (order == '@' || order == '=' || order == '<' || order == '>' || order == '!') {
    const bool big = order == '>' || order == '!';
    if (big != (std::endian::native == std::endian::big)) return std::nullopt;  // foreign byte order
    format.remove_prefix(1);
  }
  if (format.size() != 1) return std::nullopt;
  const std::string_view signed_codes = "bhilq", unsigned_codes = "BHILQ", float_codes = "efd";
  const char c = format.front();
  if (signed_codes.find(c) != std::string_view::npos) return integer_type(true, itemsize);
  if (unsigned_codes.find(c) != std::string_view::npos) return integer_type(false, itemsize);
  if (float_codes.find(c) != std::string_view::npos) return float_type(itemsize);
  return std::nullopt;
}

std::optional<tutti::DataType> type_of_dlpack(const DLDataType& t) {
  if (t.lanes != 1 || t.bits % 8 != 0) return std::nullopt;
  const std::size_t bytes = t.bits / 8;
  switch (t.code) {
    case kDLInt:
      return integer_type(true, bytes);
    case kDLUInt:
      return integer_type(false, bytes);
    case kDLFloat:
      return float_type(bytes);
    case kDLBfloat:
      return bytes == 2 ? std::optional(tutti::DataType::bf16) : std::nullopt;
    default:
      return std::nullopt;
  }
}

std::string type_name_of(py::handle object) { return py::str(py::type::of(object).attr("__name__")); }

Buffer from_buffer_protocol(py::handle object, const Role& role) {
  // A memoryview holds the export until it is released: the exporter (a bytearray, say) cannot
  // resize or free the memory meanwhile.
  py::object view = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(object.ptr()));
  if (!view) throw py::error_already_set();
  const Py_buffer* info = PyMemoryView_GET_BUFFER(view.ptr());
  const std::string format = info->format ? info->format : "B";
  const auto type = type_of_format(format, static_cast<std::size_t>(info->itemsize));
  if (!type)
    invalid(prefix(role) + role.argument + " has elements of buffer format '" + format + "' (" +
            std::to_string(info->itemsize) + " bytes), which is no Tutti type (" + supported_types + ")");
  if (!PyBuffer_IsContiguous(info, 'C'))
    invalid(prefix(role) + role.argument + " (" + type_name_of(object) +
            ") is not C-contiguous; pass a contiguous copy (numpy.ascontiguousarray)");
  if (role.output && info->readonly)
    invalid(prefix(role) + role.argument + " (" + type_name_of(object) + ") is read-only, but the call writes it");
  return {std::move(view), info->buf, static_cast<std::size_t>(info->len / info->itemsize), *type};
}

bool is_c_contiguous(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  std::int64_t expected = 1;
  for (std::int32_t d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

// Kept unconsumed in `owner`: the capsule's destructor calls the tensor's deleter once the owner
// goes, which releases the exporter's reference (DLPack's protocol). A capsule passed as it is
// keeps only what its producer holds (torch: a tensor, whose storage resize_ may still reallocate).
Buffer from_dlpack(py::handle object, const Role& role) {
  py::object capsule;
  if (PyCapsule_CheckExact(object.ptr())) {
    capsule = py::reinterpret_borrow<py::object>(object);
  } else {
    const std::string dtype = py::hasattr(object, "dtype") ? std::string(py::str(object.attr("dtype"))) : "";
    if (dtype == "torch.bool")  // exported as uint8, but sums of bools are no bools
      invalid(prefix(role) + role.argument + " has dtype torch.bool, which is no Tutti type (" + supported_types + ")");
    try {
      capsule = object.attr("__dlpack__")();
    } catch (py::error_already_set& e) {
      invalid(prefix(role) + role.argument + " (" + type_name_of(object) +
              ") cannot be exported through DLPack: " + e.what());
    }
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    invalid(prefix(role) + role.argument + " is a DLPack capsule already consumed (its name is not 'dltensor')");
  }
  const DLTensor& t = managed->dl_tensor;
  if (t.device.device_type != kDLCPU)
    invalid(prefix(role) + role.argument + " is in memory of DLPack device type " +
            std::to_string(t.device.device_type) + ", not the host (CPU = 1); tutti works on host memory");
  const auto type = type_of_dlpack(t.dtype);
  if (!type)
    invalid(prefix(role) + role.argument + " has DLPack dtype (code " + std::to_string(t.dtype.code) + ", " +
            std::to_string(t.dtype.bits) + " bits, " + std::to_string(t.dtype.lanes) +
            " lanes), which is no Tutti type (" + supported_types + ")");
  if (!is_c_contiguous(t))
    invalid(prefix(role) + role.argument + " (" + type_name_of(object) +
            ") is not C-contiguous; pass a contiguous copy (tensor.contiguous())");
  std::size_t count = 1;
  for (std::int32_t d = 0; d < t.ndim; ++d) count *= static_cast<std::size_t>(t.shape[d]);
  void* data = static_cast<std::byte*>(t.data) + t.byte_offset;
  // The capsule holds a tensor (torch: a view of it), not the memory: a resize_ reallocates the
  // storage in place and frees the old memory. Pin the storage, which also holds it across set_.
  py::object storage = hold_torch_storage(object);
  if (!storage.is_none()) capsule = py::make_tuple(capsule, storage);
  return {std::move(capsule), data, count, *type};
}

}  // namespace

std::string prefix(const Role& role) {
  return std::string(role.operation) + " (rank " + std::to_string(role.rank) + "): ";
}

void invalid(const std::string& message) { throw tutti::Error(tutti::ErrorCode::invalid_argument, message); }

Buffer buffer_of(py::handle object, const Role& role) {
  if (object.is_none()) invalid(prefix(role) + role.argument + " is None, but this rank needs a buffer there");
  if (PyObject_CheckBuffer(object.ptr())) return from_buffer_protocol(object, role);
  if (PyCapsule_CheckExact(object.ptr()) || py::hasattr(object, "__dlpack__")) return from_dlpack(object, role);
  invalid(prefix(role) + role.argument + " (" + type_name_of(object) +
          ") has neither the buffer protocol nor __dlpack__ (pass a NumPy array, a torch tensor, a bytearray...)");
}

void expect_count(const Buffer& buffer, std::size_t expected, const Role& role, const std::string& why) {
  if (buffer.count != expected)
    invalid(prefix(role) + role.argument + " has " + std::to_string(buffer.count) + " elements, expected " +
            std::to_string(expected) + " (" + why + ")");
}

void expect_type(const Buffer& buffer, const Buffer& reference, const Role& role, const char* reference_name) {
  if (buffer.type != reference.type)
    invalid(prefix(role) + role.argument + " has type " + std::string(tutti::to_string(buffer.type)) + " but " +
            reference_name + " has " + std::string(tutti::to_string(reference.type)));
}

}  // namespace tutti_python
