// Kernel statistics of stage sections from synthetic activity records, hand-computed.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "cupti/kernel_stats.h"
#include "cupti/section_marks.h"

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
// GCC, inlining these pairs, takes malloc/free for a mismatch with new/delete.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

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

// Sections by correlation id: a record belongs to the section whose (begin_id, end_id] holds
// the id of the call that launched it.

rs::ActivityRecord launched(std::uint32_t id, double start_ms, double end_ms, const char* name = "k",
                            std::uint32_t stream = kStream) {
  return {rs::ActivityKind::kKernel, at(start_ms), at(end_ms), stream, id, name};
}

rs::IdSection ids(int stage, std::uint32_t begin_id, std::uint32_t end_id, double device_ms = NAN) {
  rs::IdSection s;
  s.stage = stage;
  s.begin_id = begin_id;
  s.end_id = end_id;
  s.device_ms = device_ms;
  return s;
}

TEST(KernelStatsByIds, InterleavedIdsAndOutOfOrderRecordsGoToTheirSections) {
  rs::KernelStats stats(16);
  // Section 0 launched ids 11..20, section 1 ids 21..30. The records come back in no order
  // (CUPTI delivers buffers per stream) and run interleaved on two streams.
  stats.add(launched(23, 2, 4, "b", 3));
  stats.add(launched(12, 0, 2, "a"));
  stats.add(launched(25, 6, 7, "b", 3));
  stats.add(launched(15, 3, 5, "a"));
  stats.add(launched(30, 7, 8, "b", 3));
  stats.add(launched(11, 1, 3, "a"));
  const auto step = stats.summarize_ids({ids(0, 10, 20), ids(1, 20, 30)}, 5);
  ASSERT_EQ(step.sections.size(), 2u);
  const auto& a = step.sections[0];
  EXPECT_EQ(a.kernels, 3);
  EXPECT_EQ(a.stream_id, rs::kAnyStream);
  EXPECT_DOUBLE_EQ(a.span_ms, 5.0);  // 0 .. 5
  EXPECT_NEAR(a.busy_ms, 5.0, 1e-9);  // [0,3] u [3,5]
  EXPECT_NEAR(a.idle_ms, 0.0, 1e-9);
  const auto& b = step.sections[1];
  EXPECT_EQ(b.kernels, 3);
  EXPECT_NEAR(b.span_ms, 6.0, 1e-9);  // 2 .. 8
  EXPECT_NEAR(b.busy_ms, 4.0, 1e-9);  // [2,4] u [6,8]
  EXPECT_NEAR(b.idle_ms, 2.0, 1e-9);  // not measured: the gap inside the span
  EXPECT_NEAR(b.longest_idle_ms, 2.0, 1e-9);
  EXPECT_NEAR(b.length_ms, 6.0, 1e-9);
  ASSERT_EQ(b.top.size(), 1u);
  EXPECT_EQ(b.top[0].name, "b");
  EXPECT_EQ(b.top[0].calls, 3);
  EXPECT_EQ(step.unattributed_records, 0);
}

TEST(KernelStatsByIds, AKernelRunningAfterTheNextSectionBeganStaysWithItsOwn) {
  rs::KernelStats stats(16);
  // Section 0 (ids 1..4) queued a long kernel that ran only after section 1 (ids 5..9) had
  // begun on the host and its first kernel had run: a time range would give it to section 1.
  stats.add(launched(2, 0, 2));
  stats.add(launched(4, 12, 20, "late"));
  stats.add(launched(6, 10, 12));
  const auto step = stats.summarize_ids({ids(0, 0, 4, 25.0), ids(1, 4, 9, 12.0)}, 5);
  const auto& first = step.sections[0];
  EXPECT_EQ(first.kernels, 2);
  EXPECT_NEAR(first.span_ms, 20.0, 1e-9);
  EXPECT_NEAR(first.busy_ms, 10.0, 1e-9);
  EXPECT_DOUBLE_EQ(first.length_ms, 25.0);  // the events' time
  EXPECT_NEAR(first.idle_ms, 15.0, 1e-9);   // 25 measured - 10 busy
  const auto& second = step.sections[1];
  EXPECT_EQ(second.kernels, 1);
  EXPECT_NEAR(second.busy_ms, 2.0, 1e-9);
  EXPECT_NEAR(second.idle_ms, 10.0, 1e-9);
  // Busy beyond the measured time (kernels on another stream than the events'): idle is 0.
  const auto over = stats.summarize_ids({ids(0, 0, 4, 3.0)}, 5);
  EXPECT_DOUBLE_EQ(over.sections[0].idle_ms, 0.0);
  EXPECT_EQ(over.unattributed_records, 1);
}

TEST(KernelStatsByIds, AnEmptySectionAndNestedSections) {
  rs::KernelStats stats(16);
  stats.add(launched(3, 1, 2));
  stats.add(launched(5, 2, 4, "attn"));
  stats.add({rs::ActivityKind::kMemcpy, at(5), at(6), kStream, 6, nullptr});
  // Forward (ids 0..8) holds attention (ids 4..5); the optimizer launched nothing (8..8).
  const auto step = stats.summarize_ids({ids(6, 4, 5), ids(0, 0, 8, 10.0), ids(2, 8, 8, 4.0), ids(3, 8, 8)}, 5);
  ASSERT_EQ(step.sections.size(), 4u);
  EXPECT_EQ(step.sections[0].kernels, 1);  // attention, inside forward
  EXPECT_EQ(step.sections[1].kernels, 2);  // forward counts it too
  EXPECT_NEAR(step.sections[1].busy_ms, 3.0, 1e-9);
  EXPECT_NEAR(step.sections[1].copy_ms, 1.0, 1e-9);
  EXPECT_NEAR(step.sections[1].idle_ms, 6.0, 1e-9);  // 10 - 3 busy - 1 copy
  const auto& empty = step.sections[2];
  EXPECT_EQ(empty.kernels, 0);
  EXPECT_DOUBLE_EQ(empty.busy_ms, 0.0);
  EXPECT_DOUBLE_EQ(empty.span_ms, 0.0);
  EXPECT_DOUBLE_EQ(empty.length_ms, 4.0);
  EXPECT_DOUBLE_EQ(empty.idle_ms, 4.0);  // measured, nothing ran: all idle
  EXPECT_DOUBLE_EQ(step.sections[3].idle_ms, 0.0);  // not measured either: all zeros
  EXPECT_DOUBLE_EQ(step.sections[3].length_ms, 0.0);
  EXPECT_EQ(step.unattributed_records, 0);
}

TEST(KernelStatsByIds, OutsideRecordsInvalidTimesAndOverflowAreCounted) {
  rs::KernelStats stats(3);
  EXPECT_FALSE(stats.add({rs::ActivityKind::kKernel, 0, at(1), kStream, 2, "k"}));  // invalid
  EXPECT_TRUE(stats.add(launched(2, 0, 1)));
  EXPECT_TRUE(stats.add(launched(9, 1, 2)));   // after every section
  EXPECT_TRUE(stats.add(launched(1, 1, 2)));   // before every section (and at the begin id)
  EXPECT_FALSE(stats.add(launched(3, 2, 3)));  // the buffer is full
  const auto step = stats.summarize_ids({ids(0, 1, 5)}, 5);
  EXPECT_EQ(step.sections[0].kernels, 1);
  EXPECT_EQ(step.records, 3);
  EXPECT_EQ(step.invalid_records, 1);
  EXPECT_EQ(step.dropped_records, 1);
  EXPECT_EQ(step.unattributed_records, 2);
  EXPECT_THROW(stats.summarize_ids({ids(0, 1, 5, -1.0)}, 5), std::invalid_argument);
  EXPECT_THROW(stats.summarize_ids({ids(0, 1, 5, INFINITY)}, 5), std::invalid_argument);
}

TEST(KernelStatsByIds, TheIdCounterMayWrapInsideAStep) {
  rs::KernelStats stats(8);
  stats.add(launched(0xfffffffeu, 0, 1));
  stats.add(launched(0xffffffffu, 1, 2));
  stats.add(launched(3, 2, 4));
  stats.add(launched(7, 4, 5));
  const auto step = stats.summarize_ids({ids(0, 0xfffffff0u, 2), ids(1, 2, 10)}, 5);
  EXPECT_EQ(step.sections[0].kernels, 2);
  EXPECT_EQ(step.sections[1].kernels, 2);
  EXPECT_EQ(step.unattributed_records, 0);
}

TEST(SectionMarks, MarksBecomeIdRangesInEndOrderWithTheTimersTimes) {
  rs::SectionMarks marks(16);
  marks.mark(0, true, 10);   // forward begins
  marks.mark(6, true, 14);   // attention inside it
  marks.mark(6, false, 17);
  marks.mark(0, false, 20);
  marks.mark(1, true, 20);   // backward: marked from a thread whose last call is older
  marks.mark(1, false, 12);  // raised to 20: the range never runs backwards
  const auto s = marks.sections({{6, 1.5}, {0, 8.0}, {1, 3.0}});
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].stage, 6);
  EXPECT_EQ(s[0].begin_id, 14u);
  EXPECT_EQ(s[0].end_id, 17u);
  EXPECT_DOUBLE_EQ(s[0].device_ms, 1.5);
  EXPECT_EQ(s[1].stage, 0);
  EXPECT_EQ(s[1].begin_id, 10u);
  EXPECT_EQ(s[1].end_id, 20u);
  EXPECT_DOUBLE_EQ(s[1].device_ms, 8.0);
  EXPECT_EQ(s[2].begin_id, 20u);
  EXPECT_EQ(s[2].end_id, 20u);  // empty
  EXPECT_EQ(marks.unmatched(), 0);
  // A time of another stage at the same place is not taken; none given reads NaN.
  const auto mismatched = marks.sections({{6, 1.5}, {2, 8.0}});
  EXPECT_TRUE(std::isnan(mismatched[1].device_ms));
  EXPECT_TRUE(std::isnan(mismatched[2].device_ms));
}

TEST(SectionMarks, UnmatchedMarksAreLeftOutAndAFullBufferDrops) {
  rs::SectionMarks marks(4);
  marks.mark(2, false, 5);  // an end without its begin
  marks.mark(0, true, 6);
  marks.mark(0, false, 8);
  marks.mark(1, true, 9);   // still open at the step end
  EXPECT_FALSE(marks.mark(1, false, 10));  // full
  EXPECT_EQ(marks.dropped(), 1);
  const auto s = marks.sections({{2, 1.0}, {0, 2.0}});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].stage, 0);
  EXPECT_DOUBLE_EQ(s[0].device_ms, 2.0);  // the second end: the timer's second section
  EXPECT_EQ(marks.unmatched(), 2);
  marks.clear();
  EXPECT_EQ(marks.size(), 0u);
  EXPECT_EQ(marks.dropped(), 0);
  marks.mark(0, true, 3);  // ids kept growing: an older one is raised to the last mark's
  marks.mark(0, false, 4);
  const auto next = marks.sections({});
  EXPECT_EQ(next[0].begin_id, 9u);
  EXPECT_EQ(next[0].end_id, 9u);
  EXPECT_THROW(rs::SectionMarks{0}, std::invalid_argument);
}

TEST(SectionMarks, MarkingNeverAllocatesAndTheLastIdOnlyGrows) {
  rs::SectionMarks marks(1024);
  const long before = g_allocations.load();
  for (std::uint32_t i = 0; i < 1100; ++i) marks.mark(static_cast<int>(i % 4), i % 2 == 0, i);
  EXPECT_EQ(g_allocations.load() - before, 0);
  EXPECT_EQ(marks.dropped(), 1100 - 1024);

  std::atomic<std::uint32_t> last{0};
  rs::advance_last_id(last, 0xfffffff0u);  // the first id is taken whatever it is
  EXPECT_EQ(last.load(), 0xfffffff0u);
  rs::advance_last_id(last, 0xffffff00u);  // older
  EXPECT_EQ(last.load(), 0xfffffff0u);
  rs::advance_last_id(last, 5);  // after the wrap
  EXPECT_EQ(last.load(), 5u);
}

}  // namespace
