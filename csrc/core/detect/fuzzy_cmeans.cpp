#include "core/detect/fuzzy_cmeans.h"

#include <cmath>
#include <stdexcept>

#include "core/detect/keep_best.h"
#include "core/detect/kmeans.h"
#include "core/detect/rng.h"
#include "core/detect/scores.h"

namespace relax_straggler::core::detect {
namespace {

// Memberships from squared distances d2 (n x c). A point on a centre belongs to it alone.
void memberships(const Eigen::MatrixXd& d2, double fuzzifier, Eigen::MatrixXd& u) {
  const double power = 1.0 / (fuzzifier - 1.0);  // (d^2)^(1/(m-1)) = d^(2/(m-1))
  u.resize(d2.rows(), d2.cols());
  for (Eigen::Index i = 0; i < d2.rows(); ++i) {
    Eigen::Index zero = -1;
    for (Eigen::Index k = 0; k < d2.cols(); ++k) {
      if (d2(i, k) == 0.0) zero = k;
    }
    if (zero >= 0) {
      u.row(i).setZero();
      u(i, zero) = 1.0;
      continue;
    }
    // u_ik = d_ik^(-p) / sum_j d_ij^(-p), scaled by the smallest distance against overflow.
    const double nearest = d2.row(i).minCoeff();
    for (Eigen::Index k = 0; k < d2.cols(); ++k) u(i, k) = std::pow(nearest / d2(i, k), power);
    u.row(i) /= u.row(i).sum();
  }
}

}  // namespace

FcmResult fuzzy_cmeans(const PointMatrix& x, const Weights& w, double fuzzifier, const FcmOptions& options) {
  if (!(fuzzifier > 1.0)) throw std::invalid_argument("fuzzy_cmeans: fuzzifier must be > 1");
  if (options.clusters < 1) throw std::invalid_argument("fuzzy_cmeans: clusters must be >= 1");
  if (options.max_iter < 1) throw std::invalid_argument("fuzzy_cmeans: max_iter must be >= 1");
  if (x.rows() == 0) throw std::invalid_argument("fuzzy_cmeans: no points");

  Rng rng(options.seed);
  FcmResult out;
  out.fuzzifier = fuzzifier;
  out.centers = kmeans_plus_plus(x, w, options.clusters, rng);
  const Eigen::Index c = out.centers.rows();
  Eigen::MatrixXd d2(x.rows(), c);
  Eigen::MatrixXd previous;
  for (std::int32_t it = 0; it < options.max_iter; ++it) {
    for (Eigen::Index k = 0; k < c; ++k) d2.col(k) = (x.rowwise() - out.centers.row(k)).rowwise().squaredNorm();
    memberships(d2, fuzzifier, out.membership);
    if (it > 0 && (out.membership - previous).cwiseAbs().maxCoeff() < options.tol) break;
    previous = out.membership;
    const Eigen::MatrixXd um = out.membership.array().pow(fuzzifier).colwise() * w.array();  // n x c
    const Eigen::VectorXd mass = um.colwise().sum().transpose();
    for (Eigen::Index k = 0; k < c; ++k) {
      if (mass[k] > 0.0) out.centers.row(k) = (um.col(k).transpose() * x) / mass[k];
    }
  }
  out.labels.resize(static_cast<std::size_t>(x.rows()));
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    Eigen::Index best = 0;
    out.membership.row(i).maxCoeff(&best);
    out.labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(best);
  }
  return out;
}

FcmResult fuzzy_cmeans_auto(const PointMatrix& x, const Weights& w, const Eigen::MatrixXd& distances,
                            const FcmOptions& options) {
  KeepBest<FcmResult> best;
  for (double m : options.fuzzifiers) {
    FcmResult r = fuzzy_cmeans(x, w, m, options);
    const PartitionScore score = score_partition(x, w, r.labels, distances);
    best.offer(std::move(r), score);
  }
  return best.take();
}

}  // namespace relax_straggler::core::detect
