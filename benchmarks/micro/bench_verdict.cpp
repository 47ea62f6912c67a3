// Per-step verdict cost vs number of ranks (16 stages), reference mean and median.
// Target (issue: "Prove it costs nothing"): < 2 ms at 16,384 ranks on a 2-core machine.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "core/verdict.h"

namespace rs = relax_straggler::core;

namespace {

rs::StepMatrix make_matrix(std::int32_t ranks, std::size_t stages) {
  std::mt19937_64 rng(1234);
  std::lognormal_distribution<double> jitter(0.0, 0.01);  // 1 % rank-to-rank jitter, as on GPUs
  std::vector<std::string> names;
  for (std::size_t s = 0; s < stages; ++s) {
    names.push_back(s % 4 == 3 ? "communication/op" + std::to_string(s) : "stage" + std::to_string(s));
  }
  std::vector<double> ms(static_cast<std::size_t>(ranks) * stages);
  for (auto& x : ms) x = 100.0 * jitter(rng);
  ms[7 * stages + 1] *= 1.5;  // one straggler
  return rs::StepMatrix::from_rows(0, ranks, std::move(names), std::move(ms));
}

void BM_JudgeStep(benchmark::State& state) {
  const auto m = make_matrix(static_cast<std::int32_t>(state.range(0)), 16);
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
