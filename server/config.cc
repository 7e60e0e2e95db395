#include "server/config.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "model/device.h"
#include "nlohmann/json.hpp"

namespace kvl::server {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// Key paths read like the file: "server.listen_address", "models[2].path".
std::string Child(const std::string& path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}
std::string Index(const std::string& path, size_t i) { return absl::StrCat(path, "[", i, "]"); }

absl::Status Invalid(const std::string& path, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("config: ", path, ": ", problem));
}

// The offending value as it appeared, shortened so that an error stays one line.
std::string Shown(const Json& value) {
  std::string text =
      value.is_string() ? absl::StrCat("'", value.get<std::string>(), "'") : value.dump();
  if (text.size() > 80) text = absl::StrCat(text.substr(0, 77), "...");
  return text;
}

absl::Status ExpectObject(const Json& value, const std::string& path) {
  if (!value.is_object())
    return Invalid(path, absl::StrCat("expected an object, got ", Shown(value)));
  return absl::OkStatus();
}

// Rejects keys outside `allowed`, naming the first unknown one and the known ones.
absl::Status CheckKeys(const Json& object, const std::string& path,
                       std::initializer_list<absl::string_view> allowed) {
  for (const auto& [key, value] : object.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      return Invalid(
          Child(path, key),
          absl::StrCat("unknown key (known keys here: ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

const Json* Find(const Json& object, absl::string_view key) {
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

absl::Status ReadString(const Json& object, absl::string_view key, const std::string& path,
                        std::string* out) {
  const Json* value = Find(object, key);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_string()) {
    return Invalid(Child(path, key), absl::StrCat("expected a string, got ", Shown(*value)));
  }
  *out = value->get<std::string>();
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& object, absl::string_view key, const std::string& path,
                      bool* out) {
  const Json* value = Find(object, key);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_boolean()) {
    return Invalid(Child(path, key), absl::StrCat("expected true or false, got ", Shown(*value)));
  }
  *out = value->get<bool>();
  return absl::OkStatus();
}

absl::Status ReadInt(const Json& object, absl::string_view key, const std::string& path,
                     int64_t min, int64_t max, int64_t* out) {
  const Json* value = Find(object, key);
  if (value == nullptr) return absl::OkStatus();
  const std::string where = Child(path, key);
  if (!value->is_number_integer()) {
    return Invalid(where, absl::StrCat("expected an integer, got ", Shown(*value)));
  }
  bool in_range;
  int64_t v = 0;
  if (value->is_number_unsigned()) {
    const uint64_t u = value->get<uint64_t>();
    in_range = u <= static_cast<uint64_t>(max);
    v = in_range ? static_cast<int64_t>(u) : 0;
  } else {
    v = value->get<int64_t>();
    in_range = v <= max;
  }
  if (!in_range || v < min) {
    return Invalid(
        where, absl::StrCat("expected an integer in [", min, ", ", max, "], got ", Shown(*value)));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadNumber(const Json& object, absl::string_view key, const std::string& path,
                        double min, double max, double* out) {
  const Json* value = Find(object, key);
  if (value == nullptr) return absl::OkStatus();
  const std::string where = Child(path, key);
  if (!value->is_number())
    return Invalid(where, absl::StrCat("expected a number, got ", Shown(*value)));
  const double v = value->get<double>();
  if (!(v >= min && v <= max)) {
    return Invalid(
        where, absl::StrCat("expected a number in [", min, ", ", max, "], got ", Shown(*value)));
  }
  *out = v;
  return absl::OkStatus();
}

// ReadNumber into an optional, set only when the key is present.
absl::Status ReadOptionalNumber(const Json& object, absl::string_view key, const std::string& path,
                                double min, double max, std::optional<double>* out) {
  if (Find(object, key) == nullptr) return absl::OkStatus();
  double v = 0;
  KVL_RETURN_IF_ERROR(ReadNumber(object, key, path, min, max, &v));
  *out = v;
  return absl::OkStatus();
}

// Reads a string that must be one of `names`; `*index` is its position.
absl::Status ReadChoice(const Json& object, absl::string_view key, const std::string& path,
                        const std::vector<absl::string_view>& names, size_t* index) {
  const Json* value = Find(object, key);
  if (value == nullptr) return absl::OkStatus();
  const std::string where = Child(path, key);
  const std::string expected = absl::StrCat("expected one of ", absl::StrJoin(names, ", "));
  if (!value->is_string()) return Invalid(where, absl::StrCat(expected, ", got ", Shown(*value)));
  const std::string text = value->get<std::string>();
  auto it = std::find(names.begin(), names.end(), text);
  if (it == names.end()) return Invalid(where, absl::StrCat(expected, ", got ", Shown(*value)));
  *index = static_cast<size_t>(it - names.begin());
  return absl::OkStatus();
}

const std::vector<absl::string_view> kLogLevelNames = {"trace", "debug", "info", "warn",
                                                      "error"};
const std::vector<absl::string_view> kTranslateDtypeNames = {"auto", "float32", "bfloat16"};

// The spellings of an enum owned elsewhere, by value: names[i] is
// name_of(static_cast<Enum>(i)), so ReadChoice's index converts back.
template <typename Enum>
std::vector<absl::string_view> NamesOf(int n, const char* (*name_of)(Enum)) {
  std::vector<absl::string_view> names;
  for (int i = 0; i < n; ++i) names.push_back(name_of(static_cast<Enum>(i)));
  return names;
}
const std::vector<absl::string_view> kDtypeNames =
    NamesOf<DType>(static_cast<int>(DType::kFloat16) + 1, DTypeName);
const std::vector<absl::string_view> kPolicyNames =
    NamesOf<router::Policy>(router::kNumPolicies, router::PolicyName);
const std::vector<absl::string_view> kStrategyNames =
    NamesOf<router::Strategy>(router::kNumStrategies, router::StrategyName);
const std::vector<absl::string_view> kRepairNames =
    NamesOf<router::RepairMode>(3, router::RepairModeName);

absl::Status ReadDtype(const Json& object, const std::string& path, DType* out) {
  size_t index = static_cast<size_t>(*out);
  KVL_RETURN_IF_ERROR(ReadChoice(object, "dtype", path, kDtypeNames, &index));
  *out = static_cast<DType>(index);
  return absl::OkStatus();
}

absl::Status ReadAddress(const Json& object, absl::string_view key, const std::string& path,
                         HostPort* out) {
  std::string text;
  if (Find(object, key) == nullptr) return absl::OkStatus();
  KVL_RETURN_IF_ERROR(ReadString(object, key, path, &text));
  absl::StatusOr<HostPort> parsed = ParseHostPort(text);
  if (!parsed.ok()) return Invalid(Child(path, key), parsed.status().message());
  *out = *std::move(parsed);
  return absl::OkStatus();
}

// Model names appear in requests, logs and metric labels.
bool IsValidName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

std::string Resolve(const std::string& base_dir, const std::string& path) {
  fs::path p(path);
  if (p.is_relative() && !base_dir.empty()) p = fs::path(base_dir) / p;
  return p.lexically_normal().string();
}

absl::Status ParseServer(const Json& j, const std::string& path, ServerSection* out) {
  KVL_RETURN_IF_ERROR(ExpectObject(j, path));
  KVL_RETURN_IF_ERROR(
      CheckKeys(j, path,
                {"listen_address", "metrics_address", "drain_timeout_seconds", "max_turn_bytes",
                 "max_new_tokens_limit", "max_system_prompt_bytes", "max_import_bytes",
                 "max_metadata_bytes", "tls", "reflection", "http_address", "http_router_model",
                 "http_max_conversations"}));
  absl::Status s = ReadAddress(j, "listen_address", path, &out->listen_address);
  if (s.ok()) s = ReadAddress(j, "metrics_address", path, &out->metrics_address);
  if (s.ok() && Find(j, "http_address") != nullptr) {
    HostPort http;
    s = ReadAddress(j, "http_address", path, &http);
    if (s.ok()) out->http_address = http;
  }
  if (s.ok()) s = ReadString(j, "http_router_model", path, &out->http_router_model);
  if (s.ok()) {
    s = ReadInt(j, "http_max_conversations", path, 1, int64_t{1} << 24,
                &out->http_max_conversations);
  }
  if (s.ok())
    s = ReadNumber(j, "drain_timeout_seconds", path, 0, 3600, &out->drain_timeout_seconds);
  // gRPC's receive limit is raised to fit the largest allowed turn; 64 MiB keeps
  // one request from taking an unreasonable share of memory.
  if (s.ok()) s = ReadInt(j, "max_turn_bytes", path, 1, int64_t{64} << 20, &out->max_turn_bytes);
  if (s.ok()) s = ReadInt(j, "max_new_tokens_limit", path, 1, 1 << 20, &out->max_new_tokens_limit);
  if (s.ok()) {
    s = ReadInt(j, "max_system_prompt_bytes", path, 1, int64_t{64} << 20,
                &out->max_system_prompt_bytes);
  }
  if (s.ok()) {
    s = ReadInt(j, "max_import_bytes", path, 1, int64_t{256} << 20, &out->max_import_bytes);
  }
  if (s.ok()) {
    s = ReadInt(j, "max_metadata_bytes", path, 256, 1 << 20, &out->max_metadata_bytes);
  }
  if (s.ok()) s = ReadBool(j, "reflection", path, &out->reflection);
  if (const Json* tls = Find(j, "tls"); s.ok() && tls != nullptr) {
    const std::string at = Child(path, "tls");
    s = ExpectObject(*tls, at);
    if (s.ok()) {
      s = CheckKeys(*tls, at,
                    {"cert_file", "key_file", "client_ca_file", "reload_interval_seconds", "metrics"});
    }
    if (s.ok()) s = ReadString(*tls, "cert_file", at, &out->tls.cert_file);
    if (s.ok()) s = ReadString(*tls, "key_file", at, &out->tls.key_file);
    if (s.ok()) s = ReadString(*tls, "client_ca_file", at, &out->tls.client_ca_file);
    if (s.ok()) {
      s = ReadInt(*tls, "reload_interval_seconds", at, 1, 86400, &out->tls.reload_interval_seconds);
    }
    if (s.ok()) s = ReadBool(*tls, "metrics", at, &out->tls.metrics);
    if (s.ok() && (out->tls.cert_file.empty() || out->tls.key_file.empty())) {
      s = Invalid(at, "cert_file and key_file are both required for TLS");
    }
  }
  return s;
}

absl::Status ParseLog(const Json& j, const std::string& path, LogSection* out) {
  KVL_RETURN_IF_ERROR(ExpectObject(j, path));
  KVL_RETURN_IF_ERROR(CheckKeys(j, path, {"level"}));
  size_t index = static_cast<size_t>(out->level);
  KVL_RETURN_IF_ERROR(ReadChoice(j, "level", path, kLogLevelNames, &index));
  out->level = static_cast<LogLevel>(index);
  return absl::OkStatus();
}

absl::Status ParseRuntime(const Json& j, const std::string& path, RuntimeSection* out) {
  KVL_RETURN_IF_ERROR(ExpectObject(j, path));
  KVL_RETURN_IF_ERROR(CheckKeys(j, path, {"threads", "dtype", "device"}));
  int64_t threads = out->threads;
  KVL_RETURN_IF_ERROR(ReadInt(j, "threads", path, 0, 1024, &threads));
  out->threads = static_cast<int>(threads);
  KVL_RETURN_IF_ERROR(ReadString(j, "device", path, &out->device));
  if (absl::Status s = ParseDeviceName(out->device); !s.ok()) {
    return Invalid(absl::StrCat(path, ".device"), s.message());
  }
  return ReadDtype(j, path, &out->dtype);
}

absl::Status ExpectArray(const Json& value, const std::string& path) {
  if (!value.is_array()) return Invalid(path, absl::StrCat("expected a list, got ", Shown(value)));
  return absl::OkStatus();
}

absl::Status ParseAuth(const Json& j, const std::string& path, AuthSection* out) {
  KVL_RETURN_IF_ERROR(ExpectObject(j, path));
  KVL_RETURN_IF_ERROR(CheckKeys(j, path, {"keys", "tenants"}));
  std::set<std::string> names, hashes, tenants;
  if (const Json* keys = Find(j, "keys")) {
    const std::string at = Child(path, "keys");
    KVL_RETURN_IF_ERROR(ExpectArray(*keys, at));
    for (size_t i = 0; i < keys->size(); ++i) {
      const Json& e = (*keys)[i];
      const std::string where = Index(at, i);
      KVL_RETURN_IF_ERROR(ExpectObject(e, where));
      KVL_RETURN_IF_ERROR(CheckKeys(e, where, {"name", "tenant", "sha256", "rights"}));
      ApiKeyEntry key;
      absl::Status s = ReadString(e, "name", where, &key.name);
      if (s.ok()) s = ReadString(e, "tenant", where, &key.tenant);
      if (s.ok()) s = ReadString(e, "sha256", where, &key.sha256);
      if (!s.ok()) return s;
      key.sha256 = absl::AsciiStrToLower(key.sha256);
      if (key.name.empty()) return Invalid(Child(where, "name"), "required (it names the key in logs)");
      if (!names.insert(key.name).second) {
        return Invalid(Child(where, "name"), absl::StrCat("'", key.name, "' names another key too"));
      }
      if (!IsValidTenantName(key.tenant)) {
        return Invalid(Child(where, "tenant"), "expected 1-64 characters of [A-Za-z0-9._-]");
      }
      if (key.sha256.size() != 64 ||
          key.sha256.find_first_not_of("0123456789abcdef") != std::string::npos) {
        return Invalid(Child(where, "sha256"),
                       "expected the key's SHA-256 as 64 hex digits (kvl hash-key prints it)");
      }
      if (!hashes.insert(key.sha256).second) {
        return Invalid(Child(where, "sha256"), "another key has the same hash (the same key)");
      }
      if (const Json* rights = Find(e, "rights")) {
        const std::string r_at = Child(where, "rights");
        KVL_RETURN_IF_ERROR(ExpectArray(*rights, r_at));
        key.rights.clear();
        for (size_t k = 0; k < rights->size(); ++k) {
          const Json& r = (*rights)[k];
          std::optional<Right> right;
          for (Right candidate : {Right::kChat, Right::kModels, Right::kImport, Right::kAdmin}) {
            if (r.is_string() && r.get<std::string>() == RightName(candidate)) right = candidate;
          }
          if (!right) {
            return Invalid(Index(r_at, k), absl::StrCat("expected one of chat, models, import, "
                                                        "admin, got ", Shown(r)));
          }
          key.rights.push_back(*right);
        }
      }
      tenants.insert(key.tenant);
      out->keys.push_back(std::move(key));
    }
  }
  if (const Json* t = Find(j, "tenants")) {
    const std::string at = Child(path, "tenants");
    KVL_RETURN_IF_ERROR(ExpectObject(*t, at));
    for (const auto& [tenant, limits] : t->items()) {
      const std::string where = Child(at, tenant);
      if (tenants.count(tenant) == 0) {
        return Invalid(where, "no key in auth.keys belongs to this tenant");
      }
      KVL_RETURN_IF_ERROR(ExpectObject(limits, where));
      KVL_RETURN_IF_ERROR(CheckKeys(limits, where, {"max_sessions", "max_concurrent_turns"}));
      TenantLimits l;
      absl::Status s = ReadInt(limits, "max_sessions", where, 0, int64_t{1} << 40, &l.max_sessions);
      if (s.ok()) {
        s = ReadInt(limits, "max_concurrent_turns", where, 0, 1 << 20, &l.max_concurrent_turns);
      }
      if (!s.ok()) return s;
      out->tenants[tenant] = l;
    }
  }
  return absl::OkStatus();
}

absl::Status ReadRequiredString(const Json& object, absl::string_view key, const std::string& path,
                                std::string* out) {
  if (Find(object, key) == nullptr) return Invalid(Child(path, key), "required");
  KVL_RETURN_IF_ERROR(ReadString(object, key, path, out));
  if (out->empty()) return Invalid(Child(path, key), "must not be empty");
  return absl::OkStatus();
}

absl::Status ParseModels(const Json& j, const std::string& path, const std::string& base_dir,
                         DType default_dtype, std::vector<ModelEntry>* out) {
  KVL_RETURN_IF_ERROR(ExpectArray(j, path));
  std::set<std::string> names;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string at = Index(path, i);
    const Json& e = j[i];
    KVL_RETURN_IF_ERROR(ExpectObject(e, at));
    KVL_RETURN_IF_ERROR(CheckKeys(e, at, {"name", "path", "dtype"}));
    ModelEntry m;
    m.dtype = default_dtype;
    absl::Status s = ReadRequiredString(e, "name", at, &m.name);
    if (s.ok()) s = ReadRequiredString(e, "path", at, &m.path);
    if (s.ok()) s = ReadDtype(e, at, &m.dtype);
    if (!s.ok()) return s;
    if (!IsValidName(m.name)) {
      return Invalid(
          Child(at, "name"),
          absl::StrCat("expected 1-64 characters of [A-Za-z0-9._-], got '", m.name, "'"));
    }
    if (!names.insert(m.name).second) {
      return Invalid(Child(at, "name"), absl::StrCat("duplicate model name '", m.name, "'"));
    }
    m.path = Resolve(base_dir, m.path);
    std::error_code ec;
    if (!fs::is_directory(m.path, ec)) {
      return absl::NotFoundError(
          absl::StrCat("config: ", Child(at, "path"), ": '", m.path, "' is not a directory"));
    }
    if (!fs::is_regular_file(fs::path(m.path) / "config.json", ec)) {
      return absl::NotFoundError(
          absl::StrCat("config: ", Child(at, "path"), ": '", m.path,
                       "' has no config.json (expected a Hugging Face checkpoint directory)"));
    }
    out->push_back(std::move(m));
  }
  return absl::OkStatus();
}

// The index of the model named `name`, or InvalidArgument naming `path`.
absl::Status ResolveModel(const std::vector<ModelEntry>& models, const std::string& name,
                          const std::string& path, int* index) {
  for (size_t i = 0; i < models.size(); ++i) {
    if (models[i].name == name) {
      *index = static_cast<int>(i);
      return absl::OkStatus();
    }
  }
  std::vector<std::string> known;
  for (const ModelEntry& m : models) known.push_back(m.name);
  return Invalid(path, absl::StrCat("'", name, "' is not a configured model (configured: ",
                                    known.empty() ? "none" : absl::StrJoin(known, ", "), ")"));
}

absl::Status ParseTranslators(const Json& j, const std::string& path, const std::string& base_dir,
                              const std::vector<ModelEntry>& models,
                              std::vector<TranslatorEntry>* out) {
  KVL_RETURN_IF_ERROR(ExpectArray(j, path));
  std::set<std::string> names;
  std::set<std::pair<int, int>> pairs;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string at = Index(path, i);
    const Json& e = j[i];
    KVL_RETURN_IF_ERROR(ExpectObject(e, at));
    KVL_RETURN_IF_ERROR(CheckKeys(
        e, at,
        {"name", "source", "target", "path", "compute_dtype", "min_recovered", "max_gap_nats",
         "native_layers"}));
    TranslatorEntry t;
    std::string source, target;
    size_t compute = 0;  // "auto"
    absl::Status s = ReadString(e, "name", at, &t.name);
    if (s.ok()) s = ReadChoice(e, "compute_dtype", at, kTranslateDtypeNames, &compute);
    if (compute == 1) t.compute_dtype = DType::kFloat32;
    if (compute == 2) t.compute_dtype = DType::kBFloat16;
    if (s.ok()) s = ReadOptionalNumber(e, "min_recovered", at, 0, 1, &t.min_recovered);
    if (s.ok()) s = ReadOptionalNumber(e, "max_gap_nats", at, 0, std::numeric_limits<double>::max(),
                                             &t.max_gap_nats);
    if (s.ok() && Find(e, "native_layers") != nullptr) {
      int64_t k = 0;
      s = ReadInt(e, "native_layers", at, 0, 1 << 20, &k);
      t.native_layers = k;
    }
    if (s.ok()) s = ReadRequiredString(e, "source", at, &source);
    if (s.ok()) s = ReadRequiredString(e, "target", at, &target);
    if (s.ok()) s = ReadRequiredString(e, "path", at, &t.path);
    if (s.ok()) s = ResolveModel(models, source, Child(at, "source"), &t.source);
    if (s.ok()) s = ResolveModel(models, target, Child(at, "target"), &t.target);
    if (!s.ok()) return s;
    if (t.source == t.target) {
      return Invalid(Child(at, "target"), absl::StrCat("equals source '", source, "'"));
    }
    if (t.name.empty()) t.name = absl::StrCat(source, "->", target);
    if (!names.insert(t.name).second) {
      return Invalid(Child(at, "name"), absl::StrCat("duplicate translator name '", t.name, "'"));
    }
    if (!pairs.insert({t.source, t.target}).second) {
      return Invalid(at, absl::StrCat("a second translator from '", source, "' to '", target,
                                      "' (at most one per pair)"));
    }
    t.path = Resolve(base_dir, t.path);
    std::error_code ec;
    if (!fs::exists(t.path, ec)) {
      return absl::NotFoundError(
          absl::StrCat("config: ", Child(at, "path"), ": '", t.path, "' does not exist"));
    }
    out->push_back(std::move(t));
  }
  return absl::OkStatus();
}

absl::Status ReadModelList(const Json& object, absl::string_view key, const std::string& path,
                           const std::vector<ModelEntry>& models, std::vector<int>* out) {
  const Json* value = Find(object, key);
  if (value == nullptr) return absl::OkStatus();
  const std::string where = Child(path, key);
  KVL_RETURN_IF_ERROR(ExpectArray(*value, where));
  for (size_t i = 0; i < value->size(); ++i) {
    const Json& e = (*value)[i];
    if (!e.is_string())
      return Invalid(Index(where, i), absl::StrCat("expected a string, got ", Shown(e)));
    const std::string name = e.get<std::string>();
    int model = 0;
    KVL_RETURN_IF_ERROR(ResolveModel(models, name, Index(where, i), &model));
    if (std::find(out->begin(), out->end(), model) != out->end()) {
      return Invalid(Index(where, i), absl::StrCat("'", name, "' is listed twice"));
    }
    out->push_back(model);
  }
  return absl::OkStatus();
}

absl::Status ParseRule(const Json& e, const std::string& at, const std::vector<ModelEntry>& models,
                       router::Rule* rule) {
  KVL_RETURN_IF_ERROR(ExpectObject(e, at));
  KVL_RETURN_IF_ERROR(CheckKeys(
      e, at, {"model", "contains", "min_bytes", "max_bytes", "min_turn", "max_turn", "pattern"}));
  std::string model;
  absl::Status s = ReadRequiredString(e, "model", at, &model);
  if (s.ok()) s = ResolveModel(models, model, Child(at, "model"), &rule->model);
  if (s.ok())
    s = ReadInt(e, "min_bytes", at, 0, std::numeric_limits<int64_t>::max(), &rule->min_bytes);
  if (s.ok())
    s = ReadInt(e, "max_bytes", at, 0, std::numeric_limits<int64_t>::max(), &rule->max_bytes);
  if (s.ok())
    s = ReadInt(e, "min_turn", at, 0, std::numeric_limits<int64_t>::max(), &rule->min_turn);
  if (s.ok())
    s = ReadInt(e, "max_turn", at, 0, std::numeric_limits<int64_t>::max(), &rule->max_turn);
  if (s.ok()) s = ReadString(e, "pattern", at, &rule->pattern);
  if (!s.ok()) return s;
  if (rule->max_bytes != 0 && rule->max_bytes < rule->min_bytes) {
    return Invalid(Child(at, "max_bytes"), "is below min_bytes");
  }
  if (rule->max_turn != 0 && rule->max_turn < rule->min_turn) {
    return Invalid(Child(at, "max_turn"), "is below min_turn");
  }
  if (absl::Status compiled = router::CompileRule(rule); !compiled.ok()) {
    return Invalid(Child(at, "pattern"), compiled.message());
  }
  if (const Json* contains = Find(e, "contains"); contains != nullptr) {
    const std::string where = Child(at, "contains");
    KVL_RETURN_IF_ERROR(ExpectArray(*contains, where));
    for (size_t k = 0; k < contains->size(); ++k) {
      const Json& c = (*contains)[k];
      if (!c.is_string() || c.get<std::string>().empty()) {
        return Invalid(Index(where, k),
                       absl::StrCat("expected a non-empty string, got ", Shown(c)));
      }
      rule->contains.push_back(c.get<std::string>());
    }
  }
  return absl::OkStatus();
}

// `default_model`: the name routing.default_model gives (empty: none); the
// caller resolves it once the whole file is read.
absl::Status ParseRouting(const Json& j, const std::string& path,
                          const std::vector<ModelEntry>& models, router::RouterConfig* out,
                          std::string* default_model) {
  KVL_RETURN_IF_ERROR(ExpectObject(j, path));
  KVL_RETURN_IF_ERROR(
      CheckKeys(j, path,
                {"policy", "default_model", "strategy", "models", "rules", "cascade_max_entropy",
                 "cascade_min_mean_logprob", "native_tail_tokens", "repair", "gate"}));
  router::PolicyConfig& policy_config = out->policy;
  router::SwitchConfig& switching = out->switching;
  size_t policy = static_cast<size_t>(policy_config.policy);
  size_t strategy = static_cast<size_t>(switching.strategy);
  size_t repair = static_cast<size_t>(switching.repair);
  absl::Status s = ReadChoice(j, "policy", path, kPolicyNames, &policy);
  if (s.ok()) s = ReadChoice(j, "strategy", path, kStrategyNames, &strategy);
  if (s.ok()) s = ReadChoice(j, "repair", path, kRepairNames, &repair);
  if (s.ok()) s = ReadString(j, "default_model", path, default_model);
  if (s.ok()) s = ReadModelList(j, "models", path, models, &policy_config.order);
  if (s.ok()) {
    s = ReadNumber(j, "cascade_max_entropy", path, 0, std::numeric_limits<double>::max(),
                   &policy_config.cascade_max_entropy);
  }
  if (s.ok()) {
    s = ReadNumber(j, "cascade_min_mean_logprob", path, -std::numeric_limits<double>::max(), 0,
                   &policy_config.cascade_min_mean_logprob);
  }
  if (s.ok()) {
    s = ReadInt(j, "native_tail_tokens", path, 0, 1 << 20, &switching.native_tail_tokens);
  }
  if (!s.ok()) return s;
  policy_config.policy = static_cast<router::Policy>(policy);
  switching.strategy = static_cast<router::Strategy>(strategy);
  switching.repair = static_cast<router::RepairMode>(repair);
  if (const Json* gate = Find(j, "gate"); gate != nullptr) {
    const std::string where = Child(path, "gate");
    KVL_RETURN_IF_ERROR(ExpectObject(*gate, where));
    KVL_RETURN_IF_ERROR(CheckKeys(*gate, where,
                                  {"max_divergence_nats", "window", "min_samples",
                                   "cooldown_seconds", "min_recovered", "max_gap_nats"}));
    router::GateConfig& live = out->gate;
    router::LoadGateConfig& load = out->load_gate;
    double cooldown_seconds = std::chrono::duration<double>(live.cooldown).count();
    absl::Status st =
        ReadNumber(*gate, "max_divergence_nats", where, -std::numeric_limits<double>::max(),
                   std::numeric_limits<double>::max(), &live.max_divergence);
    if (st.ok()) st = ReadOptionalNumber(*gate, "min_recovered", where, 0, 1, &load.min_recovered);
    if (st.ok()) {
      st = ReadOptionalNumber(*gate, "max_gap_nats", where, 0, std::numeric_limits<double>::max(),
                              &load.max_gap_nats);
    }
    if (st.ok()) st = ReadInt(*gate, "window", where, 1, 1 << 20, &live.window);
    if (st.ok()) st = ReadInt(*gate, "min_samples", where, 1, 1 << 20, &live.min_samples);
    // Bounded so that "now + cool-down" cannot overflow the clock.
    if (st.ok()) st = ReadNumber(*gate, "cooldown_seconds", where, 0, 1e9, &cooldown_seconds);
    if (!st.ok()) return st;
    live.cooldown = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(cooldown_seconds));
    if (live.min_samples > live.window) {
      return Invalid(Child(where, "min_samples"),
                     absl::StrCat(live.min_samples, " exceeds window ", live.window));
    }
    if (switching.repair == router::RepairMode::kOff &&
        live.max_divergence < std::numeric_limits<double>::infinity()) {
      return Invalid(where, absl::StrCat("the live quality gate scores switches as their lines "
                                         "are repaired; it needs ",
                                         Child(path, "repair"), " other than \"off\""));
    }
  }
  if (const Json* rules = Find(j, "rules"); rules != nullptr) {
    const std::string where = Child(path, "rules");
    KVL_RETURN_IF_ERROR(ExpectArray(*rules, where));
    for (size_t i = 0; i < rules->size(); ++i) {
      router::Rule rule;
      KVL_RETURN_IF_ERROR(ParseRule((*rules)[i], Index(where, i), models, &rule));
      out->policy.rules.push_back(std::move(rule));
    }
  }
  return absl::OkStatus();
}

// Checks that need the whole file: references into `models` and what the
// configured policy requires. Per-turn policy overrides are checked per request.
// Resolves routing.default_model into `c`.
absl::Status CrossCheck(const std::string& default_model, ServerConfig& c) {
  router::PolicyConfig& r = c.router.policy;
  if (c.models.empty()) {
    if (!default_model.empty()) {
      return ResolveModel(c.models, default_model, "routing.default_model", &r.default_model);
    }
    if (r.policy != router::Policy::kFixed) {
      return Invalid("routing.policy", absl::StrCat("'", router::PolicyName(r.policy),
                                                    "' needs configured models (there are none)"));
    }
    return absl::OkStatus();
  }
  if (default_model.empty()) {
    return Invalid("routing.default_model", "required when models are configured");
  }
  KVL_RETURN_IF_ERROR(
      ResolveModel(c.models, default_model, "routing.default_model", &r.default_model));
  if ((r.policy == router::Policy::kAlternate || r.policy == router::Policy::kCascade) &&
      r.order.size() < 2) {
    return Invalid("routing.models", absl::StrCat("the '", router::PolicyName(r.policy),
                                                  "' policy needs at least 2 models here"));
  }
  if (r.policy == router::Policy::kRules && r.rules.empty()) {
    return Invalid("routing.rules", "the 'rules' policy needs at least one rule");
  }
  return absl::OkStatus();
}

// sessions.store.
absl::Status ParseSessionStore(const Json& j, SessionStoreOptions* out) {
  const std::string path = "sessions.store";
  KVL_RETURN_IF_ERROR(ExpectObject(j, path));
  KVL_RETURN_IF_ERROR(CheckKeys(j, path, {"backend", "redis_address", "key_prefix", "timeout_ms"}));
  absl::Status s = ReadString(j, "backend", path, &out->backend);
  if (s.ok() && out->backend != "memory" && out->backend != "redis") {
    s = Invalid(Child(path, "backend"),
                absl::StrCat("expected \"memory\" or \"redis\", got \"", out->backend, "\""));
  }
  if (s.ok()) s = ReadString(j, "redis_address", path, &out->redis_address);
  if (s.ok()) {
    const size_t colon = out->redis_address.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(out->redis_address.substr(colon + 1), &port) || port <= 0 ||
        port > 65535) {
      s = Invalid(Child(path, "redis_address"),
                  absl::StrCat("expected host:port, got \"", out->redis_address, "\""));
    }
  }
  if (s.ok()) s = ReadString(j, "key_prefix", path, &out->key_prefix);
  if (s.ok()) s = ReadInt(j, "timeout_ms", path, 1, 600000, &out->timeout_ms);
  return s;
}

}  // namespace

absl::string_view LogLevelName(LogLevel level) {
  return kLogLevelNames.begin()[static_cast<int>(level)];
}

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name) {
  for (size_t i = 0; i < kLogLevelNames.size(); ++i) {
    if (kLogLevelNames.begin()[i] == name) return static_cast<LogLevel>(i);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected one of ", absl::StrJoin(kLogLevelNames, ", "), ", got '", name, "'"));
}

std::string HostPort::ToString() const { return absl::StrCat(host, ":", port); }

absl::StatusOr<HostPort> ParseHostPort(absl::string_view text) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat("expected host:port, got '", text, "'"));
  };
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 || colon + 1 == text.size()) return bad();
  absl::string_view host = text.substr(0, colon);
  absl::string_view port_text = text.substr(colon + 1);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return bad();
  } else if (host.find_first_of(":[] \t/") != absl::string_view::npos) {
    return bad();  // an unbracketed IPv6 address is ambiguous
  }
  if (port_text.size() > 5 || !std::all_of(port_text.begin(), port_text.end(),
                                           [](char c) { return c >= '0' && c <= '9'; })) {
    return bad();
  }
  int port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected host:port with a port in [0, 65535], got '", text, "'"));
  }
  return HostPort{std::string(host), port};
}

absl::StatusOr<ServerConfig> ParseConfig(absl::string_view text, const std::string& base_dir) {
  Json root;
  try {
    root = Json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/true,
                       /*ignore_comments=*/true);
  } catch (const Json::exception& e) {
    // A syntax error (parse_error) or a number too large for a double
    // (out_of_range.406, found by tests/fuzz). e.what() begins with
    // "[json.exception.parse_error.101] "; keep the rest.
    std::string what = e.what();
    const size_t bracket = what.find("] ");
    if (bracket != std::string::npos) what = what.substr(bracket + 2);
    return absl::InvalidArgumentError(absl::StrCat("config: invalid JSON: ", what));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: expected a JSON object at the top level, got ", Shown(root)));
  }
  KVL_RETURN_IF_ERROR(CheckKeys(root, "",
                                {"server", "limits", "batching", "log", "runtime", "models",
                                 "translators", "routing", "sessions", "auth"}));
  ServerConfig c;
  std::string default_model;
  if (const Json* j = Find(root, "server")) {
    KVL_RETURN_IF_ERROR(ParseServer(*j, "server", &c.server));
    for (std::string* file : {&c.server.tls.cert_file, &c.server.tls.key_file,
                              &c.server.tls.client_ca_file}) {
      if (!file->empty()) *file = Resolve(base_dir, *file);
    }
  }
  if (const Json* j = Find(root, "log")) {
    KVL_RETURN_IF_ERROR(ParseLog(*j, "log", &c.log));
  }
  if (const Json* j = Find(root, "runtime")) {
    KVL_RETURN_IF_ERROR(ParseRuntime(*j, "runtime", &c.runtime));
  }
  if (const Json* j = Find(root, "models")) {
    KVL_RETURN_IF_ERROR(ParseModels(*j, "models", base_dir, c.runtime.dtype, &c.models));
  }
  for (const ModelEntry& m : c.models) {
    if (c.server.http_address && m.name == c.server.http_router_model) {
      return Invalid("server.http_router_model",
                     absl::StrCat("'", m.name,
                                  "' is also a model's name; choose another name for the router "
                                  "model (or \"\" for none)"));
    }
  }
  if (const Json* j = Find(root, "translators")) {
    KVL_RETURN_IF_ERROR(ParseTranslators(*j, "translators", base_dir, c.models, &c.translators));
  }
  if (const Json* j = Find(root, "routing")) {
    KVL_RETURN_IF_ERROR(ParseRouting(*j, "routing", c.models, &c.router, &default_model));
  }
  if (const Json* j = Find(root, "sessions")) {
    KVL_RETURN_IF_ERROR(ExpectObject(*j, "sessions"));
    KVL_RETURN_IF_ERROR(
        CheckKeys(*j, "sessions", {"idle_timeout_seconds", "memory_budget_bytes", "store"}));
    absl::Status s = ReadInt(*j, "idle_timeout_seconds", "sessions", 0,
                             int64_t{10} * 365 * 24 * 3600, &c.sessions.idle_timeout_seconds);
    if (s.ok()) {
      s = ReadInt(*j, "memory_budget_bytes", "sessions", 1, std::numeric_limits<int64_t>::max(),
                  &c.sessions.memory_budget_bytes);
    }
    if (s.ok()) {
      if (const Json* store = Find(*j, "store")) s = ParseSessionStore(*store, &c.sessions.store);
    }
    if (!s.ok()) return s;
  }
  if (const Json* j = Find(root, "limits")) {
    KVL_RETURN_IF_ERROR(ExpectObject(*j, "limits"));
    KVL_RETURN_IF_ERROR(CheckKeys(*j, "limits",
                                  {"max_concurrent_streams", "max_waiting_turns_per_model",
                                   "max_sessions", "max_history_tokens"}));
    const int64_t most = int64_t{1} << 40;
    absl::Status s = ReadInt(*j, "max_concurrent_streams", "limits", 0, most,
                             &c.limits.max_concurrent_streams);
    if (s.ok()) {
      s = ReadInt(*j, "max_waiting_turns_per_model", "limits", 0, most,
                  &c.router.limits.max_waiting_turns);
    }
    if (s.ok()) s = ReadInt(*j, "max_sessions", "limits", 0, most, &c.limits.max_sessions);
    if (s.ok()) {
      s = ReadInt(*j, "max_history_tokens", "limits", 0, most, &c.router.limits.max_history_tokens);
    }
    if (!s.ok()) return s;
  }
  if (const Json* j = Find(root, "auth")) {
    KVL_RETURN_IF_ERROR(ParseAuth(*j, "auth", &c.auth));
  }
  if (const Json* j = Find(root, "batching")) {
    KVL_RETURN_IF_ERROR(ExpectObject(*j, "batching"));
    KVL_RETURN_IF_ERROR(CheckKeys(*j, "batching", {"enabled", "max_step_tokens", "max_running"}));
    if (const Json* e = Find(*j, "enabled")) {
      if (!e->is_boolean()) return absl::InvalidArgumentError("batching.enabled: expected true or false");
      c.router.batching.enabled = e->get<bool>();
    }
    absl::Status s =
        ReadInt(*j, "max_step_tokens", "batching", 1, 1 << 20, &c.router.batching.max_step_tokens);
    if (s.ok()) s = ReadInt(*j, "max_running", "batching", 1, 4096, &c.router.batching.max_running);
    if (!s.ok()) return s;
  }
  KVL_RETURN_IF_ERROR(CrossCheck(default_model, c));
  return c;
}

absl::StatusOr<ServerConfig> LoadConfigFile(const std::string& path) {
  std::error_code ec;
  absl::StatusOr<std::string> text =
      fs::is_directory(path, ec) ? absl::NotFoundError("a directory") : ReadTextFile(path);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat("config: cannot read '", path, "'"));
  const std::string base_dir = fs::absolute(fs::path(path), ec).parent_path().string();
  return ParseConfig(*text, base_dir);
}

}  // namespace kvl::server
