// Timing helpers shared by the bench/ drivers. Header-only: each driver is one
// translation unit.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

namespace kvl::bench {

// Wall seconds of one call of f.
inline double Seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A driver's output: each line printed (and flushed) as it comes, and kept so
// that the whole report can also be written to --out at the end.
class Report {
 public:
  void operator()(const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    text_ += line + "\n";
  }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// The fastest of n calls: on a shared machine the minimum is the least noisy.
inline double Best(int n, const std::function<void()>& f) {
  double best = 1e300;
  for (int i = 0; i < n; ++i) best = std::min(best, Seconds(f));
  return best;
}

// The machine's square-GEMM rate in GFLOP/s right now (2048^3 in dtype, float32
// by default; best of 3 after one warm-up). Drivers re-measure it next to each
// measurement whose ratio to it they report, because the machine is shared.
class GemmRate {
 public:
  explicit GemmRate(at::ScalarType dtype = at::kFloat)
      : a_(at::randn({2048, 2048}).to(dtype)), b_(at::randn({2048, 2048}).to(dtype)) {}
  double Measure() const {
    at::mm(a_, b_);
    return 2.0 * 2048 * 2048 * 2048 / Best(3, [&] { at::mm(a_, b_); }) / 1e9;
  }

 private:
  at::Tensor a_, b_;
};

}  // namespace kvl::bench
