// A job ready for what-if replay: the dependency graph plus, per op instance (step, slot,
// dp lane), its recorded effective duration, and per op type its ideal duration.
//
// Effective duration (s): for an op of a sync group, its transfer part, i.e. its end minus
// the latest start of the group's members in that step (every dp_rank for dp-synced groups),
// clamped to 0 when clock skew makes it more negative than 10 ms; for any other op, its
// duration. Ideal duration per op type (paper Sec. 4.2): the mean over every worker and step
// for compute types, the median for communication types.
#pragma once

#include <cstdint>
#include <vector>

#include "core/whatif/dependency_model.h"
#include "core/whatif/op_record.h"

namespace relax_straggler::core::whatif {

struct WhatIfModel {
  DependencyGraph graph;
  std::int32_t dp = 1;                   // dp lanes
  std::vector<std::int32_t> dp_ranks;    // lane -> dp_rank as recorded
  std::vector<std::int64_t> steps;       // step index -> step number as recorded
  std::vector<OpRole> optype_roles;      // per op type
  std::vector<float> recorded;           // [step][slot][lane], s
  std::vector<double> ideal;             // per op type, s
  std::vector<double> measured_step_s;   // per step: last end - first start as recorded

  std::int32_t pp() const { return graph.pp; }
  std::int32_t num_steps() const { return static_cast<std::int32_t>(steps.size()); }
  std::size_t index(std::int32_t step, std::int32_t slot, std::int32_t lane) const {
    return (static_cast<std::size_t>(step) * graph.slots() + slot) * dp + lane;
  }
};

// Builds the model from records (any order). optype_roles[t] is the role of op type t.
// Every dp_rank and step must run the same ops (stage, op type, seq_id) as dp_rank 0 in
// the first step; stages must be 0..pp-1. Throws std::invalid_argument naming the record
// (its row index) or the missing op.
// Memory beyond the model: the distinct dp_ranks and steps, and a start and an end (16 bytes)
// per op while the effective durations are computed.
WhatIfModel build_model(const std::vector<OpRecord>& records, const std::vector<OpRole>& optype_roles);
WhatIfModel build_model(const OpColumns& records, const std::vector<OpRole>& optype_roles);

// Fills model.ideal from model.recorded (mean for compute types, median for communication).
void compute_ideal(WhatIfModel& model);

}  // namespace relax_straggler::core::whatif
