#include "translator/resample.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvl {

absl::StatusOr<KvTaps> ResampleTaps(const KvTaps& source, const std::vector<TokenRun>& runs) {
  if (!source.keys.defined() || !source.values.defined() || source.keys.dim() != 4 ||
      source.values.dim() != 4 || source.keys.size(2) != source.values.size(2)) {
    return absl::InvalidArgumentError("taps must be [L, H, T, D] keys and values of one length");
  }
  const int64_t t = source.keys.size(2);
  const int64_t n = static_cast<int64_t>(runs.size());
  std::vector<int64_t> begin(runs.size()), length(runs.size());
  int64_t longest = 0;
  for (int64_t j = 0; j < n; ++j) {
    const TokenRun& r = runs[static_cast<size_t>(j)];
    if (r.begin < 0 || r.end > t || r.end <= r.begin) {
      return absl::InvalidArgumentError(absl::StrCat("run ", j, " [", r.begin, ", ", r.end,
                                                     ") is empty or outside the span's ", t,
                                                     " tokens"));
    }
    begin[static_cast<size_t>(j)] = r.begin;
    length[static_cast<size_t>(j)] = r.end - r.begin;
    longest = std::max(longest, r.end - r.begin);
  }
  const at::Device device = source.keys.device();
  const at::Tensor first = at::tensor(begin, at::kLong).to(device);
  KvTaps out;
  for (const auto& [from, to] : {std::pair{&source.keys, &out.keys},
                                 std::pair{&source.values, &out.values}}) {
    if (longest <= 1) {  // one to one throughout: a gather
      *to = from->index_select(2, first);
      continue;
    }
    const at::ScalarType sum_type =
        from->scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    at::Tensor sum = from->index_select(2, first).to(sum_type);
    // The k-th token of every run longer than k, added to its row.
    for (int64_t k = 1; k < longest; ++k) {
      std::vector<int64_t> rows, tokens;
      for (int64_t j = 0; j < n; ++j) {
        if (length[static_cast<size_t>(j)] > k) {
          rows.push_back(j);
          tokens.push_back(begin[static_cast<size_t>(j)] + k);
        }
      }
      const at::Tensor token_index = at::tensor(tokens, at::kLong).to(device);
      sum.index_add_(2, at::tensor(rows, at::kLong).to(device),
                     from->index_select(2, token_index).to(sum_type));
    }
    const at::Tensor count =
        at::tensor(length, at::kLong).to(device).to(sum_type).view({1, 1, n, 1});
    *to = sum.div_(count).to(from->scalar_type());
  }
  return out;
}

}  // namespace kvl
