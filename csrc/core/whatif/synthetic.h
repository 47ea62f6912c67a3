// Synthetic 1F1B jobs for benchmarks and tests, built straight into a WhatIfModel (no
// record arrays, so a 16,384-worker job fits in memory): forward 10 ms and backward 20 ms
// per microbatch with +-5 % uniform noise, p2p transfers 0.2 ms, params-all-gather 5 ms,
// grads-reduce-scatter 10 ms, clip 2 ms, optimizer 5 ms. The recorded timeline is the
// replayed one (simulation error 1).
//
// vpp > 1: the interleaved (virtual pipeline) 1F1B schedule of Megatron-LM
// (schedules.py, forward_backward_pipelining_with_interleaving): each stage holds vpp model
// chunks of 1 / vpp of its layers (compute 10 / vpp and 20 / vpp ms); virtual microbatch k
// runs chunk (k mod (pp x vpp)) / pp forward (reversed backward) on microbatch
// (k / (pp x vpp)) x pp + k mod pp; stage s warms up with (pp - s - 1) x 2 + (vpp - 1) x pp
// forwards (all of them when microbatches == pp). Every compute has its p2p recv and send;
// those whose peer chunk lies outside the model are no-ops of 0 s (dependency_model.h).
// One params-all-gather and one grads-reduce-scatter per chunk.
#pragma once

#include <cstdint>

#include "core/whatif/model.h"

namespace relax_straggler::core::whatif {

struct SyntheticSpec {
  std::int32_t dp = 1, pp = 1, microbatches = 1, steps = 1;
  std::uint64_t seed = 0;
  std::int32_t slow_dp = -1, slow_stage = -1;  // the slow worker; -1 = none
  double slow_factor = 1.0;                    // its compute durations are multiplied by this
  std::int32_t vpp = 1;                        // model chunks per stage (virtual pipeline)
};

// Op types of a synthetic model, in this order (Megatron timer names).
extern const char* const kSyntheticOpTypes[13];

// Throws std::invalid_argument on a size < 1, or vpp > 1 with microbatches not a multiple of pp.
WhatIfModel synthetic_model(const SyntheticSpec& spec);

}  // namespace relax_straggler::core::whatif
