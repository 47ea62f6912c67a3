// A window of sampled steps: the input of the window detector.
//
// steps x ranks x stages of milliseconds, step-major:
//     ms[(step * num_ranks + rank) * stages.size() + stage],
// i.e. the StepMatrix of each step (rank-major, step_matrix.h) laid one after another.
// A value that is no time (step_matrix.h is_time: NaN, 0 as in Megatron's timers, +-inf,
// negative) means the rank did not run the stage in that step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/step_matrix.h"

namespace relax_straggler::core::detect {

// A read-only view; the caller keeps the data alive while the detector runs.
struct WindowView {
  const double* ms = nullptr;
  std::int64_t num_steps = 0;
  std::int32_t num_ranks = 0;
  std::vector<std::string> stages;
  std::vector<StageKind> kinds;  // same length as stages

  std::size_t num_stages() const { return stages.size(); }
  double at(std::int64_t step, std::int32_t rank, std::size_t stage) const {
    return ms[(static_cast<std::size_t>(step) * static_cast<std::size_t>(num_ranks) + static_cast<std::size_t>(rank)) *
                  stages.size() +
              stage];
  }

  // A view with kinds derived from the stage names (stage_kind_of). Throws
  // std::invalid_argument on a null pointer with a non-empty shape or negative sizes.
  static WindowView of(const double* ms, std::int64_t num_steps, std::int32_t num_ranks, std::vector<std::string> stages);
};

// An owning window stacked from consecutive StepMatrices (the live path keeps these).
// Move-only: view points into ms.
struct Window {
  std::vector<double> ms;
  WindowView view;

  Window() = default;
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;
  Window(Window&&) = default;
  Window& operator=(Window&&) = default;

  // Throws std::invalid_argument when the matrices disagree on ranks or stage names, or
  // when `steps` is empty.
  static Window stack(const std::vector<StepMatrix>& steps);
};

}  // namespace relax_straggler::core::detect
