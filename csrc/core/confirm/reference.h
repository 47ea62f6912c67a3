// A comparison group's reference in one stage and one report, and its spread.
//
// The reference of a rank is the median of the OTHER ranks of its group (leave one out):
// in a group of two it is the peer, so one slow rank cannot drag its own reference
// toward itself (with a plain mean of two, a 2x rank reads 1.33x). Above `sample` ranks
// the group median is taken over evenly spaced ranks instead; leaving one rank out then
// moves it by less than the sample's own error, so every rank gets the sample median.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/simd.h"

namespace relax_straggler::core::confirm {

struct GroupReference {
  std::int32_t count = 0;  // values the reference was taken over
  double median = std::numeric_limits<double>::quiet_NaN();  // ms
  // Leave-one-out medians, ms: for a rank above the median, below it, or equal to it.
  // NaN with fewer than two values (no peer).
  double above = std::numeric_limits<double>::quiet_NaN();
  double below = std::numeric_limits<double>::quiet_NaN();
  double at = std::numeric_limits<double>::quiet_NaN();
  // Relative spread this report: the median of |t - median| over the values, divided by
  // the median (the MAD of the ratios t / median, computed with one division instead of
  // one per value; the last bit may differ from the median of |t / median - 1|), with its
  // small-sample correction, dimensionless; NaN with fewer than two values.
  double mad = std::numeric_limits<double>::quiet_NaN();

  // The reference of a rank whose time is t (ms).
  double of(double t) const { return t > median ? above : (t < median ? below : at); }
};

// values: the finite times (ms) of one group and stage, reordered in place. exact: the
// values are the whole group (leave-one-out medians); else a sample of it. O(n).
GroupReference reference_of(std::vector<double>& values, bool exact);

// Groups up to this many sampled rows take every stage's reference at once (below).
constexpr std::size_t kColumnSortRows = 32;

// The references of one group in all S stages at once: ms rank-major (rank r's times at
// ms + r * S, NaN where it did not run the stage), rows[0, take) the group's rows, take in
// [1, kColumnSortRows]; out[s] is reference_of over stage s's finite times of those rows,
// exactly. One stage per lane of a vector: the rows' times are loaded straight into
// registers (NaN as +inf, padded to a power of two with +inf), every column sorted
// together by one odd-even merge sort network (Batcher 1968), and the deviations from the
// median, which fall and then rise over a sorted column, sorted by one bitonic merge: for
// the few ranks of a pipeline stage this costs less than gathering each column and running
// two selections on it. Compiled once per instruction set (core/simd.h: eight stages per
// vector with AVX-512, four with AVX2, else two), the widest this CPU has chosen at load time.
void references_of_rows(const double* ms, std::size_t S, const std::int32_t* rows, std::size_t take, bool exact,
                        GroupReference* out);

// references_of_rows on the path compiled for isa; every path gives the same bits. Throws
// std::invalid_argument where isa_available(isa) is false.
void references_of_rows_on(Isa isa, const double* ms, std::size_t S, const std::int32_t* rows, std::size_t take,
                           bool exact, GroupReference* out);

}  // namespace relax_straggler::core::confirm
