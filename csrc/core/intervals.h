// Interval arithmetic on one step's timeline (ms offsets from the step's first event).
//
// Used to total the wall time spent in collectives (union of possibly overlapping
// async operations) and to take the time a rank was blocked waiting for a collective
// out of the compute stage it happened in (docs/ARCHITECTURE.md invariant 8).
#pragma once

#include <vector>

namespace relax_straggler::core {

struct Interval {
  double begin_ms = 0.0;
  double end_ms = 0.0;  // end_ms < begin_ms is treated as empty
};

// Sorted, disjoint intervals covering the same time as `v` (empty ones dropped).
std::vector<Interval> merge_intervals(std::vector<Interval> v);

// Total length of the union of `v`, ms.
double union_ms(std::vector<Interval> v);

// Length of the part of `x` covered by `merged` (the output of merge_intervals), ms.
double covered_ms(const Interval& x, const std::vector<Interval>& merged);

}  // namespace relax_straggler::core
