#include "core/confirm/sequential.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace relax_straggler::core::confirm {
namespace {

// e(q) for q in 0..peers, mean 1 over the peers + 1 places.
std::vector<double> score_table(std::int32_t peers) {
  std::vector<double> e(static_cast<std::size_t>(peers) + 1);
  double sum = 0.0;
  for (std::int32_t q = 0; q <= peers; ++q) {
    e[static_cast<std::size_t>(q)] = std::exp(kSequentialTilt * q / peers);
    sum += e[static_cast<std::size_t>(q)];
  }
  for (double& v : e) v *= static_cast<double>(e.size()) / sum;
  return e;
}

double tied_log_score(const std::vector<double>& e, std::int32_t lo, std::int32_t hi) {
  double sum = 0.0;
  for (std::int32_t q = lo; q <= hi; ++q) sum += e[static_cast<std::size_t>(q)];
  return std::log(sum / (hi - lo + 1));
}

}  // namespace

double sequential_log_score(std::int32_t lo, std::int32_t hi, std::int32_t peers) {
  if (peers < 1 || lo < 0 || hi < lo || hi > peers) {
    throw std::invalid_argument("sequential_log_score: places [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                "] of 0.." + std::to_string(peers) + " (need 0 <= lo <= hi <= peers, peers >= 1)");
  }
  return tied_log_score(score_table(peers), lo, hi);
}

double sequential_threshold(std::int64_t cells, double budget) {
  if (cells < 1 || !(budget > 0.0 && budget < 1.0)) {
    throw std::invalid_argument("sequential_threshold: cells must be >= 1 and budget in (0, 1), got " +
                                std::to_string(cells) + " and " + std::to_string(budget));
  }
  return std::log(static_cast<double>(cells) / budget);
}

void SequentialEvidence::reset(std::size_t ranks, std::size_t stages) {
  stages_ = stages;
  w_.assign(ranks * stages, 0.0);
}

void SequentialEvidence::tables(std::size_t peers) {
  if (scores_.size() <= peers) scores_.resize(peers + 1), logs_.resize(peers + 1);
  if (!scores_[peers].empty()) return;
  scores_[peers] = score_table(static_cast<std::int32_t>(peers));
  for (double e : scores_[peers]) logs_[peers].push_back(std::log(e));
}

void SequentialEvidence::add(const double* ms, std::size_t S, std::size_t s, const std::int32_t* rows, std::size_t n,
                             const std::int32_t* sample, std::size_t k, const std::vector<char>& in_sample,
                             double cap) {
  sorted_.clear();
  for (std::size_t i = 0; i < k; ++i) {
    const double t = ms[static_cast<std::size_t>(sample[i]) * S + s];
    if (!std::isnan(t)) sorted_.push_back(t);
  }
  std::sort(sorted_.begin(), sorted_.end());
  const std::size_t k_all = sorted_.size();
  if (k_all < 1) return;
  tables(k_all);
  if (k_all >= 2) tables(k_all - 1);
  const double* first = sorted_.data();
  for (std::size_t i = 0; i < n; ++i) {
    const auto r = static_cast<std::size_t>(rows[i]);
    const double t = ms[r * S + s];
    if (std::isnan(t)) continue;
    const double* below = std::lower_bound(first, first + k_all, t);
    auto lo = static_cast<std::int32_t>(below - first);
    std::int32_t equal = 0;
    while (below + equal < first + k_all && below[equal] == t) ++equal;
    auto peers = static_cast<std::int32_t>(k_all);
    if (in_sample[r]) --equal, --peers;  // its own time is one of the sample's
    if (peers < 1) continue;
    const auto k = static_cast<std::size_t>(peers);
    const double step = equal == 0 ? logs_[k][static_cast<std::size_t>(lo)] : tied_log_score(scores_[k], lo, lo + equal);
    double& w = w_[r * stages_ + s];
    w = std::clamp(w + step, 0.0, cap);
  }
}

}  // namespace relax_straggler::core::confirm
