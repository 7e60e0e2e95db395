// Synthetic multi-turn chat data for training and evaluating the house models
// (`kvl make-data`, docs/data.md).
//
// Everything is a pure function of DataOptions (seed, counts, knobs) and of the
// bytes of a fixed list of Debian text files: the same options on a machine with
// the same files give byte-identical output. Items of each split are derived from
// (seed, split, index, attempt) and deduplicated by a canonical hash of their
// underlying content (the facts, records, operations or paragraph; not the
// wording), and valid/test reject anything whose canonical hash occurs in an
// earlier split, so the three splits never share an item.
//
// Not thread-safe; call from one thread.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/chat_template.h"  // ChatMessage

namespace kvl::datagen {

// Bumped whenever the output for a given seed changes.
inline constexpr char kChatDataVersion[] = "kvl-chat-data/1";

// Exact-answer tasks first; kChat (grammar small talk) and kProse (real text)
// only feed the language-modelling corpus and have no evaluation suite.
enum class Task { kFacts, kKv, kArith, kLists, kStrings, kChat, kProse };
inline constexpr int kNumTasks = 7;
inline constexpr int kNumExactTasks = 5;
const char* TaskName(Task task);

struct Conversation {
  std::string id;
  Task task = Task::kChat;
  int difficulty = 0;  // 1 (easy) .. 3 (hard) for exact tasks, 0 otherwise
  std::vector<ChatMessage> messages;
  // For exact tasks the last message is the assistant's answer, scored with
  // this rule: "exact" | "exact_ci" | "numeric". Empty for chat and prose.
  std::string scoring;
  uint64_t canonical = 0;  // hash of the underlying content (split disjointness)
};

// kPlain: paragraphs as written; kRst: reStructuredText (directives, literal
// blocks and markup dropped); kRelNotes: git release notes (one bullet, one
// paragraph); kPod: Perl POD, in .pod files or between =head/=cut in modules;
// kCmakeModule: the reStructuredText of a .cmake file's "#[[.rst:" comment.
enum class ProseFormat { kPlain, kRst, kRelNotes, kPod, kCmakeModule };

struct ProseSource {
  const char* path;
  const char* package;       // the Debian package that ships it
  ProseFormat format;
  const char* expected_sha;  // first 16 hex digits of its SHA-256 in Debian 12
};
// The fixed list of real-English files (chat_data_sources.cc).
const std::vector<ProseSource>& DefaultProseSources();

struct DataOptions {
  uint64_t seed = 1;
  // Generated conversations per split (exact tasks + grammar chat). Real-prose
  // conversations come on top: every paragraph of the split's share is used once.
  int n_train = 30000;
  int n_valid = 1500;
  int n_test = 1500;
  // Knobs: the values reached at difficulty 3; levels 1 and 2 use smaller ones.
  int facts_max_distractors = 6;  // other facts stated besides the asked one
  int facts_max_filler = 8;       // unrelated turn pairs between fact and question
  int kv_max_bytes = 12000;       // size of the record document
  int arith_max_steps = 8;        // operations applied to the running total
  int list_max_len = 12;          // items in the list
  int string_max_len = 16;        // characters in the string operated on
  // Real prose: the file list, and whether a missing file is an error.
  std::vector<ProseSource> prose_sources = DefaultProseSources();
  bool allow_missing_sources = false;
};

struct SourceRecord {
  std::string path;
  std::string package;
  std::string sha256;  // of the bytes read; empty when missing
  std::string status;  // "ok" | "drift" (hash differs from expected) | "missing"
  int64_t bytes = 0;
  int n_paragraphs = 0;          // kept after cleaning and deduplication
  int n_paragraphs_dropped = 0;  // valid/test paragraphs sharing text with an earlier split
};

inline constexpr std::array<const char*, 3> kSplitNames = {"train", "valid", "test"};

struct ChatDataset {
  DataOptions options;
  std::array<std::vector<Conversation>, 3> splits;  // train, valid, test
  std::vector<SourceRecord> sources;
  std::array<int, 3> n_prose_paragraphs{};  // per split, after deduplication
  // Train items kept although their canonical hash repeats an earlier train
  // item (a tiny easy-level problem space); never shared with valid or test.
  int n_train_duplicates = 0;
};

// One generated item of an exact task or of grammar chat, from its own seed.
// For exact tasks `difficulty` is 1..3.
Conversation GenerateItem(Task task, int difficulty, uint64_t item_seed, const DataOptions& options);

// The whole data set in memory. NotFound when a prose source is missing and
// missing sources are not allowed; InvalidArgument for bad counts or knobs;
// ResourceExhausted when a split cannot be filled with unseen items.
absl::StatusOr<ChatDataset> GenerateChatData(const DataOptions& options);

// Writes {train,valid,test}.jsonl, {train,valid,test}.txt, suites/ and
// manifest.json into out_dir (created if needed). Every byte written is a
// function of the data set (no timestamps), so reruns compare equal.
absl::Status WriteChatData(const ChatDataset& data, const std::string& out_dir);

// "<|im_start|>" + role + "\n" + content + "<|im_end|>\n" for each message.
std::string RenderChatMl(const std::vector<ChatMessage>& messages);

// Paragraphs of a prose file after format-specific clean-up (markup removed,
// lines joined, ASCII only); exposed for tests.
std::vector<std::string> ExtractParagraphs(std::string_view text, ProseFormat format);

}  // namespace kvl::datagen
