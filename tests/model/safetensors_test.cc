// The safetensors reader and writer, checked against files assembled byte by
// byte from the format's definition (8-byte little-endian header length, JSON
// header, raw little-endian data), and every malformed-file error.
#include "model/safetensors.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvl {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/st_" + name; }

std::string LittleEndian64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// A file made by hand: header length, header text, data bytes.
std::string WriteRaw(const std::string& name, const std::string& header, const std::string& data,
                     int64_t header_len_override = -1) {
  const std::string path = TempPath(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t len = header_len_override >= 0 ? header_len_override : header.size();
  out << LittleEndian64(len) << header << data;
  return path;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void ExpectInvalid(const std::string& path, const std::string& needle) {
  absl::StatusOr<SafetensorsFile> f = ReadSafetensors(path);
  ASSERT_FALSE(f.ok()) << "expected an error mentioning: " << needle;
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  EXPECT_THAT(std::string(f.status().message()), AllOf(HasSubstr(path), HasSubstr(needle)));
}

TEST(SafetensorsTest, ReadsAHandBuiltFile) {
  // Two F32 values, then three BF16 values 1.0, -2.0, 0.5 (0x3f80, 0xc000, 0x3f00).
  const float floats[2] = {1.5f, -3.25f};
  std::string data(reinterpret_cast<const char*>(floats), sizeof(floats));
  data += std::string("\x80\x3f\x00\xc0\x00\x3f", 6);
  const std::string header = R"({"b":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]},)"
                             R"("__metadata__":{"format":"pt"},)"
                             R"("a":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]}})";
  absl::StatusOr<SafetensorsFile> f = ReadSafetensors(WriteRaw("hand", header, data));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->tensors.size(), 2u);
  EXPECT_EQ(f->metadata.at("format"), "pt");
  const at::Tensor& a = f->tensors.at("a");
  EXPECT_EQ(a.scalar_type(), at::kFloat);
  EXPECT_EQ(a.sizes(), at::IntArrayRef({2, 1}));
  EXPECT_EQ(a[0][0].item<float>(), 1.5f);
  EXPECT_EQ(a[1][0].item<float>(), -3.25f);
  const at::Tensor& b = f->tensors.at("b");
  EXPECT_EQ(b.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(b.to(at::kFloat), at::tensor({1.0f, -2.0f, 0.5f})));
}

TEST(SafetensorsTest, WriterFollowsTheFormat) {
  at::Tensor x = at::arange(6, at::kFloat).reshape({2, 3});
  at::Tensor y = at::tensor({7, 8, 9}, at::kLong);
  const std::string path = TempPath("written");
  ASSERT_TRUE(WriteSafetensors(path, {{"y", y}, {"x", x}}, {{"format", "pt"}}).ok());

  const std::string bytes = ReadAll(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u) << "data section should start 8-byte aligned";
  const json header = json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"], json({{"format", "pt"}}));
  // Name order: x at offset 0, y right after it.
  EXPECT_EQ(header["x"], json({{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}));
  EXPECT_EQ(header["y"], json({{"dtype", "I64"}, {"shape", {3}}, {"data_offsets", {24, 48}}}));
  ASSERT_EQ(bytes.size(), 8 + n + 48);
  float x_back[6];
  std::memcpy(x_back, bytes.data() + 8 + n, sizeof(x_back));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(x_back[i], static_cast<float>(i));
  int64_t y_back[3];
  std::memcpy(y_back, bytes.data() + 8 + n + 24, sizeof(y_back));
  EXPECT_EQ(y_back[2], 9);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(SafetensorsTest, RoundTripsEveryDtypeExactly) {
  at::Tensor base = at::randn({3, 5}, at::kDouble) * 100;
  std::map<std::string, at::Tensor> tensors = {
      {"f64", base},
      {"f32", base.to(at::kFloat)},
      {"f16", base.to(at::kHalf)},
      {"bf16", base.to(at::kBFloat16)},
      {"i64", base.to(at::kLong)},
      {"i32", base.to(at::kInt)},
      {"i16", base.to(at::kShort)},
      {"i8", base.clamp(-100, 100).to(at::kChar)},
      {"u8", base.abs().clamp(0, 255).to(at::kByte)},
      {"bool", base > 0},
      {"scalar", at::scalar_tensor(2.5, at::kFloat)},
      {"empty", at::empty({0, 4}, at::kFloat)},
      // A transposed view: written as its values in row-major order.
      {"transposed", base.to(at::kFloat).t()},
  };
  const std::string path = TempPath("dtypes");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  absl::StatusOr<SafetensorsFile> f = ReadSafetensors(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->tensors.size(), tensors.size());
  EXPECT_TRUE(f->metadata.empty());
  for (const auto& [name, t] : tensors) {
    const at::Tensor& back = f->tensors.at(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(back.sizes(), t.sizes()) << name;
    EXPECT_TRUE(back.is_contiguous()) << name;
    EXPECT_TRUE(at::equal(back, t)) << name;
  }
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  absl::StatusOr<SafetensorsFile> f = ReadSafetensors(TempPath("does_not_exist"));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, ShorterThanTheLengthField) {
  const std::string path = TempPath("tiny");
  std::ofstream(path, std::ios::binary) << "abc";
  ExpectInvalid(path, "too short");
}

TEST(SafetensorsTest, HeaderLengthBeyondFile) {
  ExpectInvalid(WriteRaw("hdr_beyond", "{}", "", /*header_len_override=*/4096),
                "header length 4096 extends beyond the end");
}

TEST(SafetensorsTest, HeaderLengthAboveLimit) {
  ExpectInvalid(WriteRaw("hdr_huge", "{}", "", /*header_len_override=*/int64_t{1} << 40),
                "exceeds the limit");
}

TEST(SafetensorsTest, MalformedJsonHeader) {
  ExpectInvalid(WriteRaw("bad_json", R"({"a":{"dtype":"F32",)", ""), "malformed JSON header");
  ExpectInvalid(WriteRaw("json_list", "[1,2]", ""), "not an object");
}

TEST(SafetensorsTest, EntryWithoutDtype) {
  ExpectInvalid(
      WriteRaw("no_dtype", R"({"a":{"shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')),
      "lacks \"dtype\"");
}

TEST(SafetensorsTest, UnknownDtype) {
  ExpectInvalid(WriteRaw("dtype", R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})",
                         std::string(2, '\0')),
                "unsupported dtype \"Q4_K\"");
}

TEST(SafetensorsTest, NegativeDimension) {
  ExpectInvalid(WriteRaw("neg", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
                         std::string(4, '\0')),
                "negative dimension");
}

TEST(SafetensorsTest, ByteLengthDoesNotMatchShape) {
  ExpectInvalid(WriteRaw("len", R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})",
                         std::string(20, '\0')),
                "span 20 bytes but F32 shape [2,3] needs 24");
}

TEST(SafetensorsTest, TruncatedData) {
  at::Tensor x = at::arange(64, at::kFloat);
  const std::string path = TempPath("truncated");
  ASSERT_TRUE(WriteSafetensors(path, {{"x", x}}).ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 10);
  ExpectInvalid(path, "tensor \"x\" ends at byte 256 but the data section has only 246 bytes");
}

TEST(SafetensorsTest, OverlappingTensors) {
  ExpectInvalid(WriteRaw("overlap",
                         R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         std::string(12, '\0')),
                "tensor \"b\" (bytes 4..12) overlaps tensor \"a\"");
}

TEST(SafetensorsTest, GapBetweenTensors) {
  ExpectInvalid(WriteRaw("gap",
                         R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                         std::string(12, '\0')),
                "gap in the data section: bytes 4..8");
}

TEST(SafetensorsTest, TrailingBytes) {
  ExpectInvalid(WriteRaw("trailing", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                         std::string(7, '\0')),
                "3 trailing bytes");
}

TEST(SafetensorsTest, WriterRefusesReservedNameAndUnsupportedDtype) {
  absl::Status reserved =
      WriteSafetensors(TempPath("reserved"), {{"__metadata__", at::zeros({1})}});
  EXPECT_EQ(reserved.code(), absl::StatusCode::kInvalidArgument);
  absl::Status complex =
      WriteSafetensors(TempPath("complex"), {{"c", at::zeros({2}, at::kComplexFloat)}});
  EXPECT_EQ(complex.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(complex.message()), HasSubstr("c has dtype"));
}

}  // namespace
}  // namespace kvl
