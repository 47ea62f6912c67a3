#include "core/confirm/reference.h"

#include <algorithm>
#include <cmath>

namespace relax_straggler::core::confirm {
namespace {

// Small-sample consistency factors of the MAD (Croux & Rousseeuw 1992, Table 1, n = 2..9;
// n / (n - 0.8) above): the plain MAD of a handful of ratios underestimates the noise.
double mad_correction(std::size_t n) {
  static const double kSmall[] = {1.0, 1.0, 1.196, 1.495, 1.363, 1.206, 1.200, 1.140, 1.129, 1.107};
  return n <= 9 ? kSmall[n] : static_cast<double>(n) / (static_cast<double>(n) - 0.8);
}

// Sorts a handful of values: for the small groups of a pipeline job (a few ranks per
// stage) an insertion sort is several times cheaper than two selections.
void insertion_sort(std::vector<double>& v) {
  for (std::size_t i = 1; i < v.size(); ++i) {
    const double x = v[i];
    std::size_t j = i;
    for (; j > 0 && v[j - 1] > x; --j) v[j] = v[j - 1];
    v[j] = x;
  }
}

constexpr std::size_t kSortBelow = 24;  // group sizes sorted instead of selected

}  // namespace

GroupReference reference_of(std::vector<double>& values, bool exact) {
  GroupReference g;
  const std::size_t n = values.size();
  g.count = static_cast<std::int32_t>(n);
  if (n == 0) return g;
  const std::size_t m = n / 2;
  const auto mid = values.begin() + static_cast<std::ptrdiff_t>(m);
  const bool small = n < kSortBelow;
  if (small) {
    insertion_sort(values);
  } else {
    std::nth_element(values.begin(), mid, values.end());
  }
  const double upper = values[m];
  if (n == 1) {
    g.median = upper;
    return g;
  }
  const double lower = *std::max_element(values.begin(), mid);  // order statistic m - 1
  if (n % 2 == 0) {
    // Sorted v[0..2m): dropping a rank of the upper half leaves v[m-1] in the middle,
    // dropping one of the lower half leaves v[m].
    g.median = lower + 0.5 * (upper - lower);
    g.above = g.at = lower;
    g.below = upper;
  } else {
    // Sorted v[0..2m]: median v[m]; dropping a rank moves the middle pair accordingly.
    const double next = *std::min_element(mid + 1, values.end());  // order statistic m + 1
    g.median = upper;
    g.above = lower + 0.5 * (upper - lower);
    g.below = upper + 0.5 * (next - upper);
    g.at = lower + 0.5 * (next - lower);
  }
  if (!exact) g.above = g.below = g.at = g.median;
  if (g.median > 0.0) {
    for (double& x : values) x = std::fabs(x / g.median - 1.0);
    if (small) {
      insertion_sort(values);
    } else {
      std::nth_element(values.begin(), mid, values.end());
    }
    g.mad = values[m] * mad_correction(n);
  }
  return g;
}

}  // namespace relax_straggler::core::confirm
