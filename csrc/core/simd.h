// Four doubles per vector for the engine's hot loops (GCC/Clang vector extensions: one
// AVX2 instruction per operation in an AVX2 clone, else two SSE2 or NEON ones), and the
// attribute that compiles a function twice on x86-64 ELF, the AVX2 clone chosen at load
// time where the CPU has it.
#pragma once

namespace relax_straggler::core {

using V4 = double __attribute__((vector_size(32)));
using M4 = long long __attribute__((vector_size(32)));

// A zero the optimizer cannot see through (an empty asm on a register): OR-ed into a
// vector it makes a copy the compiler treats as a different value.
inline __attribute__((always_inline)) long long opaque_zero() {
  long long z = 0;
  asm("" : "+r"(z));
  return z;
}

}  // namespace relax_straggler::core

#if defined(__x86_64__) && defined(__ELF__)
#define RS_AVX2_CLONE __attribute__((target_clones("avx2", "default")))
#else
#define RS_AVX2_CLONE  // one build (aarch64: NEON; elsewhere the compiler's default)
#endif
