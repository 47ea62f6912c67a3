// The dependency model of one training step (the OSDI'25 what-if study, Sec. 4.1), built
// once from one template worker-step per pipeline stage and shared by every dp_rank and
// step, since they all run the same schedule.
//
// Nodes are op slots (stage, op type, seq_id). Edges, all within one dp_rank:
//   - forward/backward computes of a stage run in their recorded order (compute stream);
//   - each p2p type (forward/backward send/recv) runs in its recorded order (own stream);
//     a recv feeds the compute it is matched to and is posted after the previous compute of
//     that direction; a send follows the compute it is matched to; the k-th valid send of
//     stage s pairs with the k-th valid recv of stage s+1 (forward) or s-1 (backward),
//     stages wrapping modulo pp so that interleaved (virtual-pipeline) chunks hand over
//     from the last stage to the first; a send/recv whose peer chunk would lie outside the
//     model, or that lies outside the step's computes, is a no-op that pairs with nobody;
//   - with data parallelism, params-all-gather and grads-reduce-scatter run in their
//     recorded order; a chunk's first forward waits for its last params-all-gather;
//   - after the last compute: gc, layernorm all-reduce, embedding all-reduce (first and last
//     stage), the gradient sync (grads-reduce-scatter, or separate-grads-all-reduce when the
//     reduce-scatters overlap backward), optimizer-clip-main-grad, optimizer.
// Sync groups: p2p pairs, the embedding all-reduce of the first and last stage, the clip op
// of every stage, and each dp collective; dp collectives and the clip op also wait for
// every dp_rank ("dp-synced"). A sync group ends, for each member, its transfer time after
// the last member arrived.
#pragma once

#include <cstdint>
#include <vector>

#include "core/whatif/op_record.h"

namespace relax_straggler::core::whatif {

// One op of the template worker-step of one stage (dp_rank 0, first step).
struct TemplateOp {
  OpRole role;
  std::int32_t optype = 0;
  std::int32_t seq_id = 0;
  std::int32_t chunk = 0;  // model chunk, -1 = none
  double start = 0.0;      // s
  double end = 0.0;        // s
};

struct SyncGroup {
  std::vector<std::int32_t> members;  // slots
  bool sync = false;                  // false: a single op that simply runs its duration
  bool dp_synced = false;             // also waits for the same group on every dp_rank
};

struct DependencyGraph {
  std::int32_t pp = 1;
  std::int32_t vpp = 1;
  // Per slot.
  std::vector<std::int32_t> slot_stage, slot_optype, slot_seq;
  std::vector<OpRole> slot_role;
  std::vector<std::int32_t> slot_group;
  std::vector<std::int32_t> dep_begin, deps;  // CSR: deps of slot i in deps[dep_begin[i], dep_begin[i+1])
  std::vector<SyncGroup> groups;
  std::vector<std::int32_t> order;  // groups in topological order

  std::int32_t slots() const { return static_cast<std::int32_t>(slot_stage.size()); }
};

// Builds the graph from templates[stage] (ops in any order; sorted here by start, seq_id,
// op type). use_dp: more than one data-parallel replica (dp collectives synchronise).
// Throws std::invalid_argument naming the stage and op when the schedule cannot be modelled
// (an unmatched p2p op, a missing optimizer, a cycle).
DependencyGraph build_dependency_graph(const std::vector<std::vector<TemplateOp>>& templates, bool use_dp);

}  // namespace relax_straggler::core::whatif
