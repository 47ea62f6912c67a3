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

constexpr double kInf = std::numeric_limits<double>::infinity();

// Orders two vectors lane by lane: a gets the smaller of each pair, b the larger, as a
// permutation of the pair (an equal pair stays as it was). zero: opaque_zero() in every
// lane; b | zero keeps the compiler from sharing one compare between the two selections
// (a compare and two blends) so that each is one vminpd / vmaxpd.
inline __attribute__((always_inline)) void order(V4& a, V4& b, const M4& zero) {
  const V4 b_again = reinterpret_cast<V4>(reinterpret_cast<M4>(b) | zero);
  const V4 lo = a < b ? a : b;
  b = b_again > a ? b_again : a;
  a = lo;
}

// Compare-exchanges (lower row, upper row) of two networks over N rows (N a power of two),
// in order, passed to f. The sort: Batcher's odd-even merge sort (1968), 19, 63 and 191
// compare-exchanges for 8, 16 and 32 rows (a bitonic sort takes 24, 80 and 240). The
// merge: the bitonic merge, which sorts a sequence that falls and then rises (N / 2 log N).
template <std::size_t N, class F>
constexpr void odd_even_merge_sort(F&& f) {
  for (std::size_t p = 1; p < N; p <<= 1) {
    for (std::size_t k = p; k >= 1; k >>= 1) {
      for (std::size_t j = k % p; j + k < N; j += 2 * k) {
        for (std::size_t i = 0; i < k && i + j + k < N; ++i) {
          if ((i + j) / (2 * p) == (i + j + k) / (2 * p)) f(i + j, i + j + k);
        }
      }
    }
  }
}

template <std::size_t N, class F>
constexpr void bitonic_merge(F&& f) {
  for (std::size_t j = N / 2; j > 0; j >>= 1) {
    for (std::size_t i = 0; i < N; ++i) {
      if ((i & j) == 0) f(i, i | j);
    }
  }
}

// A network as constant tables: the unrolled code indexes v by constants, with no index
// arithmetic or branch per compare-exchange.
template <std::size_t N, bool kMerge>
struct Network {
  template <class F>
  static constexpr void visit(F&& f) {
    if constexpr (kMerge) {
      bitonic_merge<N>(f);
    } else {
      odd_even_merge_sort<N>(f);
    }
  }
  static constexpr std::size_t size() {
    std::size_t n = 0;
    visit([&n](std::size_t, std::size_t) { ++n; });
    return n;
  }
  std::size_t lo[size()] = {}, hi[size()] = {};
  constexpr Network() {
    std::size_t n = 0;
    visit([this, &n](std::size_t a, std::size_t b) {
      lo[n] = a;
      hi[n] = b;
      ++n;
    });
  }
};

// Sorts v[0, N) ascending lane by lane (kMerge: v falls and then rises in every lane), no
// branch on the data (+inf pads sort last).
template <std::size_t N, bool kMerge>
inline __attribute__((always_inline)) void sort(V4* v, const M4& zero) {
  static constexpr Network<N, kMerge> kNetwork;
  constexpr std::size_t kSize = Network<N, kMerge>::size();
#pragma GCC unroll 256
  for (std::size_t c = 0; c < kSize; ++c) order(v[kNetwork.lo[c]], v[kNetwork.hi[c]], zero);
}

// references_of_rows for the stages s0 .. s0 + 3 below S, N >= take the network size: each
// stage one lane of a vector, so every row's times are loaded straight from the matrix (no
// stage-minor copy) and the four columns sorted together.
template <std::size_t N>
RS_AVX2_CLONE void references_of_lanes(const double* ms, std::size_t S, std::size_t s0, const std::int32_t* rows,
                                       std::size_t take, bool exact, GroupReference* out) {
  const std::size_t width = std::min<std::size_t>(4, S - s0);
  const V4 inf = {kInf, kInf, kInf, kInf};
  V4 v[N];
  M4 finite = {0, 0, 0, 0};  // minus the count of finite times per lane
  for (std::size_t i = 0; i < N; ++i) {
    V4 t = inf;
    if (i < take) {
      const double* row = ms + static_cast<std::size_t>(rows[i]) * S + s0;
      if (width == 4) {
        std::memcpy(&t, row, sizeof t);
      } else {
        for (std::size_t l = 0; l < width; ++l) t[l] = row[l];
      }
      const M4 ok = t == t;  // NaN (not run) sorts last, as a pad
      finite += ok;
      t = ok ? t : inf;
    }
    v[i] = t;
  }
  const long long z = opaque_zero();
  const M4 zero = {z, z, z, z};
  sort<N, false>(v, zero);
  V4 median = {1.0, 1.0, 1.0, 1.0};  // lanes without a spread divide by 1 (read nowhere)
  std::size_t count[4];
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
  // The spread: |t / median - 1| over a sorted column falls to the median and rises after
  // it (division and subtraction round monotonically), and the +inf pads keep rising: a
  // bitonic sequence, which one bitonic merge (N / 2 log N compare-exchanges) sorts.
  const M4 magnitude = ~M4{0, 0, 0, 0} & 0x7fffffffffffffffLL;
  for (std::size_t i = 0; i < take; ++i) {
    v[i] = reinterpret_cast<V4>(reinterpret_cast<M4>(v[i] / median - 1.0) & magnitude);  // fabs
  }
  sort<N, true>(v, zero);
  for (std::size_t l = 0; l < width; ++l) {
    GroupReference& g = out[s0 + l];
    if (count[l] < 2 || !(g.median > 0.0)) continue;
    g.mad = v[count[l] / 2][l] * mad_correction(count[l]);
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
                        GroupReference* out) {
  static_assert(kColumnSortRows == 32, "the largest network below sorts 32 rows");
  for (std::size_t s0 = 0; s0 < S; s0 += 4) {
    if (take <= 2) {
      references_of_lanes<2>(ms, S, s0, rows, take, exact, out);
    } else if (take <= 4) {
      references_of_lanes<4>(ms, S, s0, rows, take, exact, out);
    } else if (take <= 8) {
      references_of_lanes<8>(ms, S, s0, rows, take, exact, out);
    } else if (take <= 16) {
      references_of_lanes<16>(ms, S, s0, rows, take, exact, out);
    } else {
      references_of_lanes<32>(ms, S, s0, rows, take, exact, out);
    }
  }
}

}  // namespace relax_straggler::core::confirm
