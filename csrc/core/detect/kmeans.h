// Weighted k-means: Lloyd's iterations (Lloyd 1982) from k-means++ seeding (Arthur &
// Vassilvitskii 2007), best of n_init seeded restarts by inertia.
//
// The ensemble runs it with k = 2; Mean Shift uses it to merge extra modes into two
// groups and Fuzzy C-Means to seed its centres.
#pragma once

#include <cstdint>

#include "core/detect/points.h"
#include "core/detect/rng.h"

namespace relax_straggler::core::detect {

struct KMeansOptions {
  std::int32_t k = 2;          // clusters, >= 1
  std::int32_t n_init = 3;     // seeded restarts, >= 1; the lowest inertia wins
  std::int32_t max_iter = 300;  // Lloyd iterations per restart
  std::uint64_t seed = 0;
};

struct KMeansResult {
  Labels labels;        // n, 0..k-1
  PointMatrix centers;  // k x d
  double inertia = 0.0;  // sum of w_i |x_i - center|^2
};

// k-means++ seeding: the first centre drawn with probability proportional to w, each
// next with probability proportional to w * (squared distance to the nearest centre).
// Returns min(k, n) x d centres.
PointMatrix kmeans_plus_plus(const PointMatrix& x, const Weights& w, std::int32_t k, Rng& rng);

// Throws std::invalid_argument on k < 1, n_init < 1, max_iter < 1 or an empty x. With
// fewer points than k, every point is its own cluster.
KMeansResult kmeans(const PointMatrix& x, const Weights& w, const KMeansOptions& options);

}  // namespace relax_straggler::core::detect
