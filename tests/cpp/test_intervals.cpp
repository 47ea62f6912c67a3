// Union and coverage of step-timeline intervals, hand-computed.
#include <gtest/gtest.h>

#include "core/intervals.h"

namespace rs = relax_straggler::core;

TEST(Intervals, MergeSortsAndJoinsOverlapsAndTouching) {
  auto m = rs::merge_intervals({{5, 7}, {0, 2}, {1, 3}, {3, 4}, {9, 9}, {8, 6}});
  ASSERT_EQ(m.size(), 2u);
  EXPECT_DOUBLE_EQ(m[0].begin_ms, 0);
  EXPECT_DOUBLE_EQ(m[0].end_ms, 4);
  EXPECT_DOUBLE_EQ(m[1].begin_ms, 5);
  EXPECT_DOUBLE_EQ(m[1].end_ms, 7);
}

TEST(Intervals, UnionCountsConcurrentTimeOnce) {
  // Three async collectives: [0,10] and [2,6] overlap, [12,15] alone -> 10 + 3.
  EXPECT_DOUBLE_EQ(rs::union_ms({{0, 10}, {2, 6}, {12, 15}}), 13.0);
  EXPECT_DOUBLE_EQ(rs::union_ms({}), 0.0);
}

TEST(Intervals, CoveredPartOfASection) {
  auto waits = rs::merge_intervals({{2, 4}, {6, 12}, {20, 30}});
  // Section [3, 10]: covered by [3,4] and [6,10] -> 1 + 4.
  EXPECT_DOUBLE_EQ(rs::covered_ms({3, 10}, waits), 5.0);
  EXPECT_DOUBLE_EQ(rs::covered_ms({12, 20}, waits), 0.0);
  EXPECT_DOUBLE_EQ(rs::covered_ms({0, 100}, waits), 2.0 + 6.0 + 10.0);
}
