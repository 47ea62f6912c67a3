// Fuzzy C-Means (Dunn 1973; Bezdek 1981), weighted: minimises
//     sum_i w_i sum_k u_ik^m |x_i - c_k|^2,   sum_k u_ik = 1,
// by alternating u_ik = 1 / sum_j (|x_i - c_k| / |x_i - c_j|)^(2 / (m - 1)) and
// c_k = sum_i w_i u_ik^m x_i / sum_i w_i u_ik^m from k-means++ centres, until no
// membership moves more than tol. A point is labelled with its largest membership.
#pragma once

#include <cstdint>
#include <vector>

#include "core/detect/points.h"

namespace relax_straggler::core::detect {

struct FcmOptions {
  std::int32_t clusters = 2;                     // >= 1
  std::vector<double> fuzzifiers{1.5, 2.0, 2.5};  // m values tried by fuzzy_cmeans_auto, each > 1
  std::int32_t max_iter = 300;
  double tol = 1e-6;
  std::uint64_t seed = 0;  // of the k-means++ centres
};

struct FcmResult {
  Labels labels;              // argmax membership
  Eigen::MatrixXd membership;  // n x clusters, rows sum to 1
  PointMatrix centers;        // clusters x d
  double fuzzifier = 2.0;
};

// Throws std::invalid_argument when fuzzifier <= 1, clusters < 1, max_iter < 1 or x is empty.
FcmResult fuzzy_cmeans(const PointMatrix& x, const Weights& w, double fuzzifier, const FcmOptions& options);

// Fuzzy C-Means at each fuzzifier of options.fuzzifiers; the best hard partition (scores.h) wins.
FcmResult fuzzy_cmeans_auto(const PointMatrix& x, const Weights& w, const Eigen::MatrixXd& distances,
                            const FcmOptions& options);

}  // namespace relax_straggler::core::detect
