#include "cohort/nn/pooling2d.hpp"

#include "cohort/core/check.hpp"

namespace cohort::nn {

Pooling2D::Pooling2D(int pool_size, int stride, Padding padding)
    : pool_size_(pool_size), stride_(stride == 0 ? pool_size : stride), padding_(padding) {
  COHORT_CHECK(pool_size > 0 && stride >= 0, "pooling needs a positive pool size and stride, got {} and {}", pool_size,
               stride);
}

Shape Pooling2D::build(const Shape& in, VariableFactory&) {
  COHORT_CHECK(in.rank() == 3, "{}: pooling expects (height, width, channels) samples, got {}", name(), in);
  const PaddedExtent rows = padded_extent(in[0], pool_size_, stride_, padding_);
  const PaddedExtent cols = padded_extent(in[1], pool_size_, stride_, padding_);
  geometry_ = {0, in[0], in[1], in[2], rows.out, cols.out, pool_size_, pool_size_, stride_, stride_,
               rows.pad_before, cols.pad_before};
  return {rows.out, cols.out, in[2]};
}

Tensor Pooling2D::forward(const Tensor& x, const ForwardContext&) {
  geometry_.batch = x.dim(0);
  input_ = x;
  reuse(output_, {geometry_.batch, geometry_.out_h, geometry_.out_w, geometry_.channels});
  pool_forward(x, output_, geometry_);
  return output_;
}

Tensor Pooling2D::backward(const Tensor& dy, bool need_input_gradient) {
  if (!need_input_gradient) return Tensor();
  reuse(input_gradient_, input_.shape());
  pool_backward(input_, output_, dy, input_gradient_, geometry_);
  return input_gradient_;
}

void MaxPooling2D::pool_forward(const Tensor& x, const Tensor& y, const Pool2dGeometry& g) {
  ops::max_pool_forward(x, y, g);
}
void MaxPooling2D::pool_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx,
                                 const Pool2dGeometry& g) {
  ops::max_pool_backward(x, y, dy, dx, g);
}

void AveragePooling2D::pool_forward(const Tensor& x, const Tensor& y, const Pool2dGeometry& g) {
  ops::avg_pool_forward(x, y, g);
}
void AveragePooling2D::pool_backward(const Tensor&, const Tensor&, const Tensor& dy, const Tensor& dx,
                                     const Pool2dGeometry& g) {
  ops::avg_pool_backward(dy, dx, g);
}

}  // namespace cohort::nn
