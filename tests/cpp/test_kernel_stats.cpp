// Kernel statistics of stage sections from synthetic activity records, hand-computed.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "cupti/kernel_stats.h"

// This test binary's one replacement of the global operator new: it counts allocations so
// that a test can show add() never allocates.
namespace {
std::atomic<long> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

namespace rs = relax_straggler::cupti;

constexpr std::uint64_t kMs = 1'000'000;       // ns per ms
constexpr std::uint64_t kT0 = 1'000'000'000;  // the step starts 1 s into the GPU clock
constexpr std::uint32_t kStream = 7;
// torch's fill kernel: void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>,
// at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)
constexpr const char* kFillKernel =
    "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_";

std::uint64_t at(double ms) { return kT0 + static_cast<std::uint64_t>(ms * static_cast<double>(kMs)); }

rs::ActivityRecord kernel(double start_ms, double end_ms, const char* name = "k", std::uint32_t stream = kStream) {
  return {rs::ActivityKind::kKernel, at(start_ms), at(end_ms), stream, 1, name};
}

rs::ActivityRecord copy(double start_ms, double end_ms, std::uint32_t stream = kStream) {
  return {rs::ActivityKind::kMemcpy, at(start_ms), at(end_ms), stream, 1, nullptr};
}

rs::Section section(double begin_ms, double end_ms, std::uint32_t stream = kStream, int stage = 0) {
  return {stage, stream, at(begin_ms), at(end_ms)};
}

const rs::SectionKernels& only(const rs::StepKernels& step) {
  EXPECT_EQ(step.sections.size(), 1u);
  return step.sections.at(0);
}

TEST(KernelStats, ZeroAndInvertedTimestampsAreCountedAndDropped) {
  rs::KernelStats stats(16);
  EXPECT_FALSE(stats.add({rs::ActivityKind::kKernel, 0, at(1), kStream, 1, "k"}));  // start not recorded
  EXPECT_FALSE(stats.add({rs::ActivityKind::kKernel, at(1), 0, kStream, 1, "k"}));  // end not recorded
  EXPECT_FALSE(stats.add(kernel(5, 4)));                                            // inverted
  EXPECT_TRUE(stats.add(kernel(1, 2)));
  EXPECT_TRUE(stats.add(kernel(3, 3)));  // zero length is a real (very short) kernel
  EXPECT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats.invalid_records(), 3);
  EXPECT_EQ(stats.dropped_records(), 0);  // invalid records take no room

  const auto step = stats.summarize({section(0, 10)}, 5);
  EXPECT_EQ(step.invalid_records, 3);
  EXPECT_EQ(step.records, 2);
  EXPECT_EQ(only(step).kernels, 2);
  EXPECT_DOUBLE_EQ(only(step).busy_ms, 1.0);
}

TEST(KernelStats, OverlappingKernelsAreNotDoubleCounted) {
  rs::KernelStats stats(16);
  // [0,4] and [2,6] overlap (two records of one interval), [6,7] touches, [8,9] alone.
  for (auto r : {kernel(2, 6), kernel(0, 4), kernel(6, 7), kernel(8, 9)}) stats.add(r);
  const auto step = stats.summarize({section(0, 10)}, 5);
  const auto& s = only(step);
  EXPECT_DOUBLE_EQ(s.length_ms, 10.0);
  EXPECT_DOUBLE_EQ(s.busy_ms, 8.0);
  EXPECT_DOUBLE_EQ(s.compute_ms, 8.0);
  EXPECT_DOUBLE_EQ(s.idle_ms, 2.0);
  EXPECT_DOUBLE_EQ(s.longest_idle_ms, 1.0);
  EXPECT_EQ(s.kernels, 4);
}

TEST(KernelStats, KernelSpanningASectionBoundaryIsClippedToEachSection) {
  rs::KernelStats stats(16);
  stats.add(kernel(8, 14, "long"));
  const auto step = stats.summarize({section(0, 10, kStream, 0), section(10, 20, kStream, 1)}, 5);
  ASSERT_EQ(step.sections.size(), 2u);
  EXPECT_EQ(step.sections[0].stage, 0);
  EXPECT_DOUBLE_EQ(step.sections[0].busy_ms, 2.0);
  EXPECT_DOUBLE_EQ(step.sections[0].idle_ms, 8.0);
  EXPECT_DOUBLE_EQ(step.sections[0].top.at(0).ms, 2.0);
  EXPECT_EQ(step.sections[1].stage, 1);
  EXPECT_DOUBLE_EQ(step.sections[1].busy_ms, 4.0);
  EXPECT_DOUBLE_EQ(step.sections[1].idle_ms, 6.0);
  EXPECT_EQ(step.sections[1].top.at(0).calls, 1);
  EXPECT_EQ(step.unattributed_records, 0);
}

TEST(KernelStats, ALongKernelStartedBeforeShorterOnesIsFound) {
  rs::KernelStats stats(16);
  // Sorted by start: [0,100] then [10,20]; the section [50,60] lies inside the first only.
  stats.add(kernel(10, 20, "short"));
  stats.add(kernel(0, 100, "long"));
  const auto step = stats.summarize({section(50, 60)}, 5);
  const auto& s = only(step);
  EXPECT_DOUBLE_EQ(s.busy_ms, 10.0);
  EXPECT_EQ(s.kernels, 1);
  ASSERT_EQ(s.top.size(), 1u);
  EXPECT_EQ(s.top[0].name, "long");
}

TEST(KernelStats, AFullBufferCountsDroppedRecords) {
  rs::KernelStats stats(3);
  for (int i = 0; i < 5; ++i) stats.add(kernel(i, i + 0.5));
  EXPECT_EQ(stats.size(), 3u);
  EXPECT_EQ(stats.capacity(), 3u);
  EXPECT_EQ(stats.dropped_records(), 2);
  const auto step = stats.summarize({section(0, 10)}, 5);
  EXPECT_EQ(step.dropped_records, 2);
  EXPECT_DOUBLE_EQ(only(step).busy_ms, 1.5);  // the three kept

  stats.clear();  // the next step has room again
  EXPECT_EQ(stats.size(), 0u);
  EXPECT_EQ(stats.dropped_records(), 0);
  EXPECT_TRUE(stats.add(kernel(0, 1)));
}

TEST(KernelStats, NcclKernelsAreSummedApartFromCompute) {
  const char* nccl = "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE";
  rs::KernelStats stats(16);
  stats.add(kernel(0, 4, "gemm"));
  stats.add(kernel(2, 8, nccl, 9));                  // overlaps the gemm, on the NCCL stream
  stats.add(kernel(9, 10, "ncclKernel_Broadcast_RING_LL_Sum_int8_t"));  // the pre-2.19 name
  const auto step = stats.summarize({section(0, 10, rs::kAnyStream)}, 5);
  const auto& s = only(step);
  EXPECT_DOUBLE_EQ(s.compute_ms, 4.0);
  EXPECT_DOUBLE_EQ(s.nccl_ms, 6.0 + 1.0);
  EXPECT_DOUBLE_EQ(s.busy_ms, 9.0);  // [0,8] and [9,10]: the overlap counted once
  EXPECT_DOUBLE_EQ(s.idle_ms, 1.0);

  EXPECT_TRUE(rs::is_nccl_kernel(nccl));
  EXPECT_TRUE(rs::is_nccl_kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"));
  EXPECT_FALSE(rs::is_nccl_kernel("my_ncclDevKernel_lookalike"));
  EXPECT_FALSE(rs::is_nccl_kernel("_ZN2at6native12ncclKernel_xEv"));  // a namespaced lookalike
  EXPECT_FALSE(rs::is_nccl_kernel(nullptr));
}

TEST(KernelStats, StreamsAreSeparateAndOutsideRecordsUnattributed) {
  rs::KernelStats stats(16);
  stats.add(kernel(1, 3, "mine"));
  stats.add(kernel(1, 9, "other stream", 8));
  stats.add(kernel(20, 21, "after"));
  stats.add(copy(30, 31, 3));
  const auto step = stats.summarize({section(0, 10)}, 5);
  EXPECT_DOUBLE_EQ(only(step).busy_ms, 2.0);
  EXPECT_EQ(step.unattributed_records, 3);

  const auto none = stats.summarize({}, 5);
  EXPECT_TRUE(none.sections.empty());
  EXPECT_EQ(none.unattributed_records, 4);
}

TEST(KernelStats, CopiesAreNeitherKernelTimeNorIdle) {
  rs::KernelStats stats(16);
  stats.add(kernel(0, 2));
  stats.add(copy(1, 5));  // 3 ms of it outside the kernel
  stats.add({rs::ActivityKind::kMemset, at(6), at(7), kStream, 2, nullptr});
  const auto step = stats.summarize({section(0, 10)}, 5);
  const auto& s = only(step);
  EXPECT_DOUBLE_EQ(s.busy_ms, 2.0);
  EXPECT_DOUBLE_EQ(s.copy_ms, 4.0);
  EXPECT_DOUBLE_EQ(s.idle_ms, 4.0);
  EXPECT_DOUBLE_EQ(s.longest_idle_ms, 3.0);  // [7,10]
  EXPECT_DOUBLE_EQ(s.busy_ms + s.copy_ms + s.idle_ms, s.length_ms);
  EXPECT_EQ(s.kernels, 1);
  EXPECT_EQ(s.top.size(), 1u);  // copies are not kernels
}

TEST(KernelStats, AHostStallShowsAsOneLongIdleGap) {
  rs::KernelStats stats(64);
  // Back-to-back 1 ms kernels with a 30 us launch gap, then the host stalls 20 ms.
  for (int i = 0; i < 10; ++i) stats.add(kernel(i * 1.03, i * 1.03 + 1.0));
  for (int i = 0; i < 10; ++i) stats.add(kernel(30 + i * 1.03, 30 + i * 1.03 + 1.0));
  const auto step = stats.summarize({section(0, 40.3)}, 5);
  const auto& s = only(step);
  EXPECT_NEAR(s.busy_ms, 20.0, 1e-6);
  EXPECT_NEAR(s.longest_idle_ms, 30 - (9 * 1.03 + 1.0), 1e-6);
}

TEST(KernelStats, AnEmptySectionIsAllIdleAndNoDivisionByZero) {
  rs::KernelStats stats(4);
  const auto step = stats.summarize({section(0, 5), section(5, 5), section(9, 3)}, 5);
  ASSERT_EQ(step.sections.size(), 3u);
  const auto& none = step.sections[0];
  EXPECT_DOUBLE_EQ(none.length_ms, 5.0);
  EXPECT_DOUBLE_EQ(none.busy_ms, 0.0);
  EXPECT_DOUBLE_EQ(none.idle_ms, 5.0);
  EXPECT_DOUBLE_EQ(none.longest_idle_ms, 5.0);
  EXPECT_TRUE(none.top.empty());
  for (std::size_t i : {1u, 2u}) {  // zero length and inverted: nothing ran in them
    EXPECT_DOUBLE_EQ(step.sections[i].length_ms, 0.0);
    EXPECT_DOUBLE_EQ(step.sections[i].busy_ms, 0.0);
    EXPECT_DOUBLE_EQ(step.sections[i].idle_ms, 0.0);
  }
  EXPECT_EQ(step.records, 0);
  EXPECT_EQ(step.unattributed_records, 0);
}

TEST(KernelStats, TopKernelsByTimeThenName) {
  rs::KernelStats stats(32);
  stats.add(kernel(0, 1, "b_tie"));
  stats.add(kernel(1, 2, "a_tie"));
  stats.add(kernel(2, 5, "big"));
  stats.add(kernel(5, 6, "small"));
  stats.add(kernel(6, 6.5, "small"));  // two calls sum to 1.5 ms
  stats.add(kernel(7, 7.2, "tiny"));
  const auto step = stats.summarize({section(0, 10)}, 4);
  const auto& s = only(step);
  ASSERT_EQ(s.top.size(), 4u);
  EXPECT_EQ(s.top[0].name, "big");
  EXPECT_DOUBLE_EQ(s.top[0].ms, 3.0);
  EXPECT_EQ(s.top[1].name, "small");
  EXPECT_DOUBLE_EQ(s.top[1].ms, 1.5);
  EXPECT_EQ(s.top[1].calls, 2);
  EXPECT_EQ(s.top[2].name, "a_tie");  // equal times: by name
  EXPECT_EQ(s.top[3].name, "b_tie");
  EXPECT_EQ(s.kernels, 6);

  EXPECT_EQ(only(stats.summarize({section(0, 10)}, 0)).top.size(), 0u);
  EXPECT_EQ(only(stats.summarize({section(0, 10)}, 100)).top.size(), 5u);
}

TEST(KernelStats, RealKernelNamesAreDemangledAndShortened) {
  // torch's fill kernel, a CUTLASS generated GEMM, an NCCL kernel, a Triton kernel (plain C name).
  EXPECT_EQ(rs::short_kernel_name(kFillKernel), "at::native::vectorized_elementwise_kernel");
  EXPECT_EQ(rs::short_kernel_name(
                "_ZN7cutlass7Kernel2I68cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8"
                "EEvNT_6ParamsE",
                200),
            "cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>");
  EXPECT_EQ(rs::short_kernel_name("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE"),
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL");
  EXPECT_EQ(rs::short_kernel_name("triton_poi_fused_add_mul_0"), "triton_poi_fused_add_mul_0");
  EXPECT_EQ(rs::short_kernel_name("f"), "f");                // not read as the type mangling "float"
  EXPECT_EQ(rs::short_kernel_name("_Znot_a_name"), "_Znot_a_name");  // demangling fails: kept
  EXPECT_EQ(rs::short_kernel_name(""), "<unnamed>");
  EXPECT_EQ(rs::short_kernel_name(nullptr), "<unnamed>");
}

TEST(KernelStats, ShortNamesKeepAnonymousNamespacesAndAreBounded) {
  EXPECT_EQ(rs::short_kernel_name(
                "void at::native::(anonymous namespace)::softmax_warp_forward<float, float, 10, false>(float*, int)"),
            "at::native::(anonymous namespace)::softmax_warp_forward");
  const std::string long_name = "ns::" + std::string(200, 'x') + "_kernel";
  const std::string s = rs::short_kernel_name(long_name.c_str(), 40);
  EXPECT_EQ(s.size(), 40u);
  EXPECT_EQ(s.substr(0, 3), "...");
  EXPECT_EQ(s.substr(s.size() - 7), "_kernel");  // the end names the function
  // In a section's top list too.
  rs::KernelStats stats(4);
  stats.add(kernel(0, 1, kFillKernel));
  EXPECT_EQ(only(stats.summarize({section(0, 2)}, 1)).top.at(0).name, "at::native::vectorized_elementwise_kernel");
}

TEST(KernelStats, AFullNameTableKeepsTheRecordsWithoutTheirNames) {
  rs::KernelStats stats(16, 2, 1024);
  stats.add(kernel(0, 1, "first"));
  stats.add(kernel(1, 2, "second"));
  stats.add(kernel(2, 4, "third"));   // no room for a third name
  stats.add(kernel(4, 5, "first"));   // known names still resolve
  EXPECT_EQ(stats.dropped_names(), 1);
  const auto step = stats.summarize({section(0, 10)}, 5);
  EXPECT_EQ(step.dropped_names, 1);
  const auto& s = only(step);
  EXPECT_DOUBLE_EQ(s.busy_ms, 5.0);
  ASSERT_EQ(s.top.size(), 3u);
  EXPECT_EQ(s.top[0].name, "first");  // 2 ms, as the unnamed: a known name first
  EXPECT_EQ(s.top[1].name, "<name not kept>");

  rs::KernelStats few_bytes(16, 8, 8);
  few_bytes.add(kernel(0, 1, "a_name_longer_than_eight_bytes"));
  EXPECT_EQ(few_bytes.dropped_names(), 1);
  EXPECT_EQ(few_bytes.size(), 1u);
}

TEST(KernelStats, ClearForgetsTheStepButKeepsTheNames) {
  rs::KernelStats stats(4, 1, 64);
  stats.add(kernel(0, 1, "gemm"));
  stats.add(kernel(0, 0, "gemm"));
  stats.add(kernel(2, 1, "gemm"));
  stats.clear();
  EXPECT_EQ(stats.size(), 0u);
  EXPECT_EQ(stats.invalid_records(), 0);
  stats.add(kernel(0, 1, "gemm"));  // the one name slot is still "gemm"
  EXPECT_EQ(stats.dropped_names(), 0);
  EXPECT_EQ(only(stats.summarize({section(0, 2)}, 1)).top.at(0).name, "gemm");
}

TEST(KernelStats, BadSizesAreRejected) {
  EXPECT_THROW(rs::KernelStats(0), std::invalid_argument);
  EXPECT_THROW(rs::KernelStats(4, 0), std::invalid_argument);
  EXPECT_THROW(rs::KernelStats(4, 4, 0), std::invalid_argument);
  EXPECT_THROW(rs::KernelStats(std::size_t{1} << 32), std::invalid_argument);
}

// Adds n kernels named after a few kernels of a real step; returns the seconds it took.
double add_kernels(rs::KernelStats& stats, std::size_t n) {
  static const char* names[] = {"gemm_a", "gemm_b", "elementwise", "softmax", "layernorm",
                                "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE"};
  stats.clear();
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t start = kT0 + i * 1000;
    stats.add({rs::ActivityKind::kKernel, start, start + 900, kStream, static_cast<std::uint32_t>(i), names[i % 6]});
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(KernelStats, AddingRecordsIsLinearAndNeverAllocates) {
  constexpr std::size_t kSmall = std::size_t{1} << 13, kLarge = kSmall * 16;
  rs::KernelStats stats(kLarge);
  add_kernels(stats, 16);  // the names are interned once
  const long before = g_allocations.load();
  add_kernels(stats, kLarge);
  stats.add(kernel(0, 1, "one more than fits"));  // dropped, not grown
  EXPECT_EQ(g_allocations.load() - before, 0);
  EXPECT_EQ(stats.size(), kLarge);
  EXPECT_EQ(stats.dropped_records(), 1);

  // 16x the records: ~16x the time if linear (up to ~2x more from the cache on a loaded
  // host), 256x if quadratic; best of 7 against load.
  double small = 1e9, large = 1e9;
  for (int i = 0; i < 7; ++i) {
    small = std::min(small, add_kernels(stats, kSmall));
    large = std::min(large, add_kernels(stats, kLarge));
  }
  EXPECT_LT(large, 96 * small) << "small " << small << " s, large " << large << " s";

  // And the summary of a full buffer is right.
  const auto step = stats.summarize({{0, kStream, kT0, kT0 + kLarge * 1000}}, 3);
  EXPECT_EQ(step.records, static_cast<std::int64_t>(kLarge));
  EXPECT_EQ(only(step).kernels, static_cast<std::int64_t>(kLarge));
  EXPECT_NEAR(only(step).busy_ms, static_cast<double>(kLarge) * 900 * 1e-6, 1e-6);
  EXPECT_NEAR(only(step).nccl_ms, static_cast<double>(kLarge / 6) * 900 * 1e-6, 1e-3);
  EXPECT_EQ(only(step).top.size(), 3u);
}

}  // namespace
