// Incremental scanner of Megatron-LM `Timers` text output (megatron/core/timers.py).
//
// Megatron prints, on the last rank, after each logged iteration line
//   " ... iteration      100/    1000 | ... | elapsed time per iteration (ms): 1234.5 | ..."
// one block in the form chosen by --timing-log-option:
//   all:    "times across ranks (ms):" then per timer "  <name>:" and "     rank  N: <ms>"
//           lines (a rank that did not run the timer, time 0, is not printed);
//   minmax: "(min, max) time across ranks (ms):" then "    <name> .....: (<min>, <max>)";
//   max:    "max time across ranks (ms):" then "    <name> .....: <max>".
// Values are ms per iteration (the sum over the log interval divided by the interval).
// Lines may carry a launcher prefix ("[default7]:" from torchrun --tee, "7: " from srun -l)
// that is skipped. Megatron's argument listing ("  pipeline_model_parallel_size .... 4"
// between the "arguments" rulers) is collected, so the caller can read the parallel sizes.
//
// The scanner reads bytes in any chunking (a line may span two feed() calls), keeps O(one
// block) state, and never throws on content: malformed lines inside a block become
// LineIssues with their 1-based line number and the block continues.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace relax_straggler::core::ingest {

enum class BlockForm : std::uint8_t { kAllRanks = 0, kMinMax = 1, kMax = 2 };

struct TimerValues {
  std::string name;
  std::int64_t line = 0;        // line of the timer's name
  std::vector<std::int32_t> ranks;  // kAllRanks: ranks in file order
  std::vector<double> ms;           // kAllRanks: one per rank
  double min_ms = std::numeric_limits<double>::quiet_NaN();  // kMinMax
  double max_ms = std::numeric_limits<double>::quiet_NaN();  // kMinMax, kMax
};

struct TimerBlock {
  BlockForm form = BlockForm::kAllRanks;
  std::int64_t line = 0;        // line of the block header
  std::int64_t iteration = -1;  // last iteration line before the block, -1 if none
  double iteration_ms = std::numeric_limits<double>::quiet_NaN();  // its elapsed time per iteration
  std::vector<TimerValues> timers;
};

struct LineIssue {
  std::int64_t line = 0;
  std::string message;
  std::int64_t rejected = 0;  // timer values the line held and the scanner skipped (0 or 1)
};

class TimerLogScanner {
 public:
  // Consumes bytes; complete lines are parsed now, a trailing partial line is kept.
  void feed(const char* data, std::size_t size);
  // End of input: parses a trailing unterminated line (reported: the file may be
  // truncated) and closes the open block.
  void finish();

  // Blocks completed since the last call, in file order.
  std::vector<TimerBlock> take_blocks();
  // Issues found since the last call, in the order found (a block with no timers is
  // reported, at its header's line, when it closes).
  std::vector<LineIssue> take_issues();

  const std::map<std::string, std::string>& arguments() const { return arguments_; }
  std::int64_t lines() const { return line_; }
  // Timer values so far (a rank's time in "all" blocks, a timer's line in min/max and max
  // blocks): accepted, and skipped by an issue. values() + rejected() are the values read.
  std::int64_t values() const { return values_; }
  std::int64_t rejected() const { return rejected_; }

 private:
  void parse_line(std::string_view line);
  bool parse_block_line(std::string_view text);
  void close_block();
  void issue(std::string message, std::int64_t rejected = 0);

  std::string pending_;
  std::int64_t line_ = 0;
  std::int64_t values_ = 0;
  std::int64_t rejected_ = 0;
  std::int64_t iteration_ = -1;
  double iteration_ms_ = std::numeric_limits<double>::quiet_NaN();
  bool in_block_ = false;
  bool in_arguments_ = false;
  TimerBlock block_;
  std::vector<std::uint8_t> seen_;  // ranks seen in the current timer (duplicate check)
  std::vector<TimerBlock> done_;
  std::vector<LineIssue> issues_;
  std::map<std::string, std::string> arguments_;
};

}  // namespace relax_straggler::core::ingest
