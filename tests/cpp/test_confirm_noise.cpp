// The confirmed verdict's learned noise: per (group, stage), 1.4826 x the median of the
// last noise_memory per-report MADs of the ratios (reference_of, the oracle), refreshed
// while the ring fills and then every 4th MAD learned, never below min_noise. Checked
// against that definition, recomputed here, for groups of 2 to 40 ranks (one sampled),
// a stage some reports lack (its cells learn at their own pace) and several ring sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/confirm/reference.h"
#include "core/confirm/tracker.h"

namespace rs = relax_straggler::core;
namespace cf = relax_straggler::core::confirm;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr std::size_t kStages = 5;
const std::vector<std::int32_t> kGroupSizes = {3, 8, 5, 40, 2, 12, 32};  // 7 x 5 cells

// The noise the tracker should hold per (group, stage) after the reports pushed.
struct Expected {
  std::int32_t mem;
  double min_noise;
  std::map<std::size_t, std::vector<float>> mads;  // per (group, stage): the MADs learned
  std::map<std::size_t, double> sigma;

  void push(std::size_t gs, double mad) {
    if (!std::isfinite(mad)) return;
    std::vector<float>& v = mads[gs];
    v.push_back(static_cast<float>(mad));
    const auto count = static_cast<std::int32_t>(v.size());
    if (count > mem && count % 4 != 0) return;
    std::vector<float> last(v.end() - std::min(count, mem), v.end());
    std::nth_element(last.begin(), last.begin() + static_cast<std::ptrdiff_t>(last.size() / 2), last.end());
    sigma[gs] = std::max(min_noise, 1.4826 * static_cast<double>(last[last.size() / 2]));
  }
};

std::vector<std::int32_t> group_ids() {
  std::vector<std::int32_t> out;
  for (std::size_t g = 0; g < kGroupSizes.size(); ++g) {
    out.insert(out.end(), static_cast<std::size_t>(kGroupSizes[g]), static_cast<std::int32_t>(g));
  }
  return out;
}

// One report: ~100 ms x (1 + 0.2 stage) with 0.5 % jitter (no rank near the bands); stage 3
// not run in every third report; `slow`: each group's first rank takes twice as long.
std::vector<double> report(std::int32_t ranks, std::int64_t step, std::mt19937_64& rng, bool slow,
                           const std::vector<std::int32_t>& groups) {
  std::normal_distribution<double> z(0.0, 0.005);
  std::vector<double> ms(static_cast<std::size_t>(ranks) * kStages);
  for (std::int32_t r = 0; r < ranks; ++r) {
    const bool first = r == 0 || groups[static_cast<std::size_t>(r)] != groups[static_cast<std::size_t>(r) - 1];
    for (std::size_t s = 0; s < kStages; ++s) {
      double t = 100.0 * (1.0 + 0.2 * static_cast<double>(s)) * std::exp(z(rng));
      if (slow && first) t *= 2.0;
      if (s == 3 && step % 3 == 0) t = kNaN;
      ms[static_cast<std::size_t>(r) * kStages + s] = t;
    }
  }
  return ms;
}

// The MAD of each (group, stage) as the tracker takes it: over the group's rows, or over
// reference_sample evenly spaced ones.
void expect_mads(const std::vector<double>& ms, std::int32_t sample, Expected& want) {
  std::size_t start = 0;
  for (std::size_t g = 0; g < kGroupSizes.size(); ++g) {
    const auto n = static_cast<std::size_t>(kGroupSizes[g]);
    const std::size_t take = std::min(n, static_cast<std::size_t>(sample));
    for (std::size_t s = 0; s < kStages; ++s) {
      std::vector<double> values;
      for (std::size_t i = 0; i < take; ++i) {
        const double t = ms[(start + i * n / take) * kStages + s];
        if (!std::isnan(t)) values.push_back(t);
      }
      want.push(g * kStages + s, cf::reference_of(values, n <= take).mad);
    }
    start += n;
  }
}

}  // namespace

TEST(ConfirmNoise, TheLearnedNoiseIsTheMedianOfTheLastMads) {
  const std::vector<std::int32_t> groups = group_ids();
  const auto ranks = static_cast<std::int32_t>(groups.size());
  std::vector<std::string> names;
  for (std::size_t s = 0; s < kStages; ++s) names.push_back("stage" + std::to_string(s));
  for (std::int32_t mem : {16, 5, 1, 64}) {
    SCOPED_TRACE("noise_memory=" + std::to_string(mem));
    cf::ConfirmConfig cfg;
    cfg.noise_memory = mem;
    cf::ConfirmTracker tracker(cfg);
    Expected want{mem, cfg.min_noise, {}, {}};
    std::mt19937_64 rng(17);
    std::int64_t step = 1;
    for (; step <= 45; ++step) {
      const std::vector<double> ms = report(ranks, step, rng, false, groups);
      const cf::ConfirmResult r = tracker.update(rs::StepMatrix::from_rows(step, ranks, names, ms), groups);
      ASSERT_TRUE(r.findings.empty()) << "healthy report " << step;
      expect_mads(ms, cfg.reference_sample, want);
    }
    // Each group's first rank is slow in every stage: its findings show the noise learned so
    // far (a (group, stage) with a suspect learns nothing from that report).
    const cf::ConfirmResult r =
        tracker.update(rs::StepMatrix::from_rows(step, ranks, names, report(ranks, step, rng, true, groups)), groups);
    std::size_t checked = 0;
    for (const cf::Finding& f : r.findings) {
      ASSERT_EQ(f.state, cf::State::kSuspected) << "rank " << f.rank << " stage " << f.stage;
      const std::size_t gs = static_cast<std::size_t>(f.group) * kStages + static_cast<std::size_t>(f.stage);
      ASSERT_EQ(want.sigma.count(gs), 1u);
      EXPECT_EQ(f.facts.noise, want.sigma[gs]) << "group " << f.group << " stage " << f.stage;
      ++checked;
    }
    EXPECT_EQ(checked, kGroupSizes.size() * kStages);
  }
}
