#include "core/attribute/worker_grid.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace relax_straggler::core::attribute {
namespace {

void require(bool ok, const char* field, const char* rule, double value) {
  if (!ok) throw std::invalid_argument(std::string(field) + " must be " + rule + ", got " + std::to_string(value));
}

}  // namespace

const char* p2p_op_name(P2pOp op) {
  switch (op) {
    case P2pOp::kForwardSend: return "forward-send";
    case P2pOp::kForwardRecv: return "forward-recv";
    case P2pOp::kBackwardSend: return "backward-send";
    case P2pOp::kBackwardRecv: return "backward-recv";
  }
  return "unknown";
}

int p2p_partner_direction(P2pOp op) {
  return op == P2pOp::kForwardSend || op == P2pOp::kBackwardRecv ? 1 : -1;
}

P2pOp p2p_counterpart(P2pOp op) {
  switch (op) {
    case P2pOp::kForwardSend: return P2pOp::kForwardRecv;
    case P2pOp::kForwardRecv: return P2pOp::kForwardSend;
    case P2pOp::kBackwardSend: return P2pOp::kBackwardRecv;
    case P2pOp::kBackwardRecv: return P2pOp::kBackwardSend;
  }
  return op;
}

void AttributionConfig::validate() const {
  const auto finite = [](double x) { return std::isfinite(x); };
  validate_thresholds(relative_threshold, absolute_ms_threshold);
  require(finite(min_impact) && min_impact >= 0.0 && min_impact < 1.0, "min_impact", "in [0, 1)", min_impact);
  require(finite(p2p_ratio) && p2p_ratio >= 1.0, "p2p_ratio", "a finite number >= 1", p2p_ratio);
  require(finite(jump_ratio) && jump_ratio >= 1.0, "jump_ratio", "a finite number >= 1", jump_ratio);
  require(finite(baseline_ratio) && baseline_ratio >= 1.0, "baseline_ratio", "a finite number >= 1", baseline_ratio);
  require(finite(slow_step_ratio) && slow_step_ratio >= 1.0, "slow_step_ratio", "a finite number >= 1",
          slow_step_ratio);
  require(slow_step_window >= 1, "slow_step_window", ">= 1", slow_step_window);
  require(finite(persistence) && persistence > 0.0 && persistence <= 1.0, "persistence", "in (0, 1]", persistence);
}

}  // namespace relax_straggler::core::attribute
