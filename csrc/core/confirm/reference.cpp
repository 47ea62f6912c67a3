#include "core/confirm/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

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

constexpr double kInf = std::numeric_limits<double>::infinity();

// references_of_rows for the stages s0 .. s0 + W - 1 below S, W the lanes of V (M its
// integer vector), N >= take the network size: each stage one lane of a vector, so every
// row's times are loaded straight from the matrix (no stage-minor copy) and the W columns
// sorted together. Inlined into each instruction set's path (RowsOf below).
template <class V, class M, std::size_t N>
inline __attribute__((always_inline)) void references_of_lanes(const double* ms, std::size_t S, std::size_t s0,
                                                               const std::int32_t* rows, std::size_t take, bool exact,
                                                               GroupReference* out) {
  constexpr std::size_t W = sizeof(V) / sizeof(double);
  const std::size_t width = std::min<std::size_t>(W, S - s0);
  const V inf = V{} + kInf;
  V v[N];
  M finite = {};  // minus the count of finite times per lane
  for (std::size_t i = 0; i < N; ++i) {
    V t = inf;
    if (i < take) {
      const double* row = ms + static_cast<std::size_t>(rows[i]) * S + s0;
      if (width == W) {
        std::memcpy(&t, row, sizeof t);
      } else {
        for (std::size_t l = 0; l < width; ++l) t[l] = row[l];
      }
      const M ok = t == t;  // NaN (not run) sorts last, as a pad
      finite += ok;
      t = ok ? t : inf;
    }
    v[i] = t;
  }
  const M zero = M{} + opaque_zero();
  sort_lanes<N, false>(v, zero);
  V median = V{} + 1.0;  // lanes without a spread divide by 1 (read nowhere)
  std::size_t count[W];
  for (std::size_t l = 0; l < width; ++l) {
    GroupReference& g = out[s0 + l];
    g = GroupReference{};
    const auto c = static_cast<std::size_t>(-finite[l]);
    count[l] = c;
    g.count = static_cast<std::int32_t>(c);
    if (c == 0) continue;
    const std::size_t m = c / 2;
    const double upper = v[m][l];
    if (c == 1) {
      g.median = upper;
      continue;
    }
    set_medians(g, v[m - 1][l], upper, c % 2 == 1 ? v[std::min(m + 1, N - 1)][l] : upper, c, exact);
    if (g.median > 0.0) median[l] = g.median;
  }
  // The spread: |t - median| over a sorted column falls to the median and rises after it
  // (subtraction rounds monotonically), and the +inf pads keep rising: a bitonic sequence,
  // which one bitonic merge (N / 2 log N compare-exchanges) sorts. One division per stage
  // then makes it relative.
  const M magnitude = M{} + 0x7fffffffffffffffLL;
  for (std::size_t i = 0; i < take; ++i) {
    v[i] = reinterpret_cast<V>(reinterpret_cast<M>(v[i] - median) & magnitude);  // fabs
  }
  sort_lanes<N, true>(v, zero);
  for (std::size_t l = 0; l < width; ++l) {
    GroupReference& g = out[s0 + l];
    if (count[l] < 2 || !(g.median > 0.0)) continue;
    g.mad = v[count[l] / 2][l] / g.median * mad_correction(count[l]);
  }
}

// references_of_rows with W stages per vector V (M its integer vector): the network the
// smallest that holds take rows. Every lane computes the same operations in the same order
// whatever W, so the paths agree bit for bit.
template <class V, class M>
inline __attribute__((always_inline)) void references_in(const double* ms, std::size_t S, const std::int32_t* rows,
                                                         std::size_t take, bool exact, GroupReference* out) {
  static_assert(kColumnSortRows == 32, "the largest network below sorts 32 rows");
  constexpr std::size_t W = sizeof(V) / sizeof(double);
  for (std::size_t s0 = 0; s0 < S; s0 += W) {
    if (take <= 2) {
      references_of_lanes<V, M, 2>(ms, S, s0, rows, take, exact, out);
    } else if (take <= 4) {
      references_of_lanes<V, M, 4>(ms, S, s0, rows, take, exact, out);
    } else if (take <= 8) {
      references_of_lanes<V, M, 8>(ms, S, s0, rows, take, exact, out);
    } else if (take <= 16) {
      references_of_lanes<V, M, 16>(ms, S, s0, rows, take, exact, out);
    } else {
      references_of_lanes<V, M, 32>(ms, S, s0, rows, take, exact, out);
    }
  }
}

using RowsPath = void (*)(const double*, std::size_t, const std::int32_t*, std::size_t, bool, GroupReference*);

// One function per instruction set. Two stages per vector on the base path (one SSE2 or
// NEON register: vectors of four, split in two by the compiler, cost GCC four times the
// compile time on these networks); four with AVX2 (sixteen 256-bit registers: a 32-row
// network spills); eight with AVX-512, whose 32 registers hold the rows.
void references_base(const double* ms, std::size_t S, const std::int32_t* rows, std::size_t take, bool exact,
                     GroupReference* out) {
  references_in<V2, M2>(ms, S, rows, take, exact, out);
}

#if RS_ISA_PATHS
RS_TARGET_AVX2 void references_avx2(const double* ms, std::size_t S, const std::int32_t* rows, std::size_t take,
                                    bool exact, GroupReference* out) {
  references_in<V4, M4>(ms, S, rows, take, exact, out);
}

RS_TARGET_AVX512 void references_avx512(const double* ms, std::size_t S, const std::int32_t* rows, std::size_t take,
                                        bool exact, GroupReference* out) {
  references_in<V8, M8>(ms, S, rows, take, exact, out);
}
#endif

RowsPath rows_path(Isa isa) {
#if RS_ISA_PATHS
  if (isa == Isa::kAvx512) return references_avx512;
  if (isa == Isa::kAvx2) return references_avx2;
#endif
  (void)isa;
  return references_base;
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
    for (double& x : values) x = std::fabs(x - g.median);
    if (small) {
      insertion_sort(values);
    } else {
      std::nth_element(values.begin(), mid, values.end());
    }
    g.mad = values[m] / g.median * mad_correction(n);
  }
  return g;
}

void references_of_rows_on(Isa isa, const double* ms, std::size_t S, const std::int32_t* rows, std::size_t take,
                           bool exact, GroupReference* out) {
  if (!isa_available(isa)) {
    throw std::invalid_argument("references_of_rows_on: instruction set " + std::to_string(static_cast<int>(isa)) +
                                " is not available on this CPU or build");
  }
  rows_path(isa)(ms, S, rows, take, exact, out);
}

#if RS_ISA_PATHS
// The path chosen at load time, as target_clones chooses a clone: an ifunc whose resolver
// runs once when the library is loaded.
extern "C" {
static RowsPath rs_resolve_references_of_rows() { return rows_path(widest_isa()); }
}
void references_of_rows(const double* ms, std::size_t S, const std::int32_t* rows, std::size_t take, bool exact,
                        GroupReference* out) __attribute__((ifunc("rs_resolve_references_of_rows")));
#else
void references_of_rows(const double* ms, std::size_t S, const std::int32_t* rows, std::size_t take, bool exact,
                        GroupReference* out) {
  references_base(ms, S, rows, take, exact, out);
}
#endif

}  // namespace relax_straggler::core::confirm
