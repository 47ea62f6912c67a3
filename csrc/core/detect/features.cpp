#include "core/detect/features.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "core/stats.h"
#include "core/step_matrix.h"

namespace relax_straggler::core::detect {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void validate(const FeatureOptions& o) {
  if (o.warmup_steps < 0) throw std::invalid_argument("warmup_steps must be >= 0");
  if (!(o.min_relative_spread >= 0.0) || !std::isfinite(o.min_relative_spread)) {
    throw std::invalid_argument("min_relative_spread must be a finite number >= 0");
  }
  if (!(o.min_coverage > 0.0 && o.min_coverage <= 1.0)) throw std::invalid_argument("min_coverage must be in (0, 1]");
  if (!(o.trim_fraction >= 0.0 && o.trim_fraction < 0.5)) throw std::invalid_argument("trim_fraction must be in [0, 0.5)");
}

// The k largest values seen, per (rank, stage) cell, in a k-slot min-first array: most
// values lose the one comparison against the smallest kept and cost nothing more.
class TopK {
 public:
  TopK(std::size_t cells, std::size_t k) : k_(k), values_(cells * k, -kInf) {}

  void add(std::size_t cell, double x) {
    if (k_ == 0) return;
    double* v = &values_[cell * k_];
    if (x <= v[0]) return;
    std::size_t i = 0;  // keep v ascending: shift smaller ones down, insert x
    while (i + 1 < k_ && v[i + 1] < x) {
      v[i] = v[i + 1];
      ++i;
    }
    v[i] = x;
  }
  // The j-th largest (j = 0 is the largest), j < k.
  double largest(std::size_t cell, std::size_t j) const { return values_[cell * k_ + (k_ - 1 - j)]; }

 private:
  std::size_t k_;
  std::vector<double> values_;
};

// Divisor of the robust scaling of one feature column (see features.h).
double robust_scale(const std::vector<double>& column, std::vector<double>& scratch) {
  constexpr double kMadToSigma = 1.4826;
  constexpr double kIqrToSigma = 1.0 / 1.349;
  constexpr double kMeanAbsToSigma = 1.2533;
  const double mad = nan_mad(column, scratch);
  if (mad > 0.0) return kMadToSigma * mad;
  const double iqr = nan_quantile(column, 0.75, scratch) - nan_quantile(column, 0.25, scratch);
  if (iqr > 0.0) return kIqrToSigma * iqr;
  const double median = nan_median(column, scratch);
  double abs_dev = 0.0;
  for (double x : column) abs_dev += std::fabs(x - median);
  abs_dev /= static_cast<double>(column.size());
  return abs_dev > 0.0 ? kMeanAbsToSigma * abs_dev : 1.0;
}

}  // namespace

const char* stage_status_name(StageStatus s) {
  switch (s) {
    case StageStatus::kKept: return "kept";
    case StageStatus::kNotRun: return "not_run";
    case StageStatus::kCoverageGap: return "coverage_gap";
    case StageStatus::kLowSpread: return "low_spread";
  }
  return "kept";
}

WindowFeatures compute_features(const WindowView& window, const FeatureOptions& options) {
  validate(options);
  const std::size_t stages = window.num_stages();
  const auto ranks = static_cast<std::size_t>(window.num_ranks);
  const std::int64_t first = std::min(options.warmup_steps, window.num_steps);

  // Per (rank, stage) accumulators, rank-major like the window itself.
  std::vector<double> lo(ranks * stages, kInf), hi(ranks * stages, -kInf), sum(ranks * stages, 0.0);
  std::vector<std::int64_t> count(ranks * stages, 0);
  const auto most_trimmed =
      static_cast<std::size_t>(std::floor(options.trim_fraction * static_cast<double>(window.num_steps - first)));
  // One more than the most trimmed: the largest time kept is held too.
  TopK top(ranks * stages, most_trimmed > 0 ? most_trimmed + 1 : 0);
  for (std::int64_t s = first; s < window.num_steps; ++s) {
    const double* row = window.ms + static_cast<std::size_t>(s) * ranks * stages;
    for (std::size_t i = 0; i < ranks * stages; ++i) {
      const double t = row[i];
      if (!is_time(t)) continue;  // NaN, 0, +-inf or negative: not run (step_matrix.h)
      lo[i] = std::min(lo[i], t);
      hi[i] = std::max(hi[i], t);
      sum[i] += t;
      ++count[i];
      top.add(i, t);
    }
  }

  WindowFeatures f;
  f.steps_used = window.num_steps - first;
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto* c = &count[r * stages];
    const bool present = std::any_of(c, c + stages, [](std::int64_t n) { return n > 0; });
    (present ? f.ranks : f.absent_ranks).push_back(static_cast<std::int32_t>(r));
  }
  f.status.assign(stages, StageStatus::kKept);
  f.relative_spread.assign(stages, kNaN);
  f.ran.assign(f.ranks.size() * stages, 0);
  const auto min_count = static_cast<std::int64_t>(std::ceil(options.min_coverage * static_cast<double>(f.steps_used)));
  for (std::size_t j = 0; j < stages; ++j) {
    bool any = false;
    bool gap = f.ranks.empty() || f.steps_used == 0;
    for (std::size_t k = 0; k < f.ranks.size(); ++k) {
      const std::int64_t n = count[static_cast<std::size_t>(f.ranks[k]) * stages + j];
      f.ran[k * stages + j] = n > 0;
      any = any || n > 0;
      gap = gap || n < std::max<std::int64_t>(1, min_count);
    }
    if (!any) {
      f.status[j] = StageStatus::kNotRun;
      continue;
    }
    if (gap) {
      f.status[j] = StageStatus::kCoverageGap;
      continue;
    }
    StageFeatures sf;
    sf.column = j;
    sf.kind = window.kinds[j];
    sf.raw.resize(static_cast<Eigen::Index>(f.ranks.size()), kNumFeatures);
    for (std::size_t k = 0; k < f.ranks.size(); ++k) {
      const std::size_t i = static_cast<std::size_t>(f.ranks[k]) * stages + j;
      const auto row = static_cast<Eigen::Index>(k);
      // Set aside the cell's trim largest values (its own count decides how many).
      const auto trim = std::min(most_trimmed, static_cast<std::size_t>(std::floor(
                                                   options.trim_fraction * static_cast<double>(count[i]))));
      double total = sum[i];
      for (std::size_t t = 0; t < trim; ++t) total -= top.largest(i, t);
      const double max_kept = trim > 0 ? top.largest(i, trim) : hi[i];
      sf.raw(row, kMinMs) = lo[i];
      sf.raw(row, kMaxMs) = max_kept;
      sf.raw(row, kRangeMs) = max_kept - lo[i];
      sf.raw(row, kMeanMs) = total / static_cast<double>(count[i] - static_cast<std::int64_t>(trim));
    }
    f.stages.push_back(std::move(sf));
  }
  return f;
}

void filter_and_scale(WindowFeatures& features, const FeatureOptions& options) {
  validate(options);
  std::vector<StageFeatures> kept;
  std::vector<double> column, scratch;
  for (StageFeatures& sf : features.stages) {
    const auto means = sf.raw.col(kMeanMs);
    const double spread = (means.maxCoeff() - means.minCoeff()) / means.mean();
    features.relative_spread[sf.column] = spread;
    if (!(spread >= options.min_relative_spread)) {
      features.status[sf.column] = StageStatus::kLowSpread;
      continue;
    }
    sf.scaled.resize(sf.raw.rows(), sf.raw.cols());
    for (Eigen::Index c = 0; c < sf.raw.cols(); ++c) {
      column.assign(sf.raw.rows(), 0.0);
      for (Eigen::Index r = 0; r < sf.raw.rows(); ++r) column[static_cast<std::size_t>(r)] = sf.raw(r, c);
      const double median = nan_median(column, scratch);
      const double scale = robust_scale(column, scratch);
      sf.scaled.col(c) = (sf.raw.col(c).array() - median) / scale;
    }
    kept.push_back(std::move(sf));
  }
  features.stages = std::move(kept);
}

}  // namespace relax_straggler::core::detect
