#include "core/collective_waits.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace relax_straggler::core {

CollectiveWaits collective_waits(const double* durations_ms, std::size_t ranks, std::size_t collectives) {
  if (ranks < 2 || collectives < 1) {
    throw std::invalid_argument("collective_waits needs >= 2 ranks and >= 1 collective, got " +
                                std::to_string(ranks) + " x " + std::to_string(collectives));
  }
  for (std::size_t i = 0; i < ranks * collectives; ++i) {
    if (!std::isfinite(durations_ms[i])) {
      throw std::invalid_argument("collective duration of rank " + std::to_string(i / collectives) +
                                  ", collective " + std::to_string(i % collectives) + " is not finite");
    }
  }
  CollectiveWaits out;
  out.late_counts.assign(ranks, 0);
  out.wait_ms.assign(ranks, 0.0);
  for (std::size_t c = 0; c < collectives; ++c) {
    std::size_t last = 0;
    for (std::size_t r = 1; r < ranks; ++r) {
      if (durations_ms[r * collectives + c] < durations_ms[last * collectives + c]) last = r;
    }
    const double shortest = durations_ms[last * collectives + c];
    ++out.late_counts[last];
    for (std::size_t r = 0; r < ranks; ++r) out.wait_ms[r] += durations_ms[r * collectives + c] - shortest;
  }
  out.blamed_rank = static_cast<std::int32_t>(
      std::max_element(out.late_counts.begin(), out.late_counts.end()) - out.late_counts.begin());
  return out;
}

}  // namespace relax_straggler::core
