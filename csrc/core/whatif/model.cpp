#include "core/whatif/model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_set>

namespace relax_straggler::core::whatif {
namespace {

// Transfer parts below this (s) are clock skew; they count as 0.
constexpr double kSkewEps = 1e-2;

std::string where(std::size_t row) { return "record " + std::to_string(row) + ": "; }

// The distinct values of a column, kept as a set: records come in runs of a rank or a step,
// but in no order at all there could be one value per record.
template <typename T>
class Distinct {
 public:
  void add(T v) {
    if (any_ && v == last_) return;
    any_ = true, last_ = v;
    set_.insert(v);
  }
  std::vector<T> sorted() const {
    std::vector<T> out(set_.begin(), set_.end());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::unordered_set<T> set_;
  T last_{};
  bool any_ = false;
};

// Records: a std::vector<OpRecord> or OpColumns (size(), operator[] giving an OpRecord).
template <typename Records>
WhatIfModel build(const Records& records, const std::vector<OpRole>& optype_roles) {
  if (records.size() == 0) throw std::invalid_argument("no op records");
  WhatIfModel m;
  m.optype_roles = optype_roles;
  std::int32_t pp = 0;
  Distinct<std::int32_t> dp_ranks;
  Distinct<std::int64_t> steps;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const OpRecord r = records[i];
    if (r.dp_rank < 0) throw std::invalid_argument(where(i) + "dp_rank " + std::to_string(r.dp_rank) + " < 0");
    if (r.stage < 0) throw std::invalid_argument(where(i) + "stage " + std::to_string(r.stage) + " < 0");
    if (r.optype < 0 || r.optype >= static_cast<std::int32_t>(optype_roles.size())) {
      throw std::invalid_argument(where(i) + "optype " + std::to_string(r.optype) + " is not in the op-type table");
    }
    if (!std::isfinite(r.start) || !std::isfinite(r.duration) || r.duration < 0) {
      throw std::invalid_argument(where(i) + "start/duration must be finite and duration >= 0");
    }
    pp = std::max(pp, r.stage + 1);
    dp_ranks.add(r.dp_rank);
    steps.add(r.step);
  }
  m.dp_ranks = dp_ranks.sorted();
  m.steps = steps.sorted();
  m.dp = static_cast<std::int32_t>(m.dp_ranks.size());
  auto lane_of = [&](std::int32_t d) {
    return static_cast<std::int32_t>(std::lower_bound(m.dp_ranks.begin(), m.dp_ranks.end(), d) - m.dp_ranks.begin());
  };
  auto step_of = [&](std::int64_t s) {
    return static_cast<std::int32_t>(std::lower_bound(m.steps.begin(), m.steps.end(), s) - m.steps.begin());
  };

  std::vector<std::vector<TemplateOp>> templates(pp);
  for (std::size_t i = 0; i < records.size(); ++i) {
    const OpRecord r = records[i];
    if (r.dp_rank == m.dp_ranks[0] && r.step == m.steps[0]) {
      templates[r.stage].push_back({optype_roles[r.optype], r.optype, r.seq_id, r.chunk, r.start, r.start + r.duration});
    }
  }
  for (std::int32_t s = 0; s < pp; ++s) {
    if (templates[s].empty()) {
      throw std::invalid_argument("stage " + std::to_string(s) + " has no records at dp_rank " +
                                  std::to_string(m.dp_ranks[0]) + " in step " + std::to_string(m.steps[0]) +
                                  " (stages must be 0..pp-1)");
    }
  }
  m.graph = build_dependency_graph(templates, m.dp > 1);
  const DependencyGraph& g = m.graph;
  std::map<std::tuple<std::int32_t, std::int32_t, std::int32_t>, std::int32_t> slot_of;
  for (std::int32_t i = 0; i < g.slots(); ++i) slot_of[{g.slot_stage[i], g.slot_optype[i], g.slot_seq[i]}] = i;

  const std::size_t n = static_cast<std::size_t>(m.num_steps()) * g.slots() * m.dp;
  std::vector<double> start(n, std::numeric_limits<double>::quiet_NaN()), end(n);
  for (std::size_t i = 0; i < records.size(); ++i) {
    const OpRecord r = records[i];
    auto it = slot_of.find({r.stage, r.optype, r.seq_id});
    if (it == slot_of.end()) {
      throw std::invalid_argument(where(i) + "op type " + std::to_string(r.optype) + " seq_id " +
                                  std::to_string(r.seq_id) + " at stage " + std::to_string(r.stage) +
                                  " does not occur at dp_rank " + std::to_string(m.dp_ranks[0]) + " in step " +
                                  std::to_string(m.steps[0]) + "; every dp_rank and step must run the same ops");
    }
    const std::size_t k = m.index(step_of(r.step), it->second, lane_of(r.dp_rank));
    if (!std::isnan(start[k])) {
      throw std::invalid_argument(where(i) + "a second record of the same op (dp_rank " + std::to_string(r.dp_rank) +
                                  ", stage " + std::to_string(r.stage) + ", step " + std::to_string(r.step) +
                                  ", op type " + std::to_string(r.optype) + ", seq_id " + std::to_string(r.seq_id) + ")");
    }
    start[k] = r.start;
    end[k] = r.start + r.duration;
  }
  for (std::size_t k = 0; k < n; ++k) {
    if (std::isnan(start[k])) {
      const std::int32_t lane = static_cast<std::int32_t>(k % m.dp);
      const std::int32_t slot = static_cast<std::int32_t>((k / m.dp) % g.slots());
      const std::int32_t step = static_cast<std::int32_t>(k / m.dp / g.slots());
      throw std::invalid_argument("missing op: dp_rank " + std::to_string(m.dp_ranks[lane]) + ", stage " +
                                  std::to_string(g.slot_stage[slot]) + ", step " + std::to_string(m.steps[step]) +
                                  ", op type " + std::to_string(g.slot_optype[slot]) + ", seq_id " +
                                  std::to_string(g.slot_seq[slot]));
    }
  }

  m.recorded.resize(n);
  m.measured_step_s.resize(m.num_steps());
  for (std::int32_t st = 0; st < m.num_steps(); ++st) {
    const std::size_t b = m.index(st, 0, 0), e = m.index(st + 1, 0, 0);
    m.measured_step_s[st] = *std::max_element(end.begin() + b, end.begin() + e) -
                            *std::min_element(start.begin() + b, start.begin() + e);
    for (const SyncGroup& grp : g.groups) {
      for (std::int32_t lane = 0; lane < m.dp; ++lane) {
        double latest = -std::numeric_limits<double>::infinity();
        const std::int32_t l0 = grp.dp_synced ? 0 : lane, l1 = grp.dp_synced ? m.dp : lane + 1;
        for (std::int32_t s : grp.members) {
          for (std::int32_t l = l0; l < l1; ++l) latest = std::max(latest, start[m.index(st, s, l)]);
        }
        for (std::int32_t s : grp.members) {
          const std::size_t k = m.index(st, s, lane);
          double d = end[k] - start[k];
          if (grp.sync) {
            d = end[k] - latest;
            if (d <= -kSkewEps) d = 0.0;
          }
          m.recorded[k] = static_cast<float>(d);
        }
      }
    }
  }
  compute_ideal(m);
  return m;
}

}  // namespace

WhatIfModel build_model(const std::vector<OpRecord>& records, const std::vector<OpRole>& optype_roles) {
  return build(records, optype_roles);
}

WhatIfModel build_model(const OpColumns& records, const std::vector<OpRole>& optype_roles) {
  return build(records, optype_roles);
}

void compute_ideal(WhatIfModel& m) {
  const DependencyGraph& g = m.graph;
  const std::size_t nt = m.optype_roles.size();
  std::vector<std::vector<float>> values(nt);
  std::vector<double> sum(nt, 0.0);
  std::vector<std::size_t> count(nt, 0);
  for (std::int32_t st = 0; st < m.num_steps(); ++st) {
    for (std::int32_t s = 0; s < g.slots(); ++s) {
      const std::int32_t t = g.slot_optype[s];
      const float* v = &m.recorded[m.index(st, s, 0)];
      if (is_communication(m.optype_roles[t])) {
        values[t].insert(values[t].end(), v, v + m.dp);
      } else {
        for (std::int32_t l = 0; l < m.dp; ++l) sum[t] += v[l];
        count[t] += m.dp;
      }
    }
  }
  m.ideal.assign(nt, 0.0);
  for (std::size_t t = 0; t < nt; ++t) {
    if (count[t] > 0) m.ideal[t] = sum[t] / static_cast<double>(count[t]);
    auto& v = values[t];
    if (v.empty()) continue;
    // The median of an even count is the mean of the two middle values.
    const std::size_t mid = v.size() / 2;
    std::nth_element(v.begin(), v.begin() + mid, v.end());
    double med = v[mid];
    if (v.size() % 2 == 0) med = (med + *std::max_element(v.begin(), v.begin() + mid)) / 2.0;
    m.ideal[t] = med;
  }
}

}  // namespace relax_straggler::core::whatif
