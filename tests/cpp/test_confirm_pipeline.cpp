// Blame follows the wait chain: a pipeline job where one stage-1 rank is slow and its
// stage-0 peer, waiting on it in recv, arrives last at its own group's all-reduce.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/confirm/tracker.h"

namespace rs = relax_straggler::core;
namespace cf = relax_straggler::core::confirm;

namespace {

// PP 2 x DP 4 (rank 5 slower by slow5 in forward and backward): ranks 0-3 are pipeline stage 0, ranks 4-7 stage 1; rank r of stage 0
// exchanges activations and gradients with rank r + 4. A stage-0 rank waits in recv for
// its peer's forward + backward beyond 100 ms; stage-1 ranks wait ~2 ms. Each pipeline
// stage then all-reduces among its four ranks.
rs::StepMatrix pipeline_report(std::int64_t step, std::mt19937_64& rng, double slow5) {
  std::normal_distribution<double> z(0.0, 1.0);
  const std::size_t S = 4;  // forward, backward, communication/allreduce, communication/recv
  std::vector<double> ms(8 * S), arrive(8);
  for (std::size_t r = 0; r < 8; ++r) {
    ms[r * S + 0] = 40.0 * (r == 5 ? 1.0 + slow5 : 1.0) * std::exp(0.015 * z(rng));
    ms[r * S + 1] = 80.0 * (r == 5 ? 1.0 + slow5 : 1.0) * std::exp(0.015 * z(rng));
  }
  for (std::size_t r = 0; r < 8; ++r) {
    const double peer = r < 4 ? ms[(r + 4) * S + 0] + ms[(r + 4) * S + 1] - 100.0 : 0.0;
    ms[r * S + 3] = 2.0 * std::exp(0.08 * z(rng)) + std::max(0.0, peer);
    arrive[r] = ms[r * S + 0] + ms[r * S + 1] + ms[r * S + 3];
  }
  for (std::size_t r = 0; r < 8; ++r) {
    const std::size_t g0 = r < 4 ? 0 : 4;
    const double last = *std::max_element(arrive.begin() + static_cast<std::ptrdiff_t>(g0),
                                          arrive.begin() + static_cast<std::ptrdiff_t>(g0 + 4));
    ms[r * S + 2] = 25.0 * std::exp(0.08 * z(rng)) + last - arrive[r];
  }
  return rs::StepMatrix::from_rows(step, 8, {"forward", "backward", "communication/allreduce", "communication/recv"},
                                   std::move(ms));
}

}  // namespace

TEST(ConfirmPipeline, WaitingStageIsNeverBlamed) {
  const std::vector<std::int32_t> pp_stage{0, 0, 0, 0, 1, 1, 1, 1};
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    std::mt19937_64 rng(seed);
    cf::ConfirmTracker t;
    for (std::int64_t s = 0; s < 20; ++s) t.update(pipeline_report(s, rng, 0.0), pp_stage);
    bool confirmed = false, traced = false;
    for (std::int64_t s = 20; s < 60; ++s) {
      const auto r = t.update(pipeline_report(s, rng, 0.3), pp_stage);
      for (const cf::Finding& f : r.findings) {
        // Rank 1 arrives last at stage 0's all-reduce only because it waited on rank 5.
        ASSERT_NE(f.rank, 1) << "seed " << seed << " report " << s << " " << f.stage_name;
        if (f.state == cf::State::kStraggler) {
          ASSERT_EQ(f.rank, 5) << "seed " << seed << " report " << s;
          EXPECT_TRUE(f.stage_name == "forward" || f.stage_name == "backward") << f.stage_name;
          EXPECT_EQ(f.cause, cf::Cause::kCompute);
          confirmed = true;
          traced = traced || std::count(f.facts.waiting_ranks.begin(), f.facts.waiting_ranks.end(), 1) > 0;
        }
      }
      if (s == 22) {
        EXPECT_TRUE(confirmed) << "seed " << seed << ": not confirmed within 3 reports";
      }
    }
    EXPECT_TRUE(traced) << "seed " << seed << ": rank 1's wait was not traced to rank 5";
  }
}

TEST(ConfirmPipeline, TraceWaitRules) {
  const std::vector<cf::SlowRank> slow{{5, 1, 0, 12.0, false}, {6, 1, 1, 3.0, false}, {2, 0, 0, 20.0, true}};
  // Own compute first.
  cf::Blame own = cf::trace_wait(6, 1, true, slow);
  EXPECT_EQ(own.rank, 6);
  EXPECT_FALSE(own.waited);
  // Waited on a peer: the slow rank of another group that did not wait itself, even
  // though a rank that only waited has a larger excess.
  cf::Blame peer = cf::trace_wait(1, 0, true, slow);
  EXPECT_EQ(peer.rank, 5);
  EXPECT_EQ(peer.stage, 0);
  EXPECT_TRUE(peer.waited);
  // Nobody slow elsewhere: waited, culprit unknown; not waited: the late rank's own.
  cf::Blame none = cf::trace_wait(1, 1, true, {{6, 1, 1, 3.0, false}});
  EXPECT_EQ(none.rank, -1);
  EXPECT_TRUE(none.waited);
  cf::Blame self = cf::trace_wait(3, 0, false, slow);
  EXPECT_EQ(self.rank, -1);
  EXPECT_FALSE(self.waited);
}

// With the per-op columns, the `communication` column (wall time with any collective in
// flight: the all-reduce and the pipeline waits together) is their union, not one
// collective: its shortest time is no late arrival. PP 2 x DP 2: rank 1 (stage 0) is slow,
// its stage-1 peer rank 3 waits on it in recv and the 1F1B schedule absorbs most of that
// before the all-reduce, so rank 2, which waited for nobody, reads short in the union.
TEST(ConfirmPipeline, TheCommunicationUnionIsNotJudgedBesideItsOps) {
  const std::vector<std::int32_t> pp_stage{0, 0, 1, 1};
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> z(0.0, 1.0);
    const auto j = [&](double ms) { return ms * std::exp(0.015 * z(rng)); };
    cf::ConfirmTracker t;
    for (std::int64_t s = 0; s < 40; ++s) {
      const double late = s >= 10 ? 12.0 : 0.0;  // rank 1's forward beyond its peer's
      const double fwd[4] = {j(40.0), j(40.0) + late, j(40.0), j(40.0)};
      const double recv[4] = {j(2.0), j(2.0), j(2.0), j(2.0) + late};
      // Stage 0: rank 0 waits for rank 1; stage 1: rank 2 waits 2 ms of rank 3's 12.
      const double allreduce[4] = {j(25.0) + late, j(25.0), j(25.0) + late / 6.0, j(25.0)};
      std::vector<double> ms;
      for (std::size_t r = 0; r < 4; ++r) {
        ms.insert(ms.end(), {fwd[r], j(80.0), allreduce[r] + recv[r], allreduce[r], recv[r]});
      }
      const auto r = t.update(rs::StepMatrix::from_rows(s, 4, {"forward", "backward", "communication",
                                                                "communication/allreduce", "communication/recv"},
                                                        std::move(ms)), pp_stage);
      for (const cf::Finding& f : r.findings) {
        EXPECT_NE(f.rank, 2) << "seed " << seed << " report " << s << " " << f.stage_name;
        EXPECT_NE(f.stage_name, "communication") << "seed " << seed << " report " << s << " rank " << f.rank;
      }
      if (s == 39) {
        EXPECT_EQ(r.straggler_ranks(), std::vector<std::int32_t>{1}) << "seed " << seed;
      }
    }
  }
}
