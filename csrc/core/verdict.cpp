#include "core/verdict.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

#include "core/median_bracket.h"

namespace relax_straggler::core {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool finite_at_least(double x, double lo) { return std::isfinite(x) && x >= lo; }

// Per-stage running summary of one pass over the ranks.
struct Summary {
  std::size_t count = 0;
  double sum = 0.0;
  double max = -std::numeric_limits<double>::infinity();
  double min = std::numeric_limits<double>::infinity();
  std::int32_t argmax = -1;
  std::int32_t argmin = -1;
};

// One row-major pass: per-stage count, sum, max and min, and with kBracket the median
// brackets' counts and buckets (prepare_brackets first). Two stages at a time in vector
// lanes (each lane accumulates one stage in row order, exactly as a scalar loop would;
// NaN fails every compare and adds nothing); the bucket appends stay scalar. A template
// so that the mean reference's loop carries no median work at all.
template <bool kBracket>
void summarise(const StepMatrix& m, std::vector<Summary>& sums, MedianScratch& w) {
  using V = double __attribute__((vector_size(16)));
  using M = long long __attribute__((vector_size(16)));
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const std::size_t ranks = static_cast<std::size_t>(m.num_ranks), stages = m.num_stages();
  const std::size_t pairs = (stages + 1) / 2, full = stages / 2;
  // Accumulators per pair of stages; an odd last stage is paired with a padding lane
  // that always reads NaN.
  thread_local std::vector<V> sum, mx, mn;
  thread_local std::vector<M> cnt, amax, amin;
  sum.assign(pairs, V{0.0, 0.0});
  mx.assign(pairs, V{-kInf, -kInf});
  mn.assign(pairs, V{kInf, kInf});
  cnt.assign(pairs, M{0, 0});
  amax.assign(pairs, M{-1, -1});
  amin.assign(pairs, M{-1, -1});
  const double* __restrict lo = w.lo.data();
  const double* __restrict hi = w.hi.data();
  std::size_t* __restrict below = w.below.data();
  std::size_t* __restrict filled = w.filled.data();
  double* __restrict buckets = w.buckets.data();
  const std::size_t stride = w.stride;
  const V zero = {0.0, 0.0};
  for (std::size_t r = 0; r < ranks; ++r) {
    const double* row = m.ms.data() + r * stages;
    const auto rank = static_cast<long long>(r);
    const M rv = {rank, rank};
    const auto accumulate = [&](std::size_t p, V t) {
      const M ok = t == t;
      cnt[p] = cnt[p] - ok;
      sum[p] += ok ? t : zero;
      const M gt = t > mx[p], lt = t < mn[p];  // strict: the lowest rank wins ties
      mx[p] = gt ? t : mx[p];
      amax[p] = gt ? rv : amax[p];
      mn[p] = lt ? t : mn[p];
      amin[p] = lt ? rv : amin[p];
    };
    for (std::size_t p = 0; p < full; ++p) {
      V t;
      std::memcpy(&t, row + 2 * p, sizeof t);
      accumulate(p, t);
    }
    if (full < pairs) accumulate(full, V{row[stages - 1], std::numeric_limits<double>::quiet_NaN()});
    if constexpr (kBracket) {
      // Branch-free: NaN counts neither below nor inside the bracket.
      for (std::size_t s = 0; s < stages; ++s) {
        const double t = row[s];
        below[s] += t < lo[s];
        buckets[s * stride + filled[s]] = t;
        filled[s] += (t >= lo[s]) & (t <= hi[s]);
      }
    }
  }
  for (std::size_t s = 0; s < stages; ++s) {
    Summary& a = sums[s];
    const std::size_t p = s / 2, lane = s % 2;
    a.count = static_cast<std::size_t>(cnt[p][lane]);
    a.sum = sum[p][lane];
    a.max = mx[p][lane];
    a.min = mn[p][lane];
    a.argmax = static_cast<std::int32_t>(amax[p][lane]);
    a.argmin = static_cast<std::int32_t>(amin[p][lane]);
  }
}

// Fills every StageVerdict. Two row-major passes over the matrix so
// memory is read contiguously whatever the rank count; per-stage state stays in cache.
void judge_stages(const StepMatrix& m, const VerdictConfig& cfg, StepVerdict& v) {
  const std::size_t ranks = static_cast<std::size_t>(m.num_ranks), stages = m.num_stages();
  std::vector<Summary> sums(stages);
  const bool median = cfg.reference == Reference::kMedian;
  MedianScratch& w = median_scratch();
  if (median) {
    prepare_brackets(m, w);
    summarise<true>(m, sums, w);
  } else {
    summarise<false>(m, sums, w);
  }

  v.stages.resize(stages);
  for (std::size_t s = 0; s < stages; ++s) {
    StageVerdict& sv = v.stages[s];
    const Summary& a = sums[s];
    sv.stage = m.stages[s];
    sv.kind = m.kinds[s];
    sv.ranks_reporting = static_cast<std::int32_t>(a.count);
    if (a.count == 0) {
      sv.ref_ms = sv.mean_ms = sv.max_ms = sv.min_ms = sv.slowdown_ratio = sv.relative_score = sv.excess_ms = kNaN;
      continue;
    }
    sv.mean_ms = a.sum / static_cast<double>(a.count);
    sv.ref_ms = median ? bracketed_median(m, w, s, a.count) : sv.mean_ms;
    sv.max_ms = a.max;
    sv.min_ms = a.min;
    sv.slowdown_ratio = sv.ref_ms > 0.0 ? sv.max_ms / sv.ref_ms : kNaN;
    const bool comm = sv.kind == StageKind::kCommunication;
    sv.top_rank = comm ? a.argmin : a.argmax;
    sv.excess_ms = comm ? sv.ref_ms - sv.min_ms : sv.max_ms - sv.ref_ms;
  }

  // Second pass: the stragglers. Per stage the reference and kind are copied into flat
  // arrays and every cell is tested without branches (NaN fails every compare); only a
  // row with a flagged cell is walked again to record it, in ascending rank order.
  thread_local std::vector<double> stage_refs;
  thread_local std::vector<char> stage_comm;
  stage_refs.resize(stages);
  stage_comm.resize(stages);
  for (std::size_t s = 0; s < stages; ++s) {
    stage_refs[s] = v.stages[s].ref_ms;
    stage_comm[s] = v.stages[s].kind == StageKind::kCommunication;
  }
  const double rel = cfg.relative_threshold, floor_ms = cfg.noise_floor_ms, abs_ms = cfg.absolute_ms_threshold;
  const double* __restrict refs = stage_refs.data();
  const char* __restrict comms = stage_comm.data();
  // The slow-rank rule for one cell, exactly as thresholds.h states it (so both passes agree).
  const auto flagged = [&](double t, std::size_t s) {
    const double ref = refs[s];
    const bool comm = comms[s] != 0;
    // Distance from the reference on the slow side, and the relative-rule test, for this kind.
    const double excess = comm ? ref - t : t - ref;
    const bool relative = comm ? t * rel <= ref : t >= ref * rel;
    return excess >= floor_ms && (relative || excess >= abs_ms);
  };
  // The same rule two stages at a time (vector lanes are IEEE doubles, so each lane
  // computes exactly what `flagged` does); a true lane of a compare is -1, counted by
  // subtraction.
  using V = double __attribute__((vector_size(16)));
  using M = long long __attribute__((vector_size(16)));
  const V vrel = {rel, rel}, vfloor = {floor_ms, floor_ms}, vabs = {abs_ms, abs_ms};
  const std::size_t pairs = stages / 2 * 2;
  for (std::size_t r = 0; r < ranks; ++r) {
    const double* row = m.ms.data() + r * stages;
    M hits = {0, 0};
    for (std::size_t s = 0; s < pairs; s += 2) {
      V t, ref;
      std::memcpy(&t, row + s, sizeof t);
      std::memcpy(&ref, refs + s, sizeof ref);
      const M comm = {comms[s] ? -1LL : 0LL, comms[s + 1] ? -1LL : 0LL};
      const V excess = comm ? ref - t : t - ref;
      const M relative = comm ? (t * vrel <= ref) : (t >= ref * vrel);
      const M hit = (excess >= vfloor) & (relative | (excess >= vabs));
      hits = hits - hit;
    }
    int any = (hits[0] | hits[1]) != 0;
    for (std::size_t s = pairs; s < stages; ++s) any |= static_cast<int>(flagged(row[s], s));
    if (!any) continue;
    for (std::size_t s = 0; s < stages; ++s) {
      if (flagged(row[s], s)) v.stages[s].stragglers.push_back(static_cast<std::int32_t>(r));
    }
  }
  for (StageVerdict& sv : v.stages) {
    if (sv.top_rank < 0) continue;
    const double t = sv.kind == StageKind::kCommunication ? sv.min_ms : sv.max_ms;
    const double score = sv.kind == StageKind::kCommunication ? (sv.ref_ms > 0.0 ? t / sv.ref_ms : 1.0)
                                                               : (t > 0.0 ? sv.ref_ms / t : 1.0);
    sv.relative_score = std::min(1.0, score);
  }
}

// The stage of the given kind with the largest excess (ties: first), or -1.
std::int32_t best_of_kind(const std::vector<StageVerdict>& stages, StageKind kind) {
  std::int32_t best = -1;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const StageVerdict& v = stages[i];
    if (v.kind != kind || !std::isfinite(v.excess_ms)) continue;
    if (best < 0 || v.excess_ms > stages[static_cast<std::size_t>(best)].excess_ms) best = static_cast<std::int32_t>(i);
  }
  return best;
}

// argmax of excess over stages, except when a communication stage would win and its late
// rank is slow in compute too: if that rank's compute excesses (summed over the compute
// stages it leads) cover at least half the wait it caused, the late arrival is a
// consequence and the compute stage where that rank is furthest behind is named instead.
std::int32_t likely_bottleneck(const std::vector<StageVerdict>& stages, double noise_floor_ms) {
  const std::int32_t compute = best_of_kind(stages, StageKind::kCompute);
  const std::int32_t comm = best_of_kind(stages, StageKind::kCommunication);
  std::int32_t best = compute;
  if (comm >= 0 && (compute < 0 || stages[static_cast<std::size_t>(comm)].excess_ms >
                                        stages[static_cast<std::size_t>(compute)].excess_ms)) {
    const StageVerdict& k = stages[static_cast<std::size_t>(comm)];
    double late_rank_excess = 0.0;
    std::int32_t late_rank_stage = -1;
    for (std::size_t i = 0; i < stages.size(); ++i) {
      const StageVerdict& v = stages[i];
      if (v.kind != StageKind::kCompute || v.top_rank != k.top_rank || !(v.excess_ms > 0.0)) continue;
      late_rank_excess += v.excess_ms;
      if (late_rank_stage < 0 || v.excess_ms > stages[static_cast<std::size_t>(late_rank_stage)].excess_ms) {
        late_rank_stage = static_cast<std::int32_t>(i);
      }
    }
    best = (late_rank_stage >= 0 && late_rank_excess >= 0.5 * k.excess_ms) ? late_rank_stage : comm;
  }
  if (best < 0 || !finite_at_least(stages[static_cast<std::size_t>(best)].excess_ms, noise_floor_ms)) return -1;
  // Zero noise floor: a stage with no spread at all is still no bottleneck.
  if (stages[static_cast<std::size_t>(best)].excess_ms <= 0.0) return -1;
  return best;
}

// grouped: ranks were judged within comparison groups (the reference is their group's).
std::string format_hints(const StepVerdict& v, const VerdictConfig& cfg, bool grouped) {
  const char* ref_name = cfg.reference == Reference::kMean ? (grouped ? "group mean" : "mean")
                                                           : (grouped ? "group median" : "median");
  char buf[256];
  std::string out;
  if (v.likely_bottleneck < 0) {
    out = "no stragglers";
  } else {
    const StageVerdict& b = v.stages[static_cast<std::size_t>(v.likely_bottleneck)];
    if (b.kind == StageKind::kCommunication) {
      std::snprintf(buf, sizeof buf, "rank %d arrives last at %s: %.1f ms vs %s %.1f ms (peers wait %.1f ms)",
                    b.top_rank, b.stage.c_str(), b.min_ms, ref_name, b.ref_ms, b.excess_ms);
    } else {
      std::snprintf(buf, sizeof buf, "rank %d is slow in %s: %.1f ms vs %s %.1f ms (%.2fx)", b.top_rank,
                    b.stage.c_str(), b.max_ms, ref_name, b.ref_ms, b.slowdown_ratio);
    }
    out = buf;
    if (b.stragglers.empty()) out += ", below the straggler thresholds";
  }
  std::string also;
  for (std::size_t i = 0; i < v.stages.size(); ++i) {
    if (static_cast<std::int32_t>(i) == v.likely_bottleneck || v.stages[i].stragglers.empty()) continue;
    also += also.empty() ? "" : ", ";
    also += v.stages[i].stage;
  }
  if (!also.empty()) out += "; stragglers also in " + also;
  // The largest structural imbalance between groups, when it passes the relative rule.
  const StageVerdict* worst = nullptr;
  for (const StageVerdict& s : v.stages) {
    if (std::isfinite(s.imbalance_ratio) && (worst == nullptr || s.imbalance_ratio > worst->imbalance_ratio)) worst = &s;
  }
  if (worst != nullptr && worst->imbalance_ratio >= cfg.relative_threshold) {
    std::snprintf(buf, sizeof buf, "; structural imbalance in %s: %.2fx between groups", worst->stage.c_str(),
                  worst->imbalance_ratio);
    out += buf;
  }
  return out;
}

void validate(const StepMatrix& matrix, const VerdictConfig& config) {
  config.validate();
  if (matrix.kinds.size() != matrix.stages.size()) {
    throw std::invalid_argument("StepMatrix: kinds and stages differ in length");
  }
  if (matrix.num_ranks < 0 || matrix.ms.size() != static_cast<std::size_t>(matrix.num_ranks) * matrix.num_stages()) {
    throw std::invalid_argument("StepMatrix: ms size does not match num_ranks x stages");
  }
}

// The given rows of `matrix` (ascending row ids) as a matrix of their own.
StepMatrix rows_of(const StepMatrix& matrix, const std::int32_t* rows, std::size_t count) {
  StepMatrix sub;
  sub.step = matrix.step;
  sub.stages = matrix.stages;
  sub.kinds = matrix.kinds;
  const std::size_t stages = matrix.num_stages();
  sub.ms.reserve(count * stages);
  for (std::size_t i = 0; i < count; ++i) {
    const auto r = static_cast<std::size_t>(rows[i]);
    sub.ms.insert(sub.ms.end(), matrix.ms.begin() + static_cast<std::ptrdiff_t>(r * stages),
                  matrix.ms.begin() + static_cast<std::ptrdiff_t>((r + 1) * stages));
  }
  sub.num_ranks = static_cast<std::int32_t>(count);
  return sub;
}

// Whether group verdict `g` (rank ids already rows of the whole matrix) should speak for
// the stage instead of `cur`, the stage so far (its stragglers: those of every group seen,
// non-empty exactly when its speaking group has some). A group with stragglers first, so
// that the stage's top rank is flagged whenever a rank is (as ungrouped); then the larger
// excess; then the lower top rank.
bool speaks_before(const StageVerdict& g, const StageVerdict& cur) {
  if (cur.top_rank < 0) return true;
  const bool flagged = !g.stragglers.empty(), cur_flagged = !cur.stragglers.empty();
  if (flagged != cur_flagged) return flagged;
  if (g.excess_ms != cur.excess_ms) return g.excess_ms > cur.excess_ms;
  return g.top_rank < cur.top_rank;
}

}  // namespace

void VerdictConfig::validate() const {
  validate_thresholds(relative_threshold, absolute_ms_threshold);
  if (!(std::isfinite(noise_floor_ms) && noise_floor_ms >= 0.0)) {
    throw std::invalid_argument("noise_floor_ms must be a finite number >= 0, got " + std::to_string(noise_floor_ms));
  }
  if (reference != Reference::kMean && reference != Reference::kMedian) {
    throw std::invalid_argument("reference must be mean or median");
  }
}

std::int32_t StepVerdict::num_stragglers() const {
  std::vector<std::int32_t> ranks;
  for (const auto& s : stages) ranks.insert(ranks.end(), s.stragglers.begin(), s.stragglers.end());
  std::sort(ranks.begin(), ranks.end());
  return static_cast<std::int32_t>(std::unique(ranks.begin(), ranks.end()) - ranks.begin());
}

StepVerdict judge_step(const StepMatrix& matrix, const VerdictConfig& config) {
  validate(matrix, config);
  StepVerdict v;
  v.step = matrix.step;
  v.unusable_cells = matrix.unusable;
  judge_stages(matrix, config, v);
  v.likely_bottleneck = likely_bottleneck(v.stages, config.noise_floor_ms);
  v.hints = format_hints(v, config, false);
  return v;
}

StepVerdict judge_step(const StepMatrix& matrix, const VerdictConfig& config, const std::vector<std::int32_t>& groups) {
  validate(matrix, config);
  if (groups.size() != static_cast<std::size_t>(matrix.num_ranks)) {
    throw std::invalid_argument("groups has " + std::to_string(groups.size()) + " entries, expected one per rank (" +
                                std::to_string(matrix.num_ranks) + ")");
  }
  for (std::size_t r = 0; r < groups.size(); ++r) {
    if (groups[r] < 0) throw std::invalid_argument("groups[" + std::to_string(r) + "] is negative");
  }
  // Row ids ordered by group (ascending rows within one): each group is one contiguous
  // run, found in O(ranks log ranks) whatever the number of groups.
  const auto group_of = [&groups](std::int32_t r) { return groups[static_cast<std::size_t>(r)]; };
  std::vector<std::int32_t> order(groups.size());
  for (std::size_t r = 0; r < order.size(); ++r) order[r] = static_cast<std::int32_t>(r);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return group_of(a) < group_of(b); });
  if (order.empty() || group_of(order.front()) == group_of(order.back())) return judge_step(matrix, config);

  StepVerdict v;
  v.step = matrix.step;
  v.unusable_cells = matrix.unusable;
  v.stages.resize(matrix.num_stages());
  std::vector<double> mean_sums(matrix.num_stages(), 0.0);
  std::vector<double> work_lo(matrix.num_stages(), std::numeric_limits<double>::infinity());
  std::vector<double> work_hi(matrix.num_stages(), 0.0);
  std::vector<int> works_seen(matrix.num_stages(), 0);
  std::vector<std::int32_t> stragglers;  // the stage's, kept while the speaking group changes
  for (std::size_t begin = 0, end = 0; begin < order.size(); begin = end) {
    const std::int32_t id = group_of(order[begin]);
    for (end = begin; end < order.size() && group_of(order[end]) == id; ++end) {}
    const std::int32_t* rows = order.data() + begin;
    const StepMatrix sub = rows_of(matrix, rows, end - begin);
    StepVerdict g;
    judge_stages(sub, config, g);
    for (std::size_t s = 0; s < g.stages.size(); ++s) {
      StageVerdict& gs = g.stages[s];
      StageVerdict& out = v.stages[s];
      if (gs.ranks_reporting == 0) continue;
      const double sum = gs.mean_ms * gs.ranks_reporting;
      mean_sums[s] += sum;
      // Communication times between groups differ by waiting on each other (1F1B), not by
      // work. The group's work is the mean of its unflagged ranks: a straggler's own
      // slowness would otherwise come back as imbalance (with two replicas, a 2x rank
      // makes its group's mean 1.5x).
      const auto healthy = static_cast<std::size_t>(gs.ranks_reporting) - gs.stragglers.size();
      if (gs.kind == StageKind::kCompute && healthy > 0) {
        double flagged = 0.0;
        for (std::int32_t r : gs.stragglers) flagged += sub.at(r, s);
        const double work = (sum - flagged) / static_cast<double>(healthy);
        if (work > 0.0) {
          work_lo[s] = std::min(work_lo[s], work);
          work_hi[s] = std::max(work_hi[s], work);
          ++works_seen[s];
        }
      }
      gs.top_rank = rows[static_cast<std::size_t>(gs.top_rank)];
      for (std::int32_t& r : gs.stragglers) r = rows[static_cast<std::size_t>(r)];
      const bool speaks = speaks_before(gs, out);
      stragglers = std::move(out.stragglers);
      stragglers.insert(stragglers.end(), gs.stragglers.begin(), gs.stragglers.end());
      const std::int32_t reporting = out.ranks_reporting + gs.ranks_reporting;
      if (speaks) out = gs;
      out.ranks_reporting = reporting;
      out.stragglers = std::move(stragglers);
    }
  }
  for (std::size_t s = 0; s < v.stages.size(); ++s) {
    StageVerdict& out = v.stages[s];
    out.stage = matrix.stages[s];
    out.kind = matrix.kinds[s];
    if (out.ranks_reporting == 0) {
      out.ref_ms = out.mean_ms = out.max_ms = out.min_ms = out.slowdown_ratio = out.relative_score = out.excess_ms = kNaN;
      continue;
    }
    out.mean_ms = mean_sums[s] / out.ranks_reporting;
    out.imbalance_ratio = works_seen[s] >= 2 ? work_hi[s] / work_lo[s] : kNaN;
    std::sort(out.stragglers.begin(), out.stragglers.end());
  }
  v.likely_bottleneck = likely_bottleneck(v.stages, config.noise_floor_ms);
  v.hints = format_hints(v, config, true);
  return v;
}

}  // namespace relax_straggler::core
