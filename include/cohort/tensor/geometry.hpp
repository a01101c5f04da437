#pragma once
// The shapes of the ops that take a plan (ops.hpp), the activation functions and the element-wise losses:
// plain values that device code (the CUDA kernels) includes as well, so this header needs nothing beyond C++17.

#include <cstdint>

namespace cohort {

enum class Activation { Linear, Relu, Sigmoid, Tanh, Softmax };

// Keras' class name of the activation's layer ("ReLU", "Softmax", ...).
constexpr const char* activation_name(Activation activation) {
  switch (activation) {
    case Activation::Linear: return "Linear";
    case Activation::Relu: return "ReLU";
    case Activation::Sigmoid: return "Sigmoid";
    case Activation::Tanh: return "Tanh";
    case Activation::Softmax: return "Softmax";
  }
  return "?";
}

// What ops::elementwise_loss adds up per output, prediction p against target z: Keras' losses on values
// (squared and absolute error, binary cross-entropy of probabilities or of logits), and binary accuracy's
// hits (the output, thresholded at 0.5 or at logit 0, is on the target's side of 0.5).
enum class ElementwiseLoss { SquaredError, AbsoluteError, BinaryCrossEntropy, BinaryCrossEntropyOfLogits, BinaryHits,
                             BinaryHitsOfLogits };

// Geometry of a 2-D convolution over NHWC input with an HWIO kernel.
struct Conv2dGeometry {
  std::int64_t batch = 0, in_h = 0, in_w = 0, in_c = 0;
  std::int64_t out_h = 0, out_w = 0, out_c = 0;
  std::int64_t kernel_h = 0, kernel_w = 0, stride_h = 1, stride_w = 1;
  std::int64_t pad_top = 0, pad_left = 0;  // bottom/right padding is implied by the output size
};

// Geometry of 2-D pooling over NHWC input; each window is clipped to the input. Average pooling counts
// only the window cells inside the input (padding is not counted, as in Keras).
enum class PoolMode { Max, Average };
struct Pool2dGeometry {
  std::int64_t batch = 0, in_h = 0, in_w = 0, channels = 0;
  std::int64_t out_h = 0, out_w = 0;
  std::int64_t pool_h = 0, pool_w = 0, stride_h = 1, stride_w = 1;
  std::int64_t pad_top = 0, pad_left = 0;
  PoolMode mode = PoolMode::Max;
};

// Batch normalization over all axes but the last, the channels.
struct BatchNormGeometry {
  std::int64_t channels = 0;
  float epsilon = 1e-3f;
};

}  // namespace cohort
