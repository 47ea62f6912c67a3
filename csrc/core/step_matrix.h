// The engine's input: one sampled step, ranks x stages of milliseconds.
//
// Data contract (docs/ARCHITECTURE.md): a StepMatrix holds, per rank and stage, the time
// in ms the rank spent in that stage during one sampled step, NaN where the rank did
// not run the stage. Storage is rank-major: ms[rank * num_stages + stage]. A time is a
// finite value > 0 (is_time); 0 means "not timed", as in Megatron's timers. from_rows
// turns every other value into NaN, counting the ones that are no time at all (+-inf,
// negative), so that every rule of the engine (verdict, confirm, detect) sees one meaning.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace relax_straggler::core {

// How a stage's times are read. Compute stages: the longest time is the slow rank.
// Communication stages: durations include waiting for peers, so the rank that
// arrives last has the SHORTEST duration (docs/ARCHITECTURE.md invariant 7).
enum class StageKind : std::uint8_t { kCompute = 0, kCommunication = 1 };

// "communication" and every "communication/<op>" are communication stages.
StageKind stage_kind_of(const std::string& stage_name);

// Whether t (ms) is a time the engine judges: finite and > 0. NaN and 0 are "not run".
inline bool is_time(double t) { return t > 0.0 && t < std::numeric_limits<double>::infinity(); }

struct StepMatrix {
  std::int64_t step = 0;
  std::int32_t num_ranks = 0;
  std::vector<std::string> stages;  // stage names, one per column
  std::vector<StageKind> kinds;     // same length as stages
  std::vector<double> ms;           // num_ranks * stages.size(), rank-major, NaN = not run
  std::int64_t unusable = 0;        // values from_rows found to be no time (+-inf, negative), now NaN

  std::size_t num_stages() const { return stages.size(); }
  double at(std::int32_t rank, std::size_t stage) const {
    return ms[static_cast<std::size_t>(rank) * stages.size() + stage];
  }

  // Builds a matrix with kinds derived from the names, values that are neither NaN nor a
  // time made NaN and counted in `unusable`; throws std::invalid_argument when
  // ms.size() != num_ranks * stages.size().
  static StepMatrix from_rows(std::int64_t step, std::int32_t num_ranks, std::vector<std::string> stages,
                              std::vector<double> ms);
};

}  // namespace relax_straggler::core
