// What the confirmed verdict returns (tracker.h): per finding the state, since when, how
// sure, the observed facts, and, in a field of its own, the inferred cause.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace relax_straggler::core::confirm {

enum class State : std::uint8_t {
  kHealthy = 0,
  kSuspected = 1,             // slow evidence in the latest report(s), not yet confirmed
  kStraggler = 2,             // confirmed: persistent, by accumulated evidence (sequential.h), or
                              // named by the window ensemble and agreeing
  kRecovered = 3,             // was a straggler; no evidence for recover_reports reports
  kImbalance = 4,             // a whole comparison group slower than the others: structural
  kInsufficientEvidence = 5,  // nothing judgeable yet (too few reports, or no rank has a peer)
};

enum class Cause : std::uint8_t {
  kCompute = 0,  // slow in a compute stage
  kLink = 1,     // longer transfers than its peers at a collective, not explained by waiting
  kData = 2,     // slow in input data loading
  kImbalance = 3,
  kUnknown = 4,  // late at collectives with no slow timed section of its own
  // From kernel records (kernel_cause.h); kLink too when the NCCL kernels are longer.
  kDevice = 5,  // its kernels ran longer than its peers'
  kHost = 6,    // its stream sat idle longer than its peers' (launch gaps, host stalls)
};

// "healthy", "suspected", "straggler", "recovered", "imbalance", "insufficient_evidence".
const char* state_name(State s);
// "compute", "communication_link", "data", "imbalance", "unknown", "device", "host".
const char* cause_name(Cause c);

// The window ensemble's latest answer (detect::WindowResult, reduced to what the tracker
// reads), passed as extra evidence.
struct WindowRank {
  std::int32_t rank = 0;
  std::int32_t votes = 0;           // algorithms calling it slow
  std::vector<std::string> stages;  // stages that drove the vote; empty = any compute stage
};
struct WindowEvidence {
  std::int64_t step = -1;  // report step of the analysis
  std::vector<WindowRank> anomalies;
  std::vector<std::int32_t> link_suspects;
};

// Measured or counted, never inferred.
struct Facts {
  double rank_ms = 0.0;    // the rank's time in the stage this report (per token when workload given)
  double ref_ms = 0.0;     // its comparison group's reference (median of the other ranks)
  double excess_ms = 0.0;  // distance from the reference on the slow side, ms (>= 0 when slow)
  double median_ratio = 0.0;  // median ratio over every recent tracked report (at most history), agreeing or not
  double noise = 0.0;      // learned relative noise sigma of the (group, stage)
  // Late arrivals of this rank (or of ranks waiting on it) at collectives this report:
  // the time the peers of each late rank waited, summed, ms.
  double wait_caused_ms = 0.0;
  std::vector<std::int32_t> waiting_ranks;  // ranks whose wait this report traces back here
  std::int32_t reports_agreeing = 0;        // of reports_seen, reports whose evidence agrees with the state
  std::int32_t reports_seen = 0;            // recent reports (at most history) with a time in the stage
  std::int32_t window_votes = 0;            // the window ensemble's votes, 0 when it did not name the rank
};

struct Finding {
  std::int32_t rank = -1;   // row of the matrix; -1 for imbalance (a whole group)
  std::int32_t group = 0;   // comparison group (imbalance: the slowest group)
  std::int32_t stage = -1;  // column of the matrix
  std::string stage_name;
  State state = State::kHealthy;
  std::int64_t since_step = 0;  // report step at which the current state began
  double confidence = 0.0;      // 0..1: reports_agreeing / reports_seen
  // The median, over the reports among the last `history` whose evidence agrees with the
  // state (facts.reports_agreeing), of rank / reference (compute and link) or reference /
  // rank (late arrival, > 1 = later); imbalance: slowest group / fastest group.
  double ratio = 1.0;
  bool persistent = false;   // confirmed by consecutive reports
  bool by_window = false;    // confirmed by the window ensemble's vote
  bool by_sequential = false;  // confirmed by evidence accumulated over reports (sequential.h)
  Facts facts;
  Cause cause = Cause::kUnknown;  // inferred from the facts
};

struct ConfirmResult {
  std::int64_t step = 0;
  // The most severe state over the findings but suspected (straggler > imbalance >
  // recovered > healthy: a suspected rank is a finding, not the job's state), or
  // insufficient_evidence while no (group, stage) is judged.
  State status = State::kInsufficientEvidence;
  std::vector<Finding> findings;  // stragglers first, then imbalance, suspected, recovered; larger excess first
  std::vector<std::int32_t> unjudged_ranks;  // ranks alone in their comparison group
  std::int64_t reports = 0;                  // reports seen since the last reset
  bool reset = false;  // this report started a new run (ranks, stages or groups changed)

  // Distinct ranks in state straggler, ascending.
  std::vector<std::int32_t> straggler_ranks() const;
};

}  // namespace relax_straggler::core::confirm
