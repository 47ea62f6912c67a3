// Mean Shift with a flat kernel (Fukunaga & Hostetler 1975; Comaniciu & Meer 2002), the
// variant scikit-learn's MeanShift implements: every seed climbs to the weighted mean of
// the points within `bandwidth` until it moves less than 1e-3 x bandwidth; modes are
// kept strongest first (by weight within the window) and a mode within bandwidth of a
// stronger one is dropped; each point joins its nearest mode.
//
// The bandwidth is the mean distance to the k-th nearest neighbour with k = quantile x
// total weight (scikit-learn's estimate_bandwidth). In the ensemble, more than two modes
// are merged into two groups by a weighted 2-means over the modes.
#pragma once

#include <cstdint>
#include <vector>

#include "core/detect/points.h"

namespace relax_straggler::core::detect {

// Per quantile, the mean k-distance (points.h) with k = max(1, floor(quantile x total
// weight)), weighted by w. Throws std::invalid_argument unless 0 < quantile <= 1.
std::vector<double> estimate_bandwidths(const Eigen::MatrixXd& distances, const Weights& w,
                                        const std::vector<double>& quantiles);

struct MeanShiftResult {
  Labels labels;            // nearest mode (mean_shift) or group (mean_shift_auto)
  PointMatrix modes;        // modes x d, strongest first
  double bandwidth = 0.0;
};

// bin_seeding: seed from a grid of cell size bandwidth (one seed per occupied cell, at
// the cell centre) instead of from every point. Throws std::invalid_argument when
// bandwidth <= 0 or max_iter < 1.
MeanShiftResult mean_shift(const PointMatrix& x, const Weights& w, double bandwidth, bool bin_seeding,
                           std::int32_t max_iter);

struct MeanShiftOptions {
  std::vector<double> quantiles{0.1, 0.2, 0.3};  // bandwidth grid
  bool bin_seeding = true;
  std::int32_t max_iter = 300;
  std::uint64_t seed = 0;  // of the 2-means merge
};

// Mean Shift at each bandwidth of the grid, modes merged into at most two groups, best
// partition kept (scores.h).
MeanShiftResult mean_shift_auto(const PointMatrix& x, const Weights& w, const Eigen::MatrixXd& distances,
                                const MeanShiftOptions& options);

}  // namespace relax_straggler::core::detect
