#include "model/sampling.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace kvl {

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  if (!(p.temperature >= 0.0) || !std::isfinite(p.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be >= 0, got ", p.temperature));
  }
  if (p.top_k < 0)
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", p.top_k));
  if (!(p.top_p > 0.0 && p.top_p <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", p.top_p));
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params, uint64_t seed) : params_(params), rng_(seed) {}

namespace {

void CopyLogits(const at::Tensor& logits, std::vector<float>& out) {
  const at::Tensor row = logits.reshape({-1}).to(at::kCPU, at::kFloat).contiguous();
  out.assign(row.data_ptr<float>(), row.data_ptr<float>() + row.numel());
}

int64_t ArgMax(const std::vector<float>& v) {
  return std::max_element(v.begin(), v.end()) - v.begin();  // first maximum
}

}  // namespace

void Sampler::BuildCandidates(bool sorted) {
  const int64_t n_vocab = static_cast<int64_t>(logits_.size());
  const float t = static_cast<float>(params_.temperature);
  for (float& l : logits_) l /= t;
  auto better = [&](int64_t a, int64_t b) {
    return logits_[a] > logits_[b] || (logits_[a] == logits_[b] && a < b);
  };
  order_.resize(n_vocab);
  std::iota(order_.begin(), order_.end(), 0);

  // Tokens that survive top-k: all scoring >= the k-th best (ties kept, as HF).
  int64_t n_keep = n_vocab;
  if (params_.top_k > 0 && params_.top_k < n_vocab) {
    std::nth_element(order_.begin(), order_.begin() + params_.top_k - 1, order_.end(), better);
    const float kth = logits_[order_[params_.top_k - 1]];
    n_keep =
        std::partition(order_.begin(), order_.end(), [&](int64_t i) { return logits_[i] >= kth; }) -
        order_.begin();
  }
  // Sort the survivors best first; for top-p only as many as the mass needs:
  // sort a growing prefix until it covers top_p of the (top-k) distribution.
  const float max_logit =
      logits_[*std::min_element(order_.begin(), order_.begin() + n_keep, better)];
  double total = 0.0;
  for (int64_t i = 0; i < n_keep; ++i)
    total += std::exp(static_cast<double>(logits_[order_[i]] - max_logit));
  if (params_.top_p >= 1.0 && !sorted) {  // no order needed to draw
    candidates_.clear();
    for (int64_t i = 0; i < n_keep; ++i) {
      candidates_.emplace_back(
          order_[i], std::exp(static_cast<double>(logits_[order_[i]] - max_logit)) / total);
    }
    return;
  }
  int64_t n_sorted = params_.top_p < 1.0 ? std::min<int64_t>(n_keep, 64) : n_keep;
  while (true) {
    std::partial_sort(order_.begin(), order_.begin() + n_sorted, order_.begin() + n_keep, better);
    candidates_.clear();
    double mass = 0.0;
    for (int64_t i = 0; i < n_sorted; ++i) {
      const double p = std::exp(static_cast<double>(logits_[order_[i]] - max_logit)) / total;
      candidates_.emplace_back(order_[i], p);
      mass += p;
      // Keep a token iff the mass of the better ones is still below top_p.
      if (params_.top_p < 1.0 && mass >= params_.top_p) return;
    }
    if (n_sorted == n_keep) return;
    n_sorted = std::min(n_keep, n_sorted * 8);
  }
}

std::vector<std::pair<int64_t, double>> Sampler::Candidates(const at::Tensor& logits) {
  CopyLogits(logits, logits_);
  if (params_.temperature == 0.0) return {{ArgMax(logits_), 1.0}};
  BuildCandidates(/*sorted=*/true);
  double mass = 0.0;
  for (const auto& c : candidates_) mass += c.second;
  std::vector<std::pair<int64_t, double>> out = candidates_;
  for (auto& c : out) c.second /= mass;
  return out;
}

int64_t Sampler::Sample(const at::Tensor& logits) {
  CopyLogits(logits, logits_);
  if (params_.temperature == 0.0) return ArgMax(logits_);
  BuildCandidates(/*sorted=*/false);
  double mass = 0.0;
  for (const auto& c : candidates_) mass += c.second;
  // 53 random bits -> [0, 1): the same draw for a seed on every platform
  // (std::uniform_real_distribution is implementation-defined).
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * mass;
  double acc = 0.0;
  for (const auto& c : candidates_) {
    acc += c.second;
    if (u < acc) return c.first;
  }
  return candidates_.back().first;
}

}  // namespace kvl
