// kvl stamp-translator: writes an evaluation from a `kvl eval-translator
// --json` report into a translator file, for the router's load-time quality
// gate (translator/translator.h, TranslatorEvaluation).
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "base/files.h"
#include "base/flags.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "translator/translator.h"

namespace kvl::tools {
namespace {

int Fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "kvl stamp-translator: %s\n", message.c_str());
  return code;
}

}  // namespace

int RunStampTranslator(const Args& args) {
  std::string path, report_path;
  FlagSet flags(
      "kvl stamp-translator",
      "Copies a translator's figures from a `kvl eval-translator --json` report (its\n"
      "entry under \"translators\" whose file is --translator, or failing that the one\n"
      "entry with the same file name) into the file's metadata: the recovered share and\n"
      "gap with their standard errors, and the data, windows, prefix, continuation,\n"
      "native tail and arithmetic they were measured with. kvl-server's load-time\n"
      "quality gate (routing.gate.min_recovered, max_gap_nats) reads them.");
  flags.Required("translator", &path, "FILE", "the translator file to stamp");
  flags.Required("report", &report_path, "REPORT.json", "kvl eval-translator --json output");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;

  absl::StatusOr<std::string> text = ReadTextFile(report_path);
  if (!text.ok()) return Fail(std::string(text.status().message()));
  const nlohmann::json report = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!report.is_object() || !report.contains("translators") ||
      !report["translators"].is_array()) {
    return Fail(report_path + ": not a kvl eval-translator report (no \"translators\" list)", 2);
  }
  const std::string name = std::filesystem::path(path).filename().string();
  const nlohmann::json* entry = nullptr;
  int same_name = 0;
  const nlohmann::json* by_name = nullptr;
  for (const nlohmann::json& t : report["translators"]) {
    const std::string file = t.value("file", std::string());
    if (file == path) entry = &t;
    if (std::filesystem::path(file).filename().string() == name) {
      ++same_name;
      by_name = &t;
    }
  }
  if (entry == nullptr && same_name == 1) entry = by_name;
  if (entry == nullptr) {
    return Fail(report_path + " has no entry for " + path +
                    (same_name > 1 ? " (several entries share its file name)" : ""),
                2);
  }
  TranslatorEvaluation e;
  try {
    e.recovered = entry->at("recovered").get<double>();
    e.recovered_se = entry->value("recovered_se", 0.0);
    e.gap_nats = entry->at("gap").get<double>();
    e.gap_se = entry->value("gap_se", 0.0);
    e.data = report.value("data", std::string());
    e.windows = report.value("windows", int64_t{0});
    e.prefix = report.value("prefix", int64_t{0});
    e.continuation = report.value("continuation", int64_t{0});
    e.native_tail = report.value("native_tail", int64_t{0});
    e.translate_dtype = report.value("translate_dtype", std::string());
  } catch (const nlohmann::json::exception& ex) {
    return Fail(report_path + ": malformed entry: " + ex.what(), 2);
  }
  e.measured_by = "kvl eval-translator (" + std::filesystem::path(report_path).filename().string() +
                  ")";
  if (absl::Status s = StampTranslatorEvaluation(path, e); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  std::printf("%s: recovered %.4f ± %.4f, gap %.4f ± %.4f nats/token on %s (%lld windows)\n",
              path.c_str(), e.recovered, e.recovered_se, e.gap_nats, e.gap_se, e.data.c_str(),
              static_cast<long long>(e.windows));
  return 0;
}

}  // namespace kvl::tools
