// kvl make-data: writes the synthetic chat data set (docs/data.md).
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/flags.h"
#include "datagen/chat_data.h"
#include "tools/commands.h"

namespace kvl::tools {
int RunMakeData(const Args& args) {
  datagen::DataOptions o;
  std::string out_dir;
  FlagSet flags("kvl make-data",
                "Writes the synthetic chat data set and its evaluation suites to DIR\n"
                "(docs/data.md). The difficulty knobs are the values reached at difficulty 3;\n"
                "levels 1 and 2 use smaller ones. Real-prose conversations (from fixed Debian\n"
                "files) come on top of the conversation counts.");
  flags.Required("out", &out_dir, "DIR", "the directory to write");
  flags.Add("seed", &o.seed, "N", "generator seed");
  flags.Add("train-conversations", &o.n_train, "N", "generated train conversations");
  flags.Add("valid-conversations", &o.n_valid, "N", "generated valid conversations");
  flags.Add("test-conversations", &o.n_test, "N", "generated test conversations");
  flags.Add("facts-distractors", &o.facts_max_distractors, "N",
            "difficulty knob: other facts stated besides the asked one");
  flags.Add("facts-filler", &o.facts_max_filler, "N",
            "difficulty knob: unrelated turns between fact and question");
  flags.Add("kv-max-bytes", &o.kv_max_bytes, "N",
            "difficulty knob: size of the key-value document, in bytes");
  flags.Add("arith-steps", &o.arith_max_steps, "N",
            "difficulty knob: operations on the running total");
  flags.Add("list-len", &o.list_max_len, "N", "difficulty knob: items in a list, at most 14");
  flags.Add("string-len", &o.string_max_len, "N", "difficulty knob: characters in a string");
  flags.Switch("allow-missing-sources", &o.allow_missing_sources,
               "skip prose files that are not installed");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  if (out_dir.empty()) return flags.UsageError("--out needs a directory");
  if (o.seed > (uint64_t{1} << 62)) return flags.UsageError("--seed must be in [0, 2^62]");
  // Every count and knob: [0, 10^7].
  constexpr int kMaxCount = 10000000;
  const std::pair<const char*, int> counts[] = {
      {"train-conversations", o.n_train},
      {"valid-conversations", o.n_valid},
      {"test-conversations", o.n_test},
      {"facts-distractors", o.facts_max_distractors},
      {"facts-filler", o.facts_max_filler},
      {"kv-max-bytes", o.kv_max_bytes},
      {"arith-steps", o.arith_max_steps},
      {"list-len", o.list_max_len},
      {"string-len", o.string_max_len},
  };
  for (const auto& [name, value] : counts) {
    if (value < 0 || value > kMaxCount) {
      return flags.UsageError(absl::StrCat("--", name, " must be in [0, ", kMaxCount, "]"));
    }
  }

  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<datagen::ChatDataset> data = datagen::GenerateChatData(o);
  if (!data.ok()) {
    std::fprintf(stderr, "kvl make-data: %s\n", std::string(data.status().message()).c_str());
    return 1;
  }
  if (absl::Status s = datagen::WriteChatData(*data, out_dir); !s.ok()) {
    std::fprintf(stderr, "kvl make-data: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int n_drift = 0;
  int n_missing = 0;
  for (const datagen::SourceRecord& r : data->sources) {
    if (r.status == "drift") ++n_drift;
    if (r.status == "missing") ++n_missing;
  }
  if (n_drift > 0 || n_missing > 0) {
    std::fprintf(stderr,
                 "kvl make-data: warning: %d prose source(s) differ from Debian 12 and %d are missing; "
                 "the corpus is not the reference one (see sources in manifest.json)\n",
                 n_drift, n_missing);
  }
  std::printf("wrote %s in %.1f s (seed %llu)\n", out_dir.c_str(), seconds,
              static_cast<unsigned long long>(o.seed));
  for (int split = 0; split < 3; ++split) {
    std::printf("  %-5s %7zu conversations (%d prose paragraphs)\n", datagen::kSplitNames[split],
                data->splits[split].size(), data->n_prose_paragraphs[split]);
  }
  return 0;
}

}  // namespace kvl::tools
