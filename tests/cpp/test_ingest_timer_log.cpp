// The Megatron Timers text scanner on hand-written logs in each --timing-log-option form,
// split at every byte boundary, with launcher prefixes and malformed lines.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/ingest/timer_log.h"

namespace ig = relax_straggler::core::ingest;

namespace {

const char* kAllRanks =
    "------------------------ arguments ------------------------\n"
    "  pipeline_model_parallel_size .................... 2\n"
    "  tensor_model_parallel_size ...................... 1\n"
    "-------------------- end of arguments ---------------------\n"
    " [2024-05-01 10:00:00] iteration       10/     100 | consumed samples:          640 | "
    "elapsed time per iteration (ms): 812.5 | learning rate: 1.0E-04 |\n"
    "times across ranks (ms):\n"
    "  forward-compute:\n"
    "     rank  0: 100.25\n"
    "     rank  1: 180.00\n"
    "  forward-recv:\n"
    "     rank  1: 3.50\n"
    "[Rank 0] memory (MB) | allocated: 1000.0\n";

ig::TimerLogScanner scan(const std::string& text, std::size_t chunk) {
  ig::TimerLogScanner s;
  for (std::size_t i = 0; i < text.size(); i += chunk) s.feed(text.data() + i, std::min(chunk, text.size() - i));
  s.finish();
  return s;
}

}  // namespace

TEST(IngestTimerLog, AllRanksBlockInAnyChunking) {
  const std::string text = kAllRanks;
  for (std::size_t chunk : {std::size_t{1}, std::size_t{7}, text.size()}) {
    auto s = scan(text, chunk);
    auto blocks = s.take_blocks();
    ASSERT_EQ(blocks.size(), 1u) << "chunk " << chunk;
    const auto& b = blocks[0];
    EXPECT_EQ(b.form, ig::BlockForm::kAllRanks);
    EXPECT_EQ(b.iteration, 10);
    EXPECT_DOUBLE_EQ(b.iteration_ms, 812.5);
    EXPECT_EQ(b.line, 6);
    ASSERT_EQ(b.timers.size(), 2u);
    EXPECT_EQ(b.timers[0].name, "forward-compute");
    EXPECT_EQ(b.timers[0].line, 7);
    EXPECT_EQ(b.timers[0].ranks, (std::vector<std::int32_t>{0, 1}));
    EXPECT_EQ(b.timers[0].ms, (std::vector<double>{100.25, 180.0}));
    EXPECT_EQ(b.timers[1].ranks, (std::vector<std::int32_t>{1}));
    EXPECT_TRUE(s.take_issues().empty());
    EXPECT_EQ(s.arguments().at("pipeline_model_parallel_size"), "2");
    EXPECT_EQ(s.values(), 3);
    EXPECT_EQ(s.lines(), 12);
  }
}

TEST(IngestTimerLog, MinMaxAndMaxForms) {
  auto s = scan(
      " iteration        5/      10 | elapsed time per iteration (ms): 50.0 |\n"
      "(min, max) time across ranks (ms):\n"
      "    forward-compute ................................: (10.50, 20.25)\n"
      "    optimizer ......................................: (1.00, 1.50)\n"
      "max time across ranks (ms):\n"
      "    backward-compute ...............................: 40.00\n",
      4096);
  auto blocks = s.take_blocks();
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0].form, ig::BlockForm::kMinMax);
  ASSERT_EQ(blocks[0].timers.size(), 2u);
  EXPECT_EQ(blocks[0].timers[0].name, "forward-compute");
  EXPECT_DOUBLE_EQ(blocks[0].timers[0].min_ms, 10.5);
  EXPECT_DOUBLE_EQ(blocks[0].timers[0].max_ms, 20.25);
  EXPECT_EQ(blocks[1].form, ig::BlockForm::kMax);
  EXPECT_DOUBLE_EQ(blocks[1].timers[0].max_ms, 40.0);
  EXPECT_TRUE(std::isnan(blocks[1].timers[0].min_ms));
  EXPECT_EQ(blocks[1].iteration, 5);
}

TEST(IngestTimerLog, LauncherPrefixesAreSkipped) {
  auto s = scan(
      "[default1]:times across ranks (ms):\n"
      "[default1]:  optimizer:\n"
      "[default1]:     rank  0: 1.00\n"
      "1:      rank  1: 2.00\n",
      4096);
  auto blocks = s.take_blocks();
  ASSERT_EQ(blocks.size(), 1u);
  EXPECT_EQ(blocks[0].timers[0].ranks, (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(blocks[0].iteration, -1);
}

TEST(IngestTimerLog, MalformedLinesAreReportedWithTheirLineAndSkipped) {
  auto s = scan(
      "times across ranks (ms):\n"
      "     rank  0: 1.00\n"          // 2: before any timer
      "  forward-compute:\n"
      "     rank  0: abc\n"           // 4: not a number
      "     rank  1: -3.00\n"         // 5: negative
      "     rank  2: nan\n"           // 6: NaN
      "     rank  3: 7.00\n"
      "     rank  3: 8.00\n"          // 8: repeated
      "     rank 99999999: 1.00\n"    // 9: out of range
      "(min, max) time across ranks (ms):\n"
      "    optimizer ......................................: (5.00, 1.00)\n"  // 11: min > max
      "times across ranks (ms):\n"
      "  backward-compute:\n"
      "     rank  0: 4.0",             // 14: no newline
      5);
  auto issues = s.take_issues();
  std::vector<std::int64_t> lines, rejected;
  for (const auto& i : issues) {
    lines.push_back(i.line);
    rejected.push_back(i.rejected);
  }
  // The empty min/max block (header at line 10) is reported when it closes, after line 11.
  EXPECT_EQ(lines, (std::vector<std::int64_t>{2, 4, 5, 6, 8, 9, 11, 10, 14}));
  // Each value line skips its value; the empty block and the missing newline skip none.
  EXPECT_EQ(rejected, (std::vector<std::int64_t>{1, 1, 1, 1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(s.values(), 2);
  EXPECT_EQ(s.rejected(), 7);
  EXPECT_NE(issues[1].message.find("malformed rank line"), std::string::npos);
  EXPECT_NE(issues[4].message.find("repeated"), std::string::npos);
  EXPECT_NE(issues[8].message.find("truncated"), std::string::npos);
  auto blocks = s.take_blocks();
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0].timers[0].ranks, (std::vector<std::int32_t>{3}));
  EXPECT_EQ(blocks[0].timers[0].ms, (std::vector<double>{7.0}));
  EXPECT_EQ(blocks[1].timers[0].ms, (std::vector<double>{4.0}));
}

TEST(IngestTimerLog, MinMaxTimersAreValuesAndTimesBeyondAClockAreSkipped) {
  auto s = scan(
      "(min, max) time across ranks (ms):\n"
      "    forward-compute ................................: (10.50, 20.25)\n"
      "    optimizer ......................................: (1.00, 1e308)\n"  // 3: beyond 1e14 ms
      "times across ranks (ms):\n"
      "  backward-compute:\n"
      "     rank  0: 1e14\n"
      "     rank  1: 1.7e308\n",  // 7
      4096);
  auto issues = s.take_issues();
  ASSERT_EQ(issues.size(), 2u);
  EXPECT_EQ(issues[0].line, 3);
  EXPECT_EQ(issues[1].line, 7);
  EXPECT_NE(issues[1].message.find("[0, 1e14]"), std::string::npos) << issues[1].message;
  EXPECT_EQ(s.values(), 2);  // one min/max timer and rank 0's 1e14 ms
  EXPECT_EQ(s.rejected(), 2);
}

TEST(IngestTimerLog, BinaryBytesAreEscapedInMessagesAndNeverNames) {
  auto s = scan(std::string("times across ranks (ms):\n  forward-compute:\n     rank  0: 1\xff\n  na\xffme:\n"), 4096);
  auto issues = s.take_issues();
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].line, 3);
  EXPECT_NE(issues[0].message.find("'rank  0: 1\\xff'"), std::string::npos) << issues[0].message;
  auto blocks = s.take_blocks();
  ASSERT_EQ(blocks.size(), 1u);  // the line with a non-name byte ends the block
  EXPECT_EQ(blocks[0].timers.size(), 1u);
}

TEST(IngestTimerLog, EmptyInputGivesNothing) {
  ig::TimerLogScanner s;
  s.finish();
  EXPECT_TRUE(s.take_blocks().empty());
  EXPECT_TRUE(s.take_issues().empty());
  EXPECT_EQ(s.lines(), 0);
}
