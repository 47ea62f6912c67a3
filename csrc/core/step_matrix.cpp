#include "core/step_matrix.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace relax_straggler::core {

StageKind stage_kind_of(const std::string& stage_name) {
  static const std::string kComm = "communication";
  if (stage_name.compare(0, kComm.size(), kComm) != 0) return StageKind::kCompute;
  const bool exact = stage_name.size() == kComm.size();
  const bool op = stage_name.size() > kComm.size() && stage_name[kComm.size()] == '/';
  return (exact || op) ? StageKind::kCommunication : StageKind::kCompute;
}

StepMatrix StepMatrix::from_rows(std::int64_t step, std::int32_t num_ranks, std::vector<std::string> stages,
                                 std::vector<double> ms) {
  if (num_ranks < 0) throw std::invalid_argument("StepMatrix: num_ranks must be >= 0");
  if (ms.size() != static_cast<std::size_t>(num_ranks) * stages.size()) {
    throw std::invalid_argument("StepMatrix: ms has " + std::to_string(ms.size()) + " values, expected num_ranks (" +
                                std::to_string(num_ranks) + ") x stages (" + std::to_string(stages.size()) + ")");
  }
  StepMatrix m;
  m.step = step;
  m.num_ranks = num_ranks;
  m.kinds.reserve(stages.size());
  for (const auto& name : stages) m.kinds.push_back(stage_kind_of(name));
  m.stages = std::move(stages);
  m.ms = std::move(ms);
  for (double& t : m.ms) {
    if (is_time(t) || std::isnan(t)) continue;
    m.unusable += t != 0.0;  // 0 is "not timed"; +-inf and negatives are no time at all
    t = std::numeric_limits<double>::quiet_NaN();
  }
  return m;
}

}  // namespace relax_straggler::core
