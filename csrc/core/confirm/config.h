// Settings of the confirmed verdict (tracker.h).
//
// The slow-rank rule's thresholds (thresholds.h) stay the minimum effect size of one
// report's evidence; the noise band is learned from the run itself (noise.h). Counts are
// sampled reports.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/thresholds.h"

namespace relax_straggler::core::confirm {

struct ConfirmConfig {
  // Minimum effect size, the slow-rank rule: a rank's report counts as slow only if
  // t >= ref x relative_threshold or t - ref >= absolute_ms_threshold (mirrored for the
  // late-arrival rule of communication stages).
  double relative_threshold = kDefaultRelativeThreshold;     // dimensionless, >= 1
  double absolute_ms_threshold = kDefaultAbsoluteMsThreshold;  // ms, >= 0
  // ... and only if the excess (ms; the wait caused, for a late arrival) is at least this
  // fraction of the step budget (the largest over the groups of their compute-stage
  // references' sum plus their longest collective reference: a typical rank's step): 5 ms
  // of a 2 s step cannot explain a slow job. Dimensionless, in [0, 1).
  double min_impact = 0.02;
  // ... and only if its ratio to the reference lies this many learned noise sigmas away
  // from 1 (the run's own rank-to-rank spread, replacing a fixed ms floor).
  double noise_sigmas = 4.0;  // > 0
  // Reports in a row with slow evidence before a rank is confirmed (persistence).
  std::int32_t confirm_reports = 3;  // >= 1
  // Reports in a row without evidence before a confirmed rank is recovered.
  std::int32_t recover_reports = 2;  // >= 1
  // Healthy reports a (group, stage) must have been seen in before it is judged.
  std::int32_t min_reports = 2;  // >= 1
  // Recent reports over which confidence is counted, and how long a recovered finding
  // stays listed.
  std::int32_t history = 8;  // 1..64
  // Per-report noise estimates kept per (group, stage); the noise is their median.
  std::int32_t noise_memory = 16;  // 1..64
  // Window-ensemble path: an ensemble-named rank is confirmed when the mean of its ratios
  // over the n >= confirm_reports reports since it was named (at most history) stands
  // this many standard errors (noise / sqrt(n)) beyond 1.
  double window_sigmas = 4.0;  // > 0
  // Groups larger than this are referenced by the median of this many evenly spaced
  // ranks (its error, common to the whole group, is ~1.25 / sqrt(n) noise sigmas: 0.22
  // at 32, against the 4-sigma band).
  std::int32_t reference_sample = 32;  // >= 3
  // Lower bound on the learned relative noise sigma (times that never vary).
  double min_noise = 0.002;  // > 0, dimensionless
  // Compute stages whose time scales with the rank's workload (per-token comparison).
  std::vector<std::string> workload_stages{"forward", "backward", "attention", "moe"};
  // Communication stages that are point-to-point (pipeline send/recv): a long time there
  // is waiting on a pipeline peer, never a slow link, and it moves blame to that peer.
  std::vector<std::string> p2p_stages{"communication/send", "communication/recv"};
  // The compute stage read as input data loading (cause "data").
  std::string data_stage = "data";
  // Sequential path (sequential.h): false alarms per report the CUSUM on the ranks' places
  // may raise in a healthy job, all ranks and compute stages together, by design (the
  // alarm level is log(cells / budget)); 0 turns it off.
  double sequential_budget = 1e-3;  // 0, or in (0, 1)

  // Throws std::invalid_argument naming the offending field.
  void validate() const;
};

}  // namespace relax_straggler::core::confirm
