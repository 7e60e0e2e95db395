// Command-line flags: the one parser of every `kvl` command and of kvl-server.
// A command declares its flags against the variables they set; the declaration
// is also the --help text, so the two cannot drift apart.
//
//   FlagSet flags("kvl distill", "Self-distils a closed-form translator ...");
//   flags.Required("source", &o.source_dir, "DIR", "the source model");
//   flags.Add("steps", &o.n_steps, "N", "optimizer steps");  // default: o's value
//   flags.Switch("bf16", &o.bf16, "bf16 autocast in the training steps");
//   if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
//
// Accepted forms: `--name value`, `--name=value`, `--switch`, `--help` / `-h`.
// Values are checked when parsed: an integer flag given "x" is an error naming
// the flag. A flag given twice keeps the last value (a list flag keeps all).
// Positional arguments are errors unless Positional() declared them.
//
// Why not absl flags: they are process-wide globals, and `kvl`'s commands
// declare flags of the same name with other meanings and defaults.
//
// Not thread-safe; a FlagSet lives on one thread for the parse.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace kvl {

class FlagSet {
 public:
  // `program`: as the user types it ("kvl train-lm"); `about`: what the
  // command does, printed under the flags in --help.
  FlagSet(std::string program, std::string about);

  // A flag with a value; `metavar` names the value in --help ("N", "DIR"),
  // `help` says what it sets. The variable's value at declaration is the
  // default shown in --help (unless empty). Integer flags reject numbers that
  // do not fit their type (unsigned ones reject negatives).
  void Add(std::string name, std::string* out, std::string metavar, std::string help);
  void Add(std::string name, std::optional<std::string>* out, std::string metavar,
           std::string help);
  void Add(std::string name, int* out, std::string metavar, std::string help);
  void Add(std::string name, int64_t* out, std::string metavar, std::string help);
  void Add(std::string name, uint32_t* out, std::string metavar, std::string help);
  void Add(std::string name, uint64_t* out, std::string metavar, std::string help);
  void Add(std::string name, double* out, std::string metavar, std::string help);
  void Add(std::string name, float* out, std::string metavar, std::string help);
  // Every occurrence appends one value.
  void Add(std::string name, std::vector<std::string>* out, std::string metavar,
           std::string help);
  // One of `choices`; --help lists them.
  void Choice(std::string name, std::string* out, std::vector<std::string> choices,
              std::string help);
  // A string flag that must be given, not empty.
  void Required(std::string name, std::string* out, std::string metavar, std::string help);
  // A flag without a value: true when present. `--name=...` is an error.
  void Switch(std::string name, bool* out, std::string help);
  // A value handed to `parse`, whose error (its message) names the problem;
  // the message is prefixed with the flag's name.
  void Custom(std::string name, std::string metavar, std::string help,
              std::function<absl::Status(const std::string&)> parse);
  // Accepts positional arguments into `out` (none by default).
  void Positional(std::vector<std::string>* out, std::string metavar, std::string help);

  // InvalidArgument naming the flag: unknown, missing value, bad value,
  // missing required flag, stray argument. --help sets help_requested() and
  // stops parsing with OK (required flags are then not checked).
  absl::Status Parse(const std::vector<std::string>& args);
  // Parse, then: --help prints Help() to stdout and returns 0; an error prints
  // "<program>: <message> (see <program> --help)" to stderr and returns 2;
  // nullopt when the command should run.
  std::optional<int> ParseOrExit(const std::vector<std::string>& args);

  // Bad usage found after parsing (a range, flags that go together): prints
  // "<program>: <message> (see <program> --help)" to stderr as ParseOrExit
  // does, and returns 2, the exit code for bad usage.
  int UsageError(std::string_view message) const;

  bool help_requested() const { return help_requested_; }
  // True when the flag was on the command line (not merely defaulted).
  bool Given(std::string_view name) const;
  // The generated usage: synopsis, one line per flag with its default, and
  // the `about` text.
  std::string Help() const;

 private:
  struct Flag {
    std::string name, metavar, help, default_text;
    bool required = false, is_switch = false, given = false, value_empty = false;
    std::function<absl::Status(const std::string&)> set;
  };
  Flag& Declare(std::string name, std::string metavar, std::string help, std::string default_text);
  Flag* Find(std::string_view name);

  std::string program_, about_;
  std::vector<Flag> flags_;
  std::vector<std::string>* positional_ = nullptr;
  std::string positional_metavar_, positional_help_;
  bool help_requested_ = false;
};

}  // namespace kvl
