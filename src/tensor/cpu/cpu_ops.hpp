#pragma once
// The CPU backend: the kernels behind ops.hpp for Device::CPU. Shapes and devices are already checked
// by src/tensor/ops.cpp; these functions only compute.

#include "cohort/tensor/ops.hpp"

namespace cohort::cpu {

// Row-major single-precision GEMM: c[m x n] = alpha * op(a) * op(b) + beta * c, with leading dimensions.
// Multithreaded, unless called from inside an OpenMP parallel region.
void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc);

void fill(const Tensor& x, float value);
void copy(const Tensor& source, const Tensor& destination);
void axpy(float alpha, const Tensor& x, const Tensor& y);
void scale(const Tensor& x, float alpha);
void multiply(const Tensor& a, const Tensor& b, const Tensor& out);
double sum(const Tensor& x);
double sum_of_squares(const Tensor& x);
void add_bias(const Tensor& y, const Tensor& bias);
void bias_gradient(const Tensor& dy, const Tensor& dbias);
void activation_forward(Activation activation, const Tensor& x, const Tensor& y);
void activation_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dx);

void conv2d_forward(const Tensor& x, const Tensor& kernel, const Tensor& bias, const Tensor& y,
                    const Conv2dGeometry& g);
void conv2d_backward(const Tensor& x, const Tensor& kernel, const Tensor& dy, const Tensor& dx,
                     const Tensor& dkernel, const Tensor& dbias, const Conv2dGeometry& g);

void max_pool_forward(const Tensor& x, const Tensor& y, const Pool2dGeometry& g);
void max_pool_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, const Pool2dGeometry& g);
void avg_pool_forward(const Tensor& x, const Tensor& y, const Pool2dGeometry& g);
void avg_pool_backward(const Tensor& dy, const Tensor& dx, const Pool2dGeometry& g);

void batch_norm_forward_training(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon,
                                 const Tensor& y, const Tensor& batch_mean, const Tensor& batch_variance);
void batch_norm_forward_inference(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                                  const Tensor& variance, float epsilon, const Tensor& y);
void batch_norm_backward(const Tensor& x, const Tensor& gamma, const Tensor& dy, const Tensor& batch_mean,
                         const Tensor& batch_variance, float epsilon, const Tensor& dx, const Tensor& dgamma,
                         const Tensor& dbeta);
void batch_norm_backward_inference(const Tensor& x, const Tensor& gamma, const Tensor& dy, const Tensor& mean,
                                   const Tensor& variance, float epsilon, const Tensor& dx, const Tensor& dgamma,
                                   const Tensor& dbeta);
void moving_average_update(const Tensor& moving, const Tensor& batch, float momentum);
void dropout_mask(const Tensor& mask, float rate, std::uint64_t seed);

void sgd_update(const Tensor& value, const Tensor& gradient, const Tensor& velocity, float learning_rate,
                float momentum, bool nesterov, float weight_decay);
void adam_update(const Tensor& value, const Tensor& gradient, const Tensor& m, const Tensor& v, float learning_rate,
                 float beta_1, float beta_2, float epsilon, float weight_decay);
void rmsprop_update(const Tensor& value, const Tensor& gradient, const Tensor& mean_square, const Tensor& mean_gradient,
                    const Tensor& velocity, float learning_rate, float rho, float momentum, float epsilon,
                    float weight_decay);

double softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& dlogits);
double categorical_cross_entropy(const Tensor& probabilities, const Tensor& labels, const Tensor& dprobabilities);
std::int64_t count_correct(const Tensor& scores, const Tensor& labels);

}  // namespace cohort::cpu
