// kvl make-data: writes the synthetic chat data set (docs/data.md).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tools/chat_data.h"
#include "tools/commands.h"

namespace kvl::tools {
namespace {

constexpr char kUsage[] =
    "usage: kvl make-data --out DIR [--seed N] [flags]\n"
    "  --seed N                   generator seed (default 1)\n"
    "  --train-conversations N    generated train conversations (default 30000)\n"
    "  --valid-conversations N    generated valid conversations (default 1500)\n"
    "  --test-conversations N     generated test conversations (default 1500)\n"
    "  difficulty knobs (values reached at difficulty 3):\n"
    "  --facts-distractors N      other facts stated besides the asked one (default 6)\n"
    "  --facts-filler N           unrelated turns between fact and question (default 8)\n"
    "  --kv-max-bytes N           size of the key-value document (default 12000)\n"
    "  --arith-steps N            operations on the running total (default 8)\n"
    "  --list-len N               items in a list, at most 14 (default 12)\n"
    "  --string-len N             characters in a string (default 16)\n"
    "  --allow-missing-sources    skip prose files that are not installed\n"
    "Real-prose conversations (from fixed Debian files) come on top of the counts.\n";

bool ParseInt(const std::string& s, long long lo, long long hi, long long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (*end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

}  // namespace

int RunMakeData(const Args& args) {
  DataOptions o;
  std::string out_dir;
  struct IntFlag {
    const char* name;
    int* target;
  };
  const IntFlag int_flags[] = {
      {"--train-conversations", &o.n_train}, {"--valid-conversations", &o.n_valid},
      {"--test-conversations", &o.n_test},   {"--facts-distractors", &o.facts_max_distractors},
      {"--facts-filler", &o.facts_max_filler}, {"--kv-max-bytes", &o.kv_max_bytes},
      {"--arith-steps", &o.arith_max_steps}, {"--list-len", &o.list_max_len},
      {"--string-len", &o.string_max_len},
  };
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::string value;
    bool has_value = false;
    if (const size_t eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    auto next_value = [&]() -> bool {
      if (has_value) return true;
      if (i + 1 >= args.size()) return false;
      value = args[++i];
      return true;
    };
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (flag == "--allow-missing-sources") {
      o.allow_missing_sources = true;
      continue;
    }
    if (flag == "--out") {
      if (!next_value() || value.empty()) {
        std::fprintf(stderr, "kvl make-data: --out needs a directory\n");
        return 2;
      }
      out_dir = value;
      continue;
    }
    if (flag == "--seed") {
      long long v = 0;
      if (!next_value() || !ParseInt(value, 0, (1LL << 62), &v)) {
        std::fprintf(stderr, "kvl make-data: --seed needs a non-negative integer\n");
        return 2;
      }
      o.seed = static_cast<uint64_t>(v);
      continue;
    }
    bool known = false;
    for (const IntFlag& f : int_flags) {
      if (flag != f.name) continue;
      known = true;
      long long v = 0;
      if (!next_value() || !ParseInt(value, 0, 10000000, &v)) {
        std::fprintf(stderr, "kvl make-data: %s needs a non-negative integer\n", f.name);
        return 2;
      }
      *f.target = static_cast<int>(v);
    }
    if (!known) {
      std::fprintf(stderr, "kvl make-data: unknown flag '%s'\n%s", args[i].c_str(), kUsage);
      return 2;
    }
  }
  if (out_dir.empty()) {
    std::fprintf(stderr, "kvl make-data: --out is required\n%s", kUsage);
    return 2;
  }

  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<ChatDataset> data = GenerateChatData(o);
  if (!data.ok()) {
    std::fprintf(stderr, "kvl make-data: %s\n", std::string(data.status().message()).c_str());
    return 1;
  }
  if (absl::Status s = WriteChatData(*data, out_dir); !s.ok()) {
    std::fprintf(stderr, "kvl make-data: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int n_drift = 0;
  int n_missing = 0;
  for (const SourceRecord& r : data->sources) {
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
    std::printf("  %-5s %7zu conversations (%d prose paragraphs)\n", kSplitNames[split],
                data->splits[split].size(), data->n_prose_paragraphs[split]);
  }
  return 0;
}

}  // namespace kvl::tools
