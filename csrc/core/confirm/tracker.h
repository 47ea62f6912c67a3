// The confirmed straggler verdict: a stateful tracker fed one sampled report at a time.
//
// Per report (a StepMatrix of ranks x stages ms, NaN = not run) and comparison group
// (the pipeline stage; one group when none is given), every rank is compared with the
// median of the other ranks of its group (reference.h), per token when workloads are
// given. Evidence per (rank, stage) is kept across consecutive reports:
//   slow evidence  ratio = t / ref beyond the minimum effect size (the slow-rank rule,
//                  thresholds.h: ratio >= relative_threshold or t - ref >= absolute_ms_threshold) AND
//                  beyond noise_sigmas x the learned noise AND an excess of at least
//                  min_impact x the step budget (the impact rule, config.h); communication stages use the
//                  late-arrival rule (the rank that arrives last has the SHORTEST time,
//                  invariant 7), and a longer transfer than the group's is a link;
//   noise          per (group, stage), the median of the last noise_memory per-report
//                  MADs of the ratios, x 1.4826 (a normal-consistent sigma), learned only
//                  from reports in which the (group, stage) had no suspect;
//   persistence    confirm_reports reports in a row with slow evidence confirm a rank
//                  (suspected before); recover_reports without it release it
//                  (recovered, listed for `history` reports, then healthy). Where
//                  healthy ranks show slow evidence too (heavy-tailed jitter: a 1 ms stage
//                  at 4x in one report of ten on a crowded host), more reports are
//                  needed: with r the (group, stage)'s running share of ranks starting a
//                  streak of slow evidence, the streak must reach log(2e-4 / group size) / log(r),
//                  so that a healthy rank's chance of such a streak stays ~2e-4 / group
//                  size per report (at most history reports);
//   sequential     a one-sided CUSUM per (rank, compute stage) on the rank's place among
//                  its group (sequential.h) finds a shift smaller than one report's noise:
//                  at its alarm level h = log(cells tested / sequential_budget), with the
//                  rank's median excess over the reports tracked since it reached h / 2
//                  above the impact rule, the rank is confirmed; it stays so while the
//                  statistic stays at h / 2 or more. A healthy job raises at most
//                  sequential_budget false alarms per report, whatever the shape of its
//                  jitter;
//   window vote    a rank named by the window ensemble (detect::detect_window) whose median
//                  ratio over its last `history` tracked reports stands window_sigmas
//                  standard errors beyond 1 is confirmed too, and stays so while that
//                  median agrees: this is how slowdowns under the minimum effect size are
//                  confirmed (5 %), over a window, not one report. Unless the slowdown
//                  ended: recover_reports ratios in a row window_sigmas sigmas short of
//                  that median (a transient's median trails its end by half a history);
//   union          `communication` (the union of the per-op columns) is judged only in a
//                  report where no per-op column has data: beside them, its shortest
//                  time is no late arrival (the pipeline waits are in it);
//   wait chain     a late arrival explained by the rank's own compute or by a wait on a
//                  pipeline peer is never blamed (wait_chain.h), nor kept as its evidence
//                  (its ratio counts as 1 in the median a window vote is checked against); a longer collective than
//                  the group's is no link while some rank is slow in compute (it may be
//                  that rank's wait through a group the matrix does not show, e.g. the
//                  embedding all-reduce of the first and last stage);
//   imbalance      a compute stage whose slowest group (the same one each report) has a
//                  work (its median less its slowest rank: one slow rank is a straggler,
//                  not its group's imbalance) beyond the fastest group's by the minimum
//                  effect size and by the impact rule for confirm_reports reports is
//                  structural imbalance, not a straggler. A listed imbalance keeps its
//                  group: a report in which another group is the slowest counts against
//                  it (recover_reports release it) and, where it clears the rules, towards
//                  that group's own streak.
// Design after Relax's own detector (cohorts of comparable ranks, a peer reference, N
// consecutive windows, "uncertain" for a cohort of one, "recovered", facts apart from
// causes), with a learned noise band and the ensemble as a second, slower witness.
//
// Cost per report: one pass over the matrix (a max and a min per cell) plus a selection over
// at most reference_sample ranks per (group, stage); the state is proportional to the
// groups x stages and to the ranks under suspicion, not to the matrix. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/confirm/config.h"
#include "core/confirm/reference.h"
#include "core/confirm/result.h"
#include "core/confirm/sequential.h"
#include "core/confirm/wait_chain.h"
#include "core/step_matrix.h"

namespace relax_straggler::core::confirm {

class ConfirmTracker {
 public:
  // Throws std::invalid_argument on an invalid config.
  explicit ConfirmTracker(ConfirmConfig config = {});

  // Judges one report. groups: empty (one group) or one id >= 0 per rank; workload:
  // empty or one finite value > 0 per rank (tokens), scaling config.workload_stages to
  // the mean workload; window: the window ensemble's latest result, kept until a newer
  // one is passed (nullptr keeps the previous). A change of ranks, stage names or groups
  // starts a new run (result.reset). Throws std::invalid_argument naming the input.
  ConfirmResult update(const StepMatrix& matrix, const std::vector<std::int32_t>& groups = {},
                       const std::vector<double>& workload = {}, const WindowEvidence* window = nullptr);

  void reset();  // forgets every report, the noise learned and the window evidence
  const ConfirmConfig& config() const { return cfg_; }
  std::int64_t reports() const { return reports_; }

 private:
  enum class Role : std::uint8_t { kCompute, kCollective, kP2p };
  enum class Dir : std::uint8_t { kSlow, kLate, kLink };

  struct Entry {
    std::int32_t rank = 0, stage = 0;
    Dir dir = Dir::kSlow;
    State state = State::kHealthy;
    std::int64_t since = 0;
    std::int32_t streak = 0, calm = 0, idle = 0, seen = 0;
    std::uint64_t strong_mask = 0, weak_mask = 0;
    bool persistent = false, by_window = false, by_sequential = false;
    std::vector<double> ratios;  // ring of the last history ratios (t / ref)
    std::int32_t ratios_n = 0;
    bool named = false;  // the window ensemble names it
    std::int32_t listed = 0;  // reports listed as recovered since its release
    // This report.
    bool finite = false, strong = false, weak = false, window_ok = false, median_agrees = false;
    bool accumulated = false;  // the sequential test's alarm, with an excess that matters
    bool holding = false;      // the sequential statistic at half its alarm level or more
    // Its last recover_reports ratios all window_sigmas sigmas short of its median ratio: the
    // slowdown ended (a level change, not a quiet report of a small steady one).
    bool ended = false;
    double t = 0.0, ref = 0.0, ratio = 1.0, median = 1.0;
    double typical_ms = 0.0;  // the excess of the median ratio, ms (window path impact)
    std::int32_t votes = 0;
    double wait_caused_ms = 0.0;
    std::vector<std::int32_t> waiting;
  };
  struct Imbalance {
    State state = State::kHealthy;
    std::int64_t since = 0;
    // slow_group: the group listed (state imbalance); candidate: the group of the current
    // streak, which may differ from the listed one and is listed only once the listed one
    // is released.
    std::int32_t streak = 0, calm = 0, seen = 0, slow_group = 0, candidate = 0;
    std::uint64_t mask = 0;
    double ratio = 1.0, hi_ms = 0.0, lo_ms = 0.0;
  };

  void layout(const StepMatrix& m, const std::vector<std::int32_t>& groups);
  void take_window(const WindowEvidence& w);
  void references(const double* ms);
  void scan(const double* ms);
  void evaluate(Entry& e, const double* ms);
  void accumulate(const double* ms);
  void trace_blame(const double* ms);
  static void add_waiting(Entry& culprit, std::int32_t rank);
  // A late arrival trace_blame explained by another finding: no evidence of e's own.
  void explained(Entry& e) const;
  // Whether e's last recover_reports ratios (of n tracked) show its slowdown ended (Entry::ended).
  bool ended(const Entry& e, std::size_t n, double sig) const;
  // Whether the rank was last released at least `history` reports ago (or never): the window
  // path judges a released rank again only on a history from after its release, since the
  // median of a history that still holds the slowdown agrees with the ensemble's window,
  // which holds it too, in the stage it was slow in and in the collective its peers waited at.
  bool fresh_history(const Entry& e) const;
  void window_impact();
  void advance(Entry& e, std::int64_t step);
  void judge_imbalance(std::int64_t step);
  void learn_noise();
  ConfirmResult result(std::int64_t step, bool reset) const;
  // A finding's ratio: the median, over the reports among its last `history` whose evidence
  // agrees with its state (the bits of `agree`, newest first), of t / ref (late arrival:
  // ref / t); the median over every tracked report where none agrees.
  static double agreeing_ratio(const Entry& e, std::uint64_t agree);
  Entry& entry(std::int32_t rank, std::int32_t stage, Dir dir);
  double sigma(std::size_t gs) const { return sigma_[gs]; }
  std::int32_t needed_streak(std::size_t gs) const;
  // Whether (group, stage) gs is judged: learned from min_reports reports, with a peer and
  // a positive reference this report.
  bool judged(std::size_t gs) const {
    return noise_count_[gs] >= cfg_.min_reports && refs_[gs].count >= 2 && refs_[gs].median > 0.0;
  }
  // Whether stage s is judged this report (not the communication union beside its ops).
  bool judged_stage(std::size_t s) const { return !(skip_union_ && static_cast<std::int32_t>(s) == union_stage_); }

  ConfirmConfig cfg_;
  std::int64_t reports_ = 0;
  // Layout of the current run.
  std::int32_t ranks_ = 0, groups_n_ = 0;
  std::vector<std::string> stages_;
  std::vector<Role> roles_;
  std::vector<char> scaled_;  // per stage: scales with workload
  std::int32_t data_stage_ = -1;
  std::int32_t union_stage_ = -1;  // `communication`, the union of the per-op columns
  bool skip_union_ = false;        // this report: a per-op column has data, the union is not judged
  std::vector<std::int32_t> group_;        // per rank
  std::vector<std::int32_t> group_start_;  // groups_n_ + 1 offsets into group_rows_
  std::vector<std::int32_t> group_rows_;   // rows ordered by group
  std::vector<std::int32_t> sample_start_, sample_rows_;  // rows each group's reference is taken over
  std::vector<std::int32_t> unjudged_;     // ranks alone in their group
  // Per (group, stage), index group * stages + stage.
  std::vector<GroupReference> refs_;
  std::vector<double> hi_, lo_;  // ratio bands of slow evidence this report
  // The last noise_memory per-report MADs of each (group, stage), +inf where none yet: the
  // rings of eight consecutive (group, stage) cells interleaved slot by slot (one vector
  // per slot), so that one sorting network takes the medians of all eight at once.
  std::vector<float> noise_ring_;
  std::vector<std::int32_t> noise_count_;  // per (group, stage): MADs learned
  std::vector<std::uint8_t> noise_slot_;   // per (group, stage): the ring slot written next
  std::vector<std::int32_t> noise_due_;    // per (group, stage): ring entries whose median is due now; 0 none
  std::vector<double> sigma_;
  std::vector<char> busy_;  // a suspect this report: the noise is not learned from it
  std::vector<double> spike_rate_;  // running share of ranks starting a streak of slow evidence
  std::vector<std::int32_t> spikes_;  // this report's count of them
  std::vector<double> hi_ms_, lo_ms_;  // scan's bands in ms: a cell outside may be an outlier
  std::unordered_map<std::int64_t, Entry> entries_;
  SequentialEvidence sequential_;
  std::vector<char> in_sample_;       // per rank: one of its group's reference rows
  double sequential_h_ = 0.0;         // the alarm level (+inf: off)
  std::vector<Imbalance> imbalance_;  // per stage
  WindowEvidence window_;
  std::unordered_map<std::int32_t, std::size_t> window_rank_;  // rank -> index into window_.anomalies
  // Scratch reused across reports.
  std::vector<double> values_, scaled_ms_, median_scratch_;
  double budget_ms_ = 0.0;  // this report's step budget (impact rule)
  std::vector<std::int64_t> outliers_;
  std::vector<std::int32_t> candidates_;  // rows with a cell outside the ms bands
  std::vector<SlowRank> slow_;
  std::vector<char> late_groups_;  // per (group, stage): a late arrival this report
  std::unordered_map<std::int32_t, double> typical_;  // rank -> typical excess over its stages, ms
  std::unordered_map<std::int32_t, double> costliest_;  // rank -> its largest typical excess of one stage, ms
  std::unordered_map<std::int32_t, std::int64_t> released_;  // rank -> reports_ at its last release
};

}  // namespace relax_straggler::core::confirm
