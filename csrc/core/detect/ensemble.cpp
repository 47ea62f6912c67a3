#include "core/detect/ensemble.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <thread>

#include "core/detect/agglomerative.h"
#include "core/detect/coreset.h"
#include "core/detect/kmeans.h"

namespace relax_straggler::core::detect {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// CPU time of the calling thread, ms (POSIX CLOCK_THREAD_CPUTIME_ID).
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

std::string format_value(const char* key, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s=%.4g", key, v);
  return buf;
}

// The clusterer on a stage's (coreset) points with their precomputed distances.
Clustering cluster(Algorithm a, const PointMatrix& x, const Weights& w, const Eigen::MatrixXd& d,
                   const WindowConfig& config, std::uint64_t seed) {
  switch (a) {
    case Algorithm::kKMeans: {
      KMeansOptions o;
      o.k = 2;
      o.n_init = config.kmeans_restarts;
      o.seed = seed;
      return {kmeans(x, w, o).labels, "k=2"};
    }
    case Algorithm::kDbscan: {
      DbscanResult r = dbscan_auto(x, w, d, config.dbscan);
      return {std::move(r.labels), format_value("eps", r.eps)};
    }
    case Algorithm::kGaussianMixture: {
      GmmOptions o;
      o.seed = seed;
      GmmResult r = gaussian_mixture_auto(x, w, o);
      return {std::move(r.labels), std::string("covariance=") + covariance_name(r.covariance)};
    }
    case Algorithm::kAgglomerative: {
      AgglomerativeResult r = agglomerative_auto(x, w, d, 2);
      return {std::move(r.labels), std::string("linkage=") + linkage_name(r.linkage)};
    }
    case Algorithm::kMeanShift: {
      MeanShiftOptions o = config.mean_shift;
      o.seed = seed;
      MeanShiftResult r = mean_shift_auto(x, w, d, o);
      return {std::move(r.labels), format_value("bandwidth", r.bandwidth)};
    }
    case Algorithm::kFuzzyCMeans: {
      FcmOptions o = config.fuzzy_cmeans;
      o.seed = seed;
      FcmResult r = fuzzy_cmeans_auto(x, w, d, o);
      return {std::move(r.labels), format_value("m", r.fuzzifier)};
    }
  }
  throw std::invalid_argument("unknown algorithm");
}

void check_map(const std::vector<std::int32_t>& map, std::int32_t num_ranks, const char* name) {
  if (map.empty()) return;
  if (map.size() != static_cast<std::size_t>(num_ranks)) {
    throw std::invalid_argument(std::string(name) + " has " + std::to_string(map.size()) +
                                " entries, expected one per rank (" + std::to_string(num_ranks) + ")");
  }
  for (std::int32_t id : map) {
    if (id < 0) throw std::invalid_argument(std::string(name) + " ids must be >= 0, got " + std::to_string(id));
  }
}

// What the algorithms found in one kept stage.
struct StageOutcome {
  std::vector<std::vector<Flag>> flags;  // [algorithm][analysed rank]
  std::vector<std::string> chosen;       // [algorithm]
  std::vector<double> elapsed_ms;        // [algorithm]
  std::vector<double> cpu_ms;            // [algorithm]
};

StageOutcome analyse_stage(const StageFeatures& sf, const WindowConfig& config) {
  const std::uint64_t seed = config.seed + 7919u * (sf.column + 1);
  const Coreset core = build_coreset(sf.scaled, config.max_points, seed);
  const Eigen::MatrixXd distances = pairwise_distances(core.points);
  StageOutcome out;
  for (Algorithm a : config.algorithms) {
    const auto t0 = Clock::now();
    const double cpu0 = thread_cpu_ms();
    Clustering c = cluster(a, core.points, core.weights, distances, config, seed);
    out.flags.push_back(flag_ranks(expand_labels(core, c.labels), sf.raw, sf.kind, config.slow));
    out.elapsed_ms.push_back(ms_since(t0));
    out.cpu_ms.push_back(thread_cpu_ms() - cpu0);
    out.chosen.push_back(std::move(c.chosen));
  }
  return out;
}

// analyse_stage over every kept stage on `threads` threads; the first error is rethrown.
std::vector<StageOutcome> analyse_stages(const std::vector<StageFeatures>& stages, const WindowConfig& config) {
  std::vector<StageOutcome> out(stages.size());
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto work = [&] {
    for (std::size_t s = next++; s < stages.size() && !failed; s = next++) {
      try {
        out[s] = analyse_stage(stages[s], config);
      } catch (...) {
        if (!failed.exchange(true)) error = std::current_exception();
      }
    }
  };
  const auto extra = std::min<std::size_t>(static_cast<std::size_t>(config.threads), stages.size());
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < extra; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return out;
}

double stage_weight(const WindowConfig& config, const std::string& stage) {
  const auto it = config.stage_weights.find(stage);
  return it == config.stage_weights.end() ? 1.0 : it->second;
}

}  // namespace

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::kKMeans: return "kmeans";
    case Algorithm::kDbscan: return "dbscan";
    case Algorithm::kGaussianMixture: return "gmm";
    case Algorithm::kAgglomerative: return "agglomerative";
    case Algorithm::kMeanShift: return "mean_shift";
    case Algorithm::kFuzzyCMeans: return "fuzzy_cmeans";
  }
  return "kmeans";
}

Algorithm algorithm_from_name(const std::string& name) {
  for (std::size_t i = 0; i < kNumAlgorithms; ++i) {
    const auto a = static_cast<Algorithm>(i);
    if (name == algorithm_name(a)) return a;
  }
  throw std::invalid_argument("unknown algorithm '" + name +
                              "'; algorithms are: kmeans, dbscan, gmm, agglomerative, mean_shift, fuzzy_cmeans");
}

void WindowConfig::validate() const {
  slow.validate();
  vote.validate();
  if (algorithms.empty()) throw std::invalid_argument("algorithms must name at least one algorithm");
  for (const auto& [stage, weight] : stage_weights) {
    if (!(weight >= 0.0) || !std::isfinite(weight)) {
      throw std::invalid_argument("stage_weights['" + stage + "'] must be a finite number >= 0");
    }
  }
  if (max_points < 16) throw std::invalid_argument("max_points must be >= 16");
  if (kmeans_restarts < 1) throw std::invalid_argument("kmeans_restarts must be >= 1");
  if (threads < 1) throw std::invalid_argument("threads must be >= 1");
  if (!(dbscan.min_samples > 0.0)) throw std::invalid_argument("dbscan.min_samples must be > 0");
  if (dbscan.eps_scales.empty()) throw std::invalid_argument("dbscan.eps_scales must not be empty");
  for (double s : dbscan.eps_scales) {
    if (!(s > 0.0)) throw std::invalid_argument("dbscan.eps_scales must be > 0");
  }
  if (mean_shift.quantiles.empty()) throw std::invalid_argument("mean_shift.quantiles must not be empty");
  for (double q : mean_shift.quantiles) {
    if (!(q > 0.0 && q <= 1.0)) throw std::invalid_argument("mean_shift.quantiles must be in (0, 1]");
  }
  if (fuzzy_cmeans.fuzzifiers.empty()) throw std::invalid_argument("fuzzy_cmeans.fuzzifiers must not be empty");
  for (double m : fuzzy_cmeans.fuzzifiers) {
    if (!(m > 1.0)) throw std::invalid_argument("fuzzy_cmeans.fuzzifiers must be > 1");
  }
}

std::vector<std::int32_t> WindowResult::anomaly_ranks() const {
  std::vector<std::int32_t> out;
  out.reserve(anomalies.size());
  for (const auto& a : anomalies) out.push_back(a.rank);
  return out;
}

Clustering run_clusterer(Algorithm algorithm, const PointMatrix& x, const Weights& w, const WindowConfig& config) {
  config.validate();
  if (x.rows() == 0) throw std::invalid_argument("points must not be empty");
  if (w.size() != x.rows()) throw std::invalid_argument("weights must have one entry per point");
  if (!(w.array() > 0.0).all()) throw std::invalid_argument("weights must be > 0");
  return cluster(algorithm, x, w, pairwise_distances(x), config, config.seed);
}

WindowResult detect_window(const WindowView& window, const WindowConfig& config,
                           const std::vector<std::int32_t>& rank_to_node,
                           const std::vector<std::int32_t>& rank_to_group) {
  const auto t0 = Clock::now();
  config.validate();
  check_map(rank_to_node, window.num_ranks, "rank_to_node");
  check_map(rank_to_group, window.num_ranks, "rank_to_group");

  WindowResult result;
  result.num_ranks = window.num_ranks;
  WindowFeatures f = compute_features(window, config.features);
  if (!rank_to_group.empty()) {
    result.imbalance = normalise_by_group(f, window.stages, rank_to_group, window.num_ranks, config.slow.min_slowdown);
  }
  filter_and_scale(f, config.features);
  result.steps_used = f.steps_used;
  result.absent_ranks = f.absent_ranks;

  const std::size_t num_algorithms = config.algorithms.size();
  const std::size_t ranks = f.ranks.size();
  result.stages.resize(window.num_stages());
  for (std::size_t j = 0; j < window.num_stages(); ++j) {
    result.stages[j] = {window.stages[j], window.kinds[j], f.status[j], f.relative_spread[j], {}};
  }
  result.algorithms.resize(num_algorithms);
  for (std::size_t a = 0; a < num_algorithms; ++a) result.algorithms[a].algorithm = config.algorithms[a];

  // Too few ranks to split into a body and a minority: nothing is clustered.
  const bool clusterable = ranks >= 3;
  VoteInput in;
  in.flags.assign(num_algorithms, {});
  std::vector<StageOutcome> outcomes;
  if (clusterable) outcomes = analyse_stages(f.stages, config);
  for (std::size_t s = 0; s < outcomes.size(); ++s) {
    const StageFeatures& sf = f.stages[s];
    StageReport& report = result.stages[sf.column];
    report.algorithms.resize(num_algorithms);
    in.kept_weight.push_back(stage_weight(config, window.stages[sf.column]));
    for (std::size_t a = 0; a < num_algorithms; ++a) {
      result.algorithms[a].elapsed_ms += outcomes[s].elapsed_ms[a];
      result.algorithms[a].cpu_ms += outcomes[s].cpu_ms[a];
      AlgorithmStage& as = report.algorithms[a];
      as.chosen = std::move(outcomes[s].chosen[a]);
      const std::vector<Flag>& flags = outcomes[s].flags[a];
      for (std::size_t k = 0; k < ranks; ++k) {
        if (flags[k] == Flag::kSlow) as.slow_ranks.push_back(f.ranks[k]);
        if (flags[k] == Flag::kLateArrival) as.late_ranks.push_back(f.ranks[k]);
      }
      in.flags[a].push_back(std::move(outcomes[s].flags[a]));
    }
  }
  in.ran_all.assign(ranks, 0.0);
  for (std::size_t k = 0; k < ranks; ++k) {
    for (std::size_t j = 0; j < window.num_stages(); ++j) {
      if (f.ran[k * window.num_stages() + j]) in.ran_all[k] += stage_weight(config, window.stages[j]);
    }
  }
  const VoteOutput votes = tally(in, config.vote);

  result.votes.assign(static_cast<std::size_t>(window.num_ranks), 0);
  for (std::size_t k = 0; k < ranks; ++k) {
    result.votes[static_cast<std::size_t>(f.ranks[k])] = votes.votes[k];
    for (std::size_t a = 0; a < num_algorithms; ++a) {
      if (votes.slow[a][k]) result.algorithms[a].slow_ranks.push_back(f.ranks[k]);
    }
  }
  // A stage drives a rank's vote when at least half of the algorithms flagged it there.
  const auto half = static_cast<std::size_t>((num_algorithms + 1) / 2);
  auto flagged_by = [&](std::size_t s, std::size_t k, Flag only) {
    std::size_t n = 0;
    for (std::size_t a = 0; a < num_algorithms; ++a) {
      const Flag fl = in.flags[a][s][k];
      n += (only == Flag::kNone ? fl != Flag::kNone : fl == only) ? 1 : 0;
    }
    return n;
  };
  std::vector<std::uint8_t> is_anomaly(ranks, 0);
  for (std::size_t k : votes.anomalies) {
    is_anomaly[k] = 1;
    RankFinding finding;
    finding.rank = f.ranks[k];
    finding.votes = votes.votes[k];
    finding.node = rank_to_node.empty() ? -1 : rank_to_node[static_cast<std::size_t>(finding.rank)];
    for (std::size_t s = 0; clusterable && s < f.stages.size(); ++s) {
      if (flagged_by(s, k, Flag::kNone) >= half) finding.stages.push_back(window.stages[f.stages[s].column]);
    }
    result.anomalies.push_back(std::move(finding));
  }
  if (!rank_to_node.empty()) {
    for (const auto& a : result.anomalies) result.anomaly_nodes.push_back(a.node);
    std::sort(result.anomaly_nodes.begin(), result.anomaly_nodes.end());
    result.anomaly_nodes.erase(std::unique(result.anomaly_nodes.begin(), result.anomaly_nodes.end()),
                               result.anomaly_nodes.end());
  }
  for (std::size_t k = 0; clusterable && k < ranks; ++k) {
    if (is_anomaly[k]) continue;
    for (std::size_t s = 0; s < f.stages.size(); ++s) {
      if (f.stages[s].kind == StageKind::kCommunication && flagged_by(s, k, Flag::kSlow) >= half) {
        result.link_suspects.push_back(f.ranks[k]);
        break;
      }
    }
  }
  result.elapsed_ms = ms_since(t0);
  return result;
}

}  // namespace relax_straggler::core::detect
