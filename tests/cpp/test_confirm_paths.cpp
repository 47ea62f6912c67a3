// The confirmed verdict's per-report kernels are compiled once per instruction set
// (core/simd.h: the build's default, AVX2, AVX-512) and one path is chosen at load time:
// every path this CPU runs must give the same bits on the same input (references_of_rows)
// and the same rows (rows_outside, also checked against a plain per-cell test), and the
// medians of the learned noise (ring_medians) its definition gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/confirm/reference.h"
#include "core/confirm/simd.h"
#include "core/simd.h"

namespace rs = relax_straggler::core;
namespace rc = relax_straggler::core::confirm;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<rs::Isa> available() {
  std::vector<rs::Isa> out;
  for (rs::Isa isa : {rs::Isa::kBase, rs::Isa::kAvx2, rs::Isa::kAvx512}) {
    if (rs::isa_available(isa)) out.push_back(isa);
  }
  return out;
}

std::string name(rs::Isa isa) { return "isa " + std::to_string(static_cast<int>(isa)); }

std::uint64_t bits(double x) {
  std::uint64_t b = 0;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// Times of ranks x S: log-normal around 10 ms (sigma `spread`), ties, zeros, NaN cells (not
// run) and one stage run by nobody.
std::vector<double> matrix(std::size_t ranks, std::size_t S, std::mt19937_64& rng, double spread) {
  std::normal_distribution<double> noise(0.0, spread);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> ms(ranks * S);
  for (std::size_t r = 0; r < ranks; ++r) {
    for (std::size_t s = 0; s < S; ++s) {
      double t = 10.0 * std::exp(noise(rng));
      if (u(rng) < 0.2) t = 10.0;
      if (u(rng) < 0.05) t = 0.0;
      if (u(rng) < 0.15 || (S > 1 && s == 1)) t = kNaN;
      ms[r * S + s] = t;
    }
  }
  return ms;
}

}  // namespace

TEST(ConfirmPaths, TheBasePathIsAlwaysAvailable) {
  EXPECT_TRUE(rs::isa_available(rs::Isa::kBase));
  EXPECT_TRUE(rs::isa_available(rs::widest_isa()));
}

TEST(ConfirmPaths, AnUnavailablePathIsRefusedByName) {
  if (rs::isa_available(rs::Isa::kAvx512)) GTEST_SKIP() << "this CPU runs every path (AVX-512 included): none to refuse";
  const double ms[] = {1.0, 2.0};
  const std::int32_t rows[] = {0, 1};
  rc::GroupReference out[1];
  try {
    rc::references_of_rows_on(rs::Isa::kAvx512, ms, 1, rows, 2, true, out);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("references_of_rows_on"), std::string::npos) << e.what();
  }
  std::int32_t found[2];
  const std::int32_t group[] = {0, 0};
  EXPECT_THROW(rc::rows_outside_on(rs::Isa::kAvx512, ms, 2, 1, group, ms, ms, found), std::invalid_argument);
  const float ring[8] = {};
  const std::int32_t due[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  float median[8];
  EXPECT_THROW(rc::ring_medians_on(rs::Isa::kAvx512, ring, 1, due, median), std::invalid_argument);
}

// Rings of every network size and between them, partly filled (+inf past the filled
// entries) or full, with ties; each path and the load-time choice against the definition:
// the entry at due / 2 of the ring sorted.
TEST(ConfirmPaths, EveryPathTakesTheNoiseMediansOfTheirDefinition) {
  constexpr std::size_t kRings = 8;
  const float inf = std::numeric_limits<float>::infinity();
  std::mt19937_64 rng(29);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<rs::Isa> paths = available();
  for (std::size_t mem : {1, 2, 3, 4, 5, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> block(mem * kRings);
      std::int32_t due[kRings];
      for (std::size_t l = 0; l < kRings; ++l) {
        due[l] = static_cast<std::int32_t>(u(rng) * static_cast<float>(mem + 1)) % static_cast<std::int32_t>(mem + 1);
        const std::size_t filled = trial % 2 == 0 ? static_cast<std::size_t>(due[l]) : mem;
        for (std::size_t i = 0; i < mem; ++i) {
          block[i * kRings + l] = i >= filled ? inf : u(rng) < 0.2 ? 0.5f : u(rng);
        }
      }
      float want[kRings];
      for (std::size_t l = 0; l < kRings; ++l) {
        std::vector<float> ring;
        for (std::size_t i = 0; i < mem; ++i) ring.push_back(block[i * kRings + l]);
        std::sort(ring.begin(), ring.end());
        want[l] = ring[static_cast<std::size_t>(due[l]) / 2];
      }
      float got[kRings];
      for (rs::Isa isa : paths) {
        rc::ring_medians_on(isa, block.data(), mem, due, got);
        for (std::size_t l = 0; l < kRings; ++l) {
          if (due[l] > 0) {
            EXPECT_EQ(got[l], want[l]) << name(isa) << " mem=" << mem << " ring " << l;
          }
        }
      }
      rc::ring_medians(block.data(), mem, due, got);
      for (std::size_t l = 0; l < kRings; ++l) {
        if (due[l] > 0) {
          EXPECT_EQ(got[l], want[l]) << "load-time path, mem=" << mem << " ring " << l;
        }
      }
    }
  }
}

// Stage counts below, at and between the vector widths (4 and 8 stages), every network size.
TEST(ConfirmPaths, EveryPathTakesTheSameReferencesBitForBit) {
  std::mt19937_64 rng(23);
  const std::vector<rs::Isa> paths = available();
  for (std::size_t S : {1, 3, 4, 5, 7, 8, 9, 12, 16, 17, 24}) {
    for (std::size_t take = 1; take <= rc::kColumnSortRows; ++take) {
      for (bool exact : {true, false}) {
        const std::vector<double> ms = matrix(2 * take, S, rng, take % 3 == 0 ? 3.0 : 0.05);
        std::vector<std::int32_t> rows;
        for (std::size_t i = 0; i < take; ++i) rows.push_back(static_cast<std::int32_t>(2 * take - 1 - 2 * i));
        std::vector<rc::GroupReference> want(S), got(S);
        rc::references_of_rows_on(rs::Isa::kBase, ms.data(), S, rows.data(), take, exact, want.data());
        for (rs::Isa isa : paths) {
          rc::references_of_rows_on(isa, ms.data(), S, rows.data(), take, exact, got.data());
          for (std::size_t s = 0; s < S; ++s) {
            SCOPED_TRACE(name(isa) + " S=" + std::to_string(S) + " take=" + std::to_string(take) +
                         " exact=" + std::to_string(exact) + " stage " + std::to_string(s));
            EXPECT_EQ(got[s].count, want[s].count);
            EXPECT_EQ(bits(got[s].median), bits(want[s].median));
            EXPECT_EQ(bits(got[s].above), bits(want[s].above));
            EXPECT_EQ(bits(got[s].below), bits(want[s].below));
            EXPECT_EQ(bits(got[s].at), bits(want[s].at));
            EXPECT_EQ(bits(got[s].mad), bits(want[s].mad));
          }
        }
        // The load-time choice is one of them.
        rc::references_of_rows(ms.data(), S, rows.data(), take, exact, got.data());
        for (std::size_t s = 0; s < S; ++s) EXPECT_EQ(bits(got[s].mad), bits(want[s].mad)) << "S=" << S;
      }
    }
  }
}

// Groups of several sizes (blocks of rows that straddle two groups; per_group 0: ranks
// dealt to 5 groups in turn), bounds of +-inf, NaN cells and cells exactly at a bound
// (inside), a single outlier anywhere in the row.
TEST(ConfirmPaths, EveryPathFindsTheSameRowsOutsideTheBounds) {
  std::mt19937_64 rng(29);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const std::vector<rs::Isa> paths = available();
  for (std::size_t S : {1, 3, 4, 5, 8, 12, 16, 17}) {
    for (std::size_t per_group : {0, 1, 3, 4, 6, 8, 128}) {
      const std::size_t ranks = 203;
      const std::size_t groups = per_group == 0 ? 5 : (ranks + per_group - 1) / per_group;
      std::vector<std::int32_t> group(ranks);
      for (std::size_t r = 0; r < ranks; ++r) group[r] = static_cast<std::int32_t>(per_group == 0 ? r % 5 : r / per_group);
      std::vector<double> hi(groups * S), lo(groups * S);
      for (std::size_t gs = 0; gs < groups * S; ++gs) {
        hi[gs] = u(rng) < 0.1 ? kInf : 11.0 + u(rng);
        lo[gs] = u(rng) < 0.5 ? -kInf : 9.0 - u(rng);
      }
      std::vector<double> ms(ranks * S);
      for (std::size_t r = 0; r < ranks; ++r) {
        for (std::size_t s = 0; s < S; ++s) {
          const double x = u(rng);
          const std::size_t gs = static_cast<std::size_t>(group[r]) * S + s;
          ms[r * S + s] = x < 0.1 ? kNaN : x < 0.15 ? hi[gs] : x < 0.2 ? lo[gs] : 9.5 + u(rng);
        }
        if (u(rng) < 0.1) ms[r * S + static_cast<std::size_t>(u(rng) * static_cast<double>(S))] = u(rng) < 0.5 ? 30.0 : 1.0;
      }
      std::vector<std::int32_t> want;
      for (std::size_t r = 0; r < ranks; ++r) {
        bool out = false;
        for (std::size_t s = 0; s < S; ++s) {
          const std::size_t gs = static_cast<std::size_t>(group[r]) * S + s;
          out = out || ms[r * S + s] > hi[gs] || ms[r * S + s] < lo[gs];
        }
        if (out) want.push_back(static_cast<std::int32_t>(r));
      }
      ASSERT_FALSE(want.empty());
      for (rs::Isa isa : paths) {
        std::vector<std::int32_t> got(ranks);
        got.resize(rc::rows_outside_on(isa, ms.data(), ranks, S, group.data(), hi.data(), lo.data(), got.data()));
        EXPECT_EQ(got, want) << name(isa) << " S=" << S << " per group " << per_group;
      }
    }
  }
}
