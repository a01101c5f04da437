#include "cohort/train/strategy.hpp"

namespace cohort::train {

void Local::apply_gradients(nn::Sequential& model, optim::Optimizer& optimizer, std::int64_t) {
  optimizer.apply(model.trainable_variables());
}

std::shared_ptr<const data::Sampler> Strategy::sampler(std::int64_t size, std::uint64_t seed, bool shuffle) const {
  if (shuffle) return std::make_shared<data::ShuffleSampler>(size, seed);
  return std::make_shared<data::SequentialSampler>(size);
}

}  // namespace cohort::train
