// Vectors for the engine's hot loops (GCC/Clang vector extensions: a vector wider than the
// instruction set's registers is split by the compiler, so each path uses its own widths:
// a large network on split vectors costs GCC minutes), sorting networks that sort every
// lane of such vectors at once, and the instruction sets of hot loops compiled once per
// set, each path callable by itself (tests compare the paths), one chosen at load time.
#pragma once

#include <cstddef>

namespace relax_straggler::core {

using V2 = double __attribute__((vector_size(16)));  // two doubles: one SSE2 or NEON register
using M2 = long long __attribute__((vector_size(16)));
using V4 = double __attribute__((vector_size(32)));  // four doubles
using M4 = long long __attribute__((vector_size(32)));
using V8 = double __attribute__((vector_size(64)));  // eight doubles: one AVX-512 register
using M8 = long long __attribute__((vector_size(64)));
using F4 = float __attribute__((vector_size(16)));  // four floats: one SSE2 or NEON register
using I4 = int __attribute__((vector_size(16)));
using F8 = float __attribute__((vector_size(32)));  // eight floats
using I8 = int __attribute__((vector_size(32)));

// A zero the optimizer cannot see through (an empty asm on a register): OR-ed into a
// vector it makes a copy the compiler treats as a different value.
inline __attribute__((always_inline)) long long opaque_zero() {
  long long z = 0;
  asm("" : "+r"(z));
  return z;
}

// Orders two vectors lane by lane: a gets the smaller of each pair, b the larger, as a
// permutation of the pair (an equal pair stays as it was). zero: opaque_zero() in every
// lane (M the integer vector of V's size); b | zero keeps the compiler from sharing one
// compare between the two selections (a compare and two blends) so that each is one
// vminpd / vmaxpd (vminps / vmaxps).
template <class V, class M>
inline __attribute__((always_inline)) void order(V& a, V& b, const M& zero) {
  V b_again;
  if constexpr (sizeof(V) == 64) {
    // AVX-512 only (V8): an empty asm on the register itself hides it as well, for no
    // instruction ("v": any of the 32 registers).
    (void)zero;
    b_again = b;
    asm("" : "+v"(b_again));
  } else {
    b_again = reinterpret_cast<V>(reinterpret_cast<M>(b) | zero);
  }
  const V lo = a < b ? a : b;
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

// Sorts v[0, N) ascending lane by lane (kMerge: v falls and then rises in every lane), N a
// power of two >= 2, no branch on the data (+inf pads sort last). zero as for order().
template <std::size_t N, bool kMerge, class V, class M>
inline __attribute__((always_inline)) void sort_lanes(V* v, const M& zero) {
  static constexpr Network<N, kMerge> kNetwork;
  constexpr std::size_t kSize = Network<N, kMerge>::size();
#pragma GCC unroll 1024
  for (std::size_t c = 0; c < kSize; ++c) order(v[kNetwork.lo[c]], v[kNetwork.hi[c]], zero);
}

}  // namespace relax_straggler::core

#if defined(__x86_64__) && defined(__ELF__)
#define RS_ISA_PATHS 1  // kAvx2 and kAvx512 paths are compiled (RS_TARGET_*)
#define RS_TARGET_AVX2 __attribute__((target("avx2")))
#define RS_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl")))
#else
#define RS_ISA_PATHS 0  // one build (aarch64: NEON; elsewhere the compiler's default)
#endif

namespace relax_straggler::core {

// The instruction sets a path of a hot loop is compiled for, narrowest first: kBase the
// build's default (SSE2 on x86-64), kAvx2, kAvx512 (avx512f, avx512dq and avx512vl; 8
// doubles per vector). The two wider ones exist on x86-64 ELF only.
enum class Isa : int { kBase = 0, kAvx2 = 1, kAvx512 = 2 };

// The widest path this CPU runs. Callable from an ifunc resolver (before relocations and
// constructors: __builtin_cpu_init first).
inline Isa widest_isa() {
#if RS_ISA_PATHS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2")) return Isa::kAvx2;
#endif
  return Isa::kBase;
}

// Whether this build and CPU can run the path compiled for isa.
inline bool isa_available(Isa isa) { return static_cast<int>(isa) <= static_cast<int>(widest_isa()); }

}  // namespace relax_straggler::core
