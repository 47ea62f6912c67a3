// A deterministic random source for the clusterers' seeding and the coreset sample.
//
// std::mt19937_64's output sequence is fixed by the standard, but the std::*_distribution
// classes are not (libstdc++ and libc++ differ), so draws are derived here from the raw
// 64-bit output: the same seed gives the same clustering on every platform.
#pragma once

#include <cstdint>
#include <random>

namespace relax_straggler::core::detect {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : engine_(seed) {}

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

  // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; bias below 2^-64 * n).
  std::uint64_t below(std::uint64_t n) {
    return static_cast<std::uint64_t>((static_cast<unsigned __int128>(engine_()) * n) >> 64);
  }

 private:
  std::mt19937_64 engine_;
};

}  // namespace relax_straggler::core::detect
