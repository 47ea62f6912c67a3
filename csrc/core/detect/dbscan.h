// DBSCAN (Ester, Kriegel, Sander & Xu 1996) with eps taken from the knee of the sorted
// k-distance curve (the "sorted k-dist graph" of the same paper, knee located as in
// Kneedle, Satopaa et al. 2011), tried at several multiples of that knee.
//
// A point is core when the weight within eps of it (itself included, as in
// scikit-learn) reaches min_samples; clusters are the connected core points plus the
// border points they reach; the rest is noise (kNoise).
#pragma once

#include <vector>

#include "core/detect/points.h"

namespace relax_straggler::core::detect {

// distances: n x n from pairwise_distances. Throws std::invalid_argument on eps < 0 or
// min_samples <= 0. O(n^2).
Labels dbscan(const Eigen::MatrixXd& distances, const Weights& w, double eps, double min_samples);

// The knee of the ascending k-distance curve: the value farthest below the chord from the
// smallest to the largest, both axes scaled to [0, 1]. Returns the largest k-distance
// when the curve is flat or the smallest positive one when the knee sits at 0.
double knee_eps(const Eigen::VectorXd& k_distances);

struct DbscanOptions {
  double min_samples = 8.0;  // weight a core point's eps-ball must hold (2 x dimensions, Sander et al. 1998)
  std::vector<double> eps_scales{0.5, 0.75, 1.0, 1.5, 2.0};  // multiples of the knee eps tried
};

struct DbscanResult {
  Labels labels;
  double eps = 0.0;  // the eps chosen
};

// Runs DBSCAN at each scale of the knee eps and keeps the best partition (scores.h).
// min_samples is capped at half the total weight so small rank counts still form clusters.
DbscanResult dbscan_auto(const PointMatrix& x, const Weights& w, const Eigen::MatrixXd& distances,
                         const DbscanOptions& options);

}  // namespace relax_straggler::core::detect
