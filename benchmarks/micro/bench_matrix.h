// The synthetic step the verdict micro-benchmarks judge: ranks x stages of ~100 ms with
// 1 % log-normal rank-to-rank jitter (as on GPUs), every fourth stage a communication
// stage, one straggler (rank 7, 1.5x in stage 1).
#pragma once

#include <random>
#include <string>
#include <vector>

#include "core/step_matrix.h"

namespace relax_straggler::bench {

inline core::StepMatrix make_matrix(std::int32_t ranks, std::size_t stages, std::uint64_t seed = 1234) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> jitter(0.0, 0.01);
  std::vector<std::string> names;
  for (std::size_t s = 0; s < stages; ++s) {
    names.push_back(s % 4 == 3 ? "communication/op" + std::to_string(s) : "stage" + std::to_string(s));
  }
  std::vector<double> ms(static_cast<std::size_t>(ranks) * stages);
  for (auto& x : ms) x = 100.0 * jitter(rng);
  ms[7 * stages + 1] *= 1.5;
  return core::StepMatrix::from_rows(0, ranks, std::move(names), std::move(ms));
}

}  // namespace relax_straggler::bench
