// Per-op records of a Megatron-style training step, the input of the what-if simulator.
//
// One record per op that one worker (dp_rank, pp stage) ran in one step: its type (an
// index into the caller's op-type table, each type carrying an OpRole), when it started
// and how long it took (seconds), its per-(worker, step, type) sequence number seq_id, the
// microbatch and the model chunk (virtual-pipeline chunk, 0 without virtual pipelines;
// -1 where the op belongs to no chunk).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace relax_straggler::core::whatif {

// What an op type does in the dependency model (Megatron timer names in brackets).
enum class OpRole : std::uint8_t {
  kForwardCompute,          // forward-compute
  kBackwardCompute,         // backward-compute
  kForwardSend,             // forward-send: activations to stage s+1
  kForwardRecv,             // forward-recv: activations from stage s-1
  kBackwardSend,            // backward-send: gradients to stage s-1
  kBackwardRecv,            // backward-recv: gradients from stage s+1
  kParamsAllGather,         // params-all-gather (dp collective, before a chunk's first forward)
  kGradsReduceScatter,      // grads-reduce-scatter (dp collective, gradient sync)
  kSeparateGradsAllReduce,  // separate-grads-all-reduce (dp collective, overlapped gradient sync)
  kLayernormAllReduce,      // layernorm-grads-all-reduce (communication, no cross-worker edge)
  kEmbeddingAllReduce,      // embedding-grads-all-reduce (first and last stage synchronise)
  kClipMainGrad,            // optimizer-clip-main-grad (every worker synchronises: grad norm)
  kOptimizer,               // optimizer: ends the step
  kGc,                      // gc: after the last backward
};
constexpr int kNumRoles = 14;

// Parses a Megatron timer name into its role; false when the name has no role.
bool role_from_name(const std::string& name, OpRole* role);

// Communication roles take the median as their ideal duration, compute roles the mean.
bool is_communication(OpRole role);

// One op instance. Times in seconds; start on any clock shared by all workers of a step.
struct OpRecord {
  std::int32_t dp_rank = 0;
  std::int32_t stage = 0;
  std::int64_t step = 0;
  std::int32_t optype = 0;  // index into the op-type table given with the records
  double start = 0.0;       // s
  double duration = 0.0;    // s, >= 0
  std::int32_t seq_id = 0;
  std::int32_t microbatch = -1;
  std::int32_t chunk = 0;  // model chunk (mc); -1 = none
};

// The same records as columns (n entries each, owned by the caller): what the trace readers
// hand over, read in place rather than copied into OpRecords.
struct OpColumns {
  std::size_t n = 0;
  const std::int32_t* dp_rank = nullptr;
  const std::int32_t* stage = nullptr;
  const std::int64_t* step = nullptr;
  const std::int32_t* optype = nullptr;
  const double* start = nullptr;
  const double* duration = nullptr;
  const std::int32_t* seq_id = nullptr;
  const std::int32_t* microbatch = nullptr;
  const std::int32_t* chunk = nullptr;

  std::size_t size() const { return n; }
  OpRecord operator[](std::size_t i) const {
    return {dp_rank[i], stage[i], step[i], optype[i], start[i], duration[i], seq_id[i], microbatch[i], chunk[i]};
  }
};

}  // namespace relax_straggler::core::whatif
