// The cause of a slow rank read from its kernel records (docs/DESIGN.md, "Kernel records").
//
// Stage times from CUDA events tell that a rank's section took longer, not why: its kernels
// ran longer (the device: clocks, thermals, a slower GPU), its stream sat idle between them
// (the host: launch stalls, Python, the data loader, page faults), or its NCCL kernels ran
// longer (the link) while its peers' compute was normal (a peer computing longer makes every
// other rank's NCCL kernel wait for it inside the kernel: that is no link). Per field the rank
// is compared with the median of the other ranks of its comparison group; the field whose
// excess dominates names the cause. Arithmetic only; the caller passes the latest report's
// measured times (relax_straggler/judge/confirm.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/confirm/result.h"

namespace relax_straggler::core::confirm {

// What the kernel records of one rank say about one stage section, ms; NaN = not measured.
struct KernelTimes {
  double kernel_ms = std::numeric_limits<double>::quiet_NaN();  // compute (non-NCCL) kernels running
  double idle_ms = std::numeric_limits<double>::quiet_NaN();    // nothing running on the section's stream
  double nccl_ms = std::numeric_limits<double>::quiet_NaN();    // NCCL kernels running
};

struct KernelCauseConfig {
  // An excess over the group's reference explains nothing below this many ms (timer and
  // launch jitter). ms, >= 0.
  double min_excess_ms = 1.0;
  // The dominant excess must be at least this share of the rank's summed positive excesses
  // (kernel + idle + NCCL): a slowdown split evenly between two fields names neither.
  // Dimensionless, in (0.5, 1].
  double min_share = 0.6;
  // Link only: every peer's compute kernel time is at most max(the rank's, the reference)
  // x (1 + peer_tolerance) + min_excess_ms. Dimensionless, >= 0.
  double peer_tolerance = 0.1;

  // Throws std::invalid_argument naming the offending field.
  void validate() const;
};

struct KernelCauseResult {
  // kDevice, kHost or kLink; kUnknown when a field is not measured (NaN, on the rank or on
  // every peer), no excess dominates, or NCCL dominates while a peer computed longer.
  Cause cause = Cause::kUnknown;
  KernelTimes rank;       // the rank's measured times
  KernelTimes reference;  // per field, the median over the peers that measured it
  double kernel_excess_ms = std::numeric_limits<double>::quiet_NaN();  // rank - reference
  double idle_excess_ms = std::numeric_limits<double>::quiet_NaN();
  double nccl_excess_ms = std::numeric_limits<double>::quiet_NaN();
  std::int32_t peers = 0;  // peers with all three fields measured
};

// The cause for member `rank` of `group` (the kernel times of the ranks of its comparison
// group, the rank included). Throws std::invalid_argument when rank >= group.size() or the
// config is invalid.
KernelCauseResult kernel_cause(const std::vector<KernelTimes>& group, std::size_t rank,
                               const KernelCauseConfig& config = {});

}  // namespace relax_straggler::core::confirm
