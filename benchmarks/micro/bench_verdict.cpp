// Per-step verdict cost vs number of ranks (16 stages), reference mean and median, over
// all ranks or within comparison groups (pipeline stages).
// Target: < 2 ms at 16,384 ranks on a 2-core machine, with either reference. Arg "group":
// ranks per comparison group (0 = one group of all ranks).
#include <benchmark/benchmark.h>

#include <vector>

#include "bench_matrix.h"
#include "core/verdict.h"

namespace rs = relax_straggler::core;

namespace {

void BM_JudgeStep(benchmark::State& state) {
  const auto ranks = static_cast<std::int32_t>(state.range(0));
  const auto m = relax_straggler::bench::make_matrix(ranks, 16);
  rs::VerdictConfig cfg;
  cfg.reference = state.range(1) == 0 ? rs::Reference::kMean : rs::Reference::kMedian;
  const auto per_group = static_cast<std::int32_t>(state.range(2));
  std::vector<std::int32_t> groups;
  for (std::int32_t r = 0; per_group > 0 && r < ranks; ++r) groups.push_back(r / per_group);
  for (auto _ : state) {
    auto v = groups.empty() ? rs::judge_step(m, cfg) : rs::judge_step(m, cfg, groups);
    benchmark::DoNotOptimize(v);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0) * 16);
}

}  // namespace

BENCHMARK(BM_JudgeStep)
    ->ArgNames({"ranks", "median", "group"})
    ->ArgsProduct({{8, 1024, 16384}, {0, 1}, {0, 8, 128}})
    ->Unit(benchmark::kMicrosecond);
