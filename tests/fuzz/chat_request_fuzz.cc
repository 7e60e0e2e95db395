// Request validation at the server's edge (server/chat_request.h) from raw
// protobuf bytes, as gRPC hands them over. The first byte picks the message:
// 0 ChatRequest, 1 ImportSessionRequest, 2 CreateSessionRequest's system
// prompt, 3 UTF-8 validation alone. Properties: bytes that do not parse are
// refused by protobuf before validation; every refusal is InvalidArgument or
// NotFound naming a field; what is accepted is within the limits (non-empty,
// valid UTF-8, bounded lengths, max_tokens in [1, limit], sampling in range,
// a known model); the UTF-8 check (model/utf8.h) agrees with the tokenizer's
// lossy repair (an independent implementation): text is valid exactly when
// repair leaves it unchanged. (Of the texts, only user_message and import messages
// and replies are `bytes`: protobuf refuses invalid UTF-8 in the `string`
// fields before validation, as it does in the server.)
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "google/protobuf/stubs/logging.h"
#include "kvlingo/v1/chat.pb.h"
#include "kvlingo/v1/session.pb.h"
#include "model/tokenizer.h"
#include "model/utf8.h"
#include "server/chat_request.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const kvl::server::TurnLimits kLimits{/*max_turn_bytes=*/256, /*max_new_tokens_limit=*/64,
                                      /*max_system_prompt_bytes=*/512, /*max_import_bytes=*/1024};
const std::vector<std::string> kModels = {"kvl-small", "kvl-large", "kvl-small-b"};

bool RepairLeavesUnchanged(absl::string_view text) {
  std::string repaired;
  kvl::AppendUtf8Lossy(std::string_view(text.data(), text.size()), /*final=*/true, &repaired);
  return repaired == text;
}

void CheckValidText(absl::string_view text, const char* what) {
  KVL_FUZZ_CHECK(kvl::IsValidUtf8(std::string_view(text.data(), text.size())) &&
                     RepairLeavesUnchanged(text),
                 std::string(what) + " accepted but not valid UTF-8");
}

void CheckRefusal(const absl::Status& status) {
  kvl::fuzz::Note(status);
  KVL_FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument ||
                     status.code() == absl::StatusCode::kNotFound,
                 "a refusal is InvalidArgument or NotFound: " + status.ToString());
  KVL_FUZZ_CHECK(status.message().find(": ") != absl::string_view::npos,
                 "a refusal names its field: " + status.ToString());
}

}  // namespace

// Protobuf logs an ERROR line for every string field with invalid UTF-8 (it
// refuses the message, as the server's gRPC runtime does); silence it.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 4;
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const int n = static_cast<int>(size - 1);

  if (mode == 0) {
    kvlingo::v1::ChatRequest request;
    if (!request.ParseFromArray(bytes, n)) return 0;
    absl::StatusOr<kvl::server::TurnRequest> turn =
        kvl::server::ParseChatRequest(request, kLimits, kModels);
    if (!turn.ok()) return CheckRefusal(turn.status()), 0;
    const kvl::router::TurnOptions& o = turn->options;
    KVL_FUZZ_CHECK(!o.user_message.empty() &&
                       static_cast<int64_t>(o.user_message.size()) <= kLimits.max_turn_bytes,
                   "accepted user_message length out of bounds");
    CheckValidText(o.user_message, "user_message");
    KVL_FUZZ_CHECK(o.max_tokens >= 1 && o.max_tokens <= kLimits.max_new_tokens_limit,
                   "accepted max_tokens out of [1, limit]: " + std::to_string(o.max_tokens));
    KVL_FUZZ_CHECK(o.sampling.temperature >= 0 && o.sampling.temperature <= 2 &&
                       o.sampling.top_p > 0 && o.sampling.top_p <= 1,
                   "accepted sampling out of range");
    KVL_FUZZ_CHECK(o.stop.size() <= kvl::server::kMaxStopStrings, "too many stop strings");
    for (const std::string& s : o.stop) {
      KVL_FUZZ_CHECK(!s.empty(), "empty stop string accepted");
      CheckValidText(s, "a stop string");
    }
    KVL_FUZZ_CHECK(o.explicit_model >= -1 && o.explicit_model < static_cast<int>(kModels.size()),
                   "accepted an unknown model");
    KVL_FUZZ_CHECK(!turn->session_id.empty() && turn->session_id.size() <= 128,
                   "accepted session_id length out of bounds");
  } else if (mode == 1) {
    kvlingo::v1::ImportSessionRequest request;
    if (!request.ParseFromArray(bytes, n)) return 0;
    auto turns = kvl::server::ParseImportTurns(request, kLimits, kModels, /*default_model=*/0);
    if (!turns.ok()) return CheckRefusal(turns.status()), 0;
    int64_t total = 0;
    for (const kvl::server::ImportTurn& t : *turns) {
      KVL_FUZZ_CHECK(!t.user_message.empty(), "empty imported message accepted");
      CheckValidText(t.user_message, "an imported message");
      CheckValidText(t.reply, "an imported reply");
      KVL_FUZZ_CHECK(t.model >= 0 && t.model < static_cast<int>(kModels.size()),
                     "imported turn with an unknown model");
      total += static_cast<int64_t>(t.user_message.size() + t.reply.size());
    }
    KVL_FUZZ_CHECK(total <= kLimits.max_import_bytes, "import over max_import_bytes accepted");
  } else if (mode == 2) {
    kvlingo::v1::CreateSessionRequest request;
    if (!request.ParseFromArray(bytes, n)) return 0;
    const absl::Status s = kvl::server::ValidateSystemPrompt(request.system_prompt(), kLimits,
                                                             /*preamble_tokens=*/0,
                                                             /*context_tokens=*/0);
    if (!s.ok()) return CheckRefusal(s), 0;
    KVL_FUZZ_CHECK(static_cast<int64_t>(request.system_prompt().size()) <=
                       kLimits.max_system_prompt_bytes,
                   "over-long system prompt accepted");
    CheckValidText(request.system_prompt(), "system_prompt");
  } else {
    const absl::string_view text(bytes, n);
    size_t offset = 0;
    const bool valid = kvl::IsValidUtf8(std::string_view(text.data(), text.size()), &offset);
    KVL_FUZZ_CHECK(valid == RepairLeavesUnchanged(text),
                   "IsValidUtf8 and the tokenizer's UTF-8 repair disagree");
    if (!valid) {
      KVL_FUZZ_CHECK(offset < text.size() && RepairLeavesUnchanged(text.substr(0, offset)),
                     "the first bad byte offset is wrong");
    }
  }
  return 0;
}
