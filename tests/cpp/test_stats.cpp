// Hand-computed cases for the NaN-aware statistics (values checked against numpy's
// nanmean / nanmedian / nanquantile(method="linear")).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/stats.h"

namespace rs = relax_straggler::core;

namespace {
const double kNaN = std::numeric_limits<double>::quiet_NaN();
}

TEST(Stats, MeanIgnoresNaN) {
  std::vector<double> v{1.0, kNaN, 2.0, 6.0};
  EXPECT_DOUBLE_EQ(rs::nan_mean(v), 3.0);
  EXPECT_EQ(rs::count_finite(v), 3u);
}

TEST(Stats, EmptyAndAllNaNGiveNaN) {
  std::vector<double> empty;
  std::vector<double> nans{kNaN, kNaN};
  EXPECT_TRUE(std::isnan(rs::nan_mean(empty)));
  EXPECT_TRUE(std::isnan(rs::nan_median(empty)));
  EXPECT_TRUE(std::isnan(rs::nan_mean(nans)));
  EXPECT_TRUE(std::isnan(rs::nan_median(nans)));
  EXPECT_TRUE(std::isnan(rs::nan_mad(nans)));
}

TEST(Stats, MedianOddAndEven) {
  EXPECT_DOUBLE_EQ(rs::nan_median(std::vector<double>{5.0, 1.0, 3.0}), 3.0);
  EXPECT_DOUBLE_EQ(rs::nan_median(std::vector<double>{4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_DOUBLE_EQ(rs::nan_median(std::vector<double>{4.0, kNaN, 1.0, 3.0, 2.0}), 2.5);
}

TEST(Stats, QuantileLinearInterpolation) {
  // numpy.quantile([1, 2, 3, 4, 10], q) for q = 0, 0.1, 0.25, 0.9, 1.
  std::vector<double> v{10.0, 1.0, 3.0, 2.0, 4.0};
  EXPECT_DOUBLE_EQ(rs::nan_quantile(v, 0.0), 1.0);
  EXPECT_NEAR(rs::nan_quantile(v, 0.1), 1.4, 1e-12);
  EXPECT_DOUBLE_EQ(rs::nan_quantile(v, 0.25), 2.0);
  EXPECT_NEAR(rs::nan_quantile(v, 0.9), 7.6, 1e-12);
  EXPECT_DOUBLE_EQ(rs::nan_quantile(v, 1.0), 10.0);
  EXPECT_TRUE(std::isnan(rs::nan_quantile(v, 1.5)));
}

TEST(Stats, MadAroundMedian) {
  // median 3; |x - 3| = {2, 1, 0, 1, 97} -> median 1.
  EXPECT_DOUBLE_EQ(rs::nan_mad(std::vector<double>{1.0, 2.0, 3.0, 4.0, 100.0}), 1.0);
  EXPECT_DOUBLE_EQ(rs::nan_mad(std::vector<double>{7.0, 7.0, 7.0}), 0.0);
}

TEST(Stats, ScratchIsReusedAcrossCalls) {
  std::vector<double> scratch;
  EXPECT_DOUBLE_EQ(rs::nan_median(std::vector<double>{1.0, 2.0, 3.0}, scratch), 2.0);
  EXPECT_DOUBLE_EQ(rs::nan_median(std::vector<double>{9.0}, scratch), 9.0);
}
