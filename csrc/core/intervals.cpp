#include "core/intervals.h"

#include <algorithm>

namespace relax_straggler::core {

std::vector<Interval> merge_intervals(std::vector<Interval> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](const Interval& x) { return !(x.end_ms > x.begin_ms); }), v.end());
  std::sort(v.begin(), v.end(), [](const Interval& a, const Interval& b) { return a.begin_ms < b.begin_ms; });
  std::vector<Interval> out;
  for (const Interval& x : v) {
    if (!out.empty() && x.begin_ms <= out.back().end_ms) {
      out.back().end_ms = std::max(out.back().end_ms, x.end_ms);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

double union_ms(std::vector<Interval> v) {
  double total = 0.0;
  for (const Interval& x : merge_intervals(std::move(v))) total += x.end_ms - x.begin_ms;
  return total;
}

double covered_ms(const Interval& x, const std::vector<Interval>& merged) {
  double total = 0.0;
  for (const Interval& m : merged) {
    if (m.begin_ms >= x.end_ms) break;  // merged is sorted
    const double lo = std::max(x.begin_ms, m.begin_ms), hi = std::min(x.end_ms, m.end_ms);
    if (hi > lo) total += hi - lo;
  }
  return total;
}

}  // namespace relax_straggler::core
