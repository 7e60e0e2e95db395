#include "base/flags.h"

#include <cstdio>
#include <limits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvl {
namespace {

template <typename T>
std::string DefaultOf(const T& value) {
  if constexpr (std::is_same_v<T, std::string>) {
    return value;
  } else {
    return absl::StrCat(value);
  }
}

// Integers of any width: parsed as 64 bits, then checked against T's range.
template <typename T>
std::function<absl::Status(const std::string&)> IntegerSetter(T* out) {
  return [out](const std::string& text) -> absl::Status {
    bool ok = false;
    if constexpr (std::is_signed_v<T>) {
      int64_t v = 0;
      ok = absl::SimpleAtoi(text, &v) && v >= std::numeric_limits<T>::min() &&
           v <= std::numeric_limits<T>::max();
      if (ok) *out = static_cast<T>(v);
    } else {
      uint64_t v = 0;
      ok = !text.empty() && text[0] != '-' && absl::SimpleAtoi(text, &v) &&
           v <= std::numeric_limits<T>::max();
      if (ok) *out = static_cast<T>(v);
    }
    if (ok) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", std::is_signed_v<T> ? "an integer" : "a non-negative integer",
                     " that fits ", sizeof(T) * 8, " bits, got '", text, "'"));
  };
}

}  // namespace

FlagSet::FlagSet(std::string program, std::string about)
    : program_(std::move(program)), about_(std::move(about)) {}

FlagSet::Flag& FlagSet::Declare(std::string name, std::string metavar, std::string help,
                                std::string default_text) {
  Flag flag;
  flag.name = std::move(name);
  flag.metavar = std::move(metavar);
  flag.help = std::move(help);
  flag.default_text = std::move(default_text);
  flags_.push_back(std::move(flag));
  return flags_.back();
}

void FlagSet::Add(std::string name, std::string* out, std::string metavar, std::string help) {
  Declare(std::move(name), std::move(metavar), std::move(help), *out).set =
      [out](const std::string& v) {
        *out = v;
        return absl::OkStatus();
      };
}

void FlagSet::Add(std::string name, std::optional<std::string>* out, std::string metavar,
                  std::string help) {
  Declare(std::move(name), std::move(metavar), std::move(help), out->value_or("")).set =
      [out](const std::string& v) {
        *out = v;
        return absl::OkStatus();
      };
}

void FlagSet::Add(std::string name, int* out, std::string metavar, std::string help) {
  Declare(std::move(name), std::move(metavar), std::move(help), DefaultOf(*out)).set =
      IntegerSetter(out);
}

void FlagSet::Add(std::string name, int64_t* out, std::string metavar, std::string help) {
  Declare(std::move(name), std::move(metavar), std::move(help), DefaultOf(*out)).set =
      IntegerSetter(out);
}

void FlagSet::Add(std::string name, uint32_t* out, std::string metavar, std::string help) {
  Declare(std::move(name), std::move(metavar), std::move(help), DefaultOf(*out)).set =
      IntegerSetter(out);
}

void FlagSet::Add(std::string name, uint64_t* out, std::string metavar, std::string help) {
  Declare(std::move(name), std::move(metavar), std::move(help), DefaultOf(*out)).set =
      IntegerSetter(out);
}

void FlagSet::Add(std::string name, double* out, std::string metavar, std::string help) {
  Declare(std::move(name), std::move(metavar), std::move(help), DefaultOf(*out)).set =
      [out](const std::string& v) {
        if (absl::SimpleAtod(v, out)) return absl::OkStatus();
        return absl::InvalidArgumentError(absl::StrCat("expected a number, got '", v, "'"));
      };
}

void FlagSet::Add(std::string name, float* out, std::string metavar, std::string help) {
  Declare(std::move(name), std::move(metavar), std::move(help), DefaultOf(*out)).set =
      [out](const std::string& v) {
        if (absl::SimpleAtof(v, out)) return absl::OkStatus();
        return absl::InvalidArgumentError(absl::StrCat("expected a number, got '", v, "'"));
      };
}

void FlagSet::Add(std::string name, std::vector<std::string>* out, std::string metavar,
                  std::string help) {
  Declare(std::move(name), std::move(metavar), std::move(help) + " (repeatable)", "").set =
      [out](const std::string& v) {
        out->push_back(v);
        return absl::OkStatus();
      };
}

void FlagSet::Choice(std::string name, std::string* out, std::vector<std::string> choices,
                     std::string help) {
  std::string metavar = absl::StrJoin(choices, "|");
  Declare(std::move(name), std::move(metavar), std::move(help), *out).set =
      [out, choices = std::move(choices)](const std::string& v) {
        for (const std::string& c : choices) {
          if (c == v) {
            *out = v;
            return absl::OkStatus();
          }
        }
        return absl::InvalidArgumentError(
            absl::StrCat("expected one of ", absl::StrJoin(choices, ", "), ", got '", v, "'"));
      };
}

void FlagSet::Required(std::string name, std::string* out, std::string metavar,
                       std::string help) {
  Add(std::move(name), out, std::move(metavar), std::move(help));
  flags_.back().required = true;
  flags_.back().default_text.clear();
}

void FlagSet::Switch(std::string name, bool* out, std::string help) {
  Flag& flag = Declare(std::move(name), "", std::move(help), "");
  flag.is_switch = true;
  flag.set = [out](const std::string&) {
    *out = true;
    return absl::OkStatus();
  };
}

void FlagSet::Custom(std::string name, std::string metavar, std::string help,
                     std::function<absl::Status(const std::string&)> parse) {
  Declare(std::move(name), std::move(metavar), std::move(help), "").set = std::move(parse);
}

void FlagSet::Positional(std::vector<std::string>* out, std::string metavar, std::string help) {
  positional_ = out;
  positional_metavar_ = std::move(metavar);
  positional_help_ = std::move(help);
}

FlagSet::Flag* FlagSet::Find(std::string_view name) {
  for (Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool FlagSet::Given(std::string_view name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return f.given;
  }
  return false;
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      return absl::OkStatus();
    }
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      if (positional_ != nullptr && (arg.empty() || arg[0] != '-' || arg == "-")) {
        positional_->push_back(arg);
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    Flag* flag = Find(name);
    if (flag == nullptr) return absl::InvalidArgumentError("unknown flag --" + name);
    if (flag->is_switch) {
      if (value) return absl::InvalidArgumentError("--" + name + " takes no value");
    } else if (!value) {
      if (i + 1 >= args.size()) return absl::InvalidArgumentError("--" + name + " needs a value");
      value = args[++i];
    }
    if (absl::Status s = flag->set(value.value_or("")); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", s.message()));
    }
    flag->given = true;
    flag->value_empty = value && value->empty();
  }
  for (const Flag& f : flags_) {
    if (f.required && (!f.given || f.value_empty)) {
      return absl::InvalidArgumentError("--" + f.name + " is required");
    }
  }
  return absl::OkStatus();
}

std::optional<int> FlagSet::ParseOrExit(const std::vector<std::string>& args) {
  const absl::Status status = Parse(args);
  if (help_requested_) {
    std::fputs(Help().c_str(), stdout);
    return 0;
  }
  if (!status.ok()) return UsageError(std::string(status.message()));
  return std::nullopt;
}

int FlagSet::UsageError(std::string_view message) const {
  std::fprintf(stderr, "%s: %.*s (see %s --help)\n", program_.c_str(),
               static_cast<int>(message.size()), message.data(), program_.c_str());
  return 2;
}

std::string FlagSet::Help() const {
  std::string out = absl::StrCat("usage: ", program_);
  for (const Flag& f : flags_) {
    if (f.required) absl::StrAppend(&out, " --", f.name, " ", f.metavar);
  }
  bool has_optional = false;
  for (const Flag& f : flags_) has_optional = has_optional || !f.required;
  if (has_optional) absl::StrAppend(&out, " [flags]");
  if (positional_ != nullptr) absl::StrAppend(&out, " [", positional_metavar_, "...]");
  absl::StrAppend(&out, "\n\nflags:\n");
  for (const Flag& f : flags_) {
    std::string left = absl::StrCat("  --", f.name);
    if (!f.is_switch) absl::StrAppend(&left, " ", f.metavar);
    if (left.size() < 30) left.resize(30, ' ');
    else absl::StrAppend(&left, "\n", std::string(30, ' '));
    absl::StrAppend(&out, left, f.help);
    if (f.required) {
      absl::StrAppend(&out, " (required)");
    } else if (!f.default_text.empty()) {
      absl::StrAppend(&out, " (default: ", f.default_text, ")");
    }
    absl::StrAppend(&out, "\n");
  }
  if (positional_ != nullptr) {
    std::string left = absl::StrCat("  ", positional_metavar_, "...");
    if (left.size() < 30) left.resize(30, ' ');
    absl::StrAppend(&out, left, positional_help_, "\n");
  }
  absl::StrAppend(&out, "  --help                      this text\n");
  if (!about_.empty()) absl::StrAppend(&out, "\n", about_, about_.back() == '\n' ? "" : "\n");
  return out;
}

}  // namespace kvl
