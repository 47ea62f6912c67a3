#include "core/confirm/config.h"

#include <cmath>
#include <stdexcept>

namespace relax_straggler::core::confirm {
namespace {

void require(bool ok, const char* field, const std::string& rule, double got) {
  if (!ok) throw std::invalid_argument(std::string(field) + " must be " + rule + ", got " + std::to_string(got));
}

}  // namespace

void ConfirmConfig::validate() const {
  validate_thresholds(relative_threshold, absolute_ms_threshold);
  require(std::isfinite(noise_sigmas) && noise_sigmas > 0.0, "noise_sigmas", "a finite number > 0", noise_sigmas);
  require(confirm_reports >= 1, "confirm_reports", ">= 1", confirm_reports);
  require(recover_reports >= 1, "recover_reports", ">= 1", recover_reports);
  require(min_reports >= 1, "min_reports", ">= 1", min_reports);
  require(history >= 1 && history <= 64, "history", "in 1..64", history);
  require(noise_memory >= 1 && noise_memory <= 64, "noise_memory", "in 1..64", noise_memory);
  require(std::isfinite(window_sigmas) && window_sigmas > 0.0, "window_sigmas", "a finite number > 0", window_sigmas);
  require(std::isfinite(min_impact) && min_impact >= 0.0 && min_impact < 1.0, "min_impact", "in [0, 1)", min_impact);
  require(reference_sample >= 3, "reference_sample", ">= 3", reference_sample);
  require(std::isfinite(min_noise) && min_noise > 0.0, "min_noise", "a finite number > 0", min_noise);
  require(sequential_budget == 0.0 || (sequential_budget > 0.0 && sequential_budget < 1.0), "sequential_budget",
          "0 (off) or in (0, 1)", sequential_budget);
}

}  // namespace relax_straggler::core::confirm
