// Timing helpers shared by the bench/ drivers. Header-only: each driver is one
// translation unit.
#pragma once

#include <ATen/ATen.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "base/files.h"

namespace kvl::bench {

// Waits until the work queued on `device` is done: a GPU runs LibTorch's
// kernels asynchronously, so a clock read after a call would time the launch
// only. A one-element copy to the host waits for the device's stream (what
// every kernel here is queued on); on the CPU it does nothing.
inline void Synchronize(const at::Device& device) {
  if (device.is_cpu()) return;
  (void)at::zeros({1}, at::TensorOptions().device(device)).item<float>();
}

// Wall seconds of one call of f, and of the work it queued on `device`.
inline double Seconds(const std::function<void()>& f, const at::Device& device = at::kCPU) {
  Synchronize(device);
  const auto t0 = std::chrono::steady_clock::now();
  f();
  Synchronize(device);
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

  // Writes the whole report to `path`; false, with the error naming the file
  // on stderr, when it cannot be written (a full disk, a missing directory).
  bool WriteTo(const std::string& path) const {
    const absl::Status s = WriteTextFile(path, text_);
    if (!s.ok()) std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return s.ok();
  }

 private:
  std::string text_;
};

// The fastest of n calls: on a shared machine the minimum is the least noisy.
inline double Best(int n, const std::function<void()>& f, const at::Device& device = at::kCPU) {
  double best = 1e300;
  for (int i = 0; i < n; ++i) best = std::min(best, Seconds(f, device));
  return best;
}

// The machine's GEMM rate in GFLOP/s right now (best of 3 after one warm-up):
// by default a 2048 cube in dtype (float32 by default); with shapes, an
// [m, k] x [k, n] product whose right side is read transposed, as a model's
// [out, in] weights are. Drivers re-measure it next to each measurement whose
// ratio to it they report, because the machine is shared. On `device`
// (default the CPU), timed to the end of the device's work.
class GemmRate {
 public:
  explicit GemmRate(at::ScalarType dtype = at::kFloat, const at::Device& device = at::kCPU)
      : GemmRate(2048, 2048, 2048, dtype, device) {}
  GemmRate(int64_t m, int64_t k, int64_t n, at::ScalarType dtype,
           const at::Device& device = at::kCPU)
      : a_(at::randn({m, k}).to(device, dtype)), b_(at::randn({n, k}).to(device, dtype)) {}
  double Measure() const {
    const at::Tensor bt = b_.t();
    at::mm(a_, bt);
    const double flops = 2.0 * a_.size(0) * a_.size(1) * b_.size(0);
    return flops / Best(3, [&] { at::mm(a_, bt); }, a_.device()) / 1e9;
  }

 private:
  at::Tensor a_, b_;
};

// The memory read bandwidth in GB/s right now, with LibTorch's current number
// of threads: the best of 5 sums over a float32 buffer of `bytes` (default
// 1 GiB, far beyond the caches), after one pass that faults it in; on
// `device`, its memory's.
inline double ReadBandwidth(int64_t bytes = int64_t{1} << 30, const at::Device& device = at::kCPU) {
  const at::Tensor buffer = at::ones({bytes / 4}, at::TensorOptions().device(device));
  at::sum(buffer);
  return static_cast<double>(bytes) / Best(5, [&] { at::sum(buffer); }, device) / 1e9;
}

// How much of the machine other processes used while a driver ran: the CPU
// time /proc/stat counts as busy on all CPUs, less this process's own (all its
// threads, user and system), over the CPU time there was. A benchmark that
// shared the machine reports times and ratios that are not the code's, so the
// drivers print this beside their results and say so above a small threshold.
class MachineShare {
 public:
  MachineShare() : start_(Now()) {}

  // The share of the machine's CPU time other processes used since this
  // object was made, in [0, 1]; negative when /proc/stat cannot be read.
  double Others() const {
    const Sample now = Now();
    const double total = now.total - start_.total;
    if (start_.total < 0 || now.total < 0 || total <= 0) return -1;
    return std::clamp((now.busy - start_.busy - (now.self - start_.self)) / total, 0.0, 1.0);
  }

  // One line for a report: the share, and a warning above kWarnAbove (and
  // kMinSeconds of others' CPU time: /proc/stat counts 10 ms ticks).
  std::string Line() const {
    const double others = Others();
    const bool shared = others > kWarnAbove && others * (Now().total - start_.total) > kMinSeconds;
    char buf[320];
    if (others < 0) return "machine share: /proc/stat could not be read";
    std::snprintf(buf, sizeof buf,
                  "machine share: other processes used %.1f%% of the %ld CPUs' time during this "
                  "run%s",
                  100 * others, sysconf(_SC_NPROCESSORS_ONLN),
                  shared ? " -- WARNING: the machine was shared; the times above are not this "
                           "code's alone, rerun on an idle machine"
                         : "");
    return buf;
  }

  static constexpr double kWarnAbove = 0.05;
  static constexpr double kMinSeconds = 0.1;

 private:
  struct Sample {
    double busy = -1, total = -1, self = 0;  // CPU seconds
  };
  static Sample Now() {
    Sample s;
    std::ifstream f("/proc/stat");
    std::string cpu;
    double user, nice, system, idle, iowait, irq, softirq, steal;
    if (f >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal &&
        cpu == "cpu") {
      const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
      s.busy = (user + nice + system + irq + softirq + steal) / tick;
      s.total = s.busy + (idle + iowait) / tick;
    }
    for (int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {  // children: a driver's own runs
      rusage r{};
      getrusage(who, &r);
      s.self += static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
                1e-6 * static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
    }
    return s;
  }
  Sample start_;
};

}  // namespace kvl::bench
