#pragma once
// MaxPooling2D and AveragePooling2D over NHWC input, as their Keras namesakes: pool 2, strides equal
// to the pool size, valid padding by default.
//
//   model.add(nn::MaxPooling2D(2));

#include "cohort/nn/layer.hpp"
#include "cohort/nn/padding.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::nn {

class Pooling2D : public Layer {
 public:
  // stride 0 means "equal to the pool size".
  Pooling2D(PoolMode mode, int pool_size, int stride, Padding padding);

  Shape build(const Shape& input_sample_shape, VariableFactory& factory) override;
  Tensor forward(const Tensor& x, const ForwardContext& context) override;
  Tensor backward(const Tensor& dy, bool need_input_gradient) override;
  std::optional<LayerConfig> config() const override;
  bool capturable() const override { return true; }

 private:
  PoolMode mode_;
  int pool_size_, stride_;
  Padding padding_;
  Pool2dPlan plan_;
  Tensor input_, output_, input_gradient_;
};

class MaxPooling2D : public Pooling2D {
 public:
  explicit MaxPooling2D(int pool_size = 2, int stride = 0, Padding padding = Padding::Valid)
      : Pooling2D(PoolMode::Max, pool_size, stride, padding) {}
  std::string type_name() const override { return "MaxPooling2D"; }
  std::string name_stem() const override { return "max_pooling2d"; }
};

class AveragePooling2D : public Pooling2D {
 public:
  explicit AveragePooling2D(int pool_size = 2, int stride = 0, Padding padding = Padding::Valid)
      : Pooling2D(PoolMode::Average, pool_size, stride, padding) {}
  std::string type_name() const override { return "AveragePooling2D"; }
  std::string name_stem() const override { return "average_pooling2d"; }
};

}  // namespace cohort::nn
