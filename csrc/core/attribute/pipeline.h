// Pipeline send/recv cross-validation for one step (PP >= 2).
//
// A p2p duration includes waiting for the partner (docs/ARCHITECTURE.md invariant 7), so a long wait is a
// symptom; the cause is found by asking the neighbours:
//   abnormal:  t >= p2p_ratio x ref  and  t - ref >= max(abs_ms, min_impact x budget), where
//              ref = the median of the same op over the dp replicas of the worker's pipeline
//              stage when dp >= 3, else the smallest time of the op over all workers (the
//              first-value rule of mt-detector). The replica median is preferred because a
//              straggler's own pipeline runs in another regime: downstream stages wait on
//              it, so its sends are atypically short and a global minimum would make every
//              healthy replica's sends look abnormal (the what-if AR trace shows this);
//   explained: the worker itself or another worker of its dp replica is compute-slow
//              (individual or structural, see classify.h). 1F1B couples every stage of a
//              replica both ways (a slow stage delays its downstream through forward and its
//              upstream through backward, and its own receives through the round trip), so
//              the blamed worker is the worker itself if slow, else the nearest slow worker
//              on the side the op waits for (lower pp ranks for forward-recv and
//              backward-send, higher for forward-send and backward-recv), else the nearest
//              on the other side;
//   otherwise the neighbour on the other end of the transfer decides: its counterpart op
//   abnormal too -> the link between the two; normal -> this worker's send side (send
//   ops) or receive side (recv ops). A worker whose every recorded p2p op is abnormal and
//   unexplained -> its node's network, in place of the per-op findings.
#pragma once

#include <cstdint>
#include <vector>

#include "core/attribute/classify.h"
#include "core/attribute/worker_grid.h"

namespace relax_straggler::core::attribute {

enum class P2pCause : std::uint8_t { kExplained = 0, kLink = 1, kSendSide = 2, kRecvSide = 3, kNodeNetwork = 4 };
const char* p2p_cause_name(P2pCause cause);

struct P2pFinding {
  std::int32_t worker = -1;  // where the abnormal time was measured
  P2pOp op = P2pOp::kForwardSend;
  double ms = 0.0;      // the worker's time for op
  double ref_ms = 0.0;  // the reference it was compared with
  P2pCause cause = P2pCause::kExplained;
  // kExplained: the compute-slow worker blamed; kLink: the neighbour at the other end;
  // kSendSide, kRecvSide, kNodeNetwork: the worker itself.
  std::int32_t blamed_worker = -1;
};

struct P2pStepResult {
  std::vector<std::uint8_t> abnormal;  // workers x kNumP2pOps: 1 = abnormal
  std::vector<double> ref_ms;          // workers x kNumP2pOps: the reference, NaN when none
  std::vector<P2pFinding> findings;    // one per abnormal (worker, op), except node-network merges
};

// Cross-validates one step. Returns no findings when step.p2p_ms is empty or pp < 2.
// Throws std::invalid_argument when step.p2p_ms has the wrong size.
P2pStepResult cross_validate_step(const GridShape& shape, const WorkerStep& step, const StepClassification& compute,
                                  const AttributionConfig& config);

}  // namespace relax_straggler::core::attribute
