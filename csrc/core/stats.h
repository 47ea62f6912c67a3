// NaN-aware robust statistics over contiguous doubles.
//
// Every function ignores NaN entries (a rank that did not run a stage) and
// returns NaN when no finite entry remains. Units are whatever the caller
// passes (stage times are ms throughout the engine).
#pragma once

#include <cstddef>
#include <vector>

namespace relax_straggler::core {

// A read-only view over contiguous doubles (std::span is C++20; the engine is C++17).
struct Values {
  const double* data = nullptr;
  std::size_t size = 0;

  Values() = default;
  Values(const double* d, std::size_t n) : data(d), size(n) {}
  Values(const std::vector<double>& v) : data(v.data()), size(v.size()) {}  // NOLINT: implicit on purpose
  const double* begin() const { return data; }
  const double* end() const { return data + size; }
};

// Number of non-NaN entries.
std::size_t count_finite(Values v);

// Arithmetic mean of the non-NaN entries.
double nan_mean(Values v);

// q-quantile (0 <= q <= 1) of the non-NaN entries with linear interpolation between
// order statistics (Hyndman & Fan type 7, numpy's default `linear` method).
// `scratch` is reused storage, so repeated calls do not allocate.
double nan_quantile(Values v, double q, std::vector<double>& scratch);
double nan_quantile(Values v, double q);

// Median = nan_quantile(v, 0.5).
double nan_median(Values v, std::vector<double>& scratch);
double nan_median(Values v);

// Median absolute deviation around the median, unscaled (multiply by 1.4826 for a
// normal-consistent sigma).
double nan_mad(Values v, std::vector<double>& scratch);
double nan_mad(Values v);

}  // namespace relax_straggler::core
