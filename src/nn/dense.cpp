#include "cohort/nn/dense.hpp"

#include <utility>

#include "cohort/core/check.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/initializers.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::nn {

Dense::Dense(int units, bool use_bias) : units_(units), use_bias_(use_bias) {
  COHORT_CHECK(units > 0, "Dense needs a positive number of units, got {}", units);
}

Shape Dense::build(const Shape& in, VariableFactory& factory) {
  COHORT_CHECK(in.rank() >= 1, "{}: Dense needs samples of rank >= 1", name());
  input_features_ = in[in.rank() - 1];
  rows_per_sample_ = input_features_ == 0 ? 0 : in.numel() / input_features_;
  kernel_ = factory.create("kernel", {input_features_, units_}, true);
  auto rng = factory.rng_for(kernel_);
  init::glorot_uniform(kernel_->value, rng);
  variables_ = {kernel_};
  if (use_bias_) {
    bias_ = factory.create("bias", {units_}, true);
    variables_.push_back(bias_);
  }
  std::vector<std::int64_t> out = in.dims();
  out.back() = units_;
  return Shape(std::move(out));
}

std::size_t Dense::absorb(std::span<const std::unique_ptr<Layer>> following, const ForwardContext&) {
  const auto activation = following.empty() ? std::nullopt : elementwise_activation(*following.front());
  absorbed_activation_ = activation.value_or(cohort::Activation::Linear);
  return activation ? 1 : 0;
}

Tensor Dense::forward(const Tensor& x, const ForwardContext&) {
  activation_ = std::exchange(absorbed_activation_, cohort::Activation::Linear);
  // Any leading axes are rows: (..., in) -> (rows, in).
  const std::int64_t rows = x.numel() / input_features_;
  input_rows_ = x.view({rows, input_features_});
  std::vector<std::int64_t> out_dims = x.shape().dims();
  out_dims.back() = units_;
  reuse(output_, Shape(out_dims), x);
  const Tensor out_rows = output_.view({rows, units_});
  kernel_used_ = in_type(kernel_->value, x.dtype(), kernel_in_type_);
  ops::matmul(input_rows_, false, kernel_used_, false, out_rows);
  if (use_bias_) ops::bias_activation_forward(out_rows, in_type(bias_->value, x.dtype(), bias_in_type_), activation_);
  else if (activation_ != cohort::Activation::Linear) ops::activation_forward(activation_, out_rows, out_rows);
  return output_;
}

Tensor Dense::backward(const Tensor& dy, bool need_input_gradient) {
  const std::int64_t rows = input_rows_.dim(0);
  Tensor dy_rows = dy.view({rows, units_});
  if (activation_ != cohort::Activation::Linear) {
    // The gradient before the activation, with the bias gradient in the same pass.
    reuse(output_gradient_, {rows, units_}, dy);
    const Tensor y_rows = output_.view({rows, units_});
    if (use_bias_) ops::activation_bias_backward(activation_, y_rows, dy_rows, output_gradient_, bias_->gradient);
    else ops::activation_backward(activation_, y_rows, dy_rows, output_gradient_);
    dy_rows = output_gradient_;
  } else if (use_bias_) {
    ops::bias_gradient(dy_rows, bias_->gradient);
  }
  ops::matmul(input_rows_, true, dy_rows, false, kernel_->gradient);
  if (!need_input_gradient) return Tensor();
  std::vector<std::int64_t> in_dims = dy.shape().dims();
  in_dims.back() = input_features_;
  reuse(input_gradient_, Shape(in_dims), dy);
  ops::matmul(dy_rows, false, kernel_used_, true, input_gradient_.view({rows, input_features_}));
  return input_gradient_;
}

std::optional<LayerConfig> Dense::config() const {
  return LayerConfig{{"units", units_}, {"use_bias", use_bias_ ? 1 : 0}};
}

}  // namespace cohort::nn
