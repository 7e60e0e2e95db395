// The safetensors file format: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then
// the raw little-endian tensor bytes.
#pragma once

#include <map>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvl {

struct SafetensorsFile {
  std::map<std::string, at::Tensor> tensors;  // CPU tensors owning their memory
  std::map<std::string, std::string> metadata;
};

// Reads a file. Errors (InvalidArgument, naming the path): short file, header
// length beyond the file, malformed JSON, unknown dtype, offsets outside the
// data section or not matching dtype*shape, overlapping tensors.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

// Writes tensors (contiguous copies are made as needed) in name order.
absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, at::Tensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace kvl
