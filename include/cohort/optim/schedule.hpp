#pragma once
// Learning-rate schedules: functions from the optimizer's iteration count to a learning rate.
// They compose: warm up linearly into a cosine decay, for example.
//
//   auto lr = optim::linear_warmup(optim::cosine_decay(0.1, 10000), 500);
//   optim::SGD sgd({.learning_rate = lr, .momentum = 0.9});

#include <cstdint>
#include <functional>

namespace cohort::optim {

using Schedule = std::function<double(std::int64_t iteration)>;

Schedule constant(double learning_rate);
// learning_rate * factor^(floor(iteration / every))
Schedule step_decay(double learning_rate, double factor, std::int64_t every);
// Cosine from learning_rate down to alpha * learning_rate over decay_steps, then flat (Keras CosineDecay).
Schedule cosine_decay(double learning_rate, std::int64_t decay_steps, double alpha = 0.0);
// Rises linearly from start_factor * target(0) to the target schedule over warmup_steps, then follows it.
Schedule linear_warmup(Schedule target, std::int64_t warmup_steps, double start_factor = 0.0);

// Learning-rate scaling with the number of data-parallel replicas (Goyal et al. 2017): the rate grows
// by replicas (Linear), sqrt(replicas) (Sqrt) or not at all, reached through a linear warm-up from the
// unscaled rate over warmup_steps.
enum class ReplicaScaling { None, Linear, Sqrt };
Schedule scaled_for_replicas(Schedule base, int replicas, ReplicaScaling scaling, std::int64_t warmup_steps = 0);

}  // namespace cohort::optim
