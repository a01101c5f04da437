#include "cohort/nn/zoo.hpp"

#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/batch_normalization.hpp"
#include "cohort/nn/conv2d.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/dropout.hpp"
#include "cohort/nn/flatten.hpp"
#include "cohort/nn/pooling2d.hpp"
#include "cohort/nn/sync_batch_normalization.hpp"

namespace cohort::nn {
namespace {

std::unique_ptr<Layer> batch_normalization(BatchStatistics statistics) {
  if (statistics == BatchStatistics::Global) return std::make_unique<SyncBatchNormalization>();
  return std::make_unique<BatchNormalization>();
}

}  // namespace

Sequential cifar10_cnn(const Shape& input_shape, std::uint64_t seed, Device device, BatchStatistics statistics) {
  Sequential model(input_shape, seed, device);
  const int filters[] = {32, 64, 128};
  const float dropout[] = {0.2f, 0.3f, 0.4f};
  for (int block = 0; block < 3; ++block) {
    model.add(Conv2D(filters[block], 3, Padding::Same));
    model.add(batch_normalization(statistics)).add(Activation(cohort::Activation::Relu));
    model.add(Conv2D(filters[block], 3, Padding::Valid));
    model.add(batch_normalization(statistics)).add(Activation(cohort::Activation::Relu));
    model.add(MaxPooling2D(2)).add(Dropout(dropout[block]));
  }
  model.add(Flatten()).add(Dense(512)).add(Activation(cohort::Activation::Relu)).add(Dropout(0.5f));
  model.add(Dense(10)).add(Activation(cohort::Activation::Softmax));
  return model;
}

Sequential small_cnn(const Shape& input_shape, std::uint64_t seed, Device device, BatchStatistics statistics) {
  Sequential model(input_shape, seed, device);
  for (int filters : {32, 64}) {
    model.add(Conv2D(filters, 3, Padding::Same)).add(batch_normalization(statistics));
    model.add(ReLU()).add(MaxPooling2D(2));
  }
  model.add(Flatten()).add(Dense(128)).add(ReLU()).add(Dropout(0.3f));
  model.add(Dense(10)).add(Softmax());
  return model;
}

}  // namespace cohort::nn
