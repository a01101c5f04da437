#pragma once
// Categorical cross-entropy (Keras' categorical_crossentropy and sparse_categorical_crossentropy in
// one): labels are class indices of shape (N) or one-hot/soft targets of shape (N, C). With
// from_logits the softmax is fused into the loss and computed stably.
//
//   nn::CategoricalCrossentropy loss{.from_logits = true};
//   double value = loss.compute(logits, labels, dlogits);

#include "cohort/tensor/tensor.hpp"

namespace cohort::nn {

struct CategoricalCrossentropy {
  bool from_logits = false;

  // Mean loss over the batch; writes dL/dprediction into `gradient` when it is defined.
  double compute(const Tensor& prediction, const Tensor& labels, const Tensor& gradient = Tensor()) const;
};

// Fraction of rows whose arg-max matches the label.
double accuracy(const Tensor& scores, const Tensor& labels);

}  // namespace cohort::nn
