// Synthetic 1F1B jobs for benchmarks and tests, built straight into a WhatIfModel (no
// record arrays, so a 16,384-worker job fits in memory): forward 10 ms and backward 20 ms
// per microbatch with +-5 % uniform noise, p2p transfers 0.2 ms, params-all-gather 5 ms,
// grads-reduce-scatter 10 ms, clip 2 ms, optimizer 5 ms. The recorded timeline is the
// replayed one (simulation error 1).
#pragma once

#include <cstdint>

#include "core/whatif/model.h"

namespace relax_straggler::core::whatif {

struct SyntheticSpec {
  std::int32_t dp = 1, pp = 1, microbatches = 1, steps = 1;
  std::uint64_t seed = 0;
  std::int32_t slow_dp = -1, slow_stage = -1;  // the slow worker; -1 = none
  double slow_factor = 1.0;                    // its compute durations are multiplied by this
};

// Op types of a synthetic model, in this order (Megatron timer names).
extern const char* const kSyntheticOpTypes[13];

// Throws std::invalid_argument on a size < 1.
WhatIfModel synthetic_model(const SyntheticSpec& spec);

}  // namespace relax_straggler::core::whatif
