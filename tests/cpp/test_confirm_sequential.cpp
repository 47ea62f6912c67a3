// The sequential test (core/confirm/sequential.h): its score is a likelihood ratio with
// mean 1 over the places (ties included), its level is log(cells / budget), the CUSUM
// matches a plain recomputation of the rule (places counted peer by peer) on groups with
// ties, stages not run and sampled references; and in the tracker it confirms a rank 8 %
// slower under 30 % uniform jitter (which no single report shows) within 30 reports, names
// nobody in healthy uniform or heavy-tailed jitter, and is off at sequential_budget 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/confirm/sequential.h"
#include "core/confirm/tracker.h"

namespace rs = relax_straggler::core;
namespace cf = relax_straggler::core::confirm;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// e(q) written out from the rule: exp(tilt q / k) over its mean across the k + 1 places.
double score(std::int32_t q, std::int32_t k) {
  double mean = 0.0;
  for (std::int32_t i = 0; i <= k; ++i) mean += std::exp(cf::kSequentialTilt * i / k);
  mean /= k + 1;
  return std::exp(cf::kSequentialTilt * q / k) / mean;
}

TEST(SequentialScore, IsALikelihoodRatioWithMeanOne) {
  for (std::int32_t k = 1; k <= 40; ++k) {
    double mean = 0.0;
    for (std::int32_t q = 0; q <= k; ++q) mean += std::exp(cf::sequential_log_score(q, q, k));
    EXPECT_NEAR(mean / (k + 1), 1.0, 1e-12) << k << " peers";
    // The slowest place scores most, the fastest least.
    EXPECT_GT(cf::sequential_log_score(k, k, k), 0.0);
    EXPECT_LT(cf::sequential_log_score(0, 0, k), 0.0);
  }
  // Group of four: top 2.7, bottom 0.1 (the header's figures).
  EXPECT_NEAR(std::exp(cf::sequential_log_score(3, 3, 3)), 2.70, 0.01);
  EXPECT_NEAR(std::exp(cf::sequential_log_score(0, 0, 3)), 0.10, 0.01);
  // Ties take the mean of their places: all tied scores exactly 1.
  EXPECT_NEAR(cf::sequential_log_score(0, 5, 5), 0.0, 1e-12);
  EXPECT_NEAR(std::exp(cf::sequential_log_score(1, 2, 4)), (score(1, 4) + score(2, 4)) / 2, 1e-12);
  EXPECT_THROW(cf::sequential_log_score(0, 0, 0), std::invalid_argument);
  EXPECT_THROW(cf::sequential_log_score(2, 1, 3), std::invalid_argument);
  EXPECT_THROW(cf::sequential_log_score(0, 4, 3), std::invalid_argument);
}

TEST(SequentialThreshold, IsTheLogOfCellsOverBudget) {
  EXPECT_DOUBLE_EQ(cf::sequential_threshold(16, 1e-3), std::log(16000.0));
  EXPECT_THROW(cf::sequential_threshold(0, 1e-3), std::invalid_argument);
  EXPECT_THROW(cf::sequential_threshold(4, 0.0), std::invalid_argument);
  EXPECT_THROW(cf::sequential_threshold(4, 1.0), std::invalid_argument);
}

// SequentialEvidence::add against the rule recomputed peer by peer: place = peers faster,
// ties spread over the places they share, own time left out of a sample that holds it.
TEST(SequentialEvidence, MatchesTheRuleRecomputedPeerByPeer) {
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int> coarse(0, 6);  // few distinct values: many ties
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const std::size_t S = 2, ranks = 12;
  // Rows 0..11 of one group; the sample is every other row (a sampled reference).
  std::vector<std::int32_t> rows(ranks), sample;
  std::vector<char> in_sample(ranks, 0);
  for (std::size_t r = 0; r < ranks; ++r) rows[r] = static_cast<std::int32_t>(r);
  for (std::size_t r = 0; r < ranks; r += 2) sample.push_back(static_cast<std::int32_t>(r)), in_sample[r] = 1;
  const double cap = 6.0;
  cf::SequentialEvidence ev;
  ev.reset(ranks, S);
  std::vector<double> want(ranks * S, 0.0);
  for (int report = 0; report < 300; ++report) {
    std::vector<double> ms(ranks * S);
    for (double& t : ms) t = u(rng) < 0.1 ? kNaN : 10.0 + coarse(rng);
    for (std::size_t s = 0; s < S; ++s) {
      ev.add(ms.data(), S, s, rows.data(), ranks, sample.data(), sample.size(), in_sample, cap);
      for (std::size_t r = 0; r < ranks; ++r) {
        const double t = ms[r * S + s];
        if (std::isnan(t)) continue;
        std::int32_t faster = 0, tied = 0, peers = 0;
        for (std::int32_t p : sample) {
          const double x = ms[static_cast<std::size_t>(p) * S + s];
          if (static_cast<std::size_t>(p) == r || std::isnan(x)) continue;
          ++peers;
          faster += x < t;
          tied += x == t;
        }
        if (peers == 0) continue;
        double e = 0.0;
        for (std::int32_t q = faster; q <= faster + tied; ++q) e += score(q, peers);
        want[r * S + s] = std::clamp(want[r * S + s] + std::log(e / (tied + 1)), 0.0, cap);
      }
    }
    for (std::size_t r = 0; r < ranks; ++r) {
      for (std::size_t s = 0; s < S; ++s) ASSERT_NEAR(ev.level(r, s), want[r * S + s], 1e-9) << report << " " << r;
    }
  }
}

// The 4-rank jitter model of benchmarks/detection_quality.py: forward 7.5 ms + a sleep,
// backward 38, optimizer 5, data 1, the all-reduce waiting for the last rank.
std::vector<double> jitter_report(std::mt19937_64& rng, bool heavy, double extra_ms) {
  std::uniform_real_distribution<double> sleep(0.0, 15.0), u(0.0, 1.0);
  std::lognormal_distribution<double> spread(std::log(6.0), 0.5);
  std::normal_distribution<double> z(0.0, 1.0);
  const std::vector<std::string> names = {"forward", "backward", "optimizer", "communication", "data"};
  std::vector<double> ms(4 * 5);
  double last = 0.0;
  std::vector<double> arrive(4);
  for (std::size_t r = 0; r < 4; ++r) {
    double fwd = 7.5;
    if (heavy) {
      fwd += spread(rng);
      if (u(rng) < 0.03) fwd += 15.0 / std::pow(1.0 - u(rng), 1.0 / 1.5);  // Pareto, shape 1.5
    } else {
      fwd += sleep(rng);
    }
    if (r == 2) fwd += extra_ms;
    ms[r * 5 + 0] = fwd;
    ms[r * 5 + 1] = 38.0 * std::exp(0.03 * z(rng));
    ms[r * 5 + 2] = 5.0 * std::exp(0.03 * z(rng));
    ms[r * 5 + 4] = 1.0 * std::exp(0.1 * z(rng));
    arrive[r] = ms[r * 5 + 0] + ms[r * 5 + 1] + ms[r * 5 + 4];
    last = std::max(last, arrive[r]);
  }
  for (std::size_t r = 0; r < 4; ++r) ms[r * 5 + 3] = 25.0 * std::exp(0.08 * z(rng)) + last - arrive[r];
  return ms;
}

// Runs 20 warm reports, then `reports` more with rank 2 extra_ms slower in forward; returns
// the first report (from the onset) at which rank 2 is a straggler, -1 if never, and fails
// on any other rank named.
int first_confirmed(std::uint64_t seed, bool heavy, double extra_ms, double budget, int reports,
                    bool* by_sequential = nullptr) {
  cf::ConfirmConfig cfg;
  cfg.sequential_budget = budget;
  cf::ConfirmTracker tracker(cfg);
  std::mt19937_64 rng(seed);
  const std::vector<std::string> names = {"forward", "backward", "optimizer", "communication", "data"};
  int first = -1;
  for (int i = 0; i < 20 + reports; ++i) {
    const int after = i - 20;
    const cf::ConfirmResult res =
        tracker.update(rs::StepMatrix::from_rows(i, 4, names, jitter_report(rng, heavy, after >= 0 ? extra_ms : 0.0)));
    for (const cf::Finding& f : res.findings) {
      if (f.state != cf::State::kStraggler) continue;
      EXPECT_TRUE(f.rank == 2 && after >= 0 && extra_ms > 0.0)
          << "seed " << seed << " report " << i << ": rank " << f.rank << " named in " << f.stage_name;
      if (f.rank == 2 && first < 0 && after >= 0) {
        first = after;
        if (by_sequential != nullptr) *by_sequential = f.by_sequential;
      }
    }
  }
  return first;
}

TEST(ConfirmSequential, FindsAnEightPercentRankUnderUniformJitterWithin30Reports) {
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    bool sequential = false;
    const int first = first_confirmed(seed, false, 7.3, 1e-3, 60, &sequential);
    EXPECT_GE(first, 0) << "seed " << seed;
    EXPECT_LE(first, 30) << "seed " << seed;
    EXPECT_TRUE(sequential) << "seed " << seed;
    // Off: the per-report rules never see it.
    EXPECT_EQ(first_confirmed(seed, false, 7.3, 0.0, 60), -1) << "seed " << seed;
  }
}

TEST(ConfirmSequential, NamesNobodyInHealthyJitter) {
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    EXPECT_EQ(first_confirmed(seed, false, 0.0, 1e-3, 300), -1);
    EXPECT_EQ(first_confirmed(seed, true, 0.0, 1e-3, 300), -1);
  }
}

TEST(ConfirmSequential, RejectsABudgetOutsideZeroToOne) {
  cf::ConfirmConfig cfg;
  cfg.sequential_budget = 1.0;
  EXPECT_THROW(cf::ConfirmTracker{cfg}, std::invalid_argument);
  cfg.sequential_budget = -1e-3;
  EXPECT_THROW(cf::ConfirmTracker{cfg}, std::invalid_argument);
}

}  // namespace
