// The grid searches of the clusterers (DBSCAN eps, fuzzy c-means fuzzifier, mean-shift
// bandwidth, agglomerative linkage, GMM covariance type) all keep the best candidate seen so
// far; KeepBest is that loop body, once.
#pragma once

#include <utility>

#include "core/detect/scores.h"

namespace relax_straggler::core::detect {

// Keeps the best of a sequence of (candidate, score) offers. `better(a, b)` is a strict
// order: true when score a beats score b. The first offer is always kept and a later one
// replaces it only when strictly better, so on a tie the earlier grid point wins.
// Default order: better_partition (scores.h).
template <typename Candidate, typename Score = PartitionScore>
class KeepBest {
 public:
  using Better = bool (*)(const Score&, const Score&);

  explicit KeepBest(Better better = better_partition) : better_(better) {}

  void offer(Candidate candidate, const Score& score) {
    if (have_ && !better_(score, score_)) return;
    best_ = std::move(candidate);
    score_ = score;
    have_ = true;
  }

  // False until the first offer.
  bool has_value() const { return have_; }

  // The kept candidate (a default-constructed one before any offer), moved out.
  Candidate take() { return std::move(best_); }

 private:
  Better better_;
  Candidate best_{};
  Score score_{};
  bool have_ = false;
};

}  // namespace relax_straggler::core::detect
