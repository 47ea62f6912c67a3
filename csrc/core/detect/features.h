// Window features: per (stage, rank) the 4-vector [min, max, range, mean] of the rank's
// times over the window's steps after warm-up, the stage filters, and robust scaling.
//
// Upper trim: before max, range and mean are taken, each rank's floor(trim_fraction x n)
// largest times of the stage (n = steps it ran) are set aside. One page fault or GC hiccup
// on one rank is not a straggler, but untrimmed it dominates the robust-scaled max and
// range (they barely vary across healthy ranks) and moves the mean of a short stage by
// several percent. A rank slow on more than trim_fraction of its steps keeps its excess.
//
// Filters (a dropped stage casts no votes; its status says why):
//   coverage gap   some analysed rank ran the stage in fewer than min_coverage of the
//                  steps (a rank that reported nothing at all in the window is absent,
//                  not a gap, and is left out of the analysis);
//   low spread     (max - min) / mean over ranks of the per-rank mean < min_relative_spread:
//                  every rank is equally fast, nothing to cluster.
// Scaling, per stage and feature: (x - median) / (1.4826 MAD); when MAD is 0, IQR / 1.349;
// when that is 0 too, 1.2533 x the mean absolute deviation from the median; else 1. Each
// divisor is a consistent estimate of a normal sigma, and none is moved by a minority of
// stragglers the way a z-score's standard deviation is.
#pragma once

#include <cstdint>
#include <vector>

#include "core/detect/points.h"
#include "core/detect/window.h"

namespace relax_straggler::core::detect {

enum Feature : std::int32_t { kMinMs = 0, kMaxMs = 1, kRangeMs = 2, kMeanMs = 3, kNumFeatures = 4 };

struct FeatureOptions {
  std::int64_t warmup_steps = 10;     // leading steps of the window ignored, >= 0
  double min_relative_spread = 0.03;  // stages more uniform than this are dropped, >= 0
  double min_coverage = 0.5;          // fraction of steps every rank must have run a kept stage, (0, 1]
  double trim_fraction = 0.1;         // largest times per (rank, stage) set aside, [0, 0.5)
};

enum class StageStatus : std::uint8_t { kKept = 0, kNotRun = 1, kCoverageGap = 2, kLowSpread = 3 };

const char* stage_status_name(StageStatus s);  // "kept", "not_run", "coverage_gap", "low_spread"

struct StageFeatures {
  std::size_t column = 0;  // stage column in the window
  StageKind kind = StageKind::kCompute;
  PointMatrix raw;     // ranks x kNumFeatures, ms; rows follow WindowFeatures::ranks
  PointMatrix scaled;  // robust-scaled raw (filled by scale_stages)
};

struct WindowFeatures {
  std::int64_t steps_used = 0;            // steps after warm-up
  std::vector<std::int32_t> ranks;        // analysed ranks, ascending (rows of every StageFeatures)
  std::vector<std::int32_t> absent_ranks;  // no time in any stage over the window
  std::vector<StageStatus> status;        // per window column
  std::vector<double> relative_spread;    // per window column; NaN unless the stage passed the coverage filter
  std::vector<std::uint8_t> ran;          // analysed rank x column: 1 when the rank ran the stage at least once
  std::vector<StageFeatures> stages;      // stages that passed the coverage filter (then the spread filter)
};

// Computes the features of every stage that passes the coverage filter (status kKept for
// now); relative spreads are filled by filter_and_scale. Throws std::invalid_argument on
// invalid options. One pass over the window: O(steps x ranks x stages).
WindowFeatures compute_features(const WindowView& window, const FeatureOptions& options);

// Applies the spread filter (marking dropped columns kLowSpread and removing them from
// stages) and fills `scaled` for the rest.
void filter_and_scale(WindowFeatures& features, const FeatureOptions& options);

}  // namespace relax_straggler::core::detect
