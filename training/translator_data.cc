#include "training/translator_data.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "datagen/chat_data.h"
#include "model/token_alignment.h"
#include "nlohmann/json.hpp"
#include "translator/resample.h"

namespace kvl::training {

TranslatorEndpoint TranslatorModel::Endpoint() const {
  return EndpointOf(config(), identity, tokenizer->content_hash());
}

absl::StatusOr<TranslatorModel> LoadTranslatorModel(const std::string& dir,
                                                    RuntimeOptions options) {
  options.dtype = DType::kFloat32;
  absl::StatusOr<ModelDir> loaded = LoadModelDir(dir, options);
  if (!loaded.ok()) return loaded.status();
  TranslatorModel m;
  static_cast<ModelDir&>(m) = *std::move(loaded);
  m.weights32 = m.checkpoint.weights.To(at::kFloat, "cpu");
  return m;
}

absl::StatusOr<TranslatorPair> LoadTranslatorPair(const std::string& source_dir,
                                                  const std::string& target_dir,
                                                  const RuntimeOptions& options,
                                                  Tokenizers tokenizers) {
  absl::StatusOr<TranslatorModel> source = LoadTranslatorModel(source_dir, options);
  if (!source.ok()) return source.status();
  absl::StatusOr<TranslatorModel> target = LoadTranslatorModel(target_dir, options);
  if (!target.ok()) return target.status();
  if (tokenizers == Tokenizers::kSame) KVL_RETURN_IF_ERROR(CheckSameTokenizer(*source, *target));
  return TranslatorPair{*std::move(source), *std::move(target)};
}

bool TranslatorPair::SameTokenizer() const {
  return source.tokenizer->content_hash() == target.tokenizer->content_hash();
}

TranslatorExpectation ExpectationFor(const TranslatorModel& source, const TranslatorModel& target) {
  return {source.identity, target.identity, source.tokenizer->content_hash(),
          target.tokenizer->content_hash()};
}

absl::Status CheckSameTokenizer(const TranslatorModel& source, const TranslatorModel& target) {
  if (source.tokenizer->content_hash() != target.tokenizer->content_hash()) {
    return absl::FailedPreconditionError(
        absl::StrCat(source.path, " and ", target.path,
                     " have different tokenizers; cross-tokenizer translation is not supported"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ChatMessage>> ParseChatLine(const std::string& line,
                                                       const std::string& path, int64_t line_no) {
  std::vector<ChatMessage> messages;
  try {
    const nlohmann::json chat = nlohmann::json::parse(line);
    for (const auto& m : chat.at("messages")) {
      messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": ", e.what()));
  }
  return messages;
}

namespace {

bool IsChatFile(const std::string& path) {
  return path.size() >= 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0;
}

// Calls on_chat with each chat of a .jsonl text, rendered as ChatML, until it
// returns false. InvalidArgument naming path:line for a malformed line.
absl::Status ForEachRenderedChat(const std::string& text, const std::string& path,
                                 const std::function<bool(const std::string&)>& on_chat) {
  int64_t line_no = 0;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_no;
    if (line.empty()) continue;
    absl::StatusOr<std::vector<ChatMessage>> messages = ParseChatLine(line, path, line_no);
    if (!messages.ok()) return messages.status();
    if (!on_chat(datagen::RenderChatMl(*messages))) break;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> ReadTokenStream(const std::string& path,
                                                     const Tokenizer& tokenizer) {
  absl::StatusOr<std::string> text = ReadTextFile(path);
  if (!text.ok()) return text.status();
  if (!IsChatFile(path)) return tokenizer.Encode(*text, /*parse_special=*/true);
  std::vector<int32_t> ids;
  absl::Status s = ForEachRenderedChat(*text, path, [&](const std::string& chat) {
    tokenizer.EncodeTo(chat + "\n", /*parse_special=*/true, &ids);
    return true;
  });
  if (!s.ok()) return s;
  return ids;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> ReadSequences(const std::string& path,
                                                                const Tokenizer& tokenizer,
                                                                int64_t seq_len,
                                                                int64_t max_sequences) {
  absl::StatusOr<std::string> text = ReadTextFile(path);
  if (!text.ok()) return text.status();
  std::vector<std::vector<int64_t>> out;
  auto full = [&] { return max_sequences > 0 && static_cast<int64_t>(out.size()) >= max_sequences; };
  if (IsChatFile(path)) {
    absl::Status s = ForEachRenderedChat(*text, path, [&](const std::string& chat) {
      const std::vector<int32_t> ids = tokenizer.Encode(chat);
      if (ids.size() >= 2) {
        const size_t n = std::min<size_t>(ids.size(), static_cast<size_t>(seq_len));
        out.emplace_back(ids.begin(), ids.begin() + static_cast<int64_t>(n));
      }
      return !full();
    });
    if (!s.ok()) return s;
  } else {
    const std::vector<int32_t> ids = tokenizer.Encode(*text);
    for (size_t t = 0; !full() && t + static_cast<size_t>(seq_len) <= ids.size(); t += seq_len) {
      out.emplace_back(ids.begin() + static_cast<int64_t>(t),
                       ids.begin() + static_cast<int64_t>(t) + seq_len);
    }
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no sequences"));
  return out;
}

std::vector<std::vector<int64_t>> ConsecutiveWindows(const std::vector<int32_t>& stream,
                                                     int64_t length, int64_t max_windows) {
  std::vector<std::vector<int64_t>> out;
  for (size_t t = 0; length > 0 && t + static_cast<size_t>(length) <= stream.size();
       t += static_cast<size_t>(length)) {
    if (max_windows > 0 && static_cast<int64_t>(out.size()) >= max_windows) break;
    out.emplace_back(stream.begin() + static_cast<int64_t>(t),
                     stream.begin() + static_cast<int64_t>(t) + length);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<KvCache>> TranslatedCache(Engine& source, Engine& target,
                                                         const Translator& translator,
                                                         const std::vector<int64_t>& prefix) {
  std::unique_ptr<KvCache> source_cache = source.NewCache();
  if (absl::StatusOr<at::Tensor> s = source.Prefill(*source_cache, prefix); !s.ok()) {
    return s.status();
  }
  absl::StatusOr<KvTaps> taps = source_cache->Taps(0, source_cache->Length());
  if (!taps.ok()) return taps.status();
  absl::StatusOr<KvTaps> translated =
      translator.Translate(*taps, Translator::Output::kFloat32, prefix);
  if (!translated.ok()) return translated.status();
  std::unique_ptr<KvCache> cache = target.NewCache();
  KVL_RETURN_IF_ERROR(cache->Accept(translated->keys, translated->values));
  return cache;
}

absl::StatusOr<CrossTranslated> TranslatedCacheAcross(const TranslatorModel& source,
                                                      const TranslatorModel& target,
                                                      const Translator& translator,
                                                      const std::vector<int64_t>& target_ids,
                                                      int64_t limit, UnevenGroups uneven) {
  const std::vector<int32_t> t32(target_ids.begin(), target_ids.end());
  const std::string text = target.tokenizer->Decode(t32);
  const std::vector<int32_t> s32 = source.tokenizer->Encode(text);
  absl::StatusOr<std::vector<AlignedGroup>> groups =
      AlignSpellings(*source.tokenizer, s32, *target.tokenizer, t32, text);
  if (!groups.ok()) return groups.status();
  // The groups that end by `limit`.
  size_t n_groups = 0;
  while (n_groups < groups->size() && (*groups)[n_groups].b_end <= limit) ++n_groups;
  groups->resize(n_groups);
  CrossTranslated out;
  out.cache = target.engine->NewCache();
  if (groups->empty()) return out;
  out.n_translated = groups->back().b_end;
  out.n_source = groups->back().a_end;
  out.n_groups = static_cast<int64_t>(n_groups);
  for (const AlignedGroup& g : *groups) out.n_one_to_one += g.one_to_one() ? 1 : 0;
  absl::StatusOr<std::vector<TokenRun>> runs = AssignWithinGroups(*groups);
  if (!runs.ok()) return runs.status();

  std::unique_ptr<KvCache> source_cache = source.engine->NewCache();
  const std::vector<int64_t> source_ids(s32.begin(), s32.begin() + out.n_source);
  if (absl::StatusOr<at::Tensor> s = source.engine->Prefill(*source_cache, source_ids); !s.ok()) {
    return s.status();
  }
  absl::StatusOr<KvTaps> taps = source_cache->Taps(0, source_cache->Length());
  if (!taps.ok()) return taps.status();
  absl::StatusOr<KvTaps> resampled = ResampleTaps(*taps, *runs);
  if (!resampled.ok()) return resampled.status();
  const std::vector<int64_t> translated_ids(target_ids.begin(),
                                            target_ids.begin() + out.n_translated);
  absl::StatusOr<KvTaps> translated =
      translator.Translate(*resampled, Translator::Output::kFloat32, translated_ids);
  if (!translated.ok()) return translated.status();
  if (uneven == UnevenGroups::kTranslate) {
    KVL_RETURN_IF_ERROR(out.cache->Accept(translated->keys, translated->values));
    return out;
  }
  // Translated entries up to each uneven group, then the group's own prefill.
  int64_t done = 0;
  auto accept_to = [&](int64_t end) -> absl::Status {
    if (end > done) {
      KVL_RETURN_IF_ERROR(out.cache->Accept(translated->keys.narrow(2, done, end - done),
                                            translated->values.narrow(2, done, end - done)));
    }
    done = end;
    return absl::OkStatus();
  };
  for (const AlignedGroup& g : *groups) {
    if (g.one_to_one()) continue;
    KVL_RETURN_IF_ERROR(accept_to(g.b_begin));
    const std::vector<int64_t> own(target_ids.begin() + g.b_begin, target_ids.begin() + g.b_end);
    if (absl::StatusOr<at::Tensor> p = target.engine->Prefill(*out.cache, own); !p.ok()) {
      return p.status();
    }
    done = g.b_end;
  }
  KVL_RETURN_IF_ERROR(accept_to(out.n_translated));
  return out;
}

std::vector<double> TokenNll(const at::Tensor& logits, const std::vector<int64_t>& labels) {
  c10::InferenceMode guard;
  const at::Tensor logp = at::log_softmax(logits.to(at::kDouble), -1);  // [T, V]
  const at::Tensor idx = at::tensor(labels, at::kLong).unsqueeze(1);
  const at::Tensor picked = logp.gather(1, idx).squeeze(1).neg().contiguous();
  const double* p = picked.data_ptr<double>();
  return std::vector<double>(p, p + picked.numel());
}

}  // namespace kvl::training
