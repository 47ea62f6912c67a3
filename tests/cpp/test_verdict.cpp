// The per-step verdict rule on hand-computed cases (core/thresholds.h, docs/ARCHITECTURE.md invariant 7).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "core/verdict.h"

namespace rs = relax_straggler::core;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// One-stage matrix: column of times per rank.
rs::StepMatrix column(const std::string& stage, std::vector<double> ms) {
  const auto n = static_cast<std::int32_t>(ms.size());
  return rs::StepMatrix::from_rows(7, n, {stage}, std::move(ms));
}

rs::VerdictConfig rfc(double floor_ms = 0.0) {
  rs::VerdictConfig c;
  c.noise_floor_ms = floor_ms;
  return c;
}

}  // namespace

TEST(Verdict, MeanReferenceRelativeRule) {
  // mean = (100+100+100+140)/4 = 110; 140 >= 1.2*110 = 132 -> straggler.
  auto v = rs::judge_step(column("forward", {100, 100, 100, 140}), rfc());
  const auto& s = v.stages[0];
  EXPECT_DOUBLE_EQ(s.ref_ms, 110.0);
  EXPECT_DOUBLE_EQ(s.max_ms, 140.0);
  EXPECT_EQ(s.top_rank, 3);
  EXPECT_DOUBLE_EQ(s.slowdown_ratio, 140.0 / 110.0);
  EXPECT_DOUBLE_EQ(s.relative_score, 110.0 / 140.0);
  EXPECT_EQ(s.stragglers, (std::vector<std::int32_t>{3}));
  EXPECT_EQ(v.likely_bottleneck, 0);
  EXPECT_EQ(v.step, 7);
}

TEST(Verdict, MedianReferenceIsRobustToTheOutlier) {
  // median = 100; 125 >= 120 -> straggler under median, but the mean (106.25) would give
  // 125 < 127.5 and 125 - 106.25 = 18.75 >= 5 -> also a straggler, by the absolute rule.
  auto cfg = rfc();
  cfg.reference = rs::Reference::kMedian;
  auto v = rs::judge_step(column("backward", {100, 100, 100, 125}), cfg);
  EXPECT_DOUBLE_EQ(v.stages[0].ref_ms, 100.0);
  EXPECT_EQ(v.stages[0].stragglers, (std::vector<std::int32_t>{3}));
  EXPECT_DOUBLE_EQ(v.stages[0].mean_ms, 106.25);
}

TEST(Verdict, AbsoluteThresholdOnlyCase) {
  // mean 201.5; 206 < 1.2 * 201.5 but 206 - 201.5 = 4.5 < 5 -> not a straggler;
  // 210 - 203.5 = 6.5 >= 5 -> straggler although 210 < 1.2 * 203.5.
  auto below = rs::judge_step(column("forward", {200, 200, 200, 206}), rfc());
  EXPECT_TRUE(below.stages[0].stragglers.empty());
  auto above = rs::judge_step(column("forward", {200, 200, 204, 210}), rfc());
  EXPECT_DOUBLE_EQ(above.stages[0].ref_ms, 203.5);
  EXPECT_EQ(above.stages[0].stragglers, (std::vector<std::int32_t>{3}));
}

TEST(Verdict, NaNRanksAreIgnored) {
  auto v = rs::judge_step(column("optimizer", {10, kNaN, 10, 30}), rfc());
  const auto& s = v.stages[0];
  EXPECT_EQ(s.ranks_reporting, 3);
  EXPECT_NEAR(s.ref_ms, 50.0 / 3.0, 1e-12);
  EXPECT_EQ(s.top_rank, 3);
  EXPECT_EQ(s.stragglers, (std::vector<std::int32_t>{3}));
}

TEST(Verdict, AllNaNStageHasNoTopRank) {
  auto v = rs::judge_step(column("data", {kNaN, kNaN}), rfc());
  EXPECT_EQ(v.stages[0].ranks_reporting, 0);
  EXPECT_EQ(v.stages[0].top_rank, -1);
  EXPECT_TRUE(std::isnan(v.stages[0].ref_ms));
  EXPECT_EQ(v.likely_bottleneck, -1);
  EXPECT_EQ(v.hints, "no stragglers");
}

TEST(Verdict, TiesPickTheLowestRank) {
  auto v = rs::judge_step(column("forward", {10, 50, 50, 10}), rfc());
  EXPECT_EQ(v.stages[0].top_rank, 1);
  EXPECT_EQ(v.stages[0].stragglers, (std::vector<std::int32_t>{1, 2}));
}

TEST(Verdict, OneRankIsNeverAStraggler) {
  auto v = rs::judge_step(column("forward", {123.0}), rfc());
  EXPECT_EQ(v.stages[0].top_rank, 0);
  EXPECT_DOUBLE_EQ(v.stages[0].slowdown_ratio, 1.0);
  EXPECT_TRUE(v.stages[0].stragglers.empty());
  EXPECT_EQ(v.likely_bottleneck, -1);
}

TEST(Verdict, AllEqualHasNoStragglerAndNoBottleneck) {
  auto v = rs::judge_step(column("forward", {40, 40, 40, 40}), rfc());
  EXPECT_TRUE(v.stages[0].stragglers.empty());
  EXPECT_DOUBLE_EQ(v.stages[0].relative_score, 1.0);
  EXPECT_EQ(v.likely_bottleneck, -1);
  EXPECT_EQ(v.num_stragglers(), 0);
}

TEST(Verdict, NoiseFloorSuppressesSubMillisecondJitter) {
  // 0.05 vs 0.08 ms trips the relative rule (0.08 >= 1.2 * 0.0575) under the bare RFC rule.
  auto bare = rs::judge_step(column("data", {0.05, 0.05, 0.05, 0.08}), rfc(0.0));
  EXPECT_EQ(bare.stages[0].stragglers, (std::vector<std::int32_t>{3}));
  auto floored = rs::judge_step(column("data", {0.05, 0.05, 0.05, 0.08}), rfc(1.0));
  EXPECT_TRUE(floored.stages[0].stragglers.empty());
  EXPECT_EQ(floored.likely_bottleneck, -1);
}

TEST(Verdict, CommunicationBlamesTheShortestDuration) {
  // Rank 2 arrives last: it waits ~0 ms while the others wait ~30 ms.
  auto v = rs::judge_step(column("communication", {31, 30, 0.5, 30}), rfc());
  const auto& s = v.stages[0];
  EXPECT_EQ(s.kind, rs::StageKind::kCommunication);
  EXPECT_EQ(s.top_rank, 2);
  EXPECT_EQ(s.stragglers, (std::vector<std::int32_t>{2}));
  EXPECT_DOUBLE_EQ(s.ref_ms, 22.875);
  EXPECT_DOUBLE_EQ(s.excess_ms, 22.375);
  EXPECT_NEAR(s.relative_score, 0.5 / 22.875, 1e-12);
  // The long durations of the waiting ranks are never flagged.
  EXPECT_EQ(v.likely_bottleneck, 0);
  EXPECT_NE(v.hints.find("rank 2 arrives last at communication"), std::string::npos);
}

TEST(Verdict, CommunicationOpsAreCommunicationStages) {
  EXPECT_EQ(rs::stage_kind_of("communication/allreduce"), rs::StageKind::kCommunication);
  EXPECT_EQ(rs::stage_kind_of("communication"), rs::StageKind::kCommunication);
  EXPECT_EQ(rs::stage_kind_of("communications"), rs::StageKind::kCompute);
  EXPECT_EQ(rs::stage_kind_of("forward"), rs::StageKind::kCompute);
}

TEST(Verdict, LateArrivalExplainedByComputeNamesTheComputeStage) {
  // Rank 2 is 30 ms slow in forward; the others wait ~30 ms in the gradient all-reduce.
  // The excesses are 22.5 ms (forward) and 22.1 ms; the late rank is the slow rank.
  auto m = rs::StepMatrix::from_rows(1, 4, {"forward", "communication"},
                                     {10, 30, 10, 30, 40, 0.5, 10, 30});
  auto v = rs::judge_step(m, rfc());
  EXPECT_EQ(v.stages[0].top_rank, 2);
  EXPECT_EQ(v.stages[1].top_rank, 2);
  EXPECT_EQ(v.likely_bottleneck, 0);
  EXPECT_NE(v.hints.find("rank 2 is slow in forward"), std::string::npos);
  EXPECT_NE(v.hints.find("stragglers also in communication"), std::string::npos);
}

TEST(Verdict, LateArrivalExplainedBySeveralComputeStages) {
  // Rank 1 is 10 ms behind in forward and 12 ms in backward; rank 0 waits 21.5 ms for it.
  // The compute excesses (5, 6 ms against the mean of 2 ranks) together cover the
  // communication excess (10.75 ms): backward, the larger, is named.
  auto m = rs::StepMatrix::from_rows(1, 2, {"forward", "backward", "communication"}, {10, 20, 22, 20, 32, 0.5});
  auto v = rs::judge_step(m, rfc());
  EXPECT_EQ(v.stages[2].top_rank, 1);
  EXPECT_EQ(v.likely_bottleneck, 1);
}

TEST(Verdict, UnexplainedLateArrivalNamesCommunication) {
  // Compute is balanced; rank 1 arrives late for another reason (data, a link).
  auto m = rs::StepMatrix::from_rows(1, 3, {"forward", "communication"}, {10, 20, 10.5, 0.2, 10, 20});
  auto v = rs::judge_step(m, rfc());
  EXPECT_EQ(v.likely_bottleneck, 1);
  EXPECT_EQ(v.stages[1].top_rank, 1);
}

TEST(Verdict, LikelyBottleneckIsArgmaxOfExcess) {
  // forward excess 10 - 7.5 = 2.5; backward 40 - 25 = 15.
  auto m = rs::StepMatrix::from_rows(1, 4, {"forward", "backward"}, {5, 20, 5, 20, 10, 40, 10, 20});
  auto v = rs::judge_step(m, rfc());
  EXPECT_EQ(v.likely_bottleneck, 1);
  EXPECT_EQ(v.stages[1].top_rank, 2);
}

TEST(Verdict, DistinctStragglerRanksAreCounted) {
  auto m = rs::StepMatrix::from_rows(1, 3, {"forward", "backward"}, {10, 10, 10, 10, 50, 100});
  auto v = rs::judge_step(m, rfc());
  EXPECT_EQ(v.num_stragglers(), 1);
}

TEST(Verdict, InvalidConfigNamesTheField) {
  auto m = column("forward", {1, 2});
  auto bad = rfc();
  bad.relative_threshold = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(
      {
        try {
          rs::judge_step(m, bad);
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("relative_threshold"), std::string::npos);
          throw;
        }
      },
      std::invalid_argument);
  bad = rfc();
  bad.absolute_ms_threshold = -1.0;
  EXPECT_THROW(rs::judge_step(m, bad), std::invalid_argument);
}

TEST(Verdict, MalformedMatrixThrows) {
  EXPECT_THROW(rs::StepMatrix::from_rows(0, 3, {"forward"}, {1.0, 2.0}), std::invalid_argument);
  rs::StepMatrix m = column("forward", {1, 2});
  m.ms.pop_back();
  EXPECT_THROW(rs::judge_step(m, rfc()), std::invalid_argument);
}

// Comparison groups: a 4-stage pipeline whose last stage does 1.5x the forward work (the
// loss) by design, two data-parallel replicas per stage (groups 0 0 1 1 2 2 3 3).
TEST(GroupedVerdict, StructuralDifferenceIsImbalanceNotStragglers) {
  const std::vector<std::int32_t> groups{0, 0, 1, 1, 2, 2, 3, 3};
  auto m = column("forward", {100, 100, 100, 100, 100, 100, 150, 150});
  // Ungrouped, the last stage's ranks are stragglers: mean 112.5, 150 >= 135.
  EXPECT_EQ(rs::judge_step(m, rfc()).stages[0].stragglers, (std::vector<std::int32_t>{6, 7}));
  auto v = rs::judge_step(m, rfc(), groups);
  const auto& s = v.stages[0];
  EXPECT_TRUE(s.stragglers.empty());
  EXPECT_DOUBLE_EQ(s.imbalance_ratio, 1.5);
  EXPECT_DOUBLE_EQ(s.mean_ms, 112.5);  // over all ranks
  EXPECT_EQ(s.ranks_reporting, 8);
  EXPECT_EQ(v.likely_bottleneck, -1);
  EXPECT_NE(v.hints.find("structural imbalance in forward: 1.50x"), std::string::npos) << v.hints;
}

TEST(GroupedVerdict, IndividualStragglerJudgedAgainstItsGroup) {
  // Rank 2 (group 1) takes 130 against its peer's 100: group mean 115, 130 < 138 but
  // 130 - 115 = 15 >= 5 ms. Rank 7 (150, the last stage's normal time) is not flagged.
  const std::vector<std::int32_t> groups{0, 0, 1, 1, 2, 2, 3, 3};
  auto v = rs::judge_step(column("forward", {100, 100, 130, 100, 100, 100, 150, 150}), rfc(), groups);
  const auto& s = v.stages[0];
  EXPECT_EQ(s.stragglers, (std::vector<std::int32_t>{2}));
  EXPECT_EQ(s.top_rank, 2);  // a row id of the whole matrix
  EXPECT_DOUBLE_EQ(s.ref_ms, 115.0);  // its group's reference
  EXPECT_DOUBLE_EQ(s.max_ms, 130.0);
  EXPECT_DOUBLE_EQ(s.excess_ms, 15.0);
  EXPECT_NEAR(s.slowdown_ratio, 130.0 / 115.0, 1e-12);
  EXPECT_EQ(v.likely_bottleneck, 0);
  EXPECT_NE(v.hints.find("rank 2 is slow in forward: 130.0 ms vs group mean 115.0 ms"), std::string::npos) << v.hints;
}

TEST(GroupedVerdict, CommunicationLateArrivalWithinGroup) {
  // Group 1's all-reduce waits on rank 3 (shortest); group 0 is balanced.
  const std::vector<std::int32_t> groups{0, 0, 1, 1, 1};
  auto v = rs::judge_step(column("communication", {20, 20, 40, 5, 40}), rfc(), groups);
  const auto& s = v.stages[0];
  EXPECT_EQ(s.top_rank, 3);
  EXPECT_EQ(s.stragglers, (std::vector<std::int32_t>{3}));
  EXPECT_DOUBLE_EQ(s.excess_ms, 85.0 / 3.0 - 5.0);
  EXPECT_TRUE(std::isnan(s.imbalance_ratio));  // waiting, not work
}

TEST(GroupedVerdict, OneGroupIsTheUngroupedVerdict) {
  auto m = column("backward", {100, 100, 100, 140});
  auto a = rs::judge_step(m, rfc());
  auto b = rs::judge_step(m, rfc(), {3, 3, 3, 3});
  EXPECT_EQ(a.stages[0].stragglers, b.stages[0].stragglers);
  EXPECT_EQ(a.stages[0].top_rank, b.stages[0].top_rank);
  EXPECT_DOUBLE_EQ(a.stages[0].ref_ms, b.stages[0].ref_ms);
  EXPECT_EQ(a.hints, b.hints);
  EXPECT_TRUE(std::isnan(b.stages[0].imbalance_ratio));
}

TEST(GroupedVerdict, StageRunByOneGroupOnly) {
  // The data stage runs on the first pipeline stage only: no imbalance to report.
  const std::vector<std::int32_t> groups{0, 0, 1, 1};
  auto v = rs::judge_step(column("data", {3, 3, kNaN, kNaN}), rfc(), groups);
  EXPECT_EQ(v.stages[0].ranks_reporting, 2);
  EXPECT_TRUE(std::isnan(v.stages[0].imbalance_ratio));
  EXPECT_DOUBLE_EQ(v.stages[0].mean_ms, 3.0);
}

TEST(GroupedVerdict, RejectsBadGroups) {
  auto m = column("forward", {1, 2, 3});
  EXPECT_THROW(rs::judge_step(m, rfc(), {0, 1}), std::invalid_argument);
  EXPECT_THROW(rs::judge_step(m, rfc(), {0, -1, 1}), std::invalid_argument);
}

TEST(GroupedVerdict, StageSpeaksForAGroupWithAStraggler) {
  // Group 0 (~10 ms) has a straggler, rank 3 (14 >= 11 x 1.2); group 1 (~200 ms) only has
  // noise, rank 7 at 206 (4.5 ms over its group, below both thresholds) but a larger
  // excess. The stage's top rank and the hint name the straggler, as ungrouped.
  const std::vector<std::int32_t> groups{0, 0, 0, 0, 1, 1, 1, 1};
  auto v = rs::judge_step(column("forward", {10, 10, 10, 14, 200, 200, 200, 206}), rfc(), groups);
  const auto& s = v.stages[0];
  EXPECT_EQ(s.stragglers, (std::vector<std::int32_t>{3}));
  EXPECT_EQ(s.top_rank, 3);
  EXPECT_DOUBLE_EQ(s.ref_ms, 11.0);
  EXPECT_DOUBLE_EQ(s.excess_ms, 3.0);
  EXPECT_NE(v.hints.find("rank 3 is slow in forward: 14.0 ms vs group mean 11.0 ms"), std::string::npos) << v.hints;
}

TEST(GroupedVerdict, TiesNameTheLowestRank) {
  // Group ids not in rank order; no spread anywhere: rank 0, as ungrouped.
  auto v = rs::judge_step(column("forward", {100, 120, 100, 120}), rfc(), {1, 0, 1, 0});
  EXPECT_EQ(v.stages[0].top_rank, 0);
}

TEST(GroupedVerdict, StragglerIsNotStructuralImbalance) {
  // Balanced pipeline stages (100 ms), one slow GPU (rank 3): its own slowness must not
  // come back as imbalance between the groups (group 1's mean is 150 with it, 100 without).
  auto v = rs::judge_step(column("forward", {100, 100, 100, 200}), rfc(), {0, 0, 1, 1});
  const auto& s = v.stages[0];
  EXPECT_EQ(s.stragglers, (std::vector<std::int32_t>{3}));
  EXPECT_DOUBLE_EQ(s.imbalance_ratio, 1.0);
  EXPECT_EQ(v.hints.find("structural imbalance"), std::string::npos) << v.hints;
  // Heavier stage and a straggler in it: the imbalance is the healthy ranks' (150 / 100).
  v = rs::judge_step(column("forward", {100, 100, 150, 150, 150, 300}), rfc(), {0, 0, 1, 1, 1, 1});
  EXPECT_EQ(v.stages[0].stragglers, (std::vector<std::int32_t>{5}));
  EXPECT_DOUBLE_EQ(v.stages[0].imbalance_ratio, 1.5);
}

// One rule for values that are no time (docs/ARCHITECTURE.md, data contract): 0 ("not
// timed"), +inf, -inf and negatives are judged as "not run", like NaN, the last three
// counted; before, one +inf made the reference inf (nobody flagged) and one -inf or 0
// flagged every healthy rank.
TEST(Verdict, ValuesThatAreNoTimeAreNotRunAndCounted) {
  const double inf = std::numeric_limits<double>::infinity();
  for (const rs::Reference ref : {rs::Reference::kMean, rs::Reference::kMedian}) {
    for (const double bad : {inf, -inf, -5.0, 0.0}) {
      rs::VerdictConfig cfg = rfc();
      cfg.reference = ref;
      for (const char* stage : {"forward", "communication"}) {
        const auto v = rs::judge_step(column(stage, {100, 100, 100, 101, bad}), cfg);
        const auto want = rs::judge_step(column(stage, {100, 100, 100, 101, kNaN}), cfg);
        EXPECT_EQ(v.stages[0].stragglers, want.stages[0].stragglers) << stage << " " << bad;
        EXPECT_TRUE(v.stages[0].stragglers.empty()) << stage << " " << bad;
        EXPECT_DOUBLE_EQ(v.stages[0].ref_ms, want.stages[0].ref_ms) << stage << " " << bad;
        EXPECT_EQ(v.stages[0].ranks_reporting, 4);
        EXPECT_EQ(v.unusable_cells, bad == 0.0 ? 0 : 1);
        EXPECT_EQ(want.unusable_cells, 0);
      }
    }
  }
  // A slow rank beside a rank with an infinite time is still found.
  const auto v = rs::judge_step(column("forward", {100, 100, 100, 150, inf}), rfc());
  EXPECT_EQ(v.stages[0].stragglers, (std::vector<std::int32_t>{3}));
}
