// Window features, voting and the full window detector on generated windows.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/detect/ensemble.h"

namespace rd = relax_straggler::core::detect;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// steps x ranks x {forward, backward, optimizer, communication} with 2 % log-normal
// jitter. compute_factor[r] scales rank r's compute stages; a slow rank arrives late to
// the collective, so its communication time shrinks by the time the others wait for it.
struct Scenario {
  std::int64_t steps = 60;
  std::int32_t ranks = 32;
  std::vector<double> compute_factor;
  std::vector<double> comm_factor;
  std::uint64_t seed = 11;

  std::vector<std::string> stages() const { return {"forward", "backward", "optimizer", "communication"}; }

  std::vector<double> generate() const {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> noise(0.0, 0.02);
    const double base[4] = {50.0, 100.0, 10.0, 30.0};
    std::vector<double> ms;
    for (std::int64_t s = 0; s < steps; ++s) {
      for (std::int32_t r = 0; r < ranks; ++r) {
        const double cf = compute_factor.empty() ? 1.0 : compute_factor[static_cast<std::size_t>(r)];
        const double mf = comm_factor.empty() ? 1.0 : comm_factor[static_cast<std::size_t>(r)];
        for (int j = 0; j < 4; ++j) ms.push_back(base[j] * (j == 3 ? mf : cf) * std::exp(noise(rng)));
      }
    }
    return ms;
  }
};

Scenario straggler(std::int32_t rank, double slowdown) {
  Scenario s;
  s.compute_factor.assign(static_cast<std::size_t>(s.ranks), 1.0);
  s.comm_factor.assign(static_cast<std::size_t>(s.ranks), 1.0);
  s.compute_factor[static_cast<std::size_t>(rank)] = 1.0 + slowdown;
  // The others wait (base compute 160 ms x slowdown) inside the 30 ms collective.
  for (std::int32_t r = 0; r < s.ranks; ++r) {
    if (r != rank) s.comm_factor[static_cast<std::size_t>(r)] = 1.0 + 160.0 * slowdown / 30.0;
  }
  return s;
}

rd::WindowResult detect(const Scenario& s, const std::vector<double>& ms, const rd::WindowConfig& c = {},
                        const std::vector<std::int32_t>& nodes = {}, const std::vector<std::int32_t>& groups = {}) {
  return rd::detect_window(rd::WindowView::of(ms.data(), s.steps, s.ranks, s.stages()), c, nodes, groups);
}

}  // namespace

TEST(DetectFeatures, WarmupCoverageAndSpread) {
  // 3 ranks x 2 stages x 4 steps; step 0 is warm-up with a huge value that must not count.
  const std::vector<double> ms{
      1000, 5, 1000, 5, 1000, 5,   // step 0
      10, 5, 11, 5, 30, kNaN,      // step 1
      12, 5, 13, 5, 30, 0.0,       // step 2
      14, 5, 15, 5, 30, kNaN,      // step 3
  };
  const auto view = rd::WindowView::of(ms.data(), 4, 3, {"forward", "data"});
  rd::FeatureOptions o;
  o.warmup_steps = 1;
  auto f = rd::compute_features(view, o);
  EXPECT_EQ(f.steps_used, 3);
  ASSERT_EQ(f.stages.size(), 1u);  // "data": rank 2 never ran it after warm-up -> coverage gap
  EXPECT_EQ(f.status[1], rd::StageStatus::kCoverageGap);
  const auto& raw = f.stages[0].raw;
  EXPECT_DOUBLE_EQ(raw(0, rd::kMinMs), 10.0);
  EXPECT_DOUBLE_EQ(raw(0, rd::kMaxMs), 14.0);
  EXPECT_DOUBLE_EQ(raw(0, rd::kRangeMs), 4.0);
  EXPECT_DOUBLE_EQ(raw(0, rd::kMeanMs), 12.0);
  rd::filter_and_scale(f, o);
  ASSERT_EQ(f.stages.size(), 1u);
  EXPECT_NEAR(f.relative_spread[0], (30.0 - 12.0) / ((12.0 + 13.0 + 30.0) / 3.0), 1e-12);
  // Scaled columns have median 0.
  EXPECT_DOUBLE_EQ(f.stages[0].scaled(1, rd::kMeanMs), 0.0);
  // A uniform stage is dropped for low spread.
  o.min_relative_spread = 5.0;
  auto g = rd::compute_features(view, o);
  rd::filter_and_scale(g, o);
  EXPECT_TRUE(g.stages.empty());
  EXPECT_EQ(g.status[0], rd::StageStatus::kLowSpread);
  o.min_coverage = 0.0;
  EXPECT_THROW(rd::compute_features(view, o), std::invalid_argument);
}

TEST(DetectFeatures, UpperTrimSetsHiccupsAside) {
  // 2 ranks x 1 stage x 40 steps: rank 0 has one 100 ms hiccup among 10 ms steps.
  std::vector<double> ms;
  for (int s = 0; s < 40; ++s) {
    ms.push_back(s == 17 ? 100.0 : 10.0 + 0.01 * s);
    ms.push_back(10.0 + 0.01 * s);
  }
  const auto view = rd::WindowView::of(ms.data(), 40, 2, {"forward"});
  rd::FeatureOptions o;
  o.warmup_steps = 0;
  o.trim_fraction = 0.05;  // floor(0.05 x 40) = 2 largest set aside
  const auto f = rd::compute_features(view, o);
  const auto& raw = f.stages[0].raw;
  EXPECT_DOUBLE_EQ(raw(0, rd::kMaxMs), 10.0 + 0.01 * 38);  // 100 and 10.39 set aside
  EXPECT_DOUBLE_EQ(raw(1, rd::kMaxMs), 10.0 + 0.01 * 37);
  // Rank 0 keeps 10.38 where rank 1 keeps 10.17: means differ by 0.21 / 38 kept steps.
  EXPECT_NEAR(raw(0, rd::kMeanMs) - raw(1, rd::kMeanMs), 0.21 / 38.0, 1e-9);
  EXPECT_DOUBLE_EQ(raw(0, rd::kMinMs), 10.0);
  o.trim_fraction = 0.0;
  const auto g = rd::compute_features(view, o);
  EXPECT_DOUBLE_EQ(g.stages[0].raw(0, rd::kMaxMs), 100.0);
  EXPECT_NEAR(g.stages[0].raw(0, rd::kMeanMs) - g.stages[0].raw(1, rd::kMeanMs), (100.0 - 10.17) / 40.0, 1e-9);
}

TEST(DetectFlags, MinorityRulesAndCommunicationDirections) {
  // Features [min, max, range, mean] of 6 ranks; labels put ranks 4, 5 apart.
  rd::PointMatrix f(6, rd::kNumFeatures);
  for (int r = 0; r < 6; ++r) f.row(r) << 10.0, 11.0, 1.0, 10.5;
  f.row(4) << 10.0, 14.0, 4.0, 12.0;  // waits longer, same floor
  f.row(5) << 13.0, 14.0, 1.0, 13.5;  // everything longer
  const rd::Labels labels{0, 0, 0, 0, 1, 2};
  rd::SlowClusterOptions o;
  const auto compute = rd::flag_ranks(labels, f, relax_straggler::core::StageKind::kCompute, o);
  EXPECT_EQ(compute, (std::vector<rd::Flag>{rd::Flag::kNone, rd::Flag::kNone, rd::Flag::kNone, rd::Flag::kNone,
                                            rd::Flag::kSlow, rd::Flag::kSlow}));
  // Communication: a longer mean without a higher minimum is waiting, not a slow link.
  const auto comm = rd::flag_ranks(labels, f, relax_straggler::core::StageKind::kCommunication, o);
  EXPECT_EQ(comm[4], rd::Flag::kNone);
  EXPECT_EQ(comm[5], rd::Flag::kSlow);
  // Shorter than the body: the late arrival.
  f.row(5) << 5.0, 6.0, 1.0, 5.5;
  EXPECT_EQ(rd::flag_ranks(labels, f, relax_straggler::core::StageKind::kCommunication, o)[5], rd::Flag::kLateArrival);
  EXPECT_EQ(rd::flag_ranks(labels, f, relax_straggler::core::StageKind::kCompute, o)[5], rd::Flag::kNone);
  // A majority is never the slow group; nor is a group too small to matter.
  const rd::Labels half{0, 0, 0, 1, 1, 1};
  EXPECT_EQ(rd::flag_ranks(half, f, relax_straggler::core::StageKind::kCompute, o)[4], rd::Flag::kNone);
  o.min_slowdown = 0.5;
  f.row(5) << 13.0, 14.0, 1.0, 13.5;
  EXPECT_EQ(rd::flag_ranks(labels, f, relax_straggler::core::StageKind::kCompute, o)[5], rd::Flag::kNone);
  o.max_slow_fraction = 1.0;
  EXPECT_THROW(o.validate(), std::invalid_argument);
}

TEST(DetectFeatures, AbsentRankIsNotACoverageGap) {
  std::vector<double> ms;
  for (int s = 0; s < 20; ++s) {
    for (int r = 0; r < 4; ++r) {
      ms.push_back(r == 3 ? kNaN : 10.0 + r);
    }
  }
  auto f = rd::compute_features(rd::WindowView::of(ms.data(), 20, 4, {"forward"}), rd::FeatureOptions{});
  EXPECT_EQ(f.absent_ranks, std::vector<std::int32_t>{3});
  EXPECT_EQ(f.ranks.size(), 3u);
  EXPECT_EQ(f.status[0], rd::StageStatus::kKept);
}

TEST(DetectVoting, HalfOfTheStagesItRan) {
  using rd::Flag;
  rd::VoteInput in;
  // One algorithm, two kept stages, three ranks.
  in.flags = {{{Flag::kSlow, Flag::kSlow, Flag::kNone}, {Flag::kSlow, Flag::kNone, Flag::kNone}}};
  in.kept_weight = {1.0, 1.0};
  in.ran_all = {2.0, 2.0, 2.0};
  rd::VoteOptions o;
  o.min_votes = 1;
  auto out = rd::tally(in, o);
  EXPECT_EQ(out.votes, (std::vector<std::int32_t>{1, 1, 0}));
  // Rank 1 ran 5 stages before filtering: 1 vote < 2.5.
  in.ran_all = {2.0, 5.0, 2.0};
  out = rd::tally(in, o);
  EXPECT_EQ(out.votes, (std::vector<std::int32_t>{1, 0, 0}));
  EXPECT_EQ(out.anomalies, std::vector<std::size_t>{0});
  // Weights: the second stage counts triple, rank 1 now has 1 of 4.
  in.kept_weight = {1.0, 3.0};
  in.ran_all = {4.0, 4.0, 4.0};
  out = rd::tally(in, o);
  EXPECT_EQ(out.votes, (std::vector<std::int32_t>{1, 0, 0}));
}

TEST(DetectVoting, MostVotesAndAtLeast) {
  using rd::Flag;
  rd::VoteInput in;
  const std::vector<Flag> r01{Flag::kSlow, Flag::kSlow, Flag::kNone};
  const std::vector<Flag> r0{Flag::kSlow, Flag::kNone, Flag::kNone};
  in.flags = {{r01}, {r01}, {r0}};
  in.kept_weight = {1.0};
  in.ran_all = {1.0, 1.0, 1.0};
  rd::VoteOptions o;
  o.min_votes = 2;
  EXPECT_EQ(rd::tally(in, o).anomalies, std::vector<std::size_t>{0});
  o.rule = rd::VoteRule::kAtLeast;
  EXPECT_EQ(rd::tally(in, o).anomalies, (std::vector<std::size_t>{0, 1}));
  o.min_votes = 4;
  EXPECT_TRUE(rd::tally(in, o).anomalies.empty());
  o.min_votes = 0;
  EXPECT_THROW(rd::tally(in, o), std::invalid_argument);
}

TEST(DetectWindow, HealthyRunHasNoAnomaly) {
  Scenario s;
  const auto ms = s.generate();
  const auto r = detect(s, ms);
  EXPECT_TRUE(r.anomalies.empty());
  EXPECT_TRUE(r.link_suspects.empty());
  EXPECT_EQ(r.steps_used, 50);
  for (const auto& st : r.stages) EXPECT_EQ(st.status, rd::StageStatus::kLowSpread) << st.stage;
  for (auto v : r.votes) EXPECT_EQ(v, 0);
}

TEST(DetectWindow, FindsTheStragglerWithEveryAlgorithm) {
  const Scenario s = straggler(13, 0.10);
  const auto ms = s.generate();
  const std::vector<std::int32_t> nodes = [&] {
    std::vector<std::int32_t> n;
    for (std::int32_t r = 0; r < s.ranks; ++r) n.push_back(r / 8);
    return n;
  }();
  const auto r = detect(s, ms, {}, nodes);
  ASSERT_EQ(r.anomaly_ranks(), std::vector<std::int32_t>{13});
  EXPECT_EQ(r.anomalies[0].votes, 6);
  EXPECT_EQ(r.anomalies[0].node, 1);
  EXPECT_EQ(r.anomaly_nodes, std::vector<std::int32_t>{1});
  EXPECT_EQ(r.anomalies[0].stages, (std::vector<std::string>{"forward", "backward", "optimizer", "communication"}));
  for (const auto& a : r.algorithms) EXPECT_EQ(a.slow_ranks, std::vector<std::int32_t>{13}) << rd::algorithm_name(a.algorithm);
  // In the collective the straggler is the late arrival (docs/ARCHITECTURE.md invariant 7), not a slow link.
  for (const auto& as : r.stages[3].algorithms) {
    EXPECT_EQ(as.late_ranks, std::vector<std::int32_t>{13});
    EXPECT_TRUE(as.slow_ranks.empty());
  }
  EXPECT_TRUE(r.link_suspects.empty());
}

TEST(DetectWindow, SlowLinkIsNotAStraggler) {
  Scenario s;
  s.comm_factor.assign(static_cast<std::size_t>(s.ranks), 1.0);
  s.comm_factor[5] = 1.5;
  const auto ms = s.generate();
  const auto r = detect(s, ms);
  EXPECT_TRUE(r.anomalies.empty());
  EXPECT_EQ(r.link_suspects, std::vector<std::int32_t>{5});
}

TEST(DetectWindow, PipelineStageImbalanceIsNotIndividualStragglers) {
  // Ranks 24..31 (the last of 4 pipeline stages) are 30 % slower by design.
  Scenario s;
  s.compute_factor.assign(static_cast<std::size_t>(s.ranks), 1.0);
  std::vector<std::int32_t> groups;
  for (std::int32_t r = 0; r < s.ranks; ++r) {
    groups.push_back(r / 8);
    if (r >= 24) s.compute_factor[static_cast<std::size_t>(r)] = 1.3;
  }
  const auto ms = s.generate();
  EXPECT_FALSE(detect(s, ms).anomalies.empty());  // without the map they look like a slow group
  const auto r = detect(s, ms, {}, {}, groups);
  EXPECT_TRUE(r.anomalies.empty());
  ASSERT_EQ(r.imbalance.size(), 3u);  // forward, backward, optimizer
  EXPECT_EQ(r.imbalance[0].slowest_group, 3);
  EXPECT_NEAR(r.imbalance[0].ratio, 1.3, 0.02);
}

TEST(DetectWindow, SummarisesManyRanksWithoutLosingTheStraggler) {
  Scenario s;
  s.ranks = 2048;
  s.steps = 20;
  s.compute_factor.assign(2048, 1.0);
  s.comm_factor.assign(2048, 1.0 + 160.0 * 0.5 / 30.0);
  s.compute_factor[1500] = 1.5;
  s.comm_factor[1500] = 1.0;
  const auto ms = s.generate();
  rd::WindowConfig c;
  c.max_points = 128;
  const auto r = detect(s, ms, c);
  EXPECT_EQ(r.anomaly_ranks(), std::vector<std::int32_t>{1500});
}

TEST(DetectWindow, DeterministicForAFixedSeed) {
  const Scenario s = straggler(3, 0.05);
  const auto ms = s.generate();
  const auto a = detect(s, ms);
  const auto b = detect(s, ms);
  EXPECT_EQ(a.votes, b.votes);
  for (std::size_t j = 0; j < a.stages.size(); ++j) {
    for (std::size_t k = 0; k < a.stages[j].algorithms.size(); ++k) {
      EXPECT_EQ(a.stages[j].algorithms[k].chosen, b.stages[j].algorithms[k].chosen);
    }
  }
}

TEST(DetectWindow, ThreadsDoNotChangeTheResult) {
  const Scenario s = straggler(21, 0.08);
  const auto ms = s.generate();
  rd::WindowConfig two;
  two.threads = 2;
  const auto a = detect(s, ms);
  const auto b = detect(s, ms, two);
  EXPECT_EQ(a.votes, b.votes);
  EXPECT_EQ(a.anomaly_ranks(), b.anomaly_ranks());
  ASSERT_EQ(a.anomaly_ranks(), std::vector<std::int32_t>{21});
  for (std::size_t j = 0; j < a.stages.size(); ++j) {
    for (std::size_t k = 0; k < a.stages[j].algorithms.size(); ++k) {
      EXPECT_EQ(a.stages[j].algorithms[k].slow_ranks, b.stages[j].algorithms[k].slow_ranks);
    }
  }
}

TEST(DetectWindow, RejectsBadInput) {
  Scenario s;
  const auto ms = s.generate();
  rd::WindowConfig c;
  c.algorithms.clear();
  EXPECT_THROW(detect(s, ms, c), std::invalid_argument);
  c = {};
  c.stage_weights["forward"] = -1.0;
  EXPECT_THROW(detect(s, ms, c), std::invalid_argument);
  EXPECT_THROW(detect(s, ms, {}, {0, 1}), std::invalid_argument);
  EXPECT_THROW(rd::algorithm_from_name("kmedoids"), std::invalid_argument);
  EXPECT_EQ(rd::algorithm_from_name("mean_shift"), rd::Algorithm::kMeanShift);
}

TEST(DetectWindow, StackedStepMatricesMatchTheView) {
  namespace rc = relax_straggler::core;
  std::vector<rc::StepMatrix> steps;
  for (int s = 0; s < 3; ++s) steps.push_back(rc::StepMatrix::from_rows(s, 2, {"forward"}, {1.0 + s, 2.0 + s}));
  const rd::Window w = rd::Window::stack(steps);
  EXPECT_EQ(w.view.num_steps, 3);
  EXPECT_DOUBLE_EQ(w.view.at(2, 1, 0), 4.0);
  steps.push_back(rc::StepMatrix::from_rows(3, 3, {"forward"}, {1.0, 1.0, 1.0}));
  EXPECT_THROW(rd::Window::stack(steps), std::invalid_argument);
}
