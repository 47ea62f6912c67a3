// Exact per-stage medians of a StepMatrix without selecting over whole columns (the
// median reference of judge_step, verdict.h).
//
// A strided sample of 4 sqrt(ranks) rows (at most 512) brackets each stage's median
// between two sample quantiles, 3 standard errors either side of the middle; the pass
// over the matrix that judge_stages makes anyway counts the values below the bracket and appends those inside it to the stage's
// bucket. When the median's order statistics fall inside the bucket (all but ~0.3 % of
// stages), they are selected there (~10 % of the column); otherwise, and for stages with
// fewer than 256 values, the whole column is selected, as before. Buffers are
// per thread and reused: no allocation per call once they have grown.
#pragma once

#include <cstddef>
#include <vector>

#include "core/step_matrix.h"

namespace relax_straggler::core {

// Per-thread buffers of one judge_step: brackets, their counts and buckets.
struct MedianScratch {
  std::vector<double> lo, hi;        // per stage bracket; (-inf, +inf) = whole column
  std::vector<std::size_t> below, filled;
  std::vector<double> buckets;       // stage-major, stride `stride`
  std::vector<double> sample, column;
  std::size_t stride = 0;
};

// The calling thread's scratch.
MedianScratch& median_scratch();

// Sets every stage's bracket from a strided sample of m and sizes the buckets (for an
// even number of stages: an odd count gets one padding stage). Then, for each cell t of
// stage s, in row-major order: below[s] += t < lo[s];
// buckets[s * stride + filled[s]] = t; filled[s] += lo[s] <= t <= hi[s].
void prepare_brackets(const StepMatrix& m, MedianScratch& w);

// The type-7 median (the same arithmetic as nan_median) of stage s with `count` finite
// values, after the pass above; selects over the whole column when the bracket missed.
double bracketed_median(const StepMatrix& m, MedianScratch& w, std::size_t s, std::size_t count);

}  // namespace relax_straggler::core
