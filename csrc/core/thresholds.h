// The slow-rank rule's thresholds: one home for their defaults and their bounds.
//
// A rank is slow in a compute stage when, against its reference ref (ms),
//     t >= ref x relative_threshold   or   t - ref >= absolute_ms_threshold
// and, in a communication stage (whose durations include waiting for peers, so the rank
// that arrived last has the shortest time, docs/ARCHITECTURE.md invariant 7), late when
//     t x relative_threshold <= ref   or   ref - t >= absolute_ms_threshold.
// The per-step verdict (verdict.h), the confirmed verdict's minimum effect size
// (confirm/config.h) and offline attribution (attribute/worker_grid.h, which asks both
// parts) start from these defaults.
#pragma once

namespace relax_straggler::core {

inline constexpr double kDefaultRelativeThreshold = 1.2;    // dimensionless, finite, >= 1
inline constexpr double kDefaultAbsoluteMsThreshold = 5.0;  // ms, finite, >= 0

// Throws std::invalid_argument naming the field ("relative_threshold must be a finite number
// >= 1, got ...") when a threshold is out of the bounds above.
void validate_thresholds(double relative_threshold, double absolute_ms_threshold);

}  // namespace relax_straggler::core
