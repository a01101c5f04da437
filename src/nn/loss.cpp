#include "cohort/nn/loss.hpp"

#include "cohort/core/check.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::nn {

double CategoricalCrossentropy::compute(const Tensor& prediction, const Tensor& labels, const Tensor& gradient) const {
  return from_logits ? ops::softmax_cross_entropy(prediction, labels, gradient)
                     : ops::categorical_cross_entropy(prediction, labels, gradient);
}

double accuracy(const Tensor& scores, const Tensor& labels) {
  COHORT_CHECK(scores.rank() == 2 && scores.dim(0) > 0, "accuracy needs a non-empty (N, C) batch, got {}",
               scores.shape());
  return static_cast<double>(ops::count_correct(scores, labels)) / static_cast<double>(scores.dim(0));
}

}  // namespace cohort::nn
