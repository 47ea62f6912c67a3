#include "core/median_bracket.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace relax_straggler::core {
namespace {

constexpr std::size_t kSample = 512;    // sample rows at most
constexpr std::size_t kMinRanks = 256;  // below this the whole column is selected

}  // namespace

MedianScratch& median_scratch() {
  thread_local MedianScratch scratch;
  return scratch;
}

void prepare_brackets(const StepMatrix& m, MedianScratch& w) {
  const std::size_t ranks = static_cast<std::size_t>(m.num_ranks), stages = m.num_stages();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // Padded stride: an unpadded power-of-two stride maps every stage's bucket to the same
  // cache sets.
  w.stride = ranks + 8;
  // Padded to an even number of stages: the summary pass reads stages in pairs.
  const std::size_t padded = (stages + 1) / 2 * 2;
  if (w.buckets.size() < w.stride * padded) w.buckets.resize(w.stride * padded);
  w.lo.assign(padded, -kInf);
  w.hi.assign(padded, kInf);
  w.below.assign(padded, 0);
  w.filled.assign(padded, 0);
  if (ranks < kMinRanks) return;
  // Sample size ~ sqrt(ranks) balances selecting in the sample against the bucket size.
  const std::size_t take = std::min(kSample, static_cast<std::size_t>(4.0 * std::sqrt(static_cast<double>(ranks))));
  if (w.sample.size() < take * stages) w.sample.resize(take * stages);
  std::vector<std::size_t>& n = w.filled;  // sample sizes for now, reset below
  for (std::size_t i = 0; i < take; ++i) {
    const double* row = m.ms.data() + (i * ranks / take) * stages;
    for (std::size_t s = 0; s < stages; ++s) {
      if (!std::isnan(row[s])) w.sample[s * take + n[s]++] = row[s];
    }
  }
  for (std::size_t s = 0; s < stages; ++s) {
    const std::size_t k = n[s];
    if (k < take / 2) continue;  // a sparse stage: select its whole column
    double* v = w.sample.data() + s * take;
    const double half = 1.5 / std::sqrt(static_cast<double>(k));  // 3 x the standard error 0.5 / sqrt(k)
    const auto a = static_cast<std::size_t>(std::floor(static_cast<double>(k) * (0.5 - half)));
    const auto b = std::min(k - 1, static_cast<std::size_t>(std::ceil(static_cast<double>(k) * (0.5 + half))));
    std::nth_element(v, v + a, v + k);
    w.lo[s] = v[a];
    std::nth_element(v + a, v + b, v + k);
    w.hi[s] = v[b];
  }
  std::fill(n.begin(), n.end(), 0);
}

double bracketed_median(const StepMatrix& m, MedianScratch& w, std::size_t s, std::size_t count) {
  if (count == 0) return std::numeric_limits<double>::quiet_NaN();
  const double pos = 0.5 * static_cast<double>(count - 1);
  const auto k = static_cast<std::size_t>(std::floor(pos));
  const double frac = pos - static_cast<double>(k);
  const bool two = frac != 0.0 && k + 1 < count;
  double* v = w.buckets.data() + s * w.stride;
  std::size_t first = w.below[s], n = w.filled[s];
  if (!(first <= k && k + (two ? 1 : 0) < first + n)) {
    // The median lies outside the bracket: select over the whole column.
    w.column.clear();
    const std::size_t ranks = static_cast<std::size_t>(m.num_ranks), stages = m.num_stages();
    for (std::size_t r = 0; r < ranks; ++r) {
      const double t = m.ms[r * stages + s];
      if (!std::isnan(t)) w.column.push_back(t);
    }
    v = w.column.data();
    first = 0;
    n = w.column.size();
  }
  const std::size_t i = k - first;
  std::nth_element(v, v + i, v + n);
  const double lo_value = v[i];
  if (!two) return lo_value;
  const double hi_value = *std::min_element(v + i + 1, v + n);
  return lo_value + frac * (hi_value - lo_value);
}

}  // namespace relax_straggler::core
