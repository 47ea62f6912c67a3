#include "core/whatif/dependency_model.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

namespace relax_straggler::core::whatif {
namespace {

// Clock skew between workers: an op counts as inside the computes within this margin (s).
constexpr double kEdgeEps = 5e-5;

std::string role_label(OpRole r) {
  static const char* kLabels[kNumRoles] = {"forward-compute", "backward-compute", "forward-send", "forward-recv",
                                           "backward-send", "backward-recv", "params-all-gather",
                                           "grads-reduce-scatter", "separate-grads-all-reduce",
                                           "layernorm-grads-all-reduce", "embedding-grads-all-reduce",
                                           "optimizer-clip-main-grad", "optimizer", "gc"};
  return kLabels[static_cast<int>(r)];
}

class Builder {
 public:
  Builder(const std::vector<std::vector<TemplateOp>>& templates, bool use_dp) : tpl_(templates), use_dp_(use_dp) {
    g_.pp = static_cast<std::int32_t>(templates.size());
    sorted_.resize(tpl_.size());
    for (std::size_t s = 0; s < tpl_.size(); ++s) {
      for (std::size_t i = 0; i < tpl_[s].size(); ++i) sorted_[s].push_back(static_cast<std::int32_t>(i));
      const auto& ops = tpl_[s];
      std::stable_sort(sorted_[s].begin(), sorted_[s].end(), [&](std::int32_t a, std::int32_t b) {
        return std::tie(ops[a].start, ops[a].seq_id, ops[a].optype) < std::tie(ops[b].start, ops[b].seq_id, ops[b].optype);
      });
      for (std::int32_t i : sorted_[s]) {
        const TemplateOp& op = ops[i];
        const std::int32_t slot = g_.slots();
        if (!slot_of_.emplace(std::make_tuple(static_cast<std::int32_t>(s), op.role, op.seq_id), slot).second) {
          throw std::invalid_argument("stage " + std::to_string(s) + ": two " + role_label(op.role) +
                                      " ops with seq_id " + std::to_string(op.seq_id));
        }
        g_.slot_stage.push_back(static_cast<std::int32_t>(s));
        g_.slot_optype.push_back(op.optype);
        g_.slot_seq.push_back(op.seq_id);
        g_.slot_role.push_back(op.role);
        index_.push_back(i);
        if (op.chunk >= 0) g_.vpp = std::max(g_.vpp, op.chunk + 1);
      }
    }
    deps_.resize(g_.slots());
  }

  DependencyGraph build() {
    for (std::int32_t s = 0; s < g_.pp; ++s) stage_edges(s);
    pair_p2p();
    collective_groups();
    finish();
    return std::move(g_);
  }

 private:
  const TemplateOp& op(std::int32_t slot) const { return tpl_[g_.slot_stage[slot]][index_[slot]]; }
  std::int32_t find(std::int32_t stage, OpRole role, std::int32_t seq) const {
    auto it = slot_of_.find(std::make_tuple(stage, role, seq));
    return it == slot_of_.end() ? -1 : it->second;
  }
  void edge(std::int32_t from, std::int32_t to) {
    if (from >= 0 && to >= 0) deps_[to].push_back(from);
  }
  void chain(const std::vector<std::int32_t>& slots) {
    for (std::size_t i = 1; i < slots.size(); ++i) edge(slots[i - 1], slots[i]);
  }
  // Slots of one stage with the given roles, in recorded order.
  std::vector<std::int32_t> of_roles(std::int32_t s, std::initializer_list<OpRole> roles) const {
    std::vector<std::int32_t> out;
    for (std::int32_t i : sorted_[s]) {
      const TemplateOp& o = tpl_[s][i];
      if (std::find(roles.begin(), roles.end(), o.role) != roles.end()) out.push_back(find(s, o.role, o.seq_id));
    }
    return out;
  }

  void stage_edges(std::int32_t s) {
    const auto computes = of_roles(s, {OpRole::kForwardCompute, OpRole::kBackwardCompute});
    chain(computes);
    match_p2p(s, OpRole::kForwardCompute, OpRole::kForwardSend, OpRole::kForwardRecv, +1);
    match_p2p(s, OpRole::kBackwardCompute, OpRole::kBackwardSend, OpRole::kBackwardRecv, -1);
    for (OpRole r : {OpRole::kForwardSend, OpRole::kForwardRecv, OpRole::kBackwardSend, OpRole::kBackwardRecv}) {
      chain(of_roles(s, {r}));
    }
    // 1F1B warm-up: the first backward send/recv is posted while the last warm-up forwards run.
    for (std::size_t i = 0; i < computes.size(); ++i) {
      if (g_.slot_role[computes[i]] != OpRole::kBackwardCompute) continue;
      if (i >= 2 && g_.slot_role[computes[i - 1]] == OpRole::kForwardCompute &&
          g_.slot_role[computes[i - 2]] == OpRole::kForwardCompute) {
        edge(computes[i - 2], find(s, OpRole::kBackwardRecv, 0));
        edge(computes[i - 2], find(s, OpRole::kBackwardSend, 0));
      }
      break;
    }
    if (use_dp_) dp_edges(s, computes);
    post_compute_edges(s, computes);
  }

  // Matches the sends/recvs of one direction to their computes (dir: +1 forward, -1 backward).
  void match_p2p(std::int32_t s, OpRole compute, OpRole send, OpRole recv, int dir) {
    const auto comps = of_roles(s, {compute});
    if (comps.empty()) return;
    double last_start = -1e300, first_end = 1e300;
    for (std::int32_t c : comps) {
      last_start = std::max(last_start, op(c).start);
      first_end = std::min(first_end, op(c).end);
    }
    for (OpRole role : {send, recv}) {
      const bool is_recv = role == recv;
      const auto ops = of_roles(s, {role});
      auto inside = [&](std::int32_t slot) {
        return is_recv ? op(slot).start <= last_start + kEdgeEps : op(slot).end >= first_end - kEdgeEps;
      };
      const auto cnt = static_cast<std::size_t>(std::count_if(ops.begin(), ops.end(), inside));
      std::int32_t compute_id = 0;
      if (cnt != comps.size()) {
        // Only the ends of the pipeline lack a send/recv per compute (one fewer with virtual pipelines).
        if ((s != 0 && s != g_.pp - 1) || (cnt != 0 && cnt + 1 != comps.size())) {
          throw std::invalid_argument("stage " + std::to_string(s) + ": " + std::to_string(cnt) + " " +
                                      role_label(role) + " ops for " + std::to_string(comps.size()) + " " +
                                      role_label(compute) + " ops");
        }
        if (is_recv && cnt + 1 == comps.size()) compute_id = 1;
      }
      const std::int32_t peer_delta = (is_recv ? -dir : dir);
      for (std::int32_t slot : ops) {
        if (!inside(slot)) continue;  // a no-op outside the step's computes
        const std::int32_t c = find(s, compute, compute_id);
        if (c < 0) {
          throw std::invalid_argument("stage " + std::to_string(s) + ": no " + role_label(compute) + " with seq_id " +
                                      std::to_string(compute_id) + " for " + role_label(role) + " seq_id " +
                                      std::to_string(g_.slot_seq[slot]));
        }
        const std::int32_t gmc = std::max(op(c).chunk, 0) * g_.pp + s;
        const std::int32_t peer_gmc = gmc + peer_delta;
        if (peer_gmc >= 0 && peer_gmc < g_.vpp * g_.pp) valid_[{s, role}].push_back(slot);
        if (is_recv) {
          edge(slot, c);
          edge(find(s, compute, compute_id - 1), slot);
        } else {
          edge(c, slot);
        }
        ++compute_id;
      }
    }
  }

  void dp_edges(std::int32_t s, const std::vector<std::int32_t>& computes) {
    chain(of_roles(s, {OpRole::kParamsAllGather, OpRole::kGradsReduceScatter}));
    std::vector<std::int32_t> assigned;
    auto ag = of_roles(s, {OpRole::kParamsAllGather});
    std::sort(ag.begin(), ag.end(), [&](std::int32_t a, std::int32_t b) { return g_.slot_seq[a] > g_.slot_seq[b]; });
    for (std::int32_t a : ag) {
      const std::int32_t mc = op(a).chunk;
      if (std::find(assigned.begin(), assigned.end(), mc) != assigned.end()) continue;
      std::int32_t first = -1;
      for (std::int32_t c : computes) {
        if (g_.slot_role[c] == OpRole::kForwardCompute && op(c).chunk == mc && (first < 0 || op(c).start < op(first).start)) first = c;
      }
      edge(a, first);
      assigned.push_back(mc);
    }
    if (!overlapped()) return;
    assigned.clear();
    auto rs = of_roles(s, {OpRole::kGradsReduceScatter});
    std::sort(rs.begin(), rs.end(), [&](std::int32_t a, std::int32_t b) { return g_.slot_seq[a] < g_.slot_seq[b]; });
    for (std::int32_t r : rs) {
      const std::int32_t mc = op(r).chunk;
      if (std::find(assigned.begin(), assigned.end(), mc) != assigned.end()) continue;
      std::int32_t last = -1;
      for (std::int32_t c : computes) {
        if (g_.slot_role[c] == OpRole::kBackwardCompute && op(c).chunk == mc && (last < 0 || op(c).end > op(last).end)) last = c;
      }
      edge(last, r);
      assigned.push_back(mc);
    }
  }

  bool overlapped() const {
    for (OpRole r : g_.slot_role) {
      if (r == OpRole::kSeparateGradsAllReduce) return true;
    }
    return false;
  }

  void post_compute_edges(std::int32_t s, const std::vector<std::int32_t>& computes) {
    std::int32_t last = -1;
    for (std::int32_t c : computes) {
      if (last < 0 || op(c).end > op(last).end) last = c;
    }
    const std::int32_t gc = find(s, OpRole::kGc, 0);
    edge(last, gc);
    std::vector<std::int32_t> from = {gc >= 0 ? gc : last};
    std::vector<std::int32_t> tail = {find(s, OpRole::kLayernormAllReduce, 0)};
    if (s == 0 || s == g_.pp - 1) tail.push_back(find(s, OpRole::kEmbeddingAllReduce, 0));
    auto rs = of_roles(s, {OpRole::kGradsReduceScatter});
    std::sort(rs.begin(), rs.end(), [&](std::int32_t a, std::int32_t b) { return g_.slot_seq[a] < g_.slot_seq[b]; });
    if (use_dp_ && overlapped()) {
      if (!rs.empty()) from.push_back(rs.back());
      tail.push_back(find(s, OpRole::kSeparateGradsAllReduce, 0));
    } else if (use_dp_) {
      tail.insert(tail.end(), rs.begin(), rs.end());
    }
    tail.push_back(find(s, OpRole::kClipMainGrad, 0));
    const std::int32_t opt = find(s, OpRole::kOptimizer, 0);
    if (opt < 0) throw std::invalid_argument("stage " + std::to_string(s) + ": no optimizer op in the first step");
    tail.push_back(opt);
    tail.erase(std::remove(tail.begin(), tail.end(), -1), tail.end());
    for (std::int32_t f : from) edge(f, tail.front());
    chain(tail);
  }

  void add_group(std::vector<std::int32_t> members, bool sync, bool dp_synced) {
    members.erase(std::remove(members.begin(), members.end(), -1), members.end());
    if (members.empty()) return;
    for (std::int32_t m : members) {
      if (in_group_[m]) throw std::invalid_argument("op slot in two sync groups: " + role_label(g_.slot_role[m]));
      in_group_[m] = true;
    }
    g_.groups.push_back({std::move(members), sync, dp_synced});
  }

  void pair_p2p() {
    in_group_.assign(g_.slots(), false);
    for (std::int32_t s = 0; s < g_.pp; ++s) {
      for (auto [send, recv, delta] : {std::make_tuple(OpRole::kForwardSend, OpRole::kForwardRecv, 1),
                                       std::make_tuple(OpRole::kBackwardSend, OpRole::kBackwardRecv, -1)}) {
        const std::int32_t peer = (s + delta + g_.pp) % g_.pp;
        const auto& a = valid_[{s, send}];
        const auto& b = valid_[{peer, recv}];
        if (a.size() != b.size()) {
          throw std::invalid_argument("stage " + std::to_string(s) + " has " + std::to_string(a.size()) + " " +
                                      role_label(send) + " ops but stage " + std::to_string(peer) + " has " +
                                      std::to_string(b.size()) + " matching " + role_label(recv) + " ops");
        }
        for (std::size_t k = 0; k < a.size(); ++k) add_group({a[k], b[k]}, true, false);
      }
    }
    for (std::int32_t i = 0; i < g_.slots(); ++i) {
      const OpRole r = g_.slot_role[i];
      const bool p2p = r == OpRole::kForwardSend || r == OpRole::kForwardRecv || r == OpRole::kBackwardSend ||
                       r == OpRole::kBackwardRecv;
      if (p2p && !in_group_[i]) add_group({i}, true, false);  // a no-op: pairs with nobody
    }
  }

  void collective_groups() {
    if (use_dp_) {
      for (std::int32_t i = 0; i < g_.slots(); ++i) {
        const OpRole r = g_.slot_role[i];
        if (r == OpRole::kParamsAllGather || r == OpRole::kGradsReduceScatter || r == OpRole::kSeparateGradsAllReduce) {
          add_group({i}, true, true);
        }
      }
    }
    add_group({find(0, OpRole::kEmbeddingAllReduce, 0), g_.pp > 1 ? find(g_.pp - 1, OpRole::kEmbeddingAllReduce, 0) : -1},
              true, false);
    std::vector<std::int32_t> clip;
    for (std::int32_t s = 0; s < g_.pp; ++s) clip.push_back(find(s, OpRole::kClipMainGrad, 0));
    add_group(clip, true, true);
    for (std::int32_t i = 0; i < g_.slots(); ++i) {
      if (!in_group_[i]) add_group({i}, false, false);
    }
  }

  void finish() {
    const std::int32_t n = g_.slots();
    g_.slot_group.assign(n, -1);
    for (std::size_t gi = 0; gi < g_.groups.size(); ++gi) {
      for (std::int32_t m : g_.groups[gi].members) g_.slot_group[m] = static_cast<std::int32_t>(gi);
    }
    g_.dep_begin.assign(n + 1, 0);
    for (std::int32_t i = 0; i < n; ++i) {
      auto& d = deps_[i];
      std::sort(d.begin(), d.end());
      d.erase(std::unique(d.begin(), d.end()), d.end());
      g_.dep_begin[i + 1] = g_.dep_begin[i] + static_cast<std::int32_t>(d.size());
      g_.deps.insert(g_.deps.end(), d.begin(), d.end());
    }
    // Kahn's algorithm over groups (a sync group runs as one node).
    const std::size_t ng = g_.groups.size();
    std::vector<std::vector<std::int32_t>> next(ng);
    std::vector<std::int32_t> indeg(ng, 0);
    for (std::int32_t i = 0; i < n; ++i) {
      for (std::int32_t d : deps_[i]) {
        const std::int32_t a = g_.slot_group[d], b = g_.slot_group[i];
        if (a == b) throw std::invalid_argument("cycle: " + role_label(g_.slot_role[i]) + " depends on its own sync group");
        next[a].push_back(b);
        ++indeg[b];
      }
    }
    for (std::size_t gi = 0; gi < ng; ++gi) {
      if (indeg[gi] == 0) g_.order.push_back(static_cast<std::int32_t>(gi));
    }
    for (std::size_t head = 0; head < g_.order.size(); ++head) {
      for (std::int32_t b : next[g_.order[head]]) {
        if (--indeg[b] == 0) g_.order.push_back(b);
      }
    }
    if (g_.order.size() != ng) {
      for (std::size_t gi = 0; gi < ng; ++gi) {
        if (indeg[gi] > 0) {
          const std::int32_t m = g_.groups[gi].members[0];
          throw std::invalid_argument("the dependency model has a cycle through stage " +
                                      std::to_string(g_.slot_stage[m]) + " " + role_label(g_.slot_role[m]) +
                                      " seq_id " + std::to_string(g_.slot_seq[m]));
        }
      }
    }
  }

  const std::vector<std::vector<TemplateOp>>& tpl_;
  bool use_dp_;
  DependencyGraph g_;
  std::vector<std::vector<std::int32_t>> sorted_;  // per stage: template indices in recorded order
  std::vector<std::int32_t> index_;                // slot -> template index within its stage
  std::map<std::tuple<std::int32_t, OpRole, std::int32_t>, std::int32_t> slot_of_;
  std::vector<std::vector<std::int32_t>> deps_;
  std::map<std::pair<std::int32_t, OpRole>, std::vector<std::int32_t>> valid_;  // paired sends/recvs, in order
  std::vector<bool> in_group_;
};

}  // namespace

DependencyGraph build_dependency_graph(const std::vector<std::vector<TemplateOp>>& templates, bool use_dp) {
  if (templates.empty()) throw std::invalid_argument("no pipeline stage in the records");
  return Builder(templates, use_dp).build();
}

}  // namespace relax_straggler::core::whatif
