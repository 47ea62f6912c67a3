// Collective kinds as the timer groups them; the first seven are the per-op
// communication stages (`communication/<op>`, relax_straggler.common.stages.COMMUNICATION_OPS
// order), kOther holds reduce, gather, scatter and barrier (counted in the total only).
#pragma once

#include <cstddef>
#include <cstdint>

namespace relax_straggler::torch_ext {

enum class CommOp : std::uint8_t {
  kAllreduce = 0,
  kReduceScatter = 1,
  kAllgather = 2,
  kBroadcast = 3,
  kAlltoall = 4,
  kSend = 5,
  kRecv = 6,
  kOther = 7,
};

constexpr std::size_t kNumCommOps = 8;

// Durations of at most this many collectives per sampled step are kept individually for
// the late-arrival comparison across ranks (the rest still count in the totals).
constexpr std::size_t kMaxComparableCollectives = 32;

}  // namespace relax_straggler::torch_ext
