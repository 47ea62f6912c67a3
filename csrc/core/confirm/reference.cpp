#include "core/confirm/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/simd.h"

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

// The median and leave-one-out medians of sorted v[0, n), n >= 2, into g (as reference_of).
void set_medians(GroupReference& g, double lower, double upper, double next, std::size_t n, bool exact) {
  if (n % 2 == 0) {
    // Sorted v[0..2m): dropping a rank of the upper half leaves v[m-1] in the middle,
    // dropping one of the lower half leaves v[m].
    g.median = lower + 0.5 * (upper - lower);
    g.above = g.at = lower;
    g.below = upper;
  } else {
    // Sorted v[0..2m]: median v[m]; dropping a rank moves the middle pair accordingly.
    g.median = upper;
    g.above = lower + 0.5 * (upper - lower);
    g.below = upper + 0.5 * (next - upper);
    g.at = lower + 0.5 * (next - lower);
  }
  if (!exact) g.above = g.below = g.at = g.median;
}

// Sorts each of the `lanes` columns of x (n rows of `lanes` doubles, lanes a multiple of
// 4, n a power of two) ascending with a bitonic network (Batcher 1968): n / 4 x log n x
// (log n + 1) compare-exchanges of whole rows, four columns per vector operation, no
// branch on the data (inf pads sort last).
RS_AVX2_CLONE
void sort_columns(double* x, std::size_t n, std::size_t lanes) {
  for (std::size_t k = 2; k <= n; k <<= 1) {
    for (std::size_t j = k >> 1; j > 0; j >>= 1) {
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t l = i ^ j;
        if (l <= i) continue;
        double* lo = x + ((i & k) == 0 ? i : l) * lanes;
        double* hi = x + ((i & k) == 0 ? l : i) * lanes;
        for (std::size_t t = 0; t < lanes; t += 4) {
          V4 a, b;
          std::memcpy(&a, lo + t, sizeof a);
          std::memcpy(&b, hi + t, sizeof b);
          const V4 mn = a < b ? a : b, mx = a < b ? b : a;
          std::memcpy(lo + t, &mn, sizeof mn);
          std::memcpy(hi + t, &mx, sizeof mx);
        }
      }
    }
  }
}

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
  const double next = n % 2 == 1 ? *std::min_element(mid + 1, values.end()) : upper;  // order statistic m + 1
  set_medians(g, lower, upper, next, n, exact);
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

void references_of_rows(const double* ms, std::size_t S, const std::int32_t* rows, std::size_t take, bool exact,
                        GroupReference* out, std::vector<double>& scratch) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::size_t n = 2;
  while (n < take) n <<= 1;
  const std::size_t lanes = (S + 3) / 4 * 4;
  scratch.assign(n * lanes, kInf);
  double* x = scratch.data();
  std::fill(out, out + S, GroupReference{});
  for (std::size_t i = 0; i < take; ++i) {
    const double* row = ms + static_cast<std::size_t>(rows[i]) * S;
    for (std::size_t s = 0; s < S; ++s) {
      const bool finite = !std::isnan(row[s]);
      x[i * lanes + s] = finite ? row[s] : kInf;
      out[s].count += finite;
    }
  }
  sort_columns(x, n, lanes);
  for (std::size_t s = 0; s < S; ++s) {
    GroupReference& g = out[s];
    const auto c = static_cast<std::size_t>(g.count);
    if (c == 0) continue;
    const std::size_t m = c / 2;
    const double upper = x[m * lanes + s];
    if (c == 1) {
      g.median = upper;
      continue;
    }
    set_medians(g, x[(m - 1) * lanes + s], upper, c % 2 == 1 ? x[(m + 1) * lanes + s] : upper, c, exact);
  }
  // The spread: |t / median - 1| of the finite times, sorted the same way (pads, single
  // values and non-positive medians stay inf and are not read).
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t s = 0; s < S; ++s) {
      const GroupReference& g = out[s];
      double& v = x[i * lanes + s];
      v = i < static_cast<std::size_t>(g.count) && g.count >= 2 && g.median > 0.0 ? std::fabs(v / g.median - 1.0)
                                                                                    : kInf;
    }
  }
  sort_columns(x, n, lanes);
  for (std::size_t s = 0; s < S; ++s) {
    GroupReference& g = out[s];
    if (g.count < 2 || !(g.median > 0.0)) continue;
    const auto c = static_cast<std::size_t>(g.count);
    g.mad = x[(c / 2) * lanes + s] * mad_correction(c);
  }
}

}  // namespace relax_straggler::core::confirm
