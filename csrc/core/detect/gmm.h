// Gaussian mixture fitted by expectation-maximisation (Dempster, Laird & Rubin 1977),
// weighted, with the four covariance structures of scikit-learn's GaussianMixture
// (full, tied, diag, spherical); the ensemble fits all four and keeps the lowest BIC
// (Schwarz 1978). Each point is labelled with its most responsible component.
//
// Initialisation as scikit-learn's default: responsibilities from a k-means partition.
// reg_covar is added to every covariance diagonal, which keeps a component that
// collapses onto one straggler positive definite.
#pragma once

#include <cstdint>
#include <string>

#include "core/detect/points.h"

namespace relax_straggler::core::detect {

enum class Covariance : std::uint8_t { kFull = 0, kTied = 1, kDiag = 2, kSpherical = 3 };

const char* covariance_name(Covariance c);  // "full", "tied", "diag", "spherical"

struct GmmOptions {
  std::int32_t components = 2;  // >= 1
  std::int32_t max_iter = 100;  // EM iterations, >= 1
  double tol = 1e-3;            // stop when the mean log-likelihood per unit weight changes less
  double reg_covar = 1e-6;      // added to covariance diagonals, > 0
  std::uint64_t seed = 0;       // of the k-means initialisation
};

struct GmmResult {
  Labels labels;                // argmax responsibility
  Covariance covariance = Covariance::kFull;
  double mean_log_likelihood = 0.0;  // per unit weight
  double bic = 0.0;             // -2 log L + parameters x log(total weight); +inf when the fit failed
  bool converged = false;
};

// Throws std::invalid_argument on invalid options or an empty x.
GmmResult gaussian_mixture(const PointMatrix& x, const Weights& w, Covariance covariance, const GmmOptions& options);

// Fits every covariance structure and returns the lowest BIC.
GmmResult gaussian_mixture_auto(const PointMatrix& x, const Weights& w, const GmmOptions& options);

}  // namespace relax_straggler::core::detect
