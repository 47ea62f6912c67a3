#include "core/detect/kmeans.h"

#include <limits>
#include <stdexcept>

namespace relax_straggler::core::detect {
namespace {

// Assigns each point to its nearest centre; returns the inertia and whether any label changed.
double assign(const PointMatrix& x, const Weights& w, const PointMatrix& centers, Labels& labels, bool& changed) {
  changed = false;
  double inertia = 0.0;
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    Eigen::Index best = 0;
    const double d = (centers.rowwise() - x.row(i)).rowwise().squaredNorm().minCoeff(&best);
    auto& l = labels[static_cast<std::size_t>(i)];
    if (l != static_cast<std::int32_t>(best)) {
      l = static_cast<std::int32_t>(best);
      changed = true;
    }
    inertia += w[i] * d;
  }
  return inertia;
}

// Moves each centre to the weighted mean of its points; an empty cluster keeps its centre.
void update(const PointMatrix& x, const Weights& w, const Labels& labels, PointMatrix& centers) {
  PointMatrix sums = PointMatrix::Zero(centers.rows(), centers.cols());
  Eigen::VectorXd mass = Eigen::VectorXd::Zero(centers.rows());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    const auto c = labels[static_cast<std::size_t>(i)];
    sums.row(c) += w[i] * x.row(i);
    mass[c] += w[i];
  }
  for (Eigen::Index c = 0; c < centers.rows(); ++c) {
    if (mass[c] > 0.0) centers.row(c) = sums.row(c) / mass[c];
  }
}

// Index drawn with probability proportional to p (p >= 0, sum > 0).
Eigen::Index draw(const Eigen::VectorXd& p, Rng& rng) {
  const double target = rng.uniform() * p.sum();
  double acc = 0.0;
  for (Eigen::Index i = 0; i < p.size(); ++i) {
    acc += p[i];
    if (acc > target) return i;
  }
  return p.size() - 1;
}

}  // namespace

PointMatrix kmeans_plus_plus(const PointMatrix& x, const Weights& w, std::int32_t k, Rng& rng) {
  const Eigen::Index n = x.rows();
  const Eigen::Index m = std::min<Eigen::Index>(k, n);
  PointMatrix centers(m, x.cols());
  centers.row(0) = x.row(draw(w, rng));
  Eigen::VectorXd nearest = (x.rowwise() - centers.row(0)).rowwise().squaredNorm();
  for (Eigen::Index c = 1; c < m; ++c) {
    const Eigen::VectorXd p = w.cwiseProduct(nearest);
    // All remaining mass at distance 0 (fewer distinct points than k): any point will do.
    const Eigen::Index pick = p.sum() > 0.0 ? draw(p, rng) : static_cast<Eigen::Index>(rng.below(n));
    centers.row(c) = x.row(pick);
    nearest = nearest.cwiseMin((x.rowwise() - centers.row(c)).rowwise().squaredNorm());
  }
  return centers;
}

KMeansResult kmeans(const PointMatrix& x, const Weights& w, const KMeansOptions& options) {
  if (options.k < 1) throw std::invalid_argument("kmeans: k must be >= 1");
  if (options.n_init < 1) throw std::invalid_argument("kmeans: n_init must be >= 1");
  if (options.max_iter < 1) throw std::invalid_argument("kmeans: max_iter must be >= 1");
  if (x.rows() == 0) throw std::invalid_argument("kmeans: no points");

  Rng rng(options.seed);
  KMeansResult best;
  best.inertia = std::numeric_limits<double>::infinity();
  for (std::int32_t run = 0; run < options.n_init; ++run) {
    KMeansResult r;
    r.centers = kmeans_plus_plus(x, w, options.k, rng);
    r.labels.assign(static_cast<std::size_t>(x.rows()), -1);
    bool changed = true;
    for (std::int32_t it = 0; it < options.max_iter && changed; ++it) {
      assign(x, w, r.centers, r.labels, changed);
      if (changed) update(x, w, r.labels, r.centers);
    }
    r.inertia = assign(x, w, r.centers, r.labels, changed);
    if (r.inertia < best.inertia) best = std::move(r);
  }
  return best;
}

}  // namespace relax_straggler::core::detect
