// Cost of one confirmed-verdict update (csrc/core/confirm) per report vs number of ranks
// (16 stages), against judge_step on the same matrix (bench_verdict.cpp).
// Target: < 20 % of judge_step's time at 1,024 ranks. Arg "group": ranks per comparison
// group (0 = one group of all ranks).
#include <benchmark/benchmark.h>

#include <vector>

#include "bench_matrix.h"
#include "core/confirm/tracker.h"

namespace cf = relax_straggler::core::confirm;

namespace {

void BM_ConfirmUpdate(benchmark::State& state) {
  const auto ranks = static_cast<std::int32_t>(state.range(0));
  const auto per_group = static_cast<std::int32_t>(state.range(1));
  // Two matrices alternating, so the learned noise and the evidence see changing data.
  const auto a = relax_straggler::bench::make_matrix(ranks, 16, 1);
  const auto b = relax_straggler::bench::make_matrix(ranks, 16, 2);
  std::vector<std::int32_t> groups;
  if (per_group > 0) {
    for (std::int32_t r = 0; r < ranks; ++r) groups.push_back(r / per_group);
  }
  cf::ConfirmTracker tracker;
  for (int i = 0; i < 8; ++i) tracker.update(i % 2 ? b : a, groups);  // past min_reports: judging
  std::int64_t i = 0;
  for (auto _ : state) {
    auto r = tracker.update(++i % 2 ? b : a, groups);
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations() * ranks * 16);
}

}  // namespace

BENCHMARK(BM_ConfirmUpdate)
    ->ArgNames({"ranks", "group"})
    ->ArgsProduct({{8, 1024, 16384}, {0, 8, 128}})
    ->Unit(benchmark::kMicrosecond);
