// Token sampling from a logits row: greedy, temperature, top-k, top-p, with a
// seeded generator so that a seed fixes the sequence on every platform.
//
// Order as in Hugging Face: temperature, then top-k, then top-p, then a draw
// from the renormalised remaining distribution. Not thread-safe: one Sampler
// per generation.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace kvl {

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy (argmax; ties go to the lowest id)
  int64_t top_k = 0;         // 0: off; keeps every token scoring >= the k-th best
  double top_p = 1.0;        // 1: off; keeps the smallest set of best tokens with mass >= top_p
};

// InvalidArgument for temperature < 0, top_k < 0, top_p outside (0, 1].
absl::Status ValidateSamplingParams(const SamplingParams& params);

class Sampler {
 public:
  Sampler(const SamplingParams& params, uint64_t seed);

  // logits: [V] (any float dtype/device). Returns a token id.
  int64_t Sample(const at::Tensor& logits);

  // The tokens Sample may return for these logits, with their probabilities
  // (sorted by decreasing probability); greedy gives the argmax with 1.
  std::vector<std::pair<int64_t, double>> Candidates(const at::Tensor& logits);

 private:
  // Fills candidates_ (id, unnormalised probability) from logits_, best first
  // when sorted or top-p needs it.
  void BuildCandidates(bool sorted);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> logits_;
  std::vector<int64_t> order_;
  std::vector<std::pair<int64_t, double>> candidates_;
};

}  // namespace kvl
