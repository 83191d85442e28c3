// The implementation behind a public gpu::Communicator, for the engine, tutti-bench's device
// measurements and the tests: the only way from a gpu::Communicator to its Impl (its device, the
// host-transfer failure record).
#pragma once

#include "gpu/gpu_impl.hpp"
#include "tutti/gpu.hpp"

namespace tutti::gpu::detail {

struct Access {
  /// `c`'s implementation; nullptr for a moved-from communicator.
  static Impl* impl(const Communicator& c) { return c.impl_.get(); }
};

}  // namespace tutti::gpu::detail
