#include "model/safetensors.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace kvl {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors stores little-endian bytes; this reader copies them as they are");

using nlohmann::json;

// The same bound as the reference implementation, so that a corrupt length
// cannot make us allocate gigabytes for a header.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeInfo {
  const char* name;
  at::ScalarType scalar_type;
};

constexpr DTypeInfo kDTypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},
};

const DTypeInfo* FindDType(const std::string& name) {
  for (const DTypeInfo& d : kDTypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const DTypeInfo* FindDType(at::ScalarType s) {
  for (const DTypeInfo& d : kDTypes) {
    if (s == d.scalar_type) return &d;
  }
  return nullptr;
}

struct Entry {
  std::string name;
  at::ScalarType scalar_type;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// Validates one header entry (everything that does not depend on the others).
absl::Status ParseEntry(const std::string& path, const std::string& name, const json& v,
                        Entry* out) {
  const std::string where = absl::StrCat("tensor \"", name, "\": ");
  if (!v.is_object()) return Bad(path, where + "header entry is not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!v.contains(key)) return Bad(path, absl::StrCat(where, "header entry lacks \"", key, "\""));
  }
  const json& dtype = v["dtype"];
  if (!dtype.is_string()) return Bad(path, where + "dtype is not a string");
  const DTypeInfo* info = FindDType(dtype.get<std::string>());
  if (info == nullptr) {
    return Bad(path, absl::StrCat(where, "unsupported dtype ", dtype.dump(),
                                  " (supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)"));
  }
  out->name = name;
  out->scalar_type = info->scalar_type;

  const json& shape = v["shape"];
  if (!shape.is_array()) return Bad(path, where + "shape is not a list");
  uint64_t numel = 1;
  for (const json& dim : shape) {
    if (!dim.is_number_unsigned()) {
      return Bad(path, absl::StrCat(where, "shape ", shape.dump(),
                                    " has a non-integer or negative dimension"));
    }
    const uint64_t n = dim.get<uint64_t>();
    if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (n != 0 && numel > std::numeric_limits<uint64_t>::max() / n)) {
      return Bad(path, absl::StrCat(where, "shape ", shape.dump(), " overflows"));
    }
    numel *= n;
    out->shape.push_back(static_cast<int64_t>(n));
  }

  const json& offsets = v["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return Bad(path, absl::StrCat(where, "data_offsets ", offsets.dump(),
                                  " is not a pair of non-negative integers"));
  }
  out->begin = offsets[0].get<uint64_t>();
  out->end = offsets[1].get<uint64_t>();
  if (out->end < out->begin) {
    return Bad(path, absl::StrCat(where, "data_offsets ", offsets.dump(), " end before begin"));
  }
  const uint64_t itemsize = c10::elementSize(out->scalar_type);
  if (numel > std::numeric_limits<uint64_t>::max() / itemsize ||
      out->end - out->begin != numel * itemsize) {
    return Bad(path, absl::StrCat(where, "data_offsets ", offsets.dump(), " span ",
                                  out->end - out->begin, " bytes but ", dtype.get<std::string>(),
                                  " shape ", shape.dump(), " needs ", numel * itemsize));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0, std::ios::beg);
  if (file_size < 8) {
    return Bad(path, absl::StrCat("file is ", file_size,
                                  " bytes, too short for the 8-byte header length (truncated?)"));
  }
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes) {
    return Bad(path, absl::StrCat("header length ", header_len, " exceeds the limit of ",
                                  kMaxHeaderBytes, " bytes"));
  }
  if (header_len > file_size - 8) {
    return Bad(path, absl::StrCat("header length ", header_len, " extends beyond the end of the ",
                                  file_size, "-byte file (truncated?)"));
  }
  std::string header_text(header_len, '\0');
  in.read(header_text.data(), static_cast<std::streamsize>(header_len));
  if (!in) return absl::DataLossError(absl::StrCat(path, ": read error in the header"));

  json header = json::parse(header_text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return Bad(path, "malformed JSON header");
  if (!header.is_object()) return Bad(path, "JSON header is not an object");

  SafetensorsFile file;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return Bad(path, "__metadata__ is not an object");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) {
          return Bad(path, absl::StrCat("__metadata__ value for \"", key, "\" is not a string"));
        }
        file.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    Entry e;
    KVL_RETURN_IF_ERROR(ParseEntry(path, name, value, &e));
    entries.push_back(std::move(e));
  }

  // The data section must be tiled exactly by the tensors: no overlaps (two
  // names sharing bytes), no gaps, nothing past the end, nothing left over.
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected_begin = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (e.begin < expected_begin) {
      return Bad(path, absl::StrCat("tensor \"", e.name, "\" (bytes ", e.begin, "..", e.end,
                                    ") overlaps tensor \"", entries[i - 1].name, "\" (bytes ",
                                    entries[i - 1].begin, "..", entries[i - 1].end, ")"));
    }
    if (e.begin > expected_begin) {
      return Bad(path,
                 absl::StrCat("gap in the data section: bytes ", expected_begin, "..", e.begin,
                              " before tensor \"", e.name, "\" belong to no tensor"));
    }
    if (e.end > data_size) {
      return Bad(path, absl::StrCat("tensor \"", e.name, "\" ends at byte ", e.end,
                                    " but the data section has only ", data_size,
                                    " bytes (file truncated?)"));
    }
    expected_begin = e.end;
  }
  if (expected_begin != data_size) {
    return Bad(path, absl::StrCat(data_size - expected_begin,
                                  " trailing bytes after the last tensor belong to no tensor"));
  }

  // Entries are in file order now, so the reads are sequential; each lands
  // directly in the storage of the tensor that will own it.
  for (const Entry& e : entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.scalar_type));
    const uint64_t n_bytes = e.end - e.begin;
    if (n_bytes > 0) {
      in.seekg(static_cast<std::streamoff>(data_start + e.begin), std::ios::beg);
      in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(n_bytes));
      if (!in) return absl::DataLossError(absl::StrCat(path, ": read error in tensor ", e.name));
    }
    file.tensors.emplace(e.name, std::move(t));
  }
  return file;
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, at::Tensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  data.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__") {
      return absl::InvalidArgumentError("\"__metadata__\" is reserved and cannot name a tensor");
    }
    if (!tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " is undefined"));
    }
    const DTypeInfo* info = FindDType(tensor.scalar_type());
    if (info == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has dtype ",
                                                     c10::toString(tensor.scalar_type()),
                                                     ", which safetensors cannot store"));
    }
    at::Tensor t = tensor.to(at::kCPU).contiguous();
    const uint64_t n_bytes = t.numel() * t.element_size();
    header[name] = {{"dtype", info->name},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + n_bytes}}};
    offset += n_bytes;
    data.push_back(std::move(t));
  }
  std::string header_text = header.dump();
  // Pad with spaces so that the data section starts 8-byte aligned.
  header_text.append((8 - (8 + header_text.size()) % 8) % 8, ' ');

  // Write next to the destination and rename, so that a crash never leaves a
  // half-written file under the final name.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(absl::StrCat(tmp, ": cannot create"));
    unsigned char len_bytes[8];
    uint64_t len = header_text.size();
    for (int i = 0; i < 8; ++i, len >>= 8) len_bytes[i] = static_cast<unsigned char>(len & 0xff);
    out.write(reinterpret_cast<const char*>(len_bytes), 8);
    out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
    for (const at::Tensor& t : data) {
      out.write(static_cast<const char*>(t.data_ptr()),
                static_cast<std::streamsize>(t.numel() * t.element_size()));
    }
    out.flush();
    if (!out) return absl::DataLossError(absl::StrCat(tmp, ": write failed"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace kvl
