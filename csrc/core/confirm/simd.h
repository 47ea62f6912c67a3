// The confirmed verdict's per-report kernels (ConfirmTracker, tracker.h), each compiled once
// per instruction set (core/simd.h: the build's default, AVX2, AVX-512) with the widest this
// CPU has chosen at load time; every path gives the same result on the same input.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/simd.h"

namespace relax_straggler::core::confirm {

// Noise rings interleaved in one block of ring_medians: the floats of the widest vector (F8).
inline constexpr std::size_t kNoiseLanes = 8;

// ConfirmTracker::update's pass over the matrix, the only per-cell work of a report: the
// rows r of ms (ranks x S ms, rank-major, NaN = not run) with a cell above hi_ms or below
// lo_ms at group[r] x S (per (group, stage) bounds), ascending, into out (room for ranks
// rows); returns how many. A NaN cell lies inside. Compiled once per instruction set
// (core/simd.h: eight stages per vector with AVX-512, else four), the widest this CPU has
// chosen at load time.
std::size_t rows_outside(const double* ms, std::size_t ranks, std::size_t S, const std::int32_t* group,
                         const double* hi_ms, const double* lo_ms, std::int32_t* out);

// rows_outside on the path compiled for isa; every path gives the same rows. Throws
// std::invalid_argument where isa_available(isa) is false.
std::size_t rows_outside_on(Isa isa, const double* ms, std::size_t ranks, std::size_t S, const std::int32_t* group,
                            const double* hi_ms, const double* lo_ms, std::int32_t* out);

// The medians of the learned noise (ConfirmTracker::learn_noise): block holds kNoiseLanes
// interleaved rings of mem floats (entry i of ring l at block[i * kNoiseLanes + l], +inf where not
// filled), 1 <= mem <= 64, and 0 <= due[l] <= mem; median[l] is the entry at index
// due[l] / 2 of ring l's mem entries sorted ascending (meaningful where due[l] > 0, the
// number of entries filled). Compiled once per instruction set (eight rings per vector
// with AVX2, else four), the widest this CPU has chosen at load time.
void ring_medians(const float* block, std::size_t mem, const std::int32_t* due, float* median);

// ring_medians on the path compiled for isa; every path gives the same medians. Throws
// std::invalid_argument where isa_available(isa) is false.
void ring_medians_on(Isa isa, const float* block, std::size_t mem, const std::int32_t* due, float* median);

}  // namespace relax_straggler::core::confirm
