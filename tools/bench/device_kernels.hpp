// tutti-bench --device emulated|cuda --kernels: the device's reduction kernel (dst = a op b, what
// the ipc backend reduces with) timed beside a device-to-device copy of the same bytes on the same
// stream, size by size in one run, and checked bit for bit against the host's reduce::apply.
#pragma once

#include <string>

#include "bench/device_runner.hpp"

namespace tutti::bench {

/// Runs the kernel sweep on `context` (one rank), prints the table and writes --json. Returns
/// the exit status: 0, or 1 when a result was wrong.
int run_kernels(DeviceContext& context, const std::string& device_name, const std::string& launcher);

}  // namespace tutti::bench
