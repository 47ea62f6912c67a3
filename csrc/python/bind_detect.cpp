// Python bindings of the window detector (csrc/core/detect) as the submodule
// relax_straggler._core.detect. relax_straggler/window/detector.py wraps it in plain dataclasses;
// call that instead. Every function releases the GIL while the engine runs, and
// std::invalid_argument surfaces as ValueError.
#include <pybind11/eigen.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "core/detect/agglomerative.h"
#include "core/detect/ensemble.h"
#include "core/detect/kmeans.h"
#include "core/detect/scores.h"

namespace py = pybind11;
namespace rd = relax_straggler::core::detect;

namespace relax_straggler::python {
namespace {

using Array = py::array_t<double, py::array::c_style | py::array::forcecast>;

rd::PointMatrix to_points(const Array& a) {
  if (a.ndim() != 2) throw std::invalid_argument("points must be a 2-D (n, d) array, got " + std::to_string(a.ndim()) + "-D");
  if (a.shape(0) == 0) throw std::invalid_argument("points must not be empty");
  return Eigen::Map<const rd::PointMatrix>(a.data(), a.shape(0), a.shape(1));
}

rd::Weights to_weights(const py::object& weights, Eigen::Index n) {
  if (weights.is_none()) return rd::Weights::Ones(n);
  const Array a = weights.cast<Array>();
  if (a.ndim() != 1 || a.shape(0) != n) {
    throw std::invalid_argument("weights must be a 1-D array with one entry per point (" + std::to_string(n) + ")");
  }
  rd::Weights w = Eigen::Map<const rd::Weights>(a.data(), n);
  if (!(w.array() > 0.0).all()) throw std::invalid_argument("weights must be > 0");
  return w;
}

py::array_t<std::int32_t> to_array(const rd::Labels& labels) {
  py::array_t<std::int32_t> out(static_cast<py::ssize_t>(labels.size()));
  std::copy(labels.begin(), labels.end(), out.mutable_data());
  return out;
}

rd::WindowConfig make_config(std::int64_t warmup_steps, double min_relative_spread, double min_coverage,
                             double trim_fraction, double max_slow_fraction, double min_slowdown, double link_min_z,
                             double stage_vote_fraction,
                             std::int32_t min_algorithm_votes, const std::string& vote_rule,
                             const std::vector<std::string>& algorithms,
                             const std::unordered_map<std::string, double>& stage_weights, std::int32_t max_points,
                             std::uint64_t seed, double dbscan_min_samples, std::vector<double> dbscan_eps_scales,
                             std::vector<double> mean_shift_quantiles, std::vector<double> fuzzifiers,
                             std::int32_t kmeans_restarts, std::int32_t threads) {
  rd::WindowConfig c;
  c.features = {warmup_steps, min_relative_spread, min_coverage, trim_fraction};
  c.slow = {max_slow_fraction, min_slowdown, link_min_z};
  if (vote_rule != "most_votes" && vote_rule != "at_least") {
    throw std::invalid_argument("vote_rule must be 'most_votes' or 'at_least', got '" + vote_rule + "'");
  }
  c.vote = {stage_vote_fraction, min_algorithm_votes,
            vote_rule == "most_votes" ? rd::VoteRule::kMostVotes : rd::VoteRule::kAtLeast};
  c.algorithms.clear();
  for (const auto& a : algorithms) c.algorithms.push_back(rd::algorithm_from_name(a));
  c.stage_weights = stage_weights;
  c.max_points = max_points;
  c.seed = seed;
  c.dbscan.min_samples = dbscan_min_samples;
  c.dbscan.eps_scales = std::move(dbscan_eps_scales);
  c.mean_shift.quantiles = std::move(mean_shift_quantiles);
  c.fuzzy_cmeans.fuzzifiers = std::move(fuzzifiers);
  c.kmeans_restarts = kmeans_restarts;
  c.threads = threads;
  c.validate();
  return c;
}

rd::WindowResult detect(const Array& ms, std::vector<std::string> stages, const rd::WindowConfig& config,
                        std::vector<std::int32_t> rank_to_node, std::vector<std::int32_t> rank_to_group) {
  if (ms.ndim() != 3) {
    throw std::invalid_argument("ms must be a 3-D (steps, ranks, stages) array, got " + std::to_string(ms.ndim()) + "-D");
  }
  if (static_cast<std::size_t>(ms.shape(2)) != stages.size()) {
    throw std::invalid_argument("ms has " + std::to_string(ms.shape(2)) + " stage columns but " +
                                std::to_string(stages.size()) + " stage names were given");
  }
  const auto view = rd::WindowView::of(ms.data(), ms.shape(0), static_cast<std::int32_t>(ms.shape(1)), std::move(stages));
  py::gil_scoped_release release;  // ms stays alive: the caller holds it
  return rd::detect_window(view, config, rank_to_node, rank_to_group);
}

}  // namespace

void bind_detect(py::module_& parent) {
  py::module_ m = parent.def_submodule("detect", "Window detector: features, six clusterers, votes (csrc/core/detect)");
  const rd::WindowConfig d;
  // The window ensemble's thresholds (slow_cluster.h, voting.h), the Python configurations' defaults.
  m.attr("DEFAULT_MIN_SLOWDOWN") = d.slow.min_slowdown;
  m.attr("DEFAULT_MIN_ALGORITHM_VOTES") = d.vote.min_votes;

  py::class_<rd::WindowConfig>(m, "WindowConfig", "Settings of the window detector (csrc/core/detect/ensemble.h).")
      .def(py::init(&make_config), py::arg("warmup_steps") = d.features.warmup_steps,
           py::arg("min_relative_spread") = d.features.min_relative_spread,
           py::arg("min_coverage") = d.features.min_coverage, py::arg("trim_fraction") = d.features.trim_fraction,
           py::arg("max_slow_fraction") = d.slow.max_slow_fraction,
           py::arg("min_slowdown") = d.slow.min_slowdown, py::arg("link_min_z") = d.slow.link_min_z,
           py::arg("stage_vote_fraction") = d.vote.stage_fraction,
           py::arg("min_algorithm_votes") = d.vote.min_votes, py::arg("vote_rule") = "most_votes",
           py::arg("algorithms") =
               std::vector<std::string>{"kmeans", "dbscan", "gmm", "agglomerative", "mean_shift", "fuzzy_cmeans"},
           py::arg("stage_weights") = std::unordered_map<std::string, double>{},
           py::arg("max_points") = d.max_points, py::arg("seed") = d.seed,
           py::arg("dbscan_min_samples") = d.dbscan.min_samples, py::arg("dbscan_eps_scales") = d.dbscan.eps_scales,
           py::arg("mean_shift_quantiles") = d.mean_shift.quantiles,
           py::arg("fuzzifiers") = d.fuzzy_cmeans.fuzzifiers, py::arg("kmeans_restarts") = d.kmeans_restarts,
           py::arg("threads") = d.threads);

  py::class_<rd::StageImbalance>(m, "StageImbalance")
      .def_readonly("stage", &rd::StageImbalance::stage)
      .def_readonly("slowest_group", &rd::StageImbalance::slowest_group)
      .def_readonly("fastest_group", &rd::StageImbalance::fastest_group)
      .def_readonly("ratio", &rd::StageImbalance::ratio)
      .def_readonly("group_mean_ms", &rd::StageImbalance::group_mean_ms);
  py::class_<rd::AlgorithmStage>(m, "AlgorithmStage")
      .def_readonly("slow_ranks", &rd::AlgorithmStage::slow_ranks)
      .def_readonly("late_ranks", &rd::AlgorithmStage::late_ranks)
      .def_readonly("chosen", &rd::AlgorithmStage::chosen);
  py::class_<rd::StageReport>(m, "StageReport")
      .def_readonly("stage", &rd::StageReport::stage)
      .def_property_readonly("communication", [](const rd::StageReport& s) { return s.kind == core::StageKind::kCommunication; })
      .def_property_readonly("status", [](const rd::StageReport& s) { return rd::stage_status_name(s.status); })
      .def_readonly("relative_spread", &rd::StageReport::relative_spread)
      .def_readonly("algorithms", &rd::StageReport::algorithms);
  py::class_<rd::AlgorithmReport>(m, "AlgorithmReport")
      .def_property_readonly("algorithm", [](const rd::AlgorithmReport& a) { return rd::algorithm_name(a.algorithm); })
      .def_readonly("slow_ranks", &rd::AlgorithmReport::slow_ranks)
      .def_readonly("elapsed_ms", &rd::AlgorithmReport::elapsed_ms)
      .def_readonly("cpu_ms", &rd::AlgorithmReport::cpu_ms);
  py::class_<rd::RankFinding>(m, "RankFinding")
      .def_readonly("rank", &rd::RankFinding::rank)
      .def_readonly("votes", &rd::RankFinding::votes)
      .def_readonly("node", &rd::RankFinding::node)
      .def_readonly("stages", &rd::RankFinding::stages);
  py::class_<rd::WindowResult>(m, "WindowResult")
      .def_readonly("steps_used", &rd::WindowResult::steps_used)
      .def_readonly("num_ranks", &rd::WindowResult::num_ranks)
      .def_readonly("absent_ranks", &rd::WindowResult::absent_ranks)
      .def_readonly("stages", &rd::WindowResult::stages)
      .def_readonly("algorithms", &rd::WindowResult::algorithms)
      .def_readonly("votes", &rd::WindowResult::votes)
      .def_readonly("anomalies", &rd::WindowResult::anomalies)
      .def_readonly("anomaly_nodes", &rd::WindowResult::anomaly_nodes)
      .def_readonly("link_suspects", &rd::WindowResult::link_suspects)
      .def_readonly("imbalance", &rd::WindowResult::imbalance)
      .def_readonly("elapsed_ms", &rd::WindowResult::elapsed_ms);

  m.def("detect_window", &detect, py::arg("ms"), py::arg("stages"), py::arg("config"),
        py::arg("rank_to_node") = std::vector<std::int32_t>{}, py::arg("rank_to_group") = std::vector<std::int32_t>{},
        "ms: float64 (steps, ranks, stages) in ms, NaN or <= 0 = not run. Raises ValueError on bad input.");

  m.def(
      "cluster",
      [](const Array& points, const py::object& weights, const std::string& algorithm, const rd::WindowConfig& config) {
        const rd::PointMatrix x = to_points(points);
        const rd::Weights w = to_weights(weights, x.rows());
        const rd::Algorithm a = rd::algorithm_from_name(algorithm);
        rd::Clustering c;
        {
          py::gil_scoped_release release;
          c = rd::run_clusterer(a, x, w, config);
        }
        return py::make_tuple(to_array(c.labels), c.chosen);
      },
      py::arg("points"), py::arg("weights"), py::arg("algorithm"), py::arg("config"),
      "One clusterer as the ensemble runs it (grid search, two groups): (labels, chosen hyper-parameter).");

  m.def(
      "kmeans",
      [](const Array& points, const py::object& weights, std::int32_t k, std::int32_t n_init, std::uint64_t seed) {
        const rd::PointMatrix x = to_points(points);
        const rd::Weights w = to_weights(weights, x.rows());
        py::gil_scoped_release release;
        return rd::kmeans(x, w, rd::KMeansOptions{k, n_init, 300, seed}).labels;
      },
      py::arg("points"), py::arg("weights") = py::none(), py::arg("k") = 2, py::arg("n_init") = 3, py::arg("seed") = 0);
  m.def(
      "dbscan",
      [](const Array& points, const py::object& weights, double eps, double min_samples) {
        const rd::PointMatrix x = to_points(points);
        const rd::Weights w = to_weights(weights, x.rows());
        py::gil_scoped_release release;
        return rd::dbscan(rd::pairwise_distances(x), w, eps, min_samples);
      },
      py::arg("points"), py::arg("weights") = py::none(), py::arg("eps"), py::arg("min_samples"));
  m.def(
      "gaussian_mixture",
      [](const Array& points, const py::object& weights, const std::string& covariance, std::int32_t components,
         std::uint64_t seed) {
        const rd::PointMatrix x = to_points(points);
        const rd::Weights w = to_weights(weights, x.rows());
        rd::Covariance c = rd::Covariance::kFull;
        bool found = false;
        for (auto cand : {rd::Covariance::kFull, rd::Covariance::kTied, rd::Covariance::kDiag, rd::Covariance::kSpherical}) {
          if (covariance == rd::covariance_name(cand)) {
            c = cand;
            found = true;
          }
        }
        if (!found) throw std::invalid_argument("covariance must be full, tied, diag or spherical, got '" + covariance + "'");
        rd::GmmOptions o;
        o.components = components;
        o.seed = seed;
        rd::GmmResult r;
        {
          py::gil_scoped_release release;
          r = rd::gaussian_mixture(x, w, c, o);
        }
        return py::make_tuple(r.labels, r.bic);
      },
      py::arg("points"), py::arg("weights") = py::none(), py::arg("covariance") = "full", py::arg("components") = 2,
      py::arg("seed") = 0, "Returns (labels, bic).");
  m.def(
      "agglomerative",
      [](const Array& points, const py::object& weights, const std::string& linkage, std::int32_t clusters) {
        const rd::PointMatrix x = to_points(points);
        const rd::Weights w = to_weights(weights, x.rows());
        rd::Linkage l = rd::Linkage::kWard;
        bool found = false;
        for (auto cand : {rd::Linkage::kWard, rd::Linkage::kComplete, rd::Linkage::kAverage, rd::Linkage::kSingle}) {
          if (linkage == rd::linkage_name(cand)) {
            l = cand;
            found = true;
          }
        }
        if (!found) throw std::invalid_argument("linkage must be ward, complete, average or single, got '" + linkage + "'");
        py::gil_scoped_release release;
        return rd::agglomerative(rd::pairwise_distances(x), w, l, clusters);
      },
      py::arg("points"), py::arg("weights") = py::none(), py::arg("linkage") = "ward", py::arg("clusters") = 2);
  m.def(
      "mean_shift",
      [](const Array& points, const py::object& weights, double bandwidth, bool bin_seeding) {
        const rd::PointMatrix x = to_points(points);
        const rd::Weights w = to_weights(weights, x.rows());
        py::gil_scoped_release release;
        return rd::mean_shift(x, w, bandwidth, bin_seeding, 300).labels;
      },
      py::arg("points"), py::arg("weights") = py::none(), py::arg("bandwidth"), py::arg("bin_seeding") = false);
  m.def(
      "estimate_bandwidth",
      [](const Array& points, const py::object& weights, double quantile) {
        const rd::PointMatrix x = to_points(points);
        const rd::Weights w = to_weights(weights, x.rows());
        py::gil_scoped_release release;
        return rd::estimate_bandwidths(rd::pairwise_distances(x), w, {quantile})[0];
      },
      py::arg("points"), py::arg("weights") = py::none(), py::arg("quantile") = 0.3);
  m.def(
      "fuzzy_cmeans",
      [](const Array& points, const py::object& weights, double fuzzifier, std::int32_t clusters, std::uint64_t seed) {
        const rd::PointMatrix x = to_points(points);
        const rd::Weights w = to_weights(weights, x.rows());
        rd::FcmOptions o;
        o.clusters = clusters;
        o.seed = seed;
        rd::FcmResult r;
        {
          py::gil_scoped_release release;
          r = rd::fuzzy_cmeans(x, w, fuzzifier, o);
        }
        return py::make_tuple(r.labels, r.membership);
      },
      py::arg("points"), py::arg("weights") = py::none(), py::arg("fuzzifier") = 2.0, py::arg("clusters") = 2,
      py::arg("seed") = 0, "Returns (labels, membership (n, clusters)).");
  m.def(
      "score_partition",
      [](const Array& points, const py::object& weights, const std::vector<std::int32_t>& labels) {
        const rd::PointMatrix x = to_points(points);
        const rd::Weights w = to_weights(weights, x.rows());
        if (labels.size() != static_cast<std::size_t>(x.rows())) {
          throw std::invalid_argument("labels must have one entry per point");
        }
        py::gil_scoped_release release;
        const rd::PartitionScore s = rd::score_partition(x, w, labels, rd::pairwise_distances(x));
        return std::make_tuple(s.silhouette, s.calinski_harabasz, s.davies_bouldin);
      },
      py::arg("points"), py::arg("weights") = py::none(), py::arg("labels"),
      "Returns (silhouette, calinski_harabasz, davies_bouldin); labels -1 count as one cluster.");
}

}  // namespace relax_straggler::python
