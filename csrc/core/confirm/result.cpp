#include "core/confirm/result.h"

#include <algorithm>

namespace relax_straggler::core::confirm {

const char* state_name(State s) {
  switch (s) {
    case State::kHealthy: return "healthy";
    case State::kSuspected: return "suspected";
    case State::kStraggler: return "straggler";
    case State::kRecovered: return "recovered";
    case State::kImbalance: return "imbalance";
    case State::kInsufficientEvidence: return "insufficient_evidence";
  }
  return "unknown";
}

const char* cause_name(Cause c) {
  switch (c) {
    case Cause::kCompute: return "compute";
    case Cause::kLink: return "communication_link";
    case Cause::kData: return "data";
    case Cause::kImbalance: return "imbalance";
    case Cause::kUnknown: return "unknown";
    case Cause::kDevice: return "device";
    case Cause::kHost: return "host";
  }
  return "unknown";
}

std::vector<std::int32_t> ConfirmResult::straggler_ranks() const {
  std::vector<std::int32_t> out;
  for (const Finding& f : findings) {
    if (f.state == State::kStraggler && f.rank >= 0) out.push_back(f.rank);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace relax_straggler::core::confirm
