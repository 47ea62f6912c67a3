// A weighted summary of many ranks that keeps every outlier: the points the clusterers
// actually see when there are more ranks than max_points.
//
// Representatives: the max_points / 2 rows farthest from the origin (the input is
// robust-scaled, so the origin is the per-feature median and these are the most unusual
// ranks, stragglers included), plus max_points - max_points / 2 rows sampled uniformly
// (fixed seed) from the rest. Every row is then assigned to its nearest representative,
// and a representative's weight is the number of rows assigned to it. Labels found on
// the representatives are carried back to all rows through that assignment. With
// n <= max_points every row is its own representative with weight 1 (exact algorithms).
#pragma once

#include <cstdint>
#include <vector>

#include "core/detect/points.h"

namespace relax_straggler::core::detect {

struct Coreset {
  PointMatrix points;                       // m x d representatives
  Weights weights;                          // m, rows assigned to each (>= 1)
  std::vector<std::int32_t> representative;  // n: the representative of each input row
};

// Throws std::invalid_argument when max_points < 2. O(n m d).
Coreset build_coreset(const PointMatrix& x, std::int32_t max_points, std::uint64_t seed);

// Labels of the representatives carried to every input row.
Labels expand_labels(const Coreset& coreset, const Labels& representative_labels);

}  // namespace relax_straggler::core::detect
