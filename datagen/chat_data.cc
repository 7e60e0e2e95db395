// Assembly of the chat-data set: splits, deduplication, real-prose
// conversations, and the files written by `kvl make-data`.
#include "datagen/chat_data.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "datagen/chat_data_rng.h"
#include "nlohmann/json.hpp"

namespace kvl::datagen {
namespace {

using Json = nlohmann::ordered_json;

// Share of generated conversations per task in train (out of 100); valid and
// test cycle through the tasks and levels evenly instead.
constexpr Task kMixTasks[] = {Task::kFacts, Task::kKv, Task::kArith, Task::kLists, Task::kStrings, Task::kChat};
constexpr int kMixWeights[] = {19, 8, 19, 19, 19, 16};
constexpr int kNumMix = 6;

// Real-prose paragraphs go to train / valid / test by a hash of their text,
// 90 / 5 / 5, so a paragraph can never be in two splits whatever the seed.
int ProseSplit(const std::string& paragraph) {
  const uint64_t bucket = HashBytes(paragraph) % 100;
  return bucket < 90 ? 0 : (bucket < 95 ? 1 : 2);
}

struct Paragraph {
  std::string text;
  int source = 0;  // index in the source list; consecutive paragraphs of one file stay together
};

// Position just after the sentence end nearest to `target` (". " followed by
// an upper-case letter), or npos when the text has a single sentence.
size_t SentenceBreakNear(const std::string& p, size_t target) {
  size_t best = std::string::npos;
  for (size_t i = 0; i + 2 < p.size(); ++i) {
    if ((p[i] == '.' || p[i] == '?' || p[i] == '!') && p[i + 1] == ' ' &&
        std::isupper(static_cast<unsigned char>(p[i + 2]))) {
      const size_t pos = i + 1;
      if (best == std::string::npos || (pos > target ? pos - target : target - pos) <
                                           (best > target ? best - target : target - best)) {
        best = pos;
      }
    }
  }
  return best;
}

// Hashes of what a paragraph could share with another one: each sentence
// (split after ".", "?" or "!" followed by a space and an upper-case letter)
// and each window of 8 consecutive words. Two paragraphs with no hash in common
// share no sentence and no 8-word run of text.
std::vector<uint64_t> OverlapHashes(const std::string& p) {
  std::vector<uint64_t> out;
  size_t start = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const bool end_here = i + 1 == p.size() ||
                          ((p[i] == '.' || p[i] == '?' || p[i] == '!') && i + 2 < p.size() && p[i + 1] == ' ' &&
                           std::isupper(static_cast<unsigned char>(p[i + 2])));
    if (end_here) {
      out.push_back(HashBytes(std::string_view(p).substr(start, i + 1 - start)));
      start = i + 2;
    }
  }
  constexpr size_t kWindow = 8;
  std::vector<size_t> word_starts;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != ' ' && (i == 0 || p[i - 1] == ' ')) word_starts.push_back(i);
  }
  for (size_t w = 0; w + kWindow <= word_starts.size(); ++w) {
    const size_t end = w + kWindow < word_starts.size() ? word_starts[w + kWindow] - 1 : p.size();
    out.push_back(HashBytes(std::string_view(p).substr(word_starts[w], end - word_starts[w])) ^ 0x5348494E474C45ULL);
  }
  return out;
}

constexpr const char* kWritePrompts[] = {
    "Write a paragraph.", "Tell me something you have read.", "Share a passage from a manual.",
    "Write some text in the style of technical documentation.", "Show me a paragraph of English prose.",
};

// Turns the split's paragraphs (in file order) into conversations; each
// paragraph is used once.
std::vector<Conversation> ProseConversations(const std::vector<Paragraph>& paragraphs, uint64_t seed, int split) {
  std::vector<Conversation> out;
  size_t i = 0;
  int group = 0;
  while (i < paragraphs.size()) {
    Rng rng(MixSeed({seed, static_cast<uint64_t>(split) + 1, 0x70726F7365ULL, static_cast<uint64_t>(group)}));
    const int kind = static_cast<int>(rng.Below(100));
    // How many consecutive paragraphs of the same file this conversation takes.
    auto take = [&](int n_max) {
      std::vector<std::string> ps;
      const int src = paragraphs[i].source;
      while (i < paragraphs.size() && paragraphs[i].source == src && static_cast<int>(ps.size()) < n_max) {
        ps.push_back(paragraphs[i++].text);
      }
      return ps;
    };
    Conversation c;
    c.task = Task::kProse;
    std::vector<ChatMessage>& m = c.messages;
    if (rng.Chance(0.3)) m.push_back({"system", "You are a helpful assistant."});
    std::vector<std::string> ps;
    if (kind < 40) {
      ps = take(rng.Range(1, 3));
      std::string body;
      for (const std::string& p : ps) body += (body.empty() ? "" : "\n\n") + p;
      m.push_back({"user", rng.Pick(kWritePrompts)});
      m.push_back({"assistant", body});
    } else if (kind < 65) {
      ps = take(1);
      const std::string& p = ps[0];
      size_t cut = SentenceBreakNear(p, p.size() / 2);
      if (cut == std::string::npos) cut = p.rfind(' ', p.size() / 2);
      m.push_back({"user", "Continue this text:\n\n" + p.substr(0, cut)});
      m.push_back({"assistant", p.substr(cut + 1)});
    } else if (kind < 75 && paragraphs[i].text.size() <= 600) {
      ps = take(1);
      m.push_back({"user", "Copy this paragraph exactly:\n\n" + ps[0]});
      m.push_back({"assistant", ps[0]});
    } else if (kind < 85) {
      ps = take(1);
      const size_t cut = SentenceBreakNear(ps[0], 0);
      m.push_back({"user", ps[0] + "\n\nWhat is the first sentence of this paragraph?"});
      m.push_back({"assistant", cut == std::string::npos ? ps[0] : ps[0].substr(0, cut)});
    } else {
      // Alternating turns of one document, so prose appears in both roles.
      ps = take(rng.Range(2, 4));
      if (ps.size() == 1) {
        m.push_back({"user", "Continue this text:\n\n" + ps[0]});
        m.push_back({"assistant", "That is the end of the passage."});
      } else {
        for (size_t k = 0; k < ps.size(); ++k) m.push_back({k % 2 == 0 ? "user" : "assistant", ps[k]});
        if (ps.size() % 2 == 1) m.push_back({"assistant", "Thank you for sharing that passage."});
      }
    }
    std::string canon = "prose|";
    for (const std::string& p : ps) canon += p + "\n";
    c.canonical = HashBytes(canon);
    out.push_back(std::move(c));
    ++group;
  }
  return out;
}

absl::Status ValidateOptions(const DataOptions& o) {
  if (o.n_train < 0 || o.n_valid < 0 || o.n_test < 0) {
    return absl::InvalidArgumentError("conversation counts must be >= 0");
  }
  if (o.facts_max_distractors < 0 || o.facts_max_distractors > 20) {
    return absl::InvalidArgumentError("--facts-distractors must be in [0, 20]");
  }
  if (o.facts_max_filler < 0 || o.facts_max_filler > 40) {
    return absl::InvalidArgumentError("--facts-filler must be in [0, 40]");
  }
  if (o.kv_max_bytes < 150 || o.kv_max_bytes > 200000) {
    return absl::InvalidArgumentError("--kv-max-bytes must be in [150, 200000]");
  }
  if (o.arith_max_steps < 1 || o.arith_max_steps > 50) {
    return absl::InvalidArgumentError("--arith-steps must be in [1, 50]");
  }
  if (o.list_max_len < 3 || o.list_max_len > 14) {
    return absl::InvalidArgumentError("--list-len must be in [3, 14]");
  }
  if (o.string_max_len < 3 || o.string_max_len > 64) {
    return absl::InvalidArgumentError("--string-len must be in [3, 64]");
  }
  return absl::OkStatus();
}

// Rough token count without a tokenizer: runs of letters, runs of digits and
// single other non-space characters. A small BPE vocabulary lands near it.
int64_t PretokenEstimate(const std::string& s) {
  int64_t n = 0;
  int prev = 0;  // 0 space, 1 letter, 2 digit, 3 other
  for (char ch : s) {
    const unsigned char u = static_cast<unsigned char>(ch);
    const int cls = std::isspace(u) ? 0 : (std::isalpha(u) ? 1 : (std::isdigit(u) ? 2 : 3));
    if (cls != 0 && (cls != prev || cls == 3)) ++n;
    prev = cls;
  }
  return n;
}

Json MessagesJson(const std::vector<ChatMessage>& messages, size_t n) {
  Json arr = Json::array();
  for (size_t i = 0; i < n; ++i) arr.push_back(Json{{"role", messages[i].role}, {"content", messages[i].content}});
  return arr;
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace

std::string RenderChatMl(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const ChatMessage& m : messages) {
    out += "<|im_start|>";
    out += m.role;
    out += '\n';
    out += m.content;
    out += "<|im_end|>\n";
  }
  return out;
}

absl::StatusOr<ChatDataset> GenerateChatData(const DataOptions& options) {
  KVL_RETURN_IF_ERROR(ValidateOptions(options));
  ChatDataset data;
  data.options = options;

  // Real prose, deduplicated across all files and assigned to splits by content.
  std::array<std::vector<Paragraph>, 3> prose;
  std::unordered_set<uint64_t> seen_paragraphs;
  for (size_t is = 0; is < options.prose_sources.size(); ++is) {
    const ProseSource& src = options.prose_sources[is];
    SourceRecord rec;
    rec.path = src.path;
    rec.package = src.package;
    absl::StatusOr<std::string> text = ReadTextFile(src.path);
    if (!text.ok()) {
      if (!options.allow_missing_sources) {
        return absl::NotFoundError(absl::StrCat(text.status().message(), " (install package ", src.package,
                                                " or pass --allow-missing-sources)"));
      }
      rec.status = "missing";
      data.sources.push_back(rec);
      continue;
    }
    rec.bytes = static_cast<int64_t>(text->size());
    rec.sha256 = Sha256Hex(*text);
    rec.status = rec.sha256.compare(0, 16, src.expected_sha) == 0 ? "ok" : "drift";
    for (std::string& p : ExtractParagraphs(*text, src.format)) {
      if (!seen_paragraphs.insert(HashBytes(p)).second) continue;
      const int split = ProseSplit(p);
      prose[split].push_back({std::move(p), static_cast<int>(is)});
      ++rec.n_paragraphs;
    }
    data.sources.push_back(rec);
  }

  // A sentence may recur inside different paragraphs (licence boilerplate,
  // repeated help text): valid and test drop paragraphs that share a sentence
  // or an 8-word run with an earlier split, so no text learnt in train is
  // tested later.
  std::unordered_set<uint64_t> earlier_text;
  for (int split = 0; split < 3; ++split) {
    std::vector<Paragraph> kept;
    for (Paragraph& p : prose[split]) {
      const std::vector<uint64_t> hashes = OverlapHashes(p.text);
      const bool shared = split > 0 && std::any_of(hashes.begin(), hashes.end(),
                                                   [&](uint64_t h) { return earlier_text.count(h) > 0; });
      if (shared) {
        --data.sources[p.source].n_paragraphs;
        ++data.sources[p.source].n_paragraphs_dropped;
      } else {
        kept.push_back(std::move(p));
      }
    }
    prose[split] = std::move(kept);
    for (const Paragraph& p : prose[split]) {
      for (uint64_t h : OverlapHashes(p.text)) earlier_text.insert(h);
    }
  }

  std::unordered_set<uint64_t> earlier_splits;  // canonical hashes of finished splits
  const int counts[3] = {options.n_train, options.n_valid, options.n_test};
  for (int split = 0; split < 3; ++split) {
    std::vector<Conversation>& out = data.splits[split];
    std::unordered_set<uint64_t> this_split;
    for (int index = 0; index < counts[split]; ++index) {
      Task task;
      int level;
      Rng pick(MixSeed({options.seed, static_cast<uint64_t>(split) + 1, static_cast<uint64_t>(index)}));
      if (split == 0) {
        int r = static_cast<int>(pick.Below(100));
        int t = 0;
        while (t + 1 < kNumMix && r >= kMixWeights[t]) r -= kMixWeights[t++];
        task = kMixTasks[t];
        level = pick.Range(1, 3);
      } else {
        // Even coverage: every task at every level in turn.
        task = kMixTasks[index % kNumMix];
        level = 1 + (index / kNumMix) % 3;
      }
      const int max_attempts = split == 0 ? 50 : 1000;
      Conversation c;
      bool fresh = false;
      for (int attempt = 0; attempt < max_attempts && !fresh; ++attempt) {
        const uint64_t item_seed = MixSeed({options.seed, static_cast<uint64_t>(split) + 1,
                                            static_cast<uint64_t>(index), static_cast<uint64_t>(attempt)});
        c = GenerateItem(task, level, item_seed, options);
        fresh = !earlier_splits.count(c.canonical) && !this_split.count(c.canonical);
      }
      if (!fresh) {
        if (split != 0) {
          return absl::ResourceExhaustedError(absl::StrCat("could not find an unseen ", TaskName(task), " item at level ",
                                                           level, " for ", kSplitNames[split],
                                                           "; raise the knobs or lower the counts"));
        }
        ++data.n_train_duplicates;
      }
      this_split.insert(c.canonical);
      c.id = absl::StrCat(kSplitNames[split], "-", index);
      out.push_back(std::move(c));
    }
    std::vector<Conversation> prose_convs = ProseConversations(prose[split], options.seed, split);
    data.n_prose_paragraphs[split] = static_cast<int>(prose[split].size());
    for (size_t k = 0; k < prose_convs.size(); ++k) {
      prose_convs[k].id = absl::StrCat(kSplitNames[split], "-prose-", k);
      this_split.insert(prose_convs[k].canonical);
    }
    // Prose conversations are interleaved with generated ones at fixed,
    // seed-derived positions so a reader of the file never sees long runs.
    std::vector<Conversation> merged;
    merged.reserve(out.size() + prose_convs.size());
    Rng mix(MixSeed({options.seed, static_cast<uint64_t>(split) + 1, 0x6D6978ULL}));
    size_t a = 0;
    size_t b = 0;
    while (a < out.size() || b < prose_convs.size()) {
      const uint64_t left_a = out.size() - a;
      const uint64_t left_b = prose_convs.size() - b;
      if (mix.Below(left_a + left_b) < left_a) {
        merged.push_back(std::move(out[a++]));
      } else {
        merged.push_back(std::move(prose_convs[b++]));
      }
    }
    out = std::move(merged);
    earlier_splits.insert(this_split.begin(), this_split.end());
  }
  return data;
}

absl::Status WriteChatData(const ChatDataset& data, const std::string& out_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(fs::path(out_dir) / "suites", ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));

  const DataOptions& o = data.options;
  Json manifest;
  manifest["generator"] = kChatDataVersion;
  manifest["seed"] = o.seed;
  manifest["options"] = Json{{"train_conversations", o.n_train},
                             {"valid_conversations", o.n_valid},
                             {"test_conversations", o.n_test},
                             {"facts_distractors", o.facts_max_distractors},
                             {"facts_filler", o.facts_max_filler},
                             {"kv_max_bytes", o.kv_max_bytes},
                             {"arith_steps", o.arith_max_steps},
                             {"list_len", o.list_max_len},
                             {"string_len", o.string_max_len},
                             {"allow_missing_sources", o.allow_missing_sources}};
  manifest["chat_template"] = "<|im_start|>{role}\\n{content}<|im_end|>\\n per message; one empty line after each conversation";
  manifest["scoring"] = {
      {"exact", "strip surrounding whitespace and one trailing period, then compare"},
      {"exact_ci", "as exact, case-insensitive"},
      {"numeric", "as exact, then compare as integers"}};
  Json splits = Json::object();
  Json suites = Json::object();
  Json files = Json::object();
  for (int split = 0; split < 3; ++split) {
    const std::string name = kSplitNames[split];
    std::string jsonl;
    std::string text;
    std::map<std::string, std::string> suite_lines;
    std::map<std::string, int> by_task;
    std::map<std::string, int> suite_counts;
    int64_t n_messages = 0;
    for (const Conversation& c : data.splits[split]) {
      Json line;
      line["id"] = c.id;
      line["task"] = TaskName(c.task);
      line["difficulty"] = c.difficulty;
      if (!c.scoring.empty()) line["scoring"] = c.scoring;
      line["messages"] = MessagesJson(c.messages, c.messages.size());
      jsonl += Dump(line) + "\n";
      text += RenderChatMl(c.messages) + "\n";
      by_task[TaskName(c.task)]++;
      n_messages += static_cast<int64_t>(c.messages.size());
      if (split > 0 && !c.scoring.empty()) {
        Json item;
        item["id"] = c.id;
        item["task"] = TaskName(c.task);
        item["difficulty"] = c.difficulty;
        item["messages"] = MessagesJson(c.messages, c.messages.size() - 1);
        item["answer"] = c.messages.back().content;
        item["scoring"] = c.scoring;
        suite_lines[TaskName(c.task)] += Dump(item) + "\n";
        suite_counts[TaskName(c.task)]++;
      }
    }
    const fs::path dir(out_dir);
    KVL_RETURN_IF_ERROR(WriteTextFile((dir / (name + ".jsonl")).string(), jsonl));
    KVL_RETURN_IF_ERROR(WriteTextFile((dir / (name + ".txt")).string(), text));
    files[name + ".jsonl"] = Sha256Hex(jsonl);
    files[name + ".txt"] = Sha256Hex(text);
    for (const auto& [task, lines] : suite_lines) {
      const std::string file = name + "_" + task + ".jsonl";
      KVL_RETURN_IF_ERROR(WriteTextFile((dir / "suites" / file).string(), lines));
      files["suites/" + file] = Sha256Hex(lines);
    }
    Json by_task_json = Json::object();
    for (const auto& [task, n] : by_task) by_task_json[task] = n;
    splits[name] = Json{{"conversations", data.splits[split].size()},
                        {"by_task", by_task_json},
                        {"messages", n_messages},
                        {"prose_paragraphs", data.n_prose_paragraphs[split]},
                        {"text_bytes", text.size()},
                        {"jsonl_bytes", jsonl.size()},
                        {"pretokens_estimate", PretokenEstimate(text)}};
    if (split > 0) {
      Json sc = Json::object();
      for (const auto& [task, n] : suite_counts) sc[task] = n;
      suites[name] = sc;
    }
  }
  manifest["splits"] = splits;
  manifest["suites"] = suites;
  manifest["train_duplicates"] = data.n_train_duplicates;
  Json sources = Json::array();
  for (const SourceRecord& r : data.sources) {
    sources.push_back(Json{{"path", r.path},
                           {"package", r.package},
                           {"status", r.status},
                           {"sha256", r.sha256},
                           {"bytes", r.bytes},
                           {"paragraphs", r.n_paragraphs},
                           {"paragraphs_dropped_shared_text", r.n_paragraphs_dropped}});
  }
  manifest["sources"] = sources;
  manifest["files"] = files;
  return WriteTextFile((fs::path(out_dir) / "manifest.json").string(), manifest.dump(2) + "\n");
}

}  // namespace kvl::datagen
