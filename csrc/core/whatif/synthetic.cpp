#include "core/whatif/synthetic.h"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/whatif/replay.h"

namespace relax_straggler::core::whatif {

const char* const kSyntheticOpTypes[13] = {"forward-compute", "backward-compute", "forward-send", "forward-recv",
                                           "backward-send", "backward-recv", "params-all-gather",
                                           "grads-reduce-scatter", "layernorm-grads-all-reduce",
                                           "embedding-grads-all-reduce", "optimizer-clip-main-grad", "optimizer", "gc"};

namespace {

enum Type { kF, kB, kFs, kFr, kBs, kBr, kAg, kRs, kLn, kEmb, kClip, kOpt, kGc };
constexpr double kBaseS[13] = {0.010, 0.020, 2e-4, 2e-4, 2e-4, 2e-4, 0.005, 0.010, 1e-4, 0.001, 0.002, 0.005, 1e-4};

// One stage's 1F1B order: warm-up forwards, one-forward-one-backward, cool-down backwards.
std::vector<TemplateOp> stage_template(std::int32_t s, std::int32_t pp, std::int32_t mb, bool dp,
                                       const std::vector<OpRole>& roles) {
  std::vector<TemplateOp> ops;
  double t = 0.0;
  auto add = [&](Type ty, std::int32_t seq) {
    ops.push_back({roles[ty], ty, seq, (ty == kF || ty == kB || ty == kAg || ty == kRs) ? 0 : -1, t, t + 0.5});
    t += 1.0;
  };
  auto fwd = [&](std::int32_t m) {
    if (s > 0) add(kFr, m);
    add(kF, m);
    if (s < pp - 1) add(kFs, m);
  };
  auto bwd = [&](std::int32_t m) {
    if (s < pp - 1) add(kBr, m);
    add(kB, m);
    if (s > 0) add(kBs, m);
  };
  if (dp) add(kAg, 0);
  const std::int32_t warm = std::min(pp - s - 1, mb);
  for (std::int32_t m = 0; m < warm; ++m) fwd(m);
  for (std::int32_t i = 0; i < mb - warm; ++i) {
    fwd(warm + i);
    bwd(i);
  }
  for (std::int32_t m = mb - warm; m < mb; ++m) bwd(m);
  add(kGc, 0);
  add(kLn, 0);
  if (s == 0 || s == pp - 1) add(kEmb, 0);
  if (dp) add(kRs, 0);
  add(kClip, 0);
  add(kOpt, 0);
  return ops;
}

// One stage's interleaved order (synthetic.h); seq_id k of a compute is virtual microbatch k.
std::vector<TemplateOp> interleaved_template(std::int32_t s, std::int32_t pp, std::int32_t mb, std::int32_t vpp,
                                             bool dp, const std::vector<OpRole>& roles) {
  std::vector<TemplateOp> ops;
  double t = 0.0;
  auto add = [&](Type ty, std::int32_t seq, std::int32_t chunk) {
    ops.push_back({roles[ty], ty, seq, chunk, t, t + 0.5});
    t += 1.0;
  };
  auto chunk_of = [&](std::int32_t k, bool forward) {
    const std::int32_t c = (k % (pp * vpp)) / pp;
    return forward ? c : vpp - 1 - c;
  };
  auto fwd = [&](std::int32_t k) {
    for (Type ty : {kFr, kF, kFs}) add(ty, k, chunk_of(k, true));
  };
  auto bwd = [&](std::int32_t k) {
    for (Type ty : {kBr, kB, kBs}) add(ty, k, chunk_of(k, false));
  };
  const std::int32_t total = mb * vpp;
  const std::int32_t warm = mb == pp ? total : std::min(total, (pp - s - 1) * 2 + (vpp - 1) * pp);
  if (dp) {
    for (std::int32_t c = 0; c < vpp; ++c) add(kAg, c, c);
  }
  for (std::int32_t k = 0; k < warm; ++k) fwd(k);
  for (std::int32_t i = 0; i < total - warm; ++i) {
    fwd(warm + i);
    bwd(i);
  }
  for (std::int32_t k = total - warm; k < total; ++k) bwd(k);
  add(kGc, 0, -1);
  add(kLn, 0, -1);
  if (s == 0 || s == pp - 1) add(kEmb, 0, -1);
  if (dp) {
    for (std::int32_t c = 0; c < vpp; ++c) add(kRs, c, c);
  }
  add(kClip, 0, -1);
  add(kOpt, 0, -1);
  return ops;
}

bool is_p2p(std::int32_t t) { return t == kFs || t == kFr || t == kBs || t == kBr; }

}  // namespace

WhatIfModel synthetic_model(const SyntheticSpec& spec) {
  if (spec.dp < 1 || spec.pp < 1 || spec.microbatches < 1 || spec.steps < 1 || spec.vpp < 1) {
    throw std::invalid_argument("synthetic job: dp, pp, microbatches, steps and vpp must be >= 1");
  }
  if (spec.vpp > 1 && spec.microbatches % spec.pp != 0) {
    throw std::invalid_argument("synthetic job: an interleaved schedule (vpp " + std::to_string(spec.vpp) +
                                ") needs microbatches (" + std::to_string(spec.microbatches) +
                                ") to be a multiple of pp (" + std::to_string(spec.pp) + ")");
  }
  WhatIfModel m;
  for (const char* name : kSyntheticOpTypes) {
    OpRole r;
    role_from_name(name, &r);
    m.optype_roles.push_back(r);
  }
  std::vector<std::vector<TemplateOp>> templates(spec.pp);
  for (std::int32_t s = 0; s < spec.pp; ++s) {
    templates[s] = spec.vpp > 1
                       ? interleaved_template(s, spec.pp, spec.microbatches, spec.vpp, spec.dp > 1, m.optype_roles)
                       : stage_template(s, spec.pp, spec.microbatches, spec.dp > 1, m.optype_roles);
  }
  m.graph = build_dependency_graph(templates, spec.dp > 1);
  m.dp = spec.dp;
  for (std::int32_t l = 0; l < spec.dp; ++l) m.dp_ranks.push_back(l);
  for (std::int32_t st = 0; st < spec.steps; ++st) m.steps.push_back(st);
  m.recorded.resize(static_cast<std::size_t>(spec.steps) * m.graph.slots() * spec.dp);
  std::mt19937_64 rng(spec.seed);
  std::uniform_real_distribution<float> noise(0.95f, 1.05f);
  const DependencyGraph& g = m.graph;
  for (std::int32_t st = 0; st < spec.steps; ++st) {
    for (std::int32_t slot = 0; slot < g.slots(); ++slot) {
      const std::int32_t t = g.slot_optype[slot];
      const bool compute = t == kF || t == kB;
      // A p2p op that pairs with nobody (its peer chunk is outside the model) moves nothing.
      const bool noop = is_p2p(t) && g.groups[g.slot_group[slot]].members.size() == 1;
      float* out = &m.recorded[m.index(st, slot, 0)];
      for (std::int32_t l = 0; l < spec.dp; ++l) {
        float d = noop ? 0.0f : static_cast<float>(compute ? kBaseS[t] / spec.vpp : kBaseS[t]);
        if (compute) {
          d *= noise(rng);
          if (l == spec.slow_dp && g.slot_stage[slot] == spec.slow_stage) d *= static_cast<float>(spec.slow_factor);
        }
        out[l] = d;
      }
    }
  }
  m.measured_step_s = replay_steps(m, {true, Selection::nothing()});
  compute_ideal(m);
  return m;
}

}  // namespace relax_straggler::core::whatif
