// Per-step verdict cost vs number of ranks (16 stages), reference mean and median.
// Target: < 2 ms at 16,384 ranks on a 2-core machine, with either reference.
#include <benchmark/benchmark.h>

#include "bench_matrix.h"
#include "core/verdict.h"

namespace rs = relax_straggler::core;

namespace {

void BM_JudgeStep(benchmark::State& state) {
  const auto m = relax_straggler::bench::make_matrix(static_cast<std::int32_t>(state.range(0)), 16);
  rs::VerdictConfig cfg;
  cfg.reference = state.range(1) == 0 ? rs::Reference::kMean : rs::Reference::kMedian;
  for (auto _ : state) {
    auto v = rs::judge_step(m, cfg);
    benchmark::DoNotOptimize(v);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0) * 16);
}

}  // namespace

BENCHMARK(BM_JudgeStep)
    ->ArgNames({"ranks", "median"})
    ->ArgsProduct({{8, 1024, 16384}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
