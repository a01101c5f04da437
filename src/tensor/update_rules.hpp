#pragma once
// The optimizer update rules for one element, written once for the CPU backend's loops and the CUDA
// backend's kernels, so that both devices do the same arithmetic in the same order (Keras semantics; the
// caller folds Adam's bias correction into its learning rate). Optional slots are null when unused.
#include <cmath>

#include "tensor/host_device.hpp"

namespace cohort::update_rules {

// L2 weight decay adds weight_decay * w to the gradient first.
COHORT_HOST_DEVICE inline float decayed(float gradient, float w, float weight_decay) { return gradient + weight_decay * w; }

// With momentum, v = momentum * v - lr * g; w += v (Nesterov: w += momentum * v - lr * g).
COHORT_HOST_DEVICE inline void sgd(float& w, float gradient, float* velocity, float learning_rate, float momentum,
                                   bool nesterov, float weight_decay) {
  const float grad = decayed(gradient, w, weight_decay);
  if (velocity == nullptr) {
    w -= learning_rate * grad;
    return;
  }
  *velocity = momentum * *velocity - learning_rate * grad;
  w += nesterov ? momentum * *velocity - learning_rate * grad : *velocity;
}

COHORT_HOST_DEVICE inline void adam(float& w, float gradient, float& m, float& v, float learning_rate, float beta_1,
                                    float beta_2, float epsilon, float weight_decay) {
  const float grad = decayed(gradient, w, weight_decay);
  m = beta_1 * m + (1.0f - beta_1) * grad;
  v = beta_2 * v + (1.0f - beta_2) * grad * grad;
  w -= learning_rate * m / (std::sqrt(v) + epsilon);
}

// mean_gradient when centered, velocity when momentum > 0.
COHORT_HOST_DEVICE inline void rmsprop(float& w, float gradient, float& mean_square, float* mean_gradient,
                                       float* velocity, float learning_rate, float rho, float momentum, float epsilon,
                                       float weight_decay) {
  const float grad = decayed(gradient, w, weight_decay);
  mean_square = rho * mean_square + (1.0f - rho) * grad * grad;
  float denominator = mean_square;
  if (mean_gradient != nullptr) {
    *mean_gradient = rho * *mean_gradient + (1.0f - rho) * grad;
    denominator -= *mean_gradient * *mean_gradient;
  }
  if (velocity != nullptr) {
    // Keras/TensorFlow ApplyRMSProp: epsilon inside the square root when momentum is used.
    *velocity = momentum * *velocity + learning_rate * grad / std::sqrt(denominator + epsilon);
    w -= *velocity;
  } else {
    w -= learning_rate * grad / (std::sqrt(denominator) + epsilon);
  }
}

}  // namespace cohort::update_rules
