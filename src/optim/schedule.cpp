#include "cohort/optim/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "cohort/core/check.hpp"

namespace cohort::optim {

Schedule constant(double learning_rate) {
  COHORT_CHECK(learning_rate >= 0, "learning rate must be >= 0, got {}", learning_rate);
  return [learning_rate](std::int64_t) { return learning_rate; };
}

Schedule step_decay(double learning_rate, double factor, std::int64_t every) {
  COHORT_CHECK(every > 0 && factor > 0, "step_decay needs every > 0 and factor > 0, got {} and {}", every, factor);
  return [=](std::int64_t t) { return learning_rate * std::pow(factor, static_cast<double>(t / every)); };
}

Schedule cosine_decay(double learning_rate, std::int64_t decay_steps, double alpha) {
  COHORT_CHECK(decay_steps > 0, "cosine_decay needs decay_steps > 0, got {}", decay_steps);
  return [=](std::int64_t t) {
    const double progress = std::min(1.0, static_cast<double>(t) / static_cast<double>(decay_steps));
    const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    return learning_rate * ((1.0 - alpha) * cosine + alpha);
  };
}

Schedule linear_warmup(Schedule target, std::int64_t warmup_steps, double start_factor) {
  COHORT_CHECK(warmup_steps >= 0, "warmup_steps must be >= 0, got {}", warmup_steps);
  return [target = std::move(target), warmup_steps, start_factor](std::int64_t t) {
    if (t >= warmup_steps) return target(t);
    const double fraction = static_cast<double>(t) / static_cast<double>(warmup_steps);
    return target(t) * (start_factor + (1.0 - start_factor) * fraction);
  };
}

Schedule scaled_for_replicas(Schedule base, int replicas, ReplicaScaling scaling, std::int64_t warmup_steps) {
  COHORT_CHECK(replicas >= 1 && warmup_steps >= 0, "scaled_for_replicas needs replicas >= 1 and warmup_steps >= 0");
  const double factor = scaling == ReplicaScaling::Linear ? replicas
                        : scaling == ReplicaScaling::Sqrt ? std::sqrt(static_cast<double>(replicas))
                                                          : 1.0;
  return [base = std::move(base), factor, warmup_steps](std::int64_t t) {
    if (t >= warmup_steps) return base(t) * factor;
    const double fraction = static_cast<double>(t) / static_cast<double>(warmup_steps);
    return base(t) * (1.0 + (factor - 1.0) * fraction);
  };
}

}  // namespace cohort::optim
