#include "core/detect/gmm.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "core/detect/keep_best.h"
#include "core/detect/kmeans.h"

namespace relax_straggler::core::detect {
namespace {

constexpr double kLog2Pi = 1.8378770664093453;  // log(2 pi)
constexpr double kTiny = 10.0 * std::numeric_limits<double>::epsilon();

struct Model {
  Eigen::VectorXd log_weights;            // k
  PointMatrix means;                      // k x d
  std::vector<Eigen::MatrixXd> cov;       // k of d x d (tied: all equal)
};

// M-step: the model that maximises the expected log-likelihood under resp (n x k).
Model maximise(const PointMatrix& x, const Weights& w, const Eigen::MatrixXd& resp, Covariance type, double reg) {
  const Eigen::Index k = resp.cols();
  const Eigen::Index d = x.cols();
  const Eigen::MatrixXd wr = resp.array().colwise() * w.array();  // n x k
  const Eigen::VectorXd mass = (wr.colwise().sum().transpose().array() + kTiny).matrix();
  Model m;
  m.log_weights = (mass / mass.sum()).array().log();
  m.means = (wr.transpose() * x).array().colwise() / mass.array();
  m.cov.resize(static_cast<std::size_t>(k));
  Eigen::MatrixXd tied = Eigen::MatrixXd::Zero(d, d);
  for (Eigen::Index c = 0; c < k; ++c) {
    const PointMatrix centred = x.rowwise() - m.means.row(c);
    Eigen::MatrixXd s = centred.transpose() * (centred.array().colwise() * wr.col(c).array()).matrix();
    if (type == Covariance::kTied) {
      tied += s;
      continue;
    }
    s /= mass[c];
    if (type == Covariance::kDiag) {
      s = Eigen::MatrixXd(s.diagonal().asDiagonal());
    } else if (type == Covariance::kSpherical) {
      s = Eigen::MatrixXd::Identity(d, d) * (s.diagonal().mean());
    }
    s.diagonal().array() += reg;
    m.cov[static_cast<std::size_t>(c)] = s;
  }
  if (type == Covariance::kTied) {
    tied /= mass.sum();
    tied.diagonal().array() += reg;
    for (auto& c : m.cov) c = tied;
  }
  return m;
}

// E-step: fills log_resp (n x k) and returns the mean log-likelihood per unit weight;
// NaN when a covariance is not positive definite.
double expect(const PointMatrix& x, const Weights& w, const Model& m, Eigen::MatrixXd& log_resp) {
  const Eigen::Index n = x.rows();
  const Eigen::Index k = m.means.rows();
  const auto d = static_cast<double>(x.cols());
  log_resp.resize(n, k);
  for (Eigen::Index c = 0; c < k; ++c) {
    Eigen::LLT<Eigen::MatrixXd> llt(m.cov[static_cast<std::size_t>(c)]);
    if (llt.info() != Eigen::Success) return std::numeric_limits<double>::quiet_NaN();
    const Eigen::MatrixXd centred = (x.rowwise() - m.means.row(c)).transpose();  // d x n
    const Eigen::MatrixXd solved = llt.matrixL().solve(centred);
    const double log_det = 2.0 * llt.matrixLLT().diagonal().array().log().sum();
    log_resp.col(c) = (-0.5 * (d * kLog2Pi + log_det + solved.colwise().squaredNorm().array())).matrix().transpose();
    log_resp.col(c).array() += m.log_weights[c];
  }
  double total = 0.0;
  for (Eigen::Index i = 0; i < n; ++i) {
    const double top = log_resp.row(i).maxCoeff();
    const double lse = top + std::log((log_resp.row(i).array() - top).exp().sum());
    log_resp.row(i).array() -= lse;
    total += w[i] * lse;
  }
  return total / w.sum();
}

double parameter_count(Covariance type, Eigen::Index k, Eigen::Index d) {
  const auto kk = static_cast<double>(k);
  const auto dd = static_cast<double>(d);
  double cov = 0.0;
  switch (type) {
    case Covariance::kFull: cov = kk * dd * (dd + 1.0) / 2.0; break;
    case Covariance::kTied: cov = dd * (dd + 1.0) / 2.0; break;
    case Covariance::kDiag: cov = kk * dd; break;
    case Covariance::kSpherical: cov = kk; break;
  }
  return cov + kk * dd + kk - 1.0;
}

}  // namespace

const char* covariance_name(Covariance c) {
  switch (c) {
    case Covariance::kFull: return "full";
    case Covariance::kTied: return "tied";
    case Covariance::kDiag: return "diag";
    case Covariance::kSpherical: return "spherical";
  }
  return "full";
}

GmmResult gaussian_mixture(const PointMatrix& x, const Weights& w, Covariance covariance, const GmmOptions& options) {
  if (options.components < 1) throw std::invalid_argument("gaussian_mixture: components must be >= 1");
  if (options.max_iter < 1) throw std::invalid_argument("gaussian_mixture: max_iter must be >= 1");
  if (!(options.reg_covar > 0.0)) throw std::invalid_argument("gaussian_mixture: reg_covar must be > 0");
  if (!(options.tol >= 0.0)) throw std::invalid_argument("gaussian_mixture: tol must be >= 0");
  if (x.rows() == 0) throw std::invalid_argument("gaussian_mixture: no points");

  KMeansOptions km;
  km.k = options.components;
  km.n_init = 1;
  km.seed = options.seed;
  const KMeansResult init = kmeans(x, w, km);
  Eigen::MatrixXd resp = Eigen::MatrixXd::Zero(x.rows(), options.components);
  for (Eigen::Index i = 0; i < x.rows(); ++i) resp(i, init.labels[static_cast<std::size_t>(i)]) = 1.0;

  GmmResult out;
  out.covariance = covariance;
  Eigen::MatrixXd log_resp;
  Model model = maximise(x, w, resp, covariance, options.reg_covar);
  double ll = -std::numeric_limits<double>::infinity();
  for (std::int32_t it = 0; it < options.max_iter; ++it) {
    const double next = expect(x, w, model, log_resp);
    if (std::isnan(next)) {
      out.bic = std::numeric_limits<double>::infinity();
      out.labels = init.labels;
      return out;
    }
    const double change = next - ll;
    ll = next;
    if (std::fabs(change) < options.tol) {
      out.converged = true;
      break;
    }
    model = maximise(x, w, log_resp.array().exp().matrix(), covariance, options.reg_covar);
  }
  // A final E-step so the labels agree with the last model (as scikit-learn does).
  ll = expect(x, w, model, log_resp);
  if (std::isnan(ll)) {
    out.bic = std::numeric_limits<double>::infinity();
    out.labels = init.labels;
    return out;
  }
  out.mean_log_likelihood = ll;
  out.bic = -2.0 * ll * w.sum() + parameter_count(covariance, options.components, x.cols()) * std::log(w.sum());
  out.labels.resize(static_cast<std::size_t>(x.rows()));
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    Eigen::Index best = 0;
    log_resp.row(i).maxCoeff(&best);
    out.labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(best);
  }
  return out;
}

GmmResult gaussian_mixture_auto(const PointMatrix& x, const Weights& w, const GmmOptions& options) {
  KeepBest<GmmResult, double> best([](const double& a, const double& b) { return a < b; });  // lower BIC wins
  for (Covariance c : {Covariance::kFull, Covariance::kTied, Covariance::kDiag, Covariance::kSpherical}) {
    GmmResult r = gaussian_mixture(x, w, c, options);
    const double bic = r.bic;
    best.offer(std::move(r), bic);
  }
  return best.take();
}

}  // namespace relax_straggler::core::detect
