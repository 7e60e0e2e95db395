// The safetensors reader (model/safetensors.h) on arbitrary file contents.
// Property: it either refuses the file or returns tensors whose bytes lie
// inside the file, and writing them back and reading again gives the same
// tensors and metadata.
#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>

#include "model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit(kvl::fuzz::RemoveInput);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvl::fuzz::WriteInput(data, size);
  absl::StatusOr<kvl::SafetensorsFile> file = kvl::ReadSafetensors(path);
  kvl::fuzz::Note(file.status());
  if (!file.ok()) {
    KVL_FUZZ_CHECK(file.status().code() == absl::StatusCode::kInvalidArgument,
                   "a refused file is InvalidArgument: " + file.status().ToString());
    return 0;
  }
  size_t bytes = 0;
  for (const auto& [name, t] : file->tensors) bytes += t.nbytes();
  KVL_FUZZ_CHECK(bytes <= size, "tensors hold more bytes than the file");

  const std::string again = path + ".rt";
  KVL_FUZZ_CHECK(kvl::WriteSafetensors(again, file->tensors, file->metadata).ok(),
                 "writing back what was read");
  absl::StatusOr<kvl::SafetensorsFile> reread = kvl::ReadSafetensors(again);
  std::remove(again.c_str());
  KVL_FUZZ_CHECK(reread.ok(), "reading back what was written");
  KVL_FUZZ_CHECK(reread->metadata == file->metadata, "metadata round trip");
  KVL_FUZZ_CHECK(reread->tensors.size() == file->tensors.size(), "tensor count round trip");
  for (const auto& [name, t] : file->tensors) {
    auto it = reread->tensors.find(name);
    KVL_FUZZ_CHECK(it != reread->tensors.end(), "tensor " + name + " lost in the round trip");
    const at::Tensor& u = it->second;
    KVL_FUZZ_CHECK(u.scalar_type() == t.scalar_type() && u.sizes() == t.sizes(),
                   "tensor " + name + " dtype or shape changed");
    // Byte equality (NaN payloads included), not numeric equality.
    KVL_FUZZ_CHECK(t.nbytes() == u.nbytes() &&
                       (t.nbytes() == 0 || std::memcmp(t.data_ptr(), u.data_ptr(), t.nbytes()) == 0),
                   "tensor " + name + " bytes changed");
  }
  return 0;
}
