// The CUPTI collector's life cycle where there may be no GPU: it never crashes, reports what
// it can do, backs off when refused and calls nothing in CUPTI once CUPTI could not start.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "cupti/cupti_collector.h"

namespace {

namespace rs = relax_straggler::cupti;

bool have_driver() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) h = dlopen("libcuda.so.1", RTLD_NOW);
  if (h != nullptr) dlclose(h);
  return h != nullptr;
}

rs::CollectorConfig quiet(std::vector<std::string>& warnings, std::int64_t retry_after = 2) {
  rs::CollectorConfig c;
  c.buffer_bytes = std::size_t{64} << 10;
  c.num_buffers = 2;
  c.max_records = 1024;
  c.retry_after = retry_after;
  c.warn = [&warnings](const std::string& m) { warnings.push_back(m); };
  return c;
}

TEST(CuptiCollector, BadConfigurationsAreRejected) {
  std::vector<std::string> w;
  auto small = quiet(w);
  small.buffer_bytes = 1024;
  EXPECT_THROW(rs::CuptiCollector{small}, std::invalid_argument);
  auto odd = quiet(w);
  odd.buffer_bytes = (std::size_t{64} << 10) + 4;
  EXPECT_THROW(rs::CuptiCollector{odd}, std::invalid_argument);
  auto none = quiet(w);
  none.num_buffers = 0;
  EXPECT_THROW(rs::CuptiCollector{none}, std::invalid_argument);
  auto negative = quiet(w, -1);
  EXPECT_THROW(rs::CuptiCollector{negative}, std::invalid_argument);
  auto no_marks = quiet(w);
  no_marks.max_marks = 0;
  EXPECT_THROW(rs::CuptiCollector{no_marks}, std::invalid_argument);
}

TEST(CuptiCollector, ConstructionAndShutdownCallNothing) {
  std::vector<std::string> w;
  rs::CuptiCollector c(quiet(w));
  EXPECT_EQ(c.mode(), rs::CollectorMode::kKernels);  // nothing tried yet
  EXPECT_FALSE(c.end_sampled_step({}, 5).has_value());  // no step begun
  EXPECT_FALSE(c.end_observed_step({}, 5).has_value());
  c.shutdown();
  c.shutdown();
  EXPECT_TRUE(c.last_error().empty());
  EXPECT_TRUE(w.empty());
}

TEST(CuptiCollector, WithoutADriverItIsUnavailableAndStaysQuiet) {
  if (have_driver()) GTEST_SKIP() << "a CUDA driver is present";
  std::vector<std::string> w;
  rs::CuptiCollector c(quiet(w));
  EXPECT_FALSE(c.begin_sampled_step());
  EXPECT_EQ(c.mode(), rs::CollectorMode::kUnavailable);
  EXPECT_STREQ(c.mode_name(), "unavailable");
  EXPECT_NE(c.last_error().find("cuptiSubscribe"), std::string::npos) << c.last_error();
  EXPECT_FALSE(c.end_sampled_step({{0, rs::kAnyStream, 1, 2}}, 5).has_value());
  const std::string first_error = c.last_error();
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(c.begin_sampled_step());
  EXPECT_EQ(c.last_error(), first_error);  // no CUPTI call since
  EXPECT_EQ(c.refusals(), 0);
  ASSERT_EQ(w.size(), 1u);  // warned once
  EXPECT_NE(w[0].find("CUDA events only"), std::string::npos) << w[0];
  c.shutdown();
}

TEST(CuptiCollector, TheSectionObserverMarksNothingOutsideACollectingStep) {
  std::vector<std::string> w;
  rs::CuptiCollector c(quiet(w));
  const relax_straggler::SectionObserver observer = c.section_observer();
  ASSERT_NE(observer.fn, nullptr);
  EXPECT_EQ(observer.ctx, static_cast<void*>(&c));
  observer.fn(observer.ctx, 0, 1);  // before any step: ignored, and no CUPTI call
  observer.fn(observer.ctx, 0, 0);
  EXPECT_FALSE(c.end_observed_step({{0, 1.0}}, 5).has_value());
  EXPECT_EQ(c.unmatched_marks(), 0);
  EXPECT_EQ(c.dropped_marks(), 0);
  EXPECT_TRUE(c.last_error().empty());
  if (!have_driver()) {
    EXPECT_FALSE(c.begin_sampled_step());  // unavailable: the marks of this step are ignored too
    observer.fn(observer.ctx, 1, 1);
    observer.fn(observer.ctx, 1, 0);
    EXPECT_FALSE(c.end_observed_step({{1, 1.0}}, 5).has_value());
    EXPECT_EQ(c.unmatched_marks(), 0);
  }
  c.shutdown();
  observer.fn(observer.ctx, 0, 1);  // after shutdown: still ignored
  EXPECT_TRUE(w.size() <= 1u);
}

TEST(CuptiCollector, AnActiveProfilerIsBackedOffFromAndRetried) {
  std::vector<std::string> w;
  rs::CuptiCollector c(quiet(w, 2));
  EXPECT_FALSE(c.begin_sampled_step(/*profiler_active=*/true));
  EXPECT_EQ(c.mode(), rs::CollectorMode::kEventsOnly);
  EXPECT_STREQ(c.mode_name(), "events only");
  EXPECT_EQ(c.refusals(), 1);
  EXPECT_TRUE(c.last_error().empty());  // decided without CUPTI
  EXPECT_FALSE(c.begin_sampled_step());  // backing off: 2 sampled steps
  EXPECT_FALSE(c.begin_sampled_step());
  EXPECT_EQ(c.refusals(), 1);
  EXPECT_FALSE(c.begin_sampled_step(true));  // tried again, refused again
  EXPECT_EQ(c.refusals(), 2);
  ASSERT_EQ(w.size(), 1u);  // warned once
  EXPECT_NE(w[0].find("a profiler is active"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("retrying every 3 sampled steps"), std::string::npos) << w[0];
}

TEST(CuptiCollector, ASecondCollectorBacksOff) {
  std::vector<std::string> w1, w2;
  rs::CuptiCollector first(quiet(w1));
  rs::CuptiCollector second(quiet(w2, 0));
  const bool collecting = first.begin_sampled_step();  // holds CUPTI's callbacks from now on
  EXPECT_FALSE(second.begin_sampled_step());
  EXPECT_EQ(second.mode(), rs::CollectorMode::kEventsOnly);
  ASSERT_EQ(w2.size(), 1u);
  EXPECT_NE(w2[0].find("another collector"), std::string::npos) << w2[0];
  if (collecting) {
    const auto step = first.end_sampled_step({{0, rs::kAnyStream, 1, 2}}, 5);
    ASSERT_TRUE(step.has_value());
    EXPECT_EQ(step->sections.size(), 1u);
  }
  first.shutdown();
  second.begin_sampled_step();  // may claim now: CUPTI answers for itself
  EXPECT_EQ(second.refusals(), 1);
  second.shutdown();
}

TEST(CuptiCollector, WithADriverAStepCollectsOrBacksOff) {
  if (!have_driver()) GTEST_SKIP() << "no CUDA driver";
  std::vector<std::string> w;
  rs::CuptiCollector c(quiet(w));
  if (c.begin_sampled_step()) {
    const auto step = c.end_sampled_step({{0, rs::kAnyStream, 1, 2}}, 5);
    ASSERT_TRUE(step.has_value()) << c.last_error();
    EXPECT_EQ(step->sections.size(), 1u);
    EXPECT_EQ(c.collected_steps(), 1);
    EXPECT_EQ(c.mode(), rs::CollectorMode::kKernels);
    // A step whose sections the collector observed: one section, no kernel launched in it.
    ASSERT_TRUE(c.begin_sampled_step());
    const relax_straggler::SectionObserver observer = c.section_observer();
    observer.fn(observer.ctx, 3, 1);
    observer.fn(observer.ctx, 3, 0);
    const auto observed = c.end_observed_step({{3, 0.5}}, 5);
    ASSERT_TRUE(observed.has_value()) << c.last_error();
    ASSERT_EQ(observed->sections.size(), 1u);
    EXPECT_EQ(observed->sections[0].stage, 3);
    EXPECT_DOUBLE_EQ(observed->sections[0].length_ms, 0.5);
    EXPECT_EQ(c.unmatched_marks(), 0);
  } else {
    EXPECT_NE(c.mode(), rs::CollectorMode::kKernels) << c.last_error();
  }
  c.shutdown();
}

}  // namespace
