// What the emulated device's files share: its argument errors and addresses as numbers.
#pragma once

#include <cstdint>
#include <string>

#include "tutti/types.hpp"

namespace tutti::device::detail {

/// An invalid_argument error from `function` of the emulated device.
[[noreturn]] inline void invalid(const char* function, const std::string& what) {
  throw Error(ErrorCode::invalid_argument, std::string("tutti::device::") + function + " (emulated): " + what);
}

inline std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

}  // namespace tutti::device::detail
