// Internal validity indices for choosing hyper-parameters within a bounded grid.
//
//   silhouette          Rousseeuw (1987), mean over points of (b - a) / max(a, b); in [-1, 1], higher is better.
//   Calinski-Harabasz   Calinski & Harabasz (1974), between / within dispersion ratio; higher is better.
//   Davies-Bouldin      Davies & Bouldin (1979), mean worst-case cluster similarity; >= 0, lower is better.
//
// All three are weighted (a point of weight w counts as w identical points, see points.h)
// and treat DBSCAN's noise label as one more cluster, as scikit-learn's metrics do for
// label -1. With weights 1 they equal sklearn.metrics' silhouette_score,
// calinski_harabasz_score and davies_bouldin_score.
#pragma once

#include "core/detect/points.h"

namespace relax_straggler::core::detect {

struct PartitionScore {
  double silhouette = 0.0;          // NaN when fewer than 2 clusters
  double calinski_harabasz = 0.0;   // NaN when fewer than 2 clusters; +inf when within-cluster dispersion is 0
  double davies_bouldin = 0.0;      // NaN when fewer than 2 clusters
};

// distances: the n x n matrix of pairwise_distances(x). O(n^2 + n k d).
PartitionScore score_partition(const PointMatrix& x, const Weights& w, const Labels& labels,
                               const Eigen::MatrixXd& distances);

// The selection rule every grid search uses: higher silhouette; on a tie (within 1e-9),
// lower Davies-Bouldin, then higher Calinski-Harabasz. A partition with fewer than two
// clusters (NaN silhouette) loses to any partition with two or more.
bool better_partition(const PartitionScore& a, const PartitionScore& b);

}  // namespace relax_straggler::core::detect
