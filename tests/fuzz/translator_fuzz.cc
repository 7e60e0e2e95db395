// Translator files (Translator::Load) on arbitrary contents: the safetensors
// container plus kvlingo's metadata and map tensors. Property: a file that is
// not a valid translator is InvalidArgument, or FailedPrecondition for one
// built for other models (never a crash, a sanitizer report or another code).
#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>

#include "tests/fuzz/fuzz_util.h"
#include "translator/translator.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit(kvl::fuzz::RemoveInput);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvl::fuzz::WriteInput(data, size);
  // The seeds are written for empty identities and tokenizer hashes.
  absl::StatusOr<std::unique_ptr<kvl::Translator>> t =
      kvl::Translator::Load(path, kvl::TranslatorExpectation{});
  kvl::fuzz::Note(t.status());
  if (!t.ok()) {
    const absl::StatusCode code = t.status().code();
    KVL_FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument ||
                       code == absl::StatusCode::kFailedPrecondition,
                   "a refused translator is InvalidArgument or FailedPrecondition: " +
                       t.status().ToString());
    return 0;
  }
  return 0;
}
