#include "core/thresholds.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace relax_straggler::core {

void validate_thresholds(double relative_threshold, double absolute_ms_threshold) {
  if (!(std::isfinite(relative_threshold) && relative_threshold >= 1.0)) {
    throw std::invalid_argument("relative_threshold must be a finite number >= 1, got " +
                                std::to_string(relative_threshold));
  }
  if (!(std::isfinite(absolute_ms_threshold) && absolute_ms_threshold >= 0.0)) {
    throw std::invalid_argument("absolute_ms_threshold must be a finite number >= 0, got " +
                                std::to_string(absolute_ms_threshold));
  }
}

}  // namespace relax_straggler::core
