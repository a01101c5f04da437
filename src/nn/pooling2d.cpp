#include "cohort/nn/pooling2d.hpp"

#include "cohort/core/check.hpp"

namespace cohort::nn {

Pooling2D::Pooling2D(PoolMode mode, int pool_size, int stride, Padding padding)
    : mode_(mode), pool_size_(pool_size), stride_(stride == 0 ? pool_size : stride), padding_(padding) {
  COHORT_CHECK(pool_size > 0 && stride >= 0, "pooling needs a positive pool size and stride, got {} and {}", pool_size,
               stride);
}

Shape Pooling2D::build(const Shape& in, VariableFactory& factory) {
  COHORT_CHECK(in.rank() == 3, "{}: pooling expects (height, width, channels) samples, got {}", name(), in);
  const PaddedExtent rows = padded_extent(in[0], pool_size_, stride_, padding_);
  const PaddedExtent cols = padded_extent(in[1], pool_size_, stride_, padding_);
  plan_ = Pool2dPlan({0, in[0], in[1], in[2], rows.out, cols.out, pool_size_, pool_size_, stride_, stride_,
                     rows.pad_before, cols.pad_before, mode_},
                    factory.device());
  return {rows.out, cols.out, in[2]};
}

Tensor Pooling2D::forward(const Tensor& x, const ForwardContext&) {
  const Pool2dGeometry& g = plan_.geometry();
  input_ = x;
  reuse(output_, {x.dim(0), g.out_h, g.out_w, g.channels}, x);
  ops::pool2d_forward(plan_, x, output_);
  return output_;
}

Tensor Pooling2D::backward(const Tensor& dy, bool need_input_gradient) {
  if (!need_input_gradient) return Tensor();
  reuse(input_gradient_, input_.shape(), input_);
  ops::pool2d_backward(plan_, input_, output_, dy, input_gradient_);
  return input_gradient_;
}

std::optional<LayerConfig> Pooling2D::config() const {
  return LayerConfig{{"pool_size", pool_size_}, {"stride", stride_}, {"same_padding", padding_ == Padding::Same ? 1 : 0}};
}

}  // namespace cohort::nn
