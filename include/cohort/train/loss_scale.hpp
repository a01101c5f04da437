#pragma once
// Dynamic loss scaling, for mixed_float16 (Keras' LossScaleOptimizer, PyTorch's GradScaler): the loss
// gradient is multiplied by the scale before the backward pass, so that small float16 gradients do not
// flush to zero, and the update divides it out of the float32 gradients. A step whose gradients are not all
// finite is skipped and the scale halves; after 2000 finite steps in a row it doubles. Strategies that reduce
// the gradients before they update (local, ring allreduce) see the same reduced gradients on every replica,
// so every replica skips the same step. kMaxSkipsInARow skipped steps in a row end training with an error
// naming the variable whose gradient overflowed: the scale cannot fix that.
//
//   train::LossScale scale;                     // 2^15
//   ops::scale(dlogits, scale.value());          // before backward
//   bool applied = train::update_variables(optimizer, model.trainable_variables(), &scale);
#include <cstdint>
#include <string>

namespace cohort::train {

class LossScale {
 public:
  static constexpr float kInitial = 32768.0f;
  static constexpr std::int64_t kGrowthInterval = 2000;
  static constexpr int kMaxSkipsInARow = 32;

  LossScale() = default;
  LossScale(float value, std::int64_t finite_steps);

  float value() const { return value_; }
  // Finite steps since the scale last changed.
  std::int64_t finite_steps() const { return finite_steps_; }
  int skips_in_a_row() const { return skips_in_a_row_; }
  // Records one step: finite, or not (halving the scale; `culprit` names the first variable whose gradient
  // was not finite, for the error after kMaxSkipsInARow such steps).
  void record(bool finite, const std::string& culprit);

 private:
  float value_ = kInitial;
  std::int64_t finite_steps_ = 0;
  int skips_in_a_row_ = 0;
};

}  // namespace cohort::train
