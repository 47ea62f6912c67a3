// Window-detector cost: the full ensemble over ranks x 8 stages x 100 steps (target:
// < 1 s at 16,384 ranks on a 2-core machine), and each algorithm alone, by rank count.
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/detect/ensemble.h"

namespace rd = relax_straggler::core::detect;

namespace {

constexpr std::int64_t kSteps = 100;
constexpr std::size_t kStages = 8;

// 8 stages (6 compute, 2 communication), 3 % log-normal jitter, rank 7 20 % slower in
// compute and arriving late to the collectives.
struct Data {
  std::vector<double> ms;
  rd::WindowView view;
};

Data make_window(std::int32_t ranks) {
  const std::vector<std::string> names{"forward", "backward", "optimizer", "data", "attention",
                                       "moe",     "communication", "communication/allreduce"};
  const double base[kStages] = {40.0, 80.0, 10.0, 3.0, 20.0, 15.0, 30.0, 12.0};
  std::mt19937_64 rng(42);
  std::normal_distribution<double> noise(0.0, 0.03);
  Data d;
  d.ms.resize(static_cast<std::size_t>(kSteps) * static_cast<std::size_t>(ranks) * kStages);
  std::size_t i = 0;
  for (std::int64_t s = 0; s < kSteps; ++s) {
    for (std::int32_t r = 0; r < ranks; ++r) {
      for (std::size_t j = 0; j < kStages; ++j) {
        const bool comm = j >= 6;
        double factor = 1.0;
        if (r == 7) factor = comm ? 0.6 : 1.2;
        d.ms[i++] = base[j] * factor * std::exp(noise(rng));
      }
    }
  }
  d.view = rd::WindowView::of(d.ms.data(), kSteps, ranks, names);
  return d;
}

void BM_Ensemble(benchmark::State& state) {
  const Data d = make_window(static_cast<std::int32_t>(state.range(0)));
  const rd::WindowConfig config;
  rd::WindowResult r;
  for (auto _ : state) {
    r = rd::detect_window(d.view, config);
    benchmark::DoNotOptimize(r);
  }
  // The last run's CPU time per algorithm (load-independent on a shared machine).
  for (const auto& a : r.algorithms) state.counters[std::string(rd::algorithm_name(a.algorithm)) + "_cpu_ms"] = a.cpu_ms;
  state.SetItemsProcessed(state.iterations() * state.range(0) * static_cast<std::int64_t>(kStages) * kSteps);
}
BENCHMARK(BM_Ensemble)->Arg(64)->Arg(512)->Arg(2048)->Arg(16384)->Unit(benchmark::kMillisecond);

void BM_Algorithm(benchmark::State& state) {
  const Data d = make_window(static_cast<std::int32_t>(state.range(0)));
  rd::WindowConfig config;
  config.algorithms = {static_cast<rd::Algorithm>(state.range(1))};
  config.vote.min_votes = 1;
  for (auto _ : state) {
    auto r = rd::detect_window(d.view, config);
    benchmark::DoNotOptimize(r);
  }
  state.SetLabel(rd::algorithm_name(config.algorithms[0]));
}
BENCHMARK(BM_Algorithm)
    ->ArgsProduct({{16384}, {0, 1, 2, 3, 4, 5}})
    ->Unit(benchmark::kMillisecond);

}  // namespace
