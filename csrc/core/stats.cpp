#include "core/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace relax_straggler::core {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Copies the finite entries of v into scratch; returns how many there are.
std::size_t gather_finite(Values v, std::vector<double>& scratch) {
  scratch.clear();
  scratch.reserve(v.size);
  for (double x : v) {
    if (!std::isnan(x)) scratch.push_back(x);
  }
  return scratch.size();
}

// Type-7 quantile of scratch[0, n), partially reordering it (O(n) with nth_element).
double quantile_in_place(std::vector<double>& s, double q) {
  const std::size_t n = s.size();
  if (n == 0) return kNaN;
  const double pos = q * static_cast<double>(n - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(pos));
  const double frac = pos - static_cast<double>(lo);
  std::nth_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(lo), s.end());
  const double lo_value = s[lo];
  if (frac == 0.0 || lo + 1 >= n) return lo_value;
  // The next order statistic is the minimum of the part above lo.
  const double hi_value = *std::min_element(s.begin() + static_cast<std::ptrdiff_t>(lo) + 1, s.end());
  return lo_value + frac * (hi_value - lo_value);
}

}  // namespace

std::size_t count_finite(Values v) {
  std::size_t n = 0;
  for (double x : v) n += std::isnan(x) ? 0 : 1;
  return n;
}

double nan_mean(Values v) {
  double sum = 0.0;
  std::size_t n = 0;
  for (double x : v) {
    if (std::isnan(x)) continue;
    sum += x;
    ++n;
  }
  return n == 0 ? kNaN : sum / static_cast<double>(n);
}

double nan_quantile(Values v, double q, std::vector<double>& scratch) {
  if (!(q >= 0.0 && q <= 1.0)) return kNaN;
  gather_finite(v, scratch);
  return quantile_in_place(scratch, q);
}

double nan_quantile(Values v, double q) {
  std::vector<double> scratch;
  return nan_quantile(v, q, scratch);
}

double nan_median(Values v, std::vector<double>& scratch) { return nan_quantile(v, 0.5, scratch); }

double nan_median(Values v) {
  std::vector<double> scratch;
  return nan_median(v, scratch);
}

double nan_mad(Values v, std::vector<double>& scratch) {
  const double med = nan_median(v, scratch);
  if (std::isnan(med)) return kNaN;
  // scratch now holds the finite values (reordered); reuse it for the deviations.
  for (double& x : scratch) x = std::fabs(x - med);
  return quantile_in_place(scratch, 0.5);
}

double nan_mad(Values v) {
  std::vector<double> scratch;
  return nan_mad(v, scratch);
}

}  // namespace relax_straggler::core
