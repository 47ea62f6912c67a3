// The median reference of judge_step is exact at every size: the bracketed selection
// used from 256 ranks on gives the same reference as nan_median over the whole column,
// with NaNs, ties, skew and a median that falls outside the sample's bracket.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/stats.h"
#include "core/verdict.h"

namespace rs = relax_straggler::core;

namespace {

void expect_exact_medians(std::int32_t ranks, std::uint64_t seed, double nan_share, bool ties, bool skewed,
                          std::size_t stages = 6) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> jitter(0.0, skewed ? 0.8 : 0.02);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> ms(static_cast<std::size_t>(ranks) * stages);
  for (std::size_t i = 0; i < ms.size(); ++i) {
    double x = 100.0 * jitter(rng);
    if (ties) x = std::round(x);
    ms[i] = u(rng) < nan_share ? std::numeric_limits<double>::quiet_NaN() : x;
  }
  // Stage 5: the sampled rows (evenly spaced) are all small, the others large, so the
  // sample's bracket misses the median and the whole column is selected.
  for (std::int32_t r = 0; r < ranks; ++r) ms[static_cast<std::size_t>(r) * stages + 5] = r % 2 ? 500.0 + r : 1.0 + r;
  std::vector<std::string> names{"forward", "backward", "optimizer", "communication", "data", "attention", "moe"};
  names.resize(stages);
  const auto m = rs::StepMatrix::from_rows(0, ranks, names, ms);
  rs::VerdictConfig cfg;
  cfg.reference = rs::Reference::kMedian;
  const auto v = rs::judge_step(m, cfg);
  for (std::size_t s = 0; s < stages; ++s) {
    std::vector<double> column;
    for (std::int32_t r = 0; r < ranks; ++r) column.push_back(m.at(r, s));
    const double want = rs::nan_median(column);
    EXPECT_EQ(v.stages[s].ref_ms, want) << "ranks " << ranks << " stage " << s << " seed " << seed;
  }
}

}  // namespace

TEST(VerdictMedian, BracketedSelectionIsExact) {
  for (std::int32_t ranks : {255, 256, 257, 1000, 1024, 4099, 16384}) {
    for (std::uint64_t seed = 1; seed <= 3; ++seed) {
      expect_exact_medians(ranks, seed, 0.0, false, false);
      expect_exact_medians(ranks, seed, 0.2, false, true);
      expect_exact_medians(ranks, seed, 0.05, true, false);
      expect_exact_medians(ranks, seed, 0.1, false, false, 7);  // an odd number of stages
    }
  }
}
