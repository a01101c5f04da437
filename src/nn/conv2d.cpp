#include "cohort/nn/conv2d.hpp"

#include <typeinfo>
#include <utility>

#include "cohort/core/check.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/initializers.hpp"

namespace cohort::nn {

Conv2D::Conv2D(int filters, int kernel_size, Padding padding, int stride, bool use_bias)
    : filters_(filters), kernel_size_(kernel_size), stride_(stride), padding_(padding), use_bias_(use_bias) {
  COHORT_CHECK(filters > 0 && kernel_size > 0 && stride > 0,
               "Conv2D needs positive filters, kernel size and stride, got {}, {}, {}", filters, kernel_size, stride);
}

Shape Conv2D::build(const Shape& in, VariableFactory& factory) {
  COHORT_CHECK(in.rank() == 3, "{}: Conv2D expects (height, width, channels) samples, got {}", name(), in);
  const PaddedExtent rows = padded_extent(in[0], kernel_size_, stride_, padding_);
  const PaddedExtent cols = padded_extent(in[1], kernel_size_, stride_, padding_);
  plan_ = Conv2dPlan({0, in[0], in[1], in[2], rows.out, cols.out, filters_, kernel_size_, kernel_size_, stride_,
                      stride_, rows.pad_before, cols.pad_before},
                     factory.device());
  kernel_ = factory.create("kernel", {kernel_size_, kernel_size_, in[2], filters_}, true);
  auto rng = factory.rng_for(kernel_);
  init::glorot_uniform(kernel_->value, rng);
  variables_ = {kernel_};
  if (use_bias_) {
    bias_ = factory.create("bias", {filters_}, true);
    variables_.push_back(bias_);
  }
  return {rows.out, cols.out, filters_};
}

std::size_t Conv2D::absorb(std::span<const std::unique_ptr<Layer>> following, const ForwardContext& context) {
  absorbed_normalization_ = nullptr;
  cancelling_normalization_ = nullptr;
  absorbed_activation_ = cohort::Activation::Linear;
  std::size_t absorbed = 0;
  // The built-in BatchNormalization itself only: a subclass may compute something else in its forward().
  Layer* const next = following.empty() ? nullptr : following.front().get();
  const bool normalization_follows = next != nullptr && typeid(*next) == typeid(BatchNormalization);
  if (use_bias_ && context.training && !context.inference_only && normalization_follows) {
    cancelling_normalization_ = static_cast<BatchNormalization*>(next);
    return 0;
  }
  if (context.inference_only && normalization_follows) {
    absorbed_normalization_ = static_cast<BatchNormalization*>(next);
    ++absorbed;
  }
  if (absorbed < following.size())
    if (const auto activation = elementwise_activation(*following[absorbed])) {
      absorbed_activation_ = *activation;
      ++absorbed;
    }
  return absorbed;
}

Tensor Conv2D::forward(const Tensor& x, const ForwardContext&) {
  const Conv2dGeometry& g = plan_.geometry();
  input_ = x;
  reuse(output_, {x.dim(0), g.out_h, g.out_w, g.out_c}, x);
  folded_ = std::exchange(absorbed_normalization_, nullptr);
  activation_ = std::exchange(absorbed_activation_, cohort::Activation::Linear);
  BatchNormalization* cancelling = std::exchange(cancelling_normalization_, nullptr);
  bias_cancelled_ = cancelling != nullptr;
  if (bias_cancelled_) cancelling->offset_next_batch_mean(bias_->value);
  Tensor kernel = kernel_->value, bias = use_bias_ && !bias_cancelled_ ? bias_->value : Tensor();
  if (folded_ != nullptr) {
    // Folded again on every call: the weights may have changed since, and it costs one pass over the kernel.
    reuse(folded_kernel_, kernel.shape(), x.device());
    reuse(folded_bias_, {g.out_c}, x.device());
    folded_->fold(kernel, bias, folded_kernel_, folded_bias_);
    kernel = folded_kernel_;
    bias = folded_bias_;
  }
  kernel = kernel_used_ = in_type(kernel, x.dtype(), kernel_in_type_);
  if (bias.defined()) bias = in_type(bias, x.dtype(), bias_in_type_);
  ops::conv2d_activation_forward(plan_, x, kernel, bias, activation_, output_);
  return output_;
}

Tensor Conv2D::backward(const Tensor& dy, bool need_input_gradient) {
  COHORT_CHECK(folded_ == nullptr, "{}: no backward() after an inference-only forward()", name());
  Tensor output_gradient = dy;
  if (activation_ != cohort::Activation::Linear) {
    reuse(output_gradient_, dy.shape(), dy);
    ops::activation_backward(activation_, output_, dy, output_gradient_);
    output_gradient = output_gradient_;
  }
  if (need_input_gradient) reuse(input_gradient_, input_.shape(), input_);
  const Tensor dx = need_input_gradient ? input_gradient_ : Tensor();
  if (bias_cancelled_) ops::fill(bias_->gradient, 0.0f);
  ops::conv2d_backward(plan_, input_, kernel_used_, output_gradient, dx, kernel_->gradient,
                       use_bias_ && !bias_cancelled_ ? bias_->gradient : Tensor());
  return dx;
}

std::int64_t Conv2D::multiply_adds_per_sample() const {
  const Conv2dGeometry& g = plan_.geometry();
  return g.out_h * g.out_w * g.out_c * g.kernel_h * g.kernel_w * g.in_c;
}

std::optional<LayerConfig> Conv2D::config() const {
  return LayerConfig{{"filters", filters_}, {"kernel_size", kernel_size_}, {"stride", stride_},
                     {"same_padding", padding_ == Padding::Same ? 1 : 0}, {"use_bias", use_bias_ ? 1 : 0}};
}

}  // namespace cohort::nn
