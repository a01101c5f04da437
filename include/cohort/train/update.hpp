#pragma once
// One optimizer step over a list of model variables: each trainable one is updated from its gradient,
// then the optimizer's iteration count advances. With a loss scale (loss_scale.hpp) the gradients are
// divided by it first, and a step whose gradients are not all finite changes nothing but the scale:
// update_variables then returns false.
//
//   train::update_variables(adam, model.trainable_variables());

#include <cstddef>
#include <optional>
#include <vector>

#include "cohort/nn/variable.hpp"
#include "cohort/optim/optimizer.hpp"
#include "cohort/train/loss_scale.hpp"

namespace cohort::train {

bool update_variables(optim::Optimizer& optimizer, const std::vector<nn::VariablePtr>& variables,
                      LossScale* loss_scale = nullptr);

// Divides `loss_scale` out of every gradient; the index of the first one that is not finite, if any.
std::optional<std::size_t> unscale_gradients(const std::vector<Tensor>& gradients, const LossScale& loss_scale);

}  // namespace cohort::train
