// The input of offline attribution: one step of a pipeline-parallel job, seen per worker.
//
// A worker is one (dp_rank, pp_rank) model replica slice; its tensor-parallel ranks run in
// lockstep and are merged into one row by the caller. Workers are indexed
// w = pp_rank * dp + dp_rank, so the dp replicas of one pipeline stage are contiguous.
// All times are milliseconds per step; NaN means "not recorded / not run".
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/thresholds.h"

namespace relax_straggler::core::attribute {

// Pipeline point-to-point operations, Megatron timer names forward-send, forward-recv,
// backward-send, backward-recv. Activations flow to higher pp ranks in forward, gradients
// to lower pp ranks in backward.
enum class P2pOp : std::uint8_t { kForwardSend = 0, kForwardRecv = 1, kBackwardSend = 2, kBackwardRecv = 3 };
constexpr std::size_t kNumP2pOps = 4;
const char* p2p_op_name(P2pOp op);

// +1 when the partner of `op` sits at a higher pp rank (forward-send, backward-recv), -1
// when it sits at a lower one (forward-recv, backward-send).
int p2p_partner_direction(P2pOp op);

// The op the partner runs on the other end of the same transfer (forward-send <-> forward-recv).
P2pOp p2p_counterpart(P2pOp op);

struct GridShape {
  std::int32_t dp = 1;  // data-parallel replicas, >= 1
  std::int32_t pp = 1;  // pipeline stages, >= 1

  std::int32_t workers() const { return dp * pp; }
  std::int32_t index(std::int32_t dp_rank, std::int32_t pp_rank) const { return pp_rank * dp + dp_rank; }
  std::int32_t dp_rank(std::int32_t worker) const { return worker % dp; }
  std::int32_t pp_rank(std::int32_t worker) const { return worker / dp; }
};

struct WorkerStep {
  std::int64_t step = 0;
  // workers x compute stages, worker-major (the stage names are given to the attributor).
  std::vector<double> compute_ms;
  // workers x kNumP2pOps in P2pOp order; empty when the input has no pipeline p2p times.
  std::vector<double> p2p_ms;
  // workers x collective stages (named at the attributor), the worker's shortest rank
  // (the rank that arrived last waits least); empty when the attributor has none.
  std::vector<double> collective_ms;
  // Measured wall time of the step; NaN when the input does not say. Used as the budget
  // of the impact rule; when NaN the budget is the largest per-worker compute sum.
  double step_ms = std::numeric_limits<double>::quiet_NaN();
};

struct AttributionConfig {
  // Compute rule (thresholds.h, both parts asked): t >= ref * relative_threshold and
  // t - ref >= absolute_ms_threshold.
  double relative_threshold = kDefaultRelativeThreshold;
  double absolute_ms_threshold = kDefaultAbsoluteMsThreshold;
  // Impact rule: an excess below min_impact x step budget cannot explain a slow job and is
  // not flagged (a 2x slower 20 ms optimizer in a 40 s step). Dimensionless, in [0, 1).
  double min_impact = 0.02;
  // Pipeline p2p rules: a p2p time above p2p_ratio x the smallest time of the
  // same op in the step is abnormal; a value above jump_ratio x the worker's previous value
  // is a jump; a worker whose mean exceeds baseline_ratio x the median worker mean of
  // that op is a baseline outlier.
  double p2p_ratio = 1.3;
  double jump_ratio = 2.0;
  double baseline_ratio = 2.0;
  // PP = 2 fallback: a step is slow when its step_ms exceeds slow_step_ratio x the median
  // of the previous slow_step_window steps; a worker whose p2p mean over slow steps
  // exceeds p2p_ratio x its mean over fast steps is implicated.
  double slow_step_ratio = 1.25;
  std::int32_t slow_step_window = 20;
  // A finding is persistent when it holds in at least this fraction of the steps.
  double persistence = 0.5;

  // Throws std::invalid_argument naming the offending field.
  void validate() const;
};

}  // namespace relax_straggler::core::attribute
