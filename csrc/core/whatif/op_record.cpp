#include "core/whatif/op_record.h"

#include <array>
#include <utility>

namespace relax_straggler::core::whatif {

bool role_from_name(const std::string& name, OpRole* role) {
  static const std::array<std::pair<const char*, OpRole>, kNumRoles> kNames = {{
      {"forward-compute", OpRole::kForwardCompute},
      {"backward-compute", OpRole::kBackwardCompute},
      {"forward-send", OpRole::kForwardSend},
      {"forward-recv", OpRole::kForwardRecv},
      {"backward-send", OpRole::kBackwardSend},
      {"backward-recv", OpRole::kBackwardRecv},
      {"params-all-gather", OpRole::kParamsAllGather},
      {"grads-reduce-scatter", OpRole::kGradsReduceScatter},
      {"separate-grads-all-reduce", OpRole::kSeparateGradsAllReduce},
      {"layernorm-grads-all-reduce", OpRole::kLayernormAllReduce},
      {"embedding-grads-all-reduce", OpRole::kEmbeddingAllReduce},
      {"optimizer-clip-main-grad", OpRole::kClipMainGrad},
      {"optimizer", OpRole::kOptimizer},
      {"gc", OpRole::kGc},
  }};
  for (const auto& [n, r] : kNames) {
    if (name == n) {
      *role = r;
      return true;
    }
  }
  return false;
}

bool is_communication(OpRole role) {
  switch (role) {
    case OpRole::kForwardCompute:
    case OpRole::kBackwardCompute:
    case OpRole::kOptimizer:
    case OpRole::kGc:
      return false;
    default:
      return true;
  }
}

}  // namespace relax_straggler::core::whatif
