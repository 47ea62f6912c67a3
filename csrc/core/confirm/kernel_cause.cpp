#include "core/confirm/kernel_cause.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace relax_straggler::core::confirm {
namespace {

bool measured(const KernelTimes& k) {
  return std::isfinite(k.kernel_ms) && std::isfinite(k.idle_ms) && std::isfinite(k.nccl_ms);
}

// Median of `field` over the peers that measured it (NaN when none did).
template <typename Field>
double peer_median(const std::vector<KernelTimes>& group, std::size_t rank, Field field, std::vector<double>& scratch) {
  scratch.clear();
  for (std::size_t i = 0; i < group.size(); ++i) {
    const double v = group[i].*field;
    if (i != rank && std::isfinite(v)) scratch.push_back(v);
  }
  if (scratch.empty()) return std::numeric_limits<double>::quiet_NaN();
  const std::size_t mid = scratch.size() / 2;
  std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(mid), scratch.end());
  const double hi = scratch[mid];
  if (scratch.size() % 2 == 1) return hi;
  const double lo = *std::max_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(mid));
  return 0.5 * (lo + hi);
}

}  // namespace

void KernelCauseConfig::validate() const {
  if (!(std::isfinite(min_excess_ms) && min_excess_ms >= 0.0)) {
    throw std::invalid_argument("min_excess_ms must be a finite number >= 0, got " + std::to_string(min_excess_ms));
  }
  if (!(std::isfinite(min_share) && min_share > 0.5 && min_share <= 1.0)) {
    throw std::invalid_argument("min_share must be in (0.5, 1], got " + std::to_string(min_share));
  }
  if (!(std::isfinite(peer_tolerance) && peer_tolerance >= 0.0)) {
    throw std::invalid_argument("peer_tolerance must be a finite number >= 0, got " + std::to_string(peer_tolerance));
  }
}

KernelCauseResult kernel_cause(const std::vector<KernelTimes>& group, std::size_t rank,
                               const KernelCauseConfig& config) {
  config.validate();
  if (rank >= group.size()) {
    throw std::invalid_argument("kernel_cause: rank " + std::to_string(rank) + " is not in a group of " +
                                std::to_string(group.size()));
  }
  KernelCauseResult out;
  out.rank = group[rank];
  std::vector<double> scratch;
  scratch.reserve(group.size());
  out.reference.kernel_ms = peer_median(group, rank, &KernelTimes::kernel_ms, scratch);
  out.reference.idle_ms = peer_median(group, rank, &KernelTimes::idle_ms, scratch);
  out.reference.nccl_ms = peer_median(group, rank, &KernelTimes::nccl_ms, scratch);
  bool every_peer_measured = true;
  for (std::size_t i = 0; i < group.size(); ++i) {
    if (i == rank) continue;
    if (measured(group[i])) {
      ++out.peers;
    } else {
      every_peer_measured = false;
    }
  }
  if (!measured(out.rank) || !measured(out.reference)) return out;

  out.kernel_excess_ms = out.rank.kernel_ms - out.reference.kernel_ms;
  out.idle_excess_ms = out.rank.idle_ms - out.reference.idle_ms;
  out.nccl_excess_ms = out.rank.nccl_ms - out.reference.nccl_ms;
  const double excess[3] = {out.kernel_excess_ms, out.idle_excess_ms, out.nccl_excess_ms};
  const Cause causes[3] = {Cause::kDevice, Cause::kHost, Cause::kLink};
  double positive = 0.0;
  std::size_t top = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    positive += std::max(excess[i], 0.0);
    if (excess[i] > excess[top]) top = i;
  }
  if (excess[top] < config.min_excess_ms || excess[top] <= 0.0 || excess[top] < config.min_share * positive) {
    return out;
  }
  if (causes[top] == Cause::kLink) {
    // A peer computing longer holds every other rank's NCCL kernel: the wait, not the link.
    if (!every_peer_measured) return out;
    const double bound = std::max(out.rank.kernel_ms, out.reference.kernel_ms) * (1.0 + config.peer_tolerance) +
                         config.min_excess_ms;
    for (std::size_t i = 0; i < group.size(); ++i) {
      if (i != rank && group[i].kernel_ms > bound) return out;
    }
  }
  out.cause = causes[top];
  return out;
}

}  // namespace relax_straggler::core::confirm
