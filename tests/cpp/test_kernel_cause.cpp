// The kernel-record cause rule (csrc/core/confirm/kernel_cause.h): device, host, link and
// unknown, with the margins of each threshold.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "core/confirm/kernel_cause.h"

namespace cf = relax_straggler::core::confirm;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Four ranks of one group with a 10 ms forward section: 8 ms of compute kernels, 1.5 ms
// idle, 0.5 ms NCCL; rank 3 is the one judged.
std::vector<cf::KernelTimes> group_with(cf::KernelTimes slow) {
  std::vector<cf::KernelTimes> g{{8.0, 1.5, 0.5}, {8.2, 1.4, 0.5}, {7.9, 1.6, 0.6}, slow};
  return g;
}

TEST(KernelCause, LongerKernelsAreTheDevice) {
  const auto r = cf::kernel_cause(group_with({14.0, 1.5, 0.5}), 3);
  EXPECT_EQ(r.cause, cf::Cause::kDevice);
  EXPECT_STREQ(cf::cause_name(r.cause), "device");
  EXPECT_DOUBLE_EQ(r.reference.kernel_ms, 8.0);  // median of 8.0, 8.2, 7.9
  EXPECT_DOUBLE_EQ(r.kernel_excess_ms, 6.0);
  EXPECT_DOUBLE_EQ(r.idle_excess_ms, 0.0);
  EXPECT_EQ(r.peers, 3);
}

TEST(KernelCause, AnIdleStreamIsTheHost) {
  const auto r = cf::kernel_cause(group_with({8.0, 7.5, 0.5}), 3);
  EXPECT_EQ(r.cause, cf::Cause::kHost);
  EXPECT_STREQ(cf::cause_name(r.cause), "host");
  EXPECT_DOUBLE_EQ(r.idle_excess_ms, 6.0);
}

TEST(KernelCause, LongerNcclKernelsWithNormalPeersAreTheLink) {
  const auto r = cf::kernel_cause(group_with({8.0, 1.5, 6.5}), 3);
  EXPECT_EQ(r.cause, cf::Cause::kLink);
  EXPECT_STREQ(cf::cause_name(r.cause), "communication_link");
}

TEST(KernelCause, LongerNcclKernelsBehindASlowPeerAreNoLink) {
  // Rank 0 computes 14 ms: the others' NCCL kernels wait for it inside the kernel.
  std::vector<cf::KernelTimes> g{{14.0, 1.5, 0.5}, {8.2, 1.4, 0.5}, {7.9, 1.6, 0.6}, {8.0, 1.5, 6.5}};
  EXPECT_EQ(cf::kernel_cause(g, 3).cause, cf::Cause::kUnknown);
  // Within the tolerance (max(8.0, reference 8.2) x 1.1 + 1 = 10.02 ms) a peer is normal.
  g[0].kernel_ms = 10.0;
  EXPECT_EQ(cf::kernel_cause(g, 3).cause, cf::Cause::kLink);
  g[0].kernel_ms = 10.1;
  EXPECT_EQ(cf::kernel_cause(g, 3).cause, cf::Cause::kUnknown);
}

TEST(KernelCause, NotMeasuredIsUnknown) {
  EXPECT_EQ(cf::kernel_cause(group_with({kNaN, 1.5, 0.5}), 3).cause, cf::Cause::kUnknown);
  EXPECT_EQ(cf::kernel_cause(group_with({14.0, kNaN, 0.5}), 3).cause, cf::Cause::kUnknown);
  // No peer measured: no reference.
  std::vector<cf::KernelTimes> alone{{kNaN, kNaN, kNaN}, {14.0, 1.5, 0.5}};
  const auto r = cf::kernel_cause(alone, 1);
  EXPECT_EQ(r.cause, cf::Cause::kUnknown);
  EXPECT_TRUE(std::isnan(r.reference.kernel_ms));
  EXPECT_TRUE(std::isnan(r.kernel_excess_ms));
  EXPECT_EQ(r.peers, 0);
  // A group of one has no peers either.
  EXPECT_EQ(cf::kernel_cause({{14.0, 1.5, 0.5}}, 0).cause, cf::Cause::kUnknown);
}

TEST(KernelCause, APeerNotMeasuredLeavesTheReferenceToTheOthers) {
  auto g = group_with({14.0, 1.5, 0.5});
  g[1] = {kNaN, kNaN, kNaN};
  const auto r = cf::kernel_cause(g, 3);
  EXPECT_EQ(r.cause, cf::Cause::kDevice);
  EXPECT_DOUBLE_EQ(r.reference.kernel_ms, 7.95);  // median of 8.0 and 7.9
  EXPECT_EQ(r.peers, 2);
  // ... but the link needs every peer's compute to be known normal.
  g[3] = {8.0, 1.5, 6.5};
  EXPECT_EQ(cf::kernel_cause(g, 3).cause, cf::Cause::kUnknown);
}

TEST(KernelCause, AnExcessBelowTheFloorIsUnknown) {
  cf::KernelCauseConfig c;
  c.min_excess_ms = 1.0;
  EXPECT_EQ(cf::kernel_cause(group_with({8.9, 1.5, 0.5}), 3, c).cause, cf::Cause::kUnknown);  // 0.9 ms
  EXPECT_EQ(cf::kernel_cause(group_with({9.1, 1.5, 0.5}), 3, c).cause, cf::Cause::kDevice);   // 1.1 ms
}

TEST(KernelCause, AnExcessSplitBetweenFieldsNamesNeither) {
  // Kernels +4 ms, idle +3.5 ms: 4 / 7.5 = 0.53 of the excess, under min_share 0.6.
  EXPECT_EQ(cf::kernel_cause(group_with({12.0, 5.0, 0.5}), 3).cause, cf::Cause::kUnknown);
  // Kernels +4 ms, idle +2.5 ms: 0.62.
  EXPECT_EQ(cf::kernel_cause(group_with({12.0, 4.0, 0.5}), 3).cause, cf::Cause::kDevice);
}

TEST(KernelCause, AFasterRankHasNoCause) {
  EXPECT_EQ(cf::kernel_cause(group_with({6.0, 1.0, 0.2}), 3).cause, cf::Cause::kUnknown);
}

TEST(KernelCause, BadInputsAreRejected) {
  EXPECT_THROW(cf::kernel_cause(group_with({8.0, 1.5, 0.5}), 4), std::invalid_argument);
  cf::KernelCauseConfig c;
  c.min_share = 0.5;
  EXPECT_THROW(cf::kernel_cause(group_with({8.0, 1.5, 0.5}), 3, c), std::invalid_argument);
  c = {};
  c.min_excess_ms = -1.0;
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c = {};
  c.peer_tolerance = kNaN;
  EXPECT_THROW(c.validate(), std::invalid_argument);
}

}  // namespace
