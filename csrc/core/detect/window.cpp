#include "core/detect/window.h"

#include <stdexcept>

namespace relax_straggler::core::detect {

WindowView WindowView::of(const double* ms, std::int64_t num_steps, std::int32_t num_ranks,
                          std::vector<std::string> stages) {
  if (num_steps < 0) throw std::invalid_argument("window: num_steps must be >= 0");
  if (num_ranks < 0) throw std::invalid_argument("window: num_ranks must be >= 0");
  if (ms == nullptr && num_steps > 0 && num_ranks > 0 && !stages.empty()) {
    throw std::invalid_argument("window: ms is null for a non-empty window");
  }
  WindowView v;
  v.ms = ms;
  v.num_steps = num_steps;
  v.num_ranks = num_ranks;
  v.kinds.reserve(stages.size());
  for (const auto& s : stages) v.kinds.push_back(stage_kind_of(s));
  v.stages = std::move(stages);
  return v;
}

Window Window::stack(const std::vector<StepMatrix>& steps) {
  if (steps.empty()) throw std::invalid_argument("window: no steps to stack");
  const StepMatrix& first = steps.front();
  Window w;
  w.ms.reserve(steps.size() * first.ms.size());
  for (const StepMatrix& m : steps) {
    if (m.num_ranks != first.num_ranks || m.stages != first.stages) {
      throw std::invalid_argument("window: step " + std::to_string(m.step) +
                                  " has different ranks or stages than step " + std::to_string(first.step));
    }
    if (m.ms.size() != static_cast<std::size_t>(m.num_ranks) * m.stages.size()) {
      throw std::invalid_argument("window: step " + std::to_string(m.step) + " has a malformed ms array");
    }
    w.ms.insert(w.ms.end(), m.ms.begin(), m.ms.end());
  }
  w.view = WindowView::of(w.ms.data(), static_cast<std::int64_t>(steps.size()), first.num_ranks, first.stages);
  return w;
}

}  // namespace relax_straggler::core::detect
