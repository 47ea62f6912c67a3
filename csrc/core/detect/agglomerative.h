// Agglomerative (hierarchical) clustering cut at a given number of clusters, with the
// nearest-neighbour-chain algorithm (Murtagh 1983; Mullner 2011, "Modern hierarchical,
// agglomerative clustering algorithms") and Lance-Williams distance updates, O(n^2)
// time and memory.
//
// Linkages: ward (Ward 1963: the increase in weighted within-cluster variance, reported
// as scikit-learn and SciPy do, sqrt(2 n_a n_b / (n_a + n_b)) |c_a - c_b|), complete,
// average (UPGMA) and single. All four are reducible, which the chain algorithm needs.
// Weights act as cluster sizes, so a weight-w point equals w coincident points.
#pragma once

#include <cstdint>
#include <vector>

#include "core/detect/points.h"

namespace relax_straggler::core::detect {

enum class Linkage : std::uint8_t { kWard = 0, kComplete = 1, kAverage = 2, kSingle = 3 };

const char* linkage_name(Linkage l);  // "ward", "complete", "average", "single"

// distances: n x n from pairwise_distances. Returns labels 0..clusters-1 (fewer when
// n < clusters). Throws std::invalid_argument when clusters < 1.
Labels agglomerative(const Eigen::MatrixXd& distances, const Weights& w, Linkage linkage, std::int32_t clusters);

struct AgglomerativeResult {
  Labels labels;
  Linkage linkage = Linkage::kWard;
};

// Cuts each linkage's tree at `clusters` and keeps the best partition (scores.h).
AgglomerativeResult agglomerative_auto(const PointMatrix& x, const Weights& w, const Eigen::MatrixXd& distances,
                                       std::int32_t clusters);

}  // namespace relax_straggler::core::detect
