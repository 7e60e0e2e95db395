// Where a model runs: "cpu", "cuda" (the current CUDA device) or "cuda:N".
// RuntimeOptions::device and kvl-server's runtime.device take these names.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace kvl {

// InvalidArgument unless `device` is one of the names above (the syntax alone).
absl::Status ParseDeviceName(const std::string& device);

// OK when this process can place tensors on `device`: always for "cpu"; for
// CUDA, FailedPrecondition when the LibTorch this binary links was built
// without CUDA (Debian's is CPU-only) or the machine has no such GPU, with
// how many it has.
absl::Status CheckDeviceAvailable(const std::string& device);

}  // namespace kvl
