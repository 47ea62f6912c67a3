// Evidence that accumulates over reports: a one-sided CUSUM per (rank, compute stage) on
// the rank's position among its comparison group (ConfirmTracker's sequential path).
//
// A shift smaller than one report's noise (a rank 8 % slower under 30 % jitter) never
// stands beyond the noise band in a single report, but it puts the rank in the slow half
// of its group report after report. Per report the rank's place among k peers, p in
// 0..k (0 fastest; ties share the mean of their places), scores
//     e(p) = exp(kTilt p / k) / mean_{q=0..k} exp(kTilt q / k)
// whose mean over the k + 1 places is exactly 1. The statistic is
//     W = max(0, W + log e(p)),   alarm at W >= h,   h = log(cells / budget),
// cells the (rank, compute stage) cells tested in the run. The bound, by design and free
// of the noise's distribution: while the ranks of a group are exchangeable (no straggler:
// jitter of any shape, heavy tails, pauses common to all ranks), p is uniform, e(p) is a
// likelihood ratio with mean 1, and the CUSUM's mean time to a false alarm is at least
// exp(h) reports (Lorden 1971); so a cell alarms at most budget / cells times per report,
// and the whole healthy job at most `budget` times per report. Reports are assumed
// independent (each is one sampled step). A NaN time, a stage not run, leaves
// W as it is. Cost per report: a sort of each group's sampled times per compute stage (at
// most reference_sample) and a binary search per cell.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace relax_straggler::core::confirm {

// The tilt of the score: the top of a group of four scores 2.7, the bottom 0.1 (a rank
// 8 % slower under 30 % uniform jitter ranks top 72 % of the time, and then climbs by
// 0.56 per report; a healthy rank falls by 0.65 per report).
constexpr double kSequentialTilt = 3.3;

// log e(place) for a rank whose time ties the places [lo, hi] of 0..peers (0 fastest):
// the log of the mean of e over those places (ties keep the mean at 1). peers >= 1,
// 0 <= lo <= hi <= peers.
double sequential_log_score(std::int32_t lo, std::int32_t hi, std::int32_t peers);

// The alarm level h = log(cells / budget) for a run testing that many (rank, stage) cells;
// budget in (0, 1): false alarms per report the healthy job may raise. Throws
// std::invalid_argument on cells < 1 or a budget outside (0, 1).
double sequential_threshold(std::int64_t cells, double budget);

// The CUSUM of every (rank, stage) cell of a run.
class SequentialEvidence {
 public:
  // A new run: ranks x stages cells at 0.
  void reset(std::size_t ranks, std::size_t stages);

  // Adds one report for the cells of stage s of one group: ms rank-major (rank r's times at
  // ms + r * S), rows[0, n) the group's rows, sample[0, k) the rows its peers are drawn
  // from (all rows up to a cap, else evenly spaced ones), in_sample[r] whether row r is one
  // of them. A rank is placed among the sample's finite times less its own; with no peer,
  // or a NaN time, its cell is left as it is. W is kept at most `cap` (>= 0, the alarm
  // level): it cannot bank evidence beyond the alarm, so once the rank is no longer slow it
  // falls from there at the healthy drift instead of from wherever a long slowdown took it.
  void add(const double* ms, std::size_t S, std::size_t s, const std::int32_t* rows, std::size_t n,
           const std::int32_t* sample, std::size_t k, const std::vector<char>& in_sample, double cap);

  // The statistic W of cell (rank, stage), >= 0.
  double level(std::size_t rank, std::size_t stage) const { return w_[rank * stages_ + stage]; }
  // Restarts cell (rank, stage) at 0: a released straggler's evidence is spent (a CUSUM
  // restarts after its alarm), so only new evidence can confirm it again.
  void restart(std::size_t rank, std::size_t stage) { w_[rank * stages_ + stage] = 0.0; }

 private:
  std::size_t stages_ = 0;
  std::vector<double> w_;
  std::vector<double> sorted_;  // scratch: one group's sampled times
  // scores_[k][q]: e(q) for k peers; logs_[k][q]: log e(q) (a place without ties); filled on
  // first use.
  std::vector<std::vector<double>> scores_, logs_;
  void tables(std::size_t peers);
};

}  // namespace relax_straggler::core::confirm
