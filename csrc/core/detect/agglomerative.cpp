#include "core/detect/agglomerative.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "core/detect/keep_best.h"
#include "core/detect/scores.h"

namespace relax_straggler::core::detect {
namespace {

struct Merge {
  Eigen::Index a = 0;
  Eigen::Index b = 0;
  double height = 0.0;
};

// Lance-Williams: the distance from the union of a and b (sizes na, nb, at distance dab)
// to cluster k (size nk) at distances dak, dbk.
double updated(Linkage l, double dak, double dbk, double dab, double na, double nb, double nk) {
  switch (l) {
    case Linkage::kWard:
      return std::sqrt(std::max(0.0, ((na + nk) * dak * dak + (nb + nk) * dbk * dbk - nk * dab * dab) / (na + nb + nk)));
    case Linkage::kComplete: return std::max(dak, dbk);
    case Linkage::kAverage: return (na * dak + nb * dbk) / (na + nb);
    case Linkage::kSingle: return std::min(dak, dbk);
  }
  return dak;
}

// The n - 1 merges of the full tree, in the order the chain finds them (not sorted).
std::vector<Merge> nn_chain(Eigen::MatrixXd d, const Weights& w, Linkage linkage) {
  const Eigen::Index n = d.rows();
  if (linkage == Linkage::kWard) {
    // Ward's distance between singletons i, j: sqrt(2 w_i w_j / (w_i + w_j)) |x_i - x_j|.
    for (Eigen::Index j = 0; j < n; ++j) {
      for (Eigen::Index i = 0; i < n; ++i) d(i, j) *= std::sqrt(2.0 * w[i] * w[j] / (w[i] + w[j]));
    }
  }
  std::vector<double> size(w.data(), w.data() + n);
  std::vector<char> active(static_cast<std::size_t>(n), 1);
  std::vector<Eigen::Index> chain;
  std::vector<Merge> merges;
  merges.reserve(static_cast<std::size_t>(n > 0 ? n - 1 : 0));
  Eigen::Index remaining = n;
  Eigen::Index start = 0;
  while (remaining > 1) {
    if (chain.empty()) {
      while (!active[static_cast<std::size_t>(start)]) ++start;
      chain.push_back(start);
    }
    const Eigen::Index a = chain.back();
    const Eigen::Index prev = chain.size() >= 2 ? chain[chain.size() - 2] : -1;
    // Nearest active neighbour of a; prefer the previous chain element on ties so the chain terminates.
    Eigen::Index b = prev;
    double best = prev >= 0 ? d(prev, a) : std::numeric_limits<double>::infinity();
    for (Eigen::Index k = 0; k < n; ++k) {
      if (k == a || !active[static_cast<std::size_t>(k)]) continue;
      if (d(k, a) < best) {
        best = d(k, a);
        b = k;
      }
    }
    if (b != prev) {
      chain.push_back(b);
      continue;
    }
    // a and b are reciprocal nearest neighbours: merge b into a.
    chain.pop_back();
    chain.pop_back();
    merges.push_back({a, b, best});
    const double na = size[static_cast<std::size_t>(a)];
    const double nb = size[static_cast<std::size_t>(b)];
    for (Eigen::Index k = 0; k < n; ++k) {
      if (k == a || k == b || !active[static_cast<std::size_t>(k)]) continue;
      const double v = updated(linkage, d(k, a), d(k, b), best, na, nb, size[static_cast<std::size_t>(k)]);
      d(k, a) = v;
      d(a, k) = v;
    }
    active[static_cast<std::size_t>(b)] = 0;
    size[static_cast<std::size_t>(a)] = na + nb;
    --remaining;
  }
  return merges;
}

Eigen::Index find(std::vector<Eigen::Index>& parent, Eigen::Index i) {
  while (parent[static_cast<std::size_t>(i)] != i) {
    parent[static_cast<std::size_t>(i)] = parent[static_cast<std::size_t>(parent[static_cast<std::size_t>(i)])];
    i = parent[static_cast<std::size_t>(i)];
  }
  return i;
}

}  // namespace

const char* linkage_name(Linkage l) {
  switch (l) {
    case Linkage::kWard: return "ward";
    case Linkage::kComplete: return "complete";
    case Linkage::kAverage: return "average";
    case Linkage::kSingle: return "single";
  }
  return "ward";
}

Labels agglomerative(const Eigen::MatrixXd& distances, const Weights& w, Linkage linkage, std::int32_t clusters) {
  if (clusters < 1) throw std::invalid_argument("agglomerative: clusters must be >= 1");
  const Eigen::Index n = distances.rows();
  std::vector<Merge> merges = nn_chain(distances, w, linkage);
  // The tree cut at `clusters`: apply the n - clusters lowest merges (a stable sort keeps
  // the chain's order among equal heights, which is a valid dendrogram order).
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& x, const Merge& y) { return x.height < y.height; });
  std::vector<Eigen::Index> parent(static_cast<std::size_t>(n));
  std::iota(parent.begin(), parent.end(), Eigen::Index{0});
  const auto apply = static_cast<std::size_t>(std::max<Eigen::Index>(0, n - clusters));
  for (std::size_t m = 0; m < apply && m < merges.size(); ++m) {
    parent[static_cast<std::size_t>(find(parent, merges[m].b))] = find(parent, merges[m].a);
  }
  Labels labels(static_cast<std::size_t>(n));
  for (Eigen::Index i = 0; i < n; ++i) labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(find(parent, i));
  compact_labels(labels);
  return labels;
}

AgglomerativeResult agglomerative_auto(const PointMatrix& x, const Weights& w, const Eigen::MatrixXd& distances,
                                       std::int32_t clusters) {
  KeepBest<AgglomerativeResult> best;
  for (Linkage l : {Linkage::kWard, Linkage::kComplete, Linkage::kAverage, Linkage::kSingle}) {
    Labels labels = agglomerative(distances, w, l, clusters);
    const PartitionScore score = score_partition(x, w, labels, distances);
    best.offer({std::move(labels), l}, score);
  }
  return best.take();
}

}  // namespace relax_straggler::core::detect
