#include "cohort/train/loss_scale.hpp"

#include <cmath>

#include "cohort/core/check.hpp"
#include "cohort/core/logging.hpp"

namespace cohort::train {

LossScale::LossScale(float value, std::int64_t finite_steps) : value_(value), finite_steps_(finite_steps) {
  COHORT_CHECK(std::isfinite(value) && value > 0 && finite_steps >= 0, "a loss scale of {} after {} finite steps", value,
               finite_steps);
}

void LossScale::record(bool finite, const std::string& culprit) {
  if (finite) {
    skips_in_a_row_ = 0;
    if (++finite_steps_ == kGrowthInterval) {
      value_ *= 2;
      finite_steps_ = 0;
    }
    return;
  }
  finite_steps_ = 0;
  if (++skips_in_a_row_ == kMaxSkipsInARow)
    throw Error(fmt::format("the gradient of {} was not finite in {} steps in a row, down to loss scale {:g}: it "
                            "overflows float16 whatever the scale; lower the learning rate or train in mixed_bfloat16",
                            culprit, kMaxSkipsInARow, value_));
  log::info("step skipped: the gradient of {} is not finite at loss scale {:g}; the scale halves", culprit, value_);
  value_ /= 2;
}

}  // namespace cohort::train
