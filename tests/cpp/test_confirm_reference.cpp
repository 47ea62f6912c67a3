// The confirmed verdict's group references: every stage at once (references_of_rows, a
// sorting network over the rows) must equal the per-stage selection (reference_of) on the
// same times, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/confirm/reference.h"

namespace rc = relax_straggler::core::confirm;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void expect_same(double a, double b, const char* what, std::size_t s) {
  if (std::isnan(a) || std::isnan(b)) {
    EXPECT_TRUE(std::isnan(a) && std::isnan(b)) << what << " of stage " << s << ": " << a << " vs " << b;
  } else {
    EXPECT_EQ(a, b) << what << " of stage " << s;
  }
}

// Times of `ranks` rows x S stages: log-normal around 10 ms (sigma `spread`), some ties,
// some NaN cells, one stage run by nobody and one negative-free zero-spread stage.
std::vector<double> matrix(std::size_t ranks, std::size_t S, std::mt19937_64& rng, double spread = 0.05) {
  std::normal_distribution<double> noise(0.0, spread);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> ms(ranks * S);
  for (std::size_t r = 0; r < ranks; ++r) {
    for (std::size_t s = 0; s < S; ++s) {
      double t = 10.0 * std::exp(noise(rng));
      if (u(rng) < 0.2) t = 10.0;  // ties
      if (u(rng) < 0.15) t = kNaN;  // not run by this rank
      if (s == 1) t = kNaN;  // run by nobody
      if (s == 2) t = 4.0;  // every rank alike
      ms[r * S + s] = t;
    }
  }
  return ms;
}

// Every stage of rows[0, take) of ms (ranks x S) against reference_of, field by field.
void expect_per_stage(const std::vector<double>& ms, std::size_t S, const std::vector<std::int32_t>& rows, bool exact) {
  std::vector<rc::GroupReference> got(S);
  rc::references_of_rows(ms.data(), S, rows.data(), rows.size(), exact, got.data());
  std::vector<double> values;
  for (std::size_t s = 0; s < S; ++s) {
    values.clear();
    for (std::int32_t r : rows) {
      const double t = ms[static_cast<std::size_t>(r) * S + s];
      if (!std::isnan(t)) values.push_back(t);
    }
    const rc::GroupReference want = rc::reference_of(values, exact);
    EXPECT_EQ(got[s].count, want.count) << "stage " << s;
    expect_same(got[s].median, want.median, "median", s);
    expect_same(got[s].above, want.above, "above", s);
    expect_same(got[s].below, want.below, "below", s);
    expect_same(got[s].at, want.at, "at", s);
    expect_same(got[s].mad, want.mad, "mad", s);
  }
}

}  // namespace

TEST(ConfirmReference, EveryStageAtOnceEqualsThePerStageSelection) {
  std::mt19937_64 rng(7);
  for (std::size_t S : {3, 4, 5, 16, 17}) {
    for (std::size_t take = 1; take <= rc::kColumnSortRows; ++take) {
      for (bool exact : {true, false}) {
        const std::vector<double> ms = matrix(2 * take, S, rng);
        std::vector<std::int32_t> rows;
        for (std::size_t i = 0; i < take; ++i) rows.push_back(static_cast<std::int32_t>(2 * i + 1));  // every other row
        SCOPED_TRACE("S=" + std::to_string(S) + " take=" + std::to_string(take) + " exact=" + std::to_string(exact));
        expect_per_stage(ms, S, rows, exact);
      }
    }
  }
}

// The spread is read from the sorted times (their deviations fall, then rise): also where
// times lie orders of magnitude apart (the subtraction from 1 rounds) or are zero.
TEST(ConfirmReference, TheSpreadOfTimesOrdersOfMagnitudeApartEqualsThePerStageSelection) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (std::size_t take = 2; take <= rc::kColumnSortRows; ++take) {
    std::vector<double> ms = matrix(take, 9, rng, 3.0);
    for (double& t : ms) {
      if (u(rng) < 0.05) t = 0.0;
    }
    std::vector<std::int32_t> rows;
    for (std::size_t i = 0; i < take; ++i) rows.push_back(static_cast<std::int32_t>(i));
    SCOPED_TRACE("take=" + std::to_string(take));
    expect_per_stage(ms, 9, rows, true);
  }
}

TEST(ConfirmReference, AStageNobodyRanHasNoReference) {
  const std::vector<double> ms = {kNaN, 5.0, kNaN, 7.0};  // 2 ranks x 2 stages
  const std::int32_t rows[] = {0, 1};
  rc::GroupReference out[2];
  rc::references_of_rows(ms.data(), 2, rows, 2, true, out);
  EXPECT_EQ(out[0].count, 0);
  EXPECT_TRUE(std::isnan(out[0].median) && std::isnan(out[0].mad));
  EXPECT_EQ(out[1].count, 2);
  EXPECT_EQ(out[1].median, 6.0);
  EXPECT_EQ(out[1].above, 5.0);  // the slower rank's reference is its peer
  EXPECT_EQ(out[1].below, 7.0);
}
