#pragma once
// Normalization: (x - mean) / stddev per channel (the last axis), with the statistics held as
// non-trainable variables, as keras.layers.Normalization. It puts a data set's normalization inside the
// model, so that a saved model takes raw inputs (nn::save_model adds one for the training transforms).
//
//   const auto stats = data::channel_statistics(train_set);
//   model.add(nn::Normalization(stats.mean, stats.stddev));

#include <vector>

#include "cohort/nn/layer.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::nn {

class Normalization : public Layer {
 public:
  // One mean and one positive standard deviation per channel.
  Normalization(std::vector<float> mean, std::vector<float> stddev);

  std::string type_name() const override { return "Normalization"; }
  bool capturable() const override { return true; }
  std::string name_stem() const override { return "normalization"; }
  Shape build(const Shape& input_sample_shape, VariableFactory& factory) override;
  Tensor forward(const Tensor& x, const ForwardContext& context) override;
  Tensor backward(const Tensor& dy, bool need_input_gradient) override;
  std::optional<LayerConfig> config() const override;

 private:
  std::vector<float> mean_, stddev_;
  BatchNormPlan plan_;
  VariablePtr mean_variable_, scale_;  // scale = 1 / stddev
  // Batch normalization's inference op with beta = 0 and a variance whose sum with epsilon is 1.
  Tensor zeros_, unit_variance_, input_, output_, input_gradient_, scratch_gamma_, scratch_beta_;
};

}  // namespace cohort::nn
