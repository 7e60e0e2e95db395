#include "training/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvl::training {
namespace {

constexpr int kBarWidth = 24;

double SecondsBetween(std::chrono::steady_clock::time_point a,
                      std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

std::string FormatDuration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%d:%02d", s / 60, s % 60);
  return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
}

std::string FormatCount(double value) {
  const double a = std::fabs(value);
  if (a >= 1e9) return absl::StrFormat("%.2fG", value / 1e9);
  if (a >= 1e6) return absl::StrFormat("%.2fM", value / 1e6);
  if (a >= 1e3) return absl::StrFormat("%.2fk", value / 1e3);
  if (a >= 10 || a == std::floor(a)) return absl::StrFormat("%.0f", value);
  return absl::StrFormat("%.2f", value);
}

ProgressBar::ProgressBar(ProgressOptions options, int64_t initial)
    : options_(std::move(options)), initial_(initial), done_(initial) {
  tty_ = options_.force_tty >= 0 ? options_.force_tty == 1
                                 : (options_.out != nullptr && isatty(fileno(options_.out)));
  start_ = std::chrono::steady_clock::now();
  last_draw_ = start_;
}

ProgressBar::~ProgressBar() { Finish(); }

double ProgressBar::ElapsedSeconds() const {
  return SecondsBetween(start_, std::chrono::steady_clock::now());
}

double ProgressBar::Rate() const {
  const double elapsed = ElapsedSeconds();
  if (done_ <= initial_ || elapsed <= 0) return 0;
  return static_cast<double>(done_ - initial_) / elapsed;
}

double ProgressBar::EtaSeconds() const {
  const double rate = Rate();
  if (options_.total <= 0 || rate <= 0) return -1;
  return static_cast<double>(std::max<int64_t>(options_.total - done_, 0)) / rate;
}

std::string ProgressBar::Render() const {
  std::string line = options_.label.empty() ? "" : absl::StrCat(options_.label, " ");
  if (options_.total > 0) {
    const double frac =
        std::clamp(static_cast<double>(done_) / static_cast<double>(options_.total), 0.0, 1.0);
    const int filled = static_cast<int>(frac * kBarWidth);
    std::string bar(kBarWidth, ' ');
    std::fill(bar.begin(), bar.begin() + filled, '=');
    if (filled < kBarWidth && done_ > 0) bar[filled] = '>';
    absl::StrAppend(&line, "[", bar, "] ", done_, "/", options_.total, " ", options_.unit,
                    absl::StrFormat(" %3.0f%%", 100 * frac));
  } else {
    absl::StrAppend(&line, done_, " ", options_.unit);
  }
  absl::StrAppend(&line, " | ", FormatCount(Rate()), " ", options_.unit, "/s | ",
                  FormatDuration(ElapsedSeconds()));
  if (options_.total > 0) absl::StrAppend(&line, " ETA ", FormatDuration(EtaSeconds()));
  if (!status_.empty()) absl::StrAppend(&line, " | ", status_);
  return line;
}

void ProgressBar::Update(int64_t done, std::string_view status) {
  done_ = done;
  if (!status.empty()) status_ = std::string(status);
  if (options_.out == nullptr || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  const double interval = tty_ ? options_.min_interval_s : options_.min_interval_non_tty_s;
  if (drawn_ && SecondsBetween(last_draw_, now) < interval) return;
  Draw(/*final=*/false);
}

void ProgressBar::Finish(std::string_view status) {
  if (finished_) return;
  if (!status.empty()) status_ = std::string(status);
  if (options_.out != nullptr) Draw(/*final=*/true);
  finished_ = true;
}

void ProgressBar::Draw(bool final) {
  const std::string line = Render();
  if (tty_) {
    // Pad over the remains of a longer previous line.
    const size_t pad = last_width_ > line.size() ? last_width_ - line.size() : 0;
    std::fprintf(options_.out, "\r%s%s%s", line.c_str(), std::string(pad, ' ').c_str(),
                 final ? "\n" : "");
  } else {
    std::fprintf(options_.out, "%s\n", line.c_str());
  }
  std::fflush(options_.out);
  last_width_ = line.size();
  last_draw_ = std::chrono::steady_clock::now();
  drawn_ = true;
}

}  // namespace kvl::training
