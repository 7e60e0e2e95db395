// A progress line for long-running kvl commands (training, evaluation,
// fitting): done/total, percentage, rate, elapsed time, ETA and a free-form
// status ("loss 3.21 | 15.2k tok/s").
//
// On a terminal the line is redrawn in place (at most every `min_interval_s`);
// otherwise (a log file, a pipe) a full line is printed at most every
// `min_interval_non_tty_s`, so logs stay readable. Finish() always prints the
// final state and a newline.
//
// Thread safety: none; one ProgressBar belongs to one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace kvl::training {

struct ProgressOptions {
  std::string label;          // e.g. "train"
  int64_t total = 0;          // 0: unknown (no percentage, no ETA)
  std::string unit = "it";    // what is counted, e.g. "step", "item"
  FILE* out = stderr;
  double min_interval_s = 0.2;
  double min_interval_non_tty_s = 10.0;
  // Overrides terminal detection (tests); -1: detect with isatty.
  int force_tty = -1;
};

class ProgressBar {
 public:
  // `initial` is where counting starts (e.g. the step a resumed run begins
  // at): the rate and ETA use only progress made by this process.
  explicit ProgressBar(ProgressOptions options, int64_t initial = 0);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Records progress; redraws when enough time has passed since the last draw.
  void Update(int64_t done, std::string_view status = {});
  // Draws the final state and ends the line. Idempotent; the destructor calls it.
  void Finish(std::string_view status = {});

  double ElapsedSeconds() const;
  // Units per second since construction (0 before any progress).
  double Rate() const;
  // Seconds left at the current rate; negative when unknown.
  double EtaSeconds() const;

  // The line as it would be drawn now (without terminal control characters).
  std::string Render() const;

 private:
  void Draw(bool final);

  ProgressOptions options_;
  bool tty_ = false;
  int64_t initial_ = 0;
  int64_t done_ = 0;
  std::string status_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  bool drawn_ = false;
  bool finished_ = false;
  size_t last_width_ = 0;
};

// "1:02:03", "4:05", "12s"-style durations; "?" for negative values.
std::string FormatDuration(double seconds);
// 1234 -> "1.23k", 2.5e6 -> "2.50M"; plain below 1000.
std::string FormatCount(double value);

}  // namespace kvl::training
