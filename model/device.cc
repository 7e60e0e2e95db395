#include "model/device.h"

#include <ATen/Context.h>
#include <c10/core/Device.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"

namespace kvl {
namespace {

// The CUDA ordinal of "cuda:N" (N), -1 for "cuda", -2 for anything else.
int CudaOrdinal(const std::string& device) {
  if (device == "cuda") return -1;
  const absl::string_view prefix = "cuda:";
  if (absl::string_view(device).substr(0, prefix.size()) != prefix) return -2;
  const absl::string_view digits = absl::string_view(device).substr(prefix.size());
  int n = 0;
  if (digits.empty() || digits.size() > 3 || digits.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(digits, &n)) {
    return -2;
  }
  return n;
}

}  // namespace

absl::Status ParseDeviceName(const std::string& device) {
  if (device == "cpu" || CudaOrdinal(device) >= -1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", device, "'; expected cpu, cuda or cuda:N"));
}

absl::Status CheckDeviceAvailable(const std::string& device) {
  KVL_RETURN_IF_ERROR(ParseDeviceName(device));
  if (device == "cpu") return absl::OkStatus();
  if (!at::hasCUDA()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", device, ": this binary's LibTorch has no CUDA (a CPU-only build, such as "
        "Debian's); build against a CUDA LibTorch with -DTorch_DIR (deploy/README.md, \"GPU\")"));
  }
  const int n_gpus = static_cast<int>(at::getNumGPUs());
  const int ordinal = CudaOrdinal(device);
  if (n_gpus == 0 || ordinal >= n_gpus) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", device, ": this machine has ", n_gpus, " CUDA device(s)",
                     n_gpus > 0 ? absl::StrCat(" (cuda:0 to cuda:", n_gpus - 1, ")") : ""));
  }
  return absl::OkStatus();
}

}  // namespace kvl
