// Attribution over a whole run: feeds steps one at a time (streaming; memory is
// O(workers), never O(steps x workers)) and unions the per-step findings.
//
// Per step: classify_step (individual vs structural compute slowness),
// cross_validate_step (pipeline p2p) and find_late_arrivals (data-parallel collectives).
// Over the run:
//   - each finding counts the steps it held in; it is persistent when that is at least
//     persistence x steps (a one-step blip is reported, as transient);
//   - jumps: a worker's p2p time above jump_ratio x its previous value;
//   - baseline outliers: a worker whose mean p2p time exceeds baseline_ratio x the median
//     of all workers' means of that op;
//   - PP = 2 fallback (one neighbour per worker, so cross-validation cannot tell sides
//     apart): steps slower than slow_step_ratio x the rolling median step time are slow; a
//     worker whose p2p mean over slow steps exceeds p2p_ratio x its mean over fast steps
//     is reported (kP2pSlowSteps).
// The design follows mt-detector (Megatron timers: first-value, jump and
// baseline checks, then send/recv cross-validation) restated on per-step worker grids.
#pragma once

#include <cstdint>
#include <array>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "core/attribute/classify.h"
#include "core/attribute/late_arrival.h"
#include "core/attribute/pipeline.h"
#include "core/attribute/worker_grid.h"

namespace relax_straggler::core::attribute {

enum class FindingKind : std::uint8_t {
  kIndividual = 0,   // one worker slow in a compute stage vs its dp replicas
  kStructural = 1,   // every replica of a pipeline stage slow vs the other stages
  kLink = 2,         // p2p between two neighbouring workers, both ends abnormal
  kSendSide = 3,     // one worker's sends abnormal, receiver normal
  kRecvSide = 4,     // one worker's receives abnormal, sender normal
  kNodeNetwork = 5,  // every p2p op of a worker abnormal
  kP2pSlowSteps = 6  // PP = 2 fallback
};
const char* finding_kind_name(FindingKind kind);

struct Finding {
  FindingKind kind = FindingKind::kIndividual;
  std::int32_t worker = -1;       // individual, send/recv side, node network, p2p slow steps; link: lower worker
  std::int32_t peer_worker = -1;  // link: the higher worker
  std::int32_t pp_rank = -1;      // structural: the stage; others: the worker's pp rank
  std::int32_t stage = -1;        // compute stage column (individual, structural), else -1
  std::int32_t op = -1;           // P2pOp (send/recv side, node network: first op, p2p slow steps), else -1
  std::int64_t steps_flagged = 0;
  std::int64_t first_step = 0, last_step = 0;
  double mean_ratio = 0.0;      // time / reference, mean over flagged steps
  double max_ratio = 0.0;
  double mean_excess_ms = 0.0;  // time - reference, mean over flagged steps
  bool persistent = false;
  // individual / structural: p2p waits of other workers explained by this worker (stage).
  std::int64_t waits_explained = 0;
};

struct JumpEvent {
  std::int64_t step = 0;
  std::int32_t worker = -1;
  P2pOp op = P2pOp::kForwardSend;
  double ms = 0.0, previous_ms = 0.0;
};

struct BaselineOutlier {
  std::int32_t worker = -1;
  P2pOp op = P2pOp::kForwardSend;
  double mean_ms = 0.0, baseline_ms = 0.0;
  std::int64_t steps_abnormal = 0, steps_explained = 0;
};

struct RunAttribution {
  std::int64_t steps = 0;
  std::vector<Finding> findings;  // persistent first, then by steps_flagged, then by excess
  std::vector<JumpEvent> jumps;   // in step order
  std::vector<BaselineOutlier> baseline_outliers;
  std::vector<std::int64_t> slow_steps;  // PP = 2 fallback only
  // workers x collective stages, worker-major: steps in which the worker arrived last.
  std::vector<std::int64_t> late_arrivals;
};

struct StepAttribution {
  StepClassification compute;
  P2pStepResult p2p;
  std::vector<LateArrival> late;
};

class RunAttributor {
 public:
  // collective_stages: the columns of WorkerStep::collective_ms (none: no late arrivals).
  // Throws std::invalid_argument on an invalid shape, stage list or config.
  RunAttributor(GridShape shape, std::vector<std::string> compute_stages, AttributionConfig config,
                std::vector<std::string> collective_stages = {});

  // Judges one step and folds it into the run. Throws std::invalid_argument on sizes that
  // do not match the shape, or when p2p_ms is given for some steps and not others.
  StepAttribution add_step(const WorkerStep& step);

  // The run so far (callable repeatedly).
  RunAttribution finish() const;

  const GridShape& shape() const { return shape_; }
  const std::vector<std::string>& compute_stages() const { return stages_; }
  const std::vector<std::string>& collective_stages() const { return collective_stages_; }

 private:
  struct Accum {
    Finding finding;
    double sum_ratio = 0.0, sum_excess_ms = 0.0;
  };
  struct SeriesState {
    double previous_ms = 0.0;
    bool has_previous = false;
    double sum_ms = 0.0;
    std::int64_t count = 0, abnormal = 0, explained = 0;
    double slow_sum_ms = 0.0, fast_sum_ms = 0.0;
    std::int64_t slow_count = 0, fast_count = 0;
  };

  void count(Finding key, std::int64_t step, double ratio, double excess_ms);
  void fold_p2p(const WorkerStep& step, const P2pStepResult& p2p, bool slow_step, bool fast_step);
  bool classify_slow_step(double step_ms, bool& fast);

  GridShape shape_;
  std::vector<std::string> stages_;
  std::vector<std::string> collective_stages_;
  AttributionConfig config_;
  std::int64_t steps_ = 0;
  int has_p2p_ = -1;  // -1 unknown until the first step
  std::vector<Accum> accums_;
  // (kind, worker, peer_worker, pp_rank, stage, op) -> index into accums_
  std::map<std::array<std::int32_t, 6>, std::size_t> accum_index_;
  std::vector<std::int64_t> worker_waits_explained_;  // per worker
  std::vector<SeriesState> series_;                   // workers x kNumP2pOps
  std::vector<JumpEvent> jumps_;
  std::deque<double> recent_step_ms_;
  std::vector<std::int64_t> slow_steps_;
  std::vector<std::int64_t> late_arrivals_;  // workers x collective stages
  std::vector<double> scratch_;
};

}  // namespace relax_straggler::core::attribute
