#pragma once
// What the trainer tests train: a learnable synthetic set of 8x8x2 images in 4 classes, and a CNN small enough
// to fit it in a few epochs, with every kind of layer the flagship has.
#include <vector>

#include "cohort/data/synthetic.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/batch_normalization.hpp"
#include "cohort/nn/conv2d.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/dropout.hpp"
#include "cohort/nn/flatten.hpp"
#include "cohort/nn/pooling2d.hpp"
#include "cohort/nn/sequential.hpp"

namespace train_test {

inline const cohort::data::ImageDataset& synthetic_set() {
  static const auto set = cohort::data::make_synthetic({.samples = 600, .sample_shape = {8, 8, 2}, .classes = 4, .noise = 90});
  return set;
}

inline cohort::nn::Sequential tiny_cnn(cohort::nn::Precision precision = cohort::nn::Precision::Float32,
                                       cohort::Device device = cohort::Device::CPU) {
  using namespace cohort;
  nn::Sequential model({8, 8, 2}, 11, device);
  model.add(nn::Conv2D(8, 3, nn::Padding::Same)).add(nn::BatchNormalization()).add(nn::ReLU()).add(nn::MaxPooling2D(2));
  model.add(nn::Flatten()).add(nn::Dropout(0.2f)).add(nn::Dense(4)).add(nn::Softmax());
  model.set_precision(precision);
  return model;
}

// Every variable's values, in creation order.
inline std::vector<std::vector<float>> snapshot(const cohort::nn::Sequential& model) {
  std::vector<std::vector<float>> values;
  for (const auto& v : model.variables()) values.push_back(v->value.to_vector());
  return values;
}

}  // namespace train_test
