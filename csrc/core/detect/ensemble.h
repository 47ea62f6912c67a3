// The window detector: features -> (group normalisation) -> filters and robust scaling
// -> six clusterers per stage -> slow flags -> votes -> anomaly ranks, nodes and the
// stages that drove the vote.
//
// Design after the Megatron Timer Predictor detector (per-timer [min, max, range, mean]
// over a window, robust scaling, six clusterers, slow cluster = highest mean, weighted
// vote across timers, max-vote across algorithms), made to run over tens of thousands of
// ranks: the clusterers see a weighted coreset (coreset.h) when there are more ranks
// than max_points, and the pairwise distances of a stage are computed once and shared.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/detect/dbscan.h"
#include "core/detect/features.h"
#include "core/detect/fuzzy_cmeans.h"
#include "core/detect/gmm.h"
#include "core/detect/groups.h"
#include "core/detect/mean_shift.h"
#include "core/detect/slow_cluster.h"
#include "core/detect/voting.h"
#include "core/detect/window.h"

namespace relax_straggler::core::detect {

enum class Algorithm : std::uint8_t {
  kKMeans = 0,
  kDbscan = 1,
  kGaussianMixture = 2,
  kAgglomerative = 3,
  kMeanShift = 4,
  kFuzzyCMeans = 5,
};
constexpr std::size_t kNumAlgorithms = 6;

// "kmeans", "dbscan", "gmm", "agglomerative", "mean_shift", "fuzzy_cmeans".
const char* algorithm_name(Algorithm a);
// Inverse of algorithm_name; throws std::invalid_argument listing the valid names.
Algorithm algorithm_from_name(const std::string& name);

struct WindowConfig {
  FeatureOptions features;
  SlowClusterOptions slow;
  VoteOptions vote;
  std::vector<Algorithm> algorithms{Algorithm::kKMeans,       Algorithm::kDbscan,    Algorithm::kGaussianMixture,
                                    Algorithm::kAgglomerative, Algorithm::kMeanShift, Algorithm::kFuzzyCMeans};
  std::unordered_map<std::string, double> stage_weights;  // stage name -> weight >= 0; absent = 1
  std::int32_t max_points = 512;  // coreset size above which ranks are summarised, >= 16
  std::uint64_t seed = 0;         // every random choice derives from it
  DbscanOptions dbscan;
  MeanShiftOptions mean_shift;
  FcmOptions fuzzy_cmeans;
  std::int32_t kmeans_restarts = 3;
  // Threads clustering stages in parallel (stages are independent; results do not
  // depend on it), >= 1. The live path keeps 1 so the training process keeps its cores.
  std::int32_t threads = 1;

  // Throws std::invalid_argument naming the offending field.
  void validate() const;
};

struct AlgorithmStage {
  std::vector<std::int32_t> slow_ranks;          // flagged kSlow, ascending rank ids
  std::vector<std::int32_t> late_ranks;          // flagged kLateArrival (communication only)
  std::string chosen;                            // hyper-parameter the grid search picked, e.g. "linkage=single"
};

struct StageReport {
  std::string stage;
  StageKind kind = StageKind::kCompute;
  StageStatus status = StageStatus::kKept;
  double relative_spread = 0.0;             // NaN when the stage failed the coverage filter
  std::vector<AlgorithmStage> algorithms;   // per config.algorithms entry; empty unless kept
};

struct AlgorithmReport {
  Algorithm algorithm = Algorithm::kKMeans;
  std::vector<std::int32_t> slow_ranks;  // ranks this algorithm calls slow after its stage vote
  double elapsed_ms = 0.0;               // wall time of its clustering over all kept stages
  double cpu_ms = 0.0;                   // CPU time of the same (the thread's own clock; load-independent)
};

struct RankFinding {
  std::int32_t rank = 0;
  std::int32_t votes = 0;               // algorithms calling it slow
  std::int32_t node = -1;               // from rank_to_node, -1 when unknown
  std::vector<std::string> stages;      // stages flagged by at least half of the algorithms
};

struct WindowResult {
  std::int64_t steps_used = 0;
  std::int32_t num_ranks = 0;
  std::vector<std::int32_t> absent_ranks;
  std::vector<StageReport> stages;        // one per window column
  std::vector<AlgorithmReport> algorithms;  // one per config.algorithms entry
  std::vector<std::int32_t> votes;        // per rank (num_ranks): algorithms calling it slow
  std::vector<RankFinding> anomalies;     // ascending rank
  std::vector<std::int32_t> anomaly_nodes;  // ascending, when rank_to_node was given
  // Ranks not among the anomalies whose communication time is longer than their peers'
  // in some stage by at least half of the algorithms: a slow link rather than a slow rank.
  std::vector<std::int32_t> link_suspects;
  std::vector<StageImbalance> imbalance;  // when rank_to_group was given
  double elapsed_ms = 0.0;                // total wall time

  std::vector<std::int32_t> anomaly_ranks() const;
};

// rank_to_node, rank_to_group: empty, or one id >= 0 per rank. Throws
// std::invalid_argument on an invalid config or a malformed map.
WindowResult detect_window(const WindowView& window, const WindowConfig& config,
                           const std::vector<std::int32_t>& rank_to_node = {},
                           const std::vector<std::int32_t>& rank_to_group = {});

// One clusterer on explicit points, as the ensemble runs it on a stage's coreset (the
// "auto" variants with their grid searches, k = 2). For tests and notebooks.
struct Clustering {
  Labels labels;
  std::string chosen;
};
Clustering run_clusterer(Algorithm algorithm, const PointMatrix& x, const Weights& w, const WindowConfig& config);

}  // namespace relax_straggler::core::detect
