#include "core/confirm/simd.h"

#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace relax_straggler::core::confirm {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Whether any lane of m is non-zero: halves OR-ed down to 128 bits (a vector extract and
// an OR per halving) where lane by lane it took an extract and an OR per lane.
inline __attribute__((always_inline)) bool any_lane(const M2& m) { return (m[0] | m[1]) != 0; }

// The OR of m's two halves into half (by reference: a vector returned by value would
// depend on the caller's instruction set).
template <class Half, class M>
inline __attribute__((always_inline)) void fold(const M& m, Half& half) {
  Half hi;
  std::memcpy(&half, &m, sizeof half);
  std::memcpy(&hi, reinterpret_cast<const char*>(&m) + sizeof half, sizeof hi);
  half |= hi;
}

inline __attribute__((always_inline)) bool any_lane(const M4& m) {
  M2 half;
  fold(m, half);
  return any_lane(half);
}

inline __attribute__((always_inline)) bool any_lane(const M8& m) {
  M4 half;
  fold(m, half);
  return any_lane(half);
}

// Whether a cell of the K rows at `rows` (S doubles apart) in the stages from s on, W at a
// time (W the lanes of V, M its integer vector), lies above hi or below lo; s is advanced
// past the stages tested. Per stage the K rows' largest and smallest time (a NaN, a stage
// not run, is skipped: it compares false), then one compare with each bound: a cell costs
// one max and one min (where it cost two compares and two ORs), each bound is loaded once
// for the K rows, and there is one reduction (outliers are rare).
template <class V, class M, std::size_t K>
inline __attribute__((always_inline)) bool outside_lanes(const double* rows, std::size_t S, const double* hi,
                                                         const double* lo, std::size_t& s) {
  constexpr std::size_t W = sizeof(V) / sizeof(double);
  // Two accumulators: OR-ing both compares into one, GCC 12 splits 512-bit ones into scalars.
  M above = {}, under = {};
  for (; s + W <= S; s += W) {
    V top = V{} - kInf, bottom = V{} + kInf;
    for (std::size_t k = 0; k < K; ++k) {
      V t;
      std::memcpy(&t, rows + k * S + s, sizeof t);
      top = t > top ? t : top;
      bottom = t < bottom ? t : bottom;
    }
    V h, l;
    std::memcpy(&h, hi + s, sizeof h);
    std::memcpy(&l, lo + s, sizeof l);
    above |= top > h;
    under |= bottom < l;
  }
  return any_lane(above | under);
}

// Whether any of the K rows at `rows` has a cell outside its stage's bounds: V's lanes,
// then four, then one stage at a time.
template <class V, class M, std::size_t K>
inline __attribute__((always_inline)) bool outside(const double* rows, std::size_t S, const double* hi,
                                                   const double* lo) {
  std::size_t s = 0;
  bool out = outside_lanes<V, M, K>(rows, S, hi, lo, s);
  if constexpr (sizeof(V) > sizeof(V4)) out = outside_lanes<V4, M4, K>(rows, S, hi, lo, s) || out;
  for (; s < S; ++s) {
    for (std::size_t k = 0; k < K; ++k) out = out || rows[k * S + s] > hi[s] || rows[k * S + s] < lo[s];
  }
  return out;
}

// Whether rows [r, r + n) all belong to group[r].
inline bool same_group(const std::int32_t* group, std::size_t r, std::size_t n) {
  bool same = true;
  for (std::size_t k = 1; k < n; ++k) same = same && group[r + k] == group[r];
  return same;
}

// rows_outside with the stages W at a time, W the lanes of V: eight rows of one group are
// tested together (four where a block of eight spans two groups), and only the rows of a
// block with a cell outside one by one.
template <class V, class M>
inline __attribute__((always_inline)) std::size_t rows_outside_in(const double* ms, std::size_t ranks, std::size_t S,
                                                                  const std::int32_t* group, const double* hi_ms,
                                                                  const double* lo_ms, std::int32_t* out) {
  constexpr std::size_t kBlock = 8, kHalf = kBlock / 2;
  std::size_t n = 0, r = 0;
  // always_inline: a lambda compiled apart would get the build's default vectors.
  const auto test = [&](std::size_t row) __attribute__((always_inline)) {
    const std::size_t base = static_cast<std::size_t>(group[row]) * S;
    out[n] = static_cast<std::int32_t>(row);
    n += outside<V, M, 1>(ms + row * S, S, hi_ms + base, lo_ms + base);
  };
  const auto test_half = [&](std::size_t first) __attribute__((always_inline)) {
    const std::size_t base = static_cast<std::size_t>(group[first]) * S;
    if (same_group(group, first, kHalf) && !outside<V, M, kHalf>(ms + first * S, S, hi_ms + base, lo_ms + base)) {
      return;
    }
    for (std::size_t k = first; k < first + kHalf; ++k) test(k);
  };
  for (; r + kBlock <= ranks; r += kBlock) {
    const std::size_t base = static_cast<std::size_t>(group[r]) * S;
    if (same_group(group, r, kBlock)) {
      if (!outside<V, M, kBlock>(ms + r * S, S, hi_ms + base, lo_ms + base)) continue;
      for (std::size_t k = r; k < r + kBlock; ++k) test(k);
    } else {
      test_half(r);
      test_half(r + kHalf);
    }
  }
  for (; r < ranks; ++r) test(r);
  return n;
}

using OutsidePath = std::size_t (*)(const double*, std::size_t, std::size_t, const std::int32_t*, const double*,
                                    const double*, std::int32_t*);

// One function per instruction set (core/simd.h), the widest chosen at load time (below).
std::size_t rows_outside_base(const double* ms, std::size_t ranks, std::size_t S, const std::int32_t* group,
                              const double* hi_ms, const double* lo_ms, std::int32_t* out) {
  return rows_outside_in<V4, M4>(ms, ranks, S, group, hi_ms, lo_ms, out);
}

#if RS_ISA_PATHS
RS_TARGET_AVX2 std::size_t rows_outside_avx2(const double* ms, std::size_t ranks, std::size_t S,
                                             const std::int32_t* group, const double* hi_ms, const double* lo_ms,
                                             std::int32_t* out) {
  return rows_outside_in<V4, M4>(ms, ranks, S, group, hi_ms, lo_ms, out);
}

RS_TARGET_AVX512 std::size_t rows_outside_avx512(const double* ms, std::size_t ranks, std::size_t S,
                                                 const std::int32_t* group, const double* hi_ms, const double* lo_ms,
                                                 std::int32_t* out) {
  return rows_outside_in<V8, M8>(ms, ranks, S, group, hi_ms, lo_ms, out);
}
#endif

OutsidePath outside_path(Isa isa) {
#if RS_ISA_PATHS
  if (isa == Isa::kAvx512) return rows_outside_avx512;
  if (isa == Isa::kAvx2) return rows_outside_avx2;
#endif
  (void)isa;
  return rows_outside_base;
}

// The median of the first due[l] entries of each lane's ring (lane l of kNoiseLanes
// interleaved rings of mem floats, +inf past the filled entries; due[l] 0: not wanted) into
// median[l]: the rings sorted by one network of N >= mem rows, padded with +inf, W lanes at
// a time (W the floats of V, I its integer vector).
template <std::size_t N, class V, class I>
inline __attribute__((always_inline)) void ring_medians_of(const float* block, std::size_t mem,
                                                           const std::int32_t* due, float* median) {
  constexpr std::size_t W = sizeof(V) / sizeof(float);
  static_assert(kNoiseLanes % W == 0, "a vector holds a whole number of lanes");
  const float inf = std::numeric_limits<float>::infinity();
  for (std::size_t l0 = 0; l0 < kNoiseLanes; l0 += W) {
    V v[N];
    for (std::size_t i = 0; i < N; ++i) {
      if (i < mem) {
        std::memcpy(&v[i], block + i * kNoiseLanes + l0, sizeof v[i]);
      } else {
        v[i] = V{} + inf;
      }
    }
    sort_lanes<N, false>(v, I{} + static_cast<int>(opaque_zero()));
    for (std::size_t l = 0; l < W; ++l) median[l0 + l] = v[static_cast<std::size_t>(due[l0 + l]) / 2][l];
  }
}

template <class V, class I>
inline __attribute__((always_inline)) void ring_medians_in(const float* block, std::size_t mem,
                                                           const std::int32_t* due, float* median) {
  if (mem <= 2) return ring_medians_of<2, V, I>(block, mem, due, median);
  if (mem <= 4) return ring_medians_of<4, V, I>(block, mem, due, median);
  if (mem <= 8) return ring_medians_of<8, V, I>(block, mem, due, median);
  if (mem <= 16) return ring_medians_of<16, V, I>(block, mem, due, median);
  if (mem <= 32) return ring_medians_of<32, V, I>(block, mem, due, median);
  ring_medians_of<64, V, I>(block, mem, due, median);
}

using MediansPath = void (*)(const float*, std::size_t, const std::int32_t*, float*);

// One function per instruction set: eight lanes per vector with AVX2, else four (a vector
// of eight floats split in two by the compiler costs GCC minutes on the 64-row network).
void ring_medians_base(const float* block, std::size_t mem, const std::int32_t* due, float* median) {
  ring_medians_in<F4, I4>(block, mem, due, median);
}

#if RS_ISA_PATHS
RS_TARGET_AVX2 void ring_medians_avx2(const float* block, std::size_t mem, const std::int32_t* due, float* median) {
  ring_medians_in<F8, I8>(block, mem, due, median);
}
#endif

MediansPath medians_path(Isa isa) {
#if RS_ISA_PATHS
  if (isa != Isa::kBase) return ring_medians_avx2;
#endif
  (void)isa;
  return ring_medians_base;
}

}  // namespace

void ring_medians_on(Isa isa, const float* block, std::size_t mem, const std::int32_t* due, float* median) {
  if (!isa_available(isa)) {
    throw std::invalid_argument("ring_medians_on: instruction set " + std::to_string(static_cast<int>(isa)) +
                                " is not available on this CPU or build");
  }
  medians_path(isa)(block, mem, due, median);
}

std::size_t rows_outside_on(Isa isa, const double* ms, std::size_t ranks, std::size_t S, const std::int32_t* group,
                            const double* hi_ms, const double* lo_ms, std::int32_t* out) {
  if (!isa_available(isa)) {
    throw std::invalid_argument("rows_outside_on: instruction set " + std::to_string(static_cast<int>(isa)) +
                                " is not available on this CPU or build");
  }
  return outside_path(isa)(ms, ranks, S, group, hi_ms, lo_ms, out);
}

#if RS_ISA_PATHS
// The path chosen at load time, as target_clones chooses a clone: an ifunc whose resolver
// runs once when the library is loaded.
extern "C" {
static OutsidePath rs_resolve_rows_outside() { return outside_path(widest_isa()); }
static MediansPath rs_resolve_ring_medians() { return medians_path(widest_isa()); }
}
std::size_t rows_outside(const double* ms, std::size_t ranks, std::size_t S, const std::int32_t* group,
                         const double* hi_ms, const double* lo_ms, std::int32_t* out)
    __attribute__((ifunc("rs_resolve_rows_outside")));
void ring_medians(const float* block, std::size_t mem, const std::int32_t* due, float* median)
    __attribute__((ifunc("rs_resolve_ring_medians")));
#else
std::size_t rows_outside(const double* ms, std::size_t ranks, std::size_t S, const std::int32_t* group,
                         const double* hi_ms, const double* lo_ms, std::int32_t* out) {
  return rows_outside_base(ms, ranks, S, group, hi_ms, lo_ms, out);
}
void ring_medians(const float* block, std::size_t mem, const std::int32_t* due, float* median) {
  ring_medians_base(block, mem, due, median);
}
#endif

}  // namespace relax_straggler::core::confirm
