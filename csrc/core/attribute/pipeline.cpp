#include "core/attribute/pipeline.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/stats.h"

namespace relax_straggler::core::attribute {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The nearest compute-slow worker of w's dp replica in direction dir (+1 higher pp ranks,
// -1 lower), or -1.
std::int32_t nearest_slow(const GridShape& shape, std::int32_t w, int dir, const std::vector<std::uint8_t>& slow) {
  const std::int32_t d = shape.dp_rank(w);
  for (std::int32_t p = shape.pp_rank(w) + dir; p >= 0 && p < shape.pp; p += dir) {
    const std::int32_t q = shape.index(d, p);
    if (slow[static_cast<std::size_t>(q)]) return q;
  }
  return -1;
}

// The compute-slow worker that explains a wait of w in op, or -1 (see pipeline.h).
std::int32_t explaining_worker(const GridShape& shape, std::int32_t w, P2pOp op,
                               const std::vector<std::uint8_t>& slow) {
  if (slow[static_cast<std::size_t>(w)]) return w;
  const int dir = p2p_partner_direction(op);
  const std::int32_t q = nearest_slow(shape, w, dir, slow);
  return q >= 0 ? q : nearest_slow(shape, w, -dir, slow);
}

// Per worker and op: the median over the dp replicas of the stage (dp >= 3), else the
// minimum over all workers.
std::vector<double> references(const GridShape& shape, const WorkerStep& step) {
  const std::size_t workers = static_cast<std::size_t>(shape.workers());
  std::vector<double> ref(workers * kNumP2pOps, kNaN), column, scratch;
  const auto t = [&](std::size_t w, std::size_t o) { return step.p2p_ms[w * kNumP2pOps + o]; };
  for (std::size_t o = 0; o < kNumP2pOps; ++o) {
    if (shape.dp >= 3) {
      for (std::int32_t p = 0; p < shape.pp; ++p) {
        column.clear();
        for (std::int32_t d = 0; d < shape.dp; ++d) column.push_back(t(static_cast<std::size_t>(shape.index(d, p)), o));
        const double median = nan_median(Values(column), scratch);
        for (std::int32_t d = 0; d < shape.dp; ++d) {
          ref[static_cast<std::size_t>(shape.index(d, p)) * kNumP2pOps + o] = median;
        }
      }
      continue;
    }
    double low = kNaN;
    for (std::size_t w = 0; w < workers; ++w) {
      if (std::isfinite(t(w, o)) && !(t(w, o) >= low)) low = t(w, o);
    }
    for (std::size_t w = 0; w < workers; ++w) ref[w * kNumP2pOps + o] = low;
  }
  return ref;
}

bool is_send(P2pOp op) { return op == P2pOp::kForwardSend || op == P2pOp::kBackwardSend; }

}  // namespace

const char* p2p_cause_name(P2pCause cause) {
  switch (cause) {
    case P2pCause::kExplained: return "explained";
    case P2pCause::kLink: return "link";
    case P2pCause::kSendSide: return "send_side";
    case P2pCause::kRecvSide: return "recv_side";
    case P2pCause::kNodeNetwork: return "node_network";
  }
  return "unknown";
}

P2pStepResult cross_validate_step(const GridShape& shape, const WorkerStep& step, const StepClassification& compute,
                                  const AttributionConfig& config) {
  P2pStepResult out;
  if (step.p2p_ms.empty() || shape.pp < 2) return out;
  const std::size_t workers = static_cast<std::size_t>(shape.workers());
  if (step.p2p_ms.size() != workers * kNumP2pOps) {
    throw std::invalid_argument("step " + std::to_string(step.step) + ": p2p_ms has " +
                                std::to_string(step.p2p_ms.size()) + " values, expected workers (" +
                                std::to_string(workers) + ") x " + std::to_string(kNumP2pOps));
  }
  const auto t = [&](std::size_t w, std::size_t o) { return step.p2p_ms[w * kNumP2pOps + o]; };
  out.ref_ms = references(shape, step);
  const double min_excess_ms = std::max(config.absolute_ms_threshold, config.min_impact * compute.budget_ms);
  out.abnormal.assign(workers * kNumP2pOps, 0);
  for (std::size_t i = 0; i < workers * kNumP2pOps; ++i) {
    const double x = step.p2p_ms[i], ref = out.ref_ms[i];
    out.abnormal[i] = std::isfinite(x) && x >= ref * config.p2p_ratio && x - ref >= min_excess_ms ? 1 : 0;
  }

  for (std::size_t w = 0; w < workers; ++w) {
    const auto wi = static_cast<std::int32_t>(w);
    std::vector<P2pFinding> unexplained;
    std::size_t recorded = 0;
    for (std::size_t o = 0; o < kNumP2pOps; ++o) {
      if (std::isfinite(t(w, o))) ++recorded;
      if (!out.abnormal[w * kNumP2pOps + o]) continue;
      const auto op = static_cast<P2pOp>(o);
      P2pFinding f{wi, op, t(w, o), out.ref_ms[w * kNumP2pOps + o], P2pCause::kExplained, -1};
      f.blamed_worker = explaining_worker(shape, wi, op, compute.worker_slow);
      if (f.blamed_worker >= 0) {
        out.findings.push_back(f);
        continue;
      }
      const std::int32_t p = shape.pp_rank(wi) + p2p_partner_direction(op);
      const std::int32_t neighbour = p >= 0 && p < shape.pp ? shape.index(shape.dp_rank(wi), p) : -1;
      const bool both_ends = neighbour >= 0 && out.abnormal[static_cast<std::size_t>(neighbour) * kNumP2pOps +
                                                            static_cast<std::size_t>(p2p_counterpart(op))];
      f.cause = both_ends ? P2pCause::kLink : (is_send(op) ? P2pCause::kSendSide : P2pCause::kRecvSide);
      f.blamed_worker = both_ends ? neighbour : wi;
      unexplained.push_back(f);
    }
    if (recorded >= 2 && unexplained.size() == recorded) {
      P2pFinding merged = unexplained.front();
      merged.cause = P2pCause::kNodeNetwork;
      merged.blamed_worker = wi;
      out.findings.push_back(merged);
    } else {
      out.findings.insert(out.findings.end(), unexplained.begin(), unexplained.end());
    }
  }
  return out;
}

}  // namespace relax_straggler::core::attribute
