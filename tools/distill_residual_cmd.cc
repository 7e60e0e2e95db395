// kvl distill-residual: self-distillation of one residual map of the
// native-depth dial (training/residual_fit.h), written back into the
// translator file.
#include <cstdio>
#include <optional>
#include <string>

#include "base/files.h"
#include "base/flags.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "training/residual_fit.h"
#include "training/train_lm.h"
#include "training/translator_data.h"
#include "translator/translator.h"

namespace kvl::tools {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvl distill-residual: %s\n", message.c_str());
  return 1;
}

}  // namespace

int RunDistillResidual(const Args& args) {
  training::ResidualDistillOptions o;
  std::string translator_path, out_path, source_dir, target_dir, json_path;
  int n_threads = 0;
  bool quiet = false;
  FlagSet flags("kvl distill-residual",
                "Distils the residual map of target layer --layer (kvl fit-residual) with both\n"
                "models and the K/V maps frozen: at each step, windows of the training stream\n"
                "whose first --prefix tokens the source prefills; the maps translate the target's\n"
                "layers below --layer, the map predicts the residual stream at its input, the\n"
                "target computes the layers from there, and the target's distribution over the\n"
                "next --continuation tokens is pulled towards its own on a native cache\n"
                "(KL). Keeps the map with the lowest validation KL (which may be the init) and\n"
                "writes the translator with it to --out; prints the validation KL of the plain\n"
                "translation, of the init and of the best map.");
  flags.Required("translator", &translator_path, "FILE", "translator with the layer's map");
  flags.Required("source", &source_dir, "DIR", "the source model");
  flags.Required("target", &target_dir, "DIR", "the target model");
  flags.Required("train", &o.train_path, "FILE", "training corpus (.jsonl chats or text)");
  flags.Required("valid", &o.valid_path, "FILE", "validation corpus");
  flags.Add("layer", &o.layer, "J", "the map's target layer (k = L - J native layers), >= 1");
  flags.Required("out", &out_path, "FILE", "the translator to write");
  flags.Add("steps", &o.steps, "N", "optimizer steps");
  flags.Add("lr", &o.lr, "LR", "peak learning rate (warm-up, then cosine to a tenth)");
  flags.Add("batch", &o.batch, "B", "windows per step");
  flags.Add("prefix", &o.prefix, "P", "tokens translated per window");
  flags.Add("continuation", &o.continuation, "C", "positions scored per window");
  flags.Add("eval-every", &o.eval_every, "N", "steps between validations");
  flags.Add("valid-windows", &o.valid_windows, "N", "validation windows");
  flags.Add("seed", &o.seed, "S", "window sampling seed");
  flags.Add("threads", &n_threads, "N", "intra-op threads, 0: all cores");
  flags.Add("json", &json_path, "FILE", "also write the figures and the curve as JSON");
  flags.Switch("quiet", &quiet, "no progress bar on stderr");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  if (o.layer < 1) return flags.UsageError("--layer J (>= 1) is required");
  if (o.steps < 0 || o.batch < 1 || o.prefix < 1 || o.continuation < 1 || o.eval_every < 1 ||
      o.valid_windows < 1) {
    return flags.UsageError(
        "--steps >= 0; --batch, --prefix, --continuation, --eval-every and "
        "--valid-windows >= 1");
  }
  o.progress = !quiet;
  training::SetIntraOpThreads(n_threads);
  RuntimeOptions runtime;
  runtime.n_threads = n_threads;
  absl::StatusOr<training::TranslatorPair> pair =
      training::LoadTranslatorPair(source_dir, target_dir, runtime);
  if (!pair.ok()) return Fail(std::string(pair.status().message()));
  absl::StatusOr<std::unique_ptr<Translator>> translator =
      Translator::Load(translator_path, training::ExpectationFor(pair->source, pair->target));
  if (!translator.ok()) return Fail(std::string(translator.status().message()));
  absl::StatusOr<training::ResidualDistill> d =
      training::DistillResidualMap(o, *pair, **translator);
  if (!d.ok()) return Fail(std::string(d.status().message()));
  const TranslatorSpec& spec = (*translator)->spec();
  if (absl::Status s =
          (*translator)->SetResidualMaps({d->map}, spec.native_layers, spec.native_layers_basis);
      !s.ok()) {
    return Fail(std::string(s.message()));
  }
  if (absl::Status s = (*translator)->Save(out_path); !s.ok())
    return Fail(std::string(s.message()));
  std::printf(
      "validation KL (nats/position, %lld windows): plain translation %.5f, residual map "
      "of layer %lld: init %.5f, best %.5f at step %lld\n",
      static_cast<long long>(o.valid_windows), d->translate_kl, static_cast<long long>(o.layer),
      d->initial_kl, d->best_kl, static_cast<long long>(d->best_step));
  for (const auto& [step, kl] : d->curve) {
    std::printf("  step %lld: %.5f\n", static_cast<long long>(step), kl);
  }
  if (!json_path.empty()) {
    nlohmann::json j = {{"translator", translator_path},
                        {"layer", o.layer},
                        {"steps", o.steps},
                        {"lr", o.lr},
                        {"batch", o.batch},
                        {"prefix", o.prefix},
                        {"continuation", o.continuation},
                        {"translate_kl", d->translate_kl},
                        {"initial_kl", d->initial_kl},
                        {"best_kl", d->best_kl},
                        {"best_step", d->best_step},
                        {"curve", d->curve}};
    if (absl::Status s = WriteTextFile(json_path, j.dump(2) + "\n"); !s.ok()) {
      return Fail(std::string(s.message()));
    }
  }
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}

}  // namespace kvl::tools
