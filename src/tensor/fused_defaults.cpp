// The fused ops of a backend that does not fuse them: the unfused ops one after the other, with the same
// results, so every backend has them.
#include "tensor/backend.hpp"

namespace cohort {

void Backend::conv2d_forward_activated(const PlanState* plan, const Conv2dGeometry& g, const Tensor& x,
                                       const Tensor& kernel, const Tensor& bias, Activation activation,
                                       const Tensor& y) {
  conv2d_forward(plan, g, x, kernel, bias, y);
  if (activation != Activation::Linear) activation_forward(activation, y, y);
}

void Backend::bias_activation_forward(const Tensor& y, const Tensor& bias, Activation activation) {
  add_bias(y, bias);
  if (activation != Activation::Linear) activation_forward(activation, y, y);
}

void Backend::activation_bias_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dpre,
                                       const Tensor& dbias) {
  if (activation != Activation::Linear) activation_backward(activation, y, dy, dpre);
  else copy(dy, dpre);
  bias_gradient(dpre, dbias);
}

void Backend::batch_norm_activation_forward_training(const PlanState* plan, const BatchNormGeometry& g,
                                                     const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                                     Activation activation, const Tensor& y, const Tensor& batch_mean,
                                                     const Tensor& batch_variance) {
  batch_norm_forward_training(plan, g, x, gamma, beta, y, batch_mean, batch_variance);
  if (activation != Activation::Linear) activation_forward(activation, y, y);
}

void Backend::batch_norm_activation_forward_inference(const PlanState* plan, const BatchNormGeometry& g,
                                                      const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                                      const Tensor& mean, const Tensor& variance,
                                                      Activation activation, const Tensor& y) {
  batch_norm_forward_inference(plan, g, x, gamma, beta, mean, variance, y);
  if (activation != Activation::Linear) activation_forward(activation, y, y);
}

void Backend::batch_norm_activation_backward(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                             const Tensor& y, const Tensor& gamma, const Tensor&, const Tensor& dy,
                                             const Tensor& batch_mean, const Tensor& batch_variance,
                                             Activation activation, const Tensor& dx, const Tensor& dgamma,
                                             const Tensor& dbeta) {
  // A buffer of its own: the backward kernels may not read and write the same memory.
  const Tensor dnormalized = Tensor::uninitialized(dy.shape(), dy.dtype(), dy.device());
  if (activation != Activation::Linear) activation_backward(activation, y, dy, dnormalized);
  else copy(dy, dnormalized);
  batch_norm_backward(plan, g, x, gamma, dnormalized, batch_mean, batch_variance, dx, dgamma, dbeta);
}

}  // namespace cohort
