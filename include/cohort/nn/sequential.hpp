#pragma once
// Sequential: a linear stack of layers with Keras semantics. Each add() builds the layer right away for
// the current output shape and names it Keras-style (conv2d, conv2d_1, ...), so variables exist, with
// stable names and creation order, as soon as the model is defined. Initial values depend only on the
// model seed and the variable names, not on the device. A model lives on one device: it is built there
// (the constructor's device) or moved there with to(); its batches must be on that device too.
//
//   nn::Sequential model({28, 28, 1});
//   model.add(nn::Conv2D(32, 3, nn::Padding::Same)).add(nn::ReLU()).add(nn::Flatten()).add(nn::Dense(10));
//   fmt::print("{}", model.summary());

#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cohort/nn/layer.hpp"
#include "cohort/nn/precision.hpp"
#include "cohort/tensor/geometry.hpp"

namespace cohort::nn {

class Sequential {
 public:
  explicit Sequential(Shape input_shape, std::uint64_t seed = 0, Device device = Device::CPU);
  Sequential(Sequential&&) noexcept = default;
  Sequential& operator=(Sequential&&) noexcept = default;

  template <std::derived_from<Layer> L>
  Sequential& add(L layer) {
    return add(std::unique_ptr<Layer>(new L(std::move(layer))));
  }
  Sequential& add(std::unique_ptr<Layer> layer);

  Device device() const { return device_; }
  // Moves every variable and gradient to `device`; layers' buffers and plans follow on the next call.
  Sequential& to(Device device);

  // The precision policy (nn/precision.hpp), float32 unless set: what the layers compute in. The input
  // batch, the variables and the output stay float32 under every policy.
  void set_precision(Precision precision) { precision_ = precision; }
  Precision precision() const { return precision_; }
  // Mode for forward(): train() enables dropout and batch statistics; eval() is inference.
  void train() { training_ = true; }
  void eval() { training_ = false; }
  bool is_training() const { return training_; }

  // Runs all layers on a batch (N, input_shape...). The result is valid until the next forward() or infer().
  Tensor forward(const Tensor& x);
  // Runs all layers but a final Softmax or Sigmoid, so that a loss can fuse it with cross-entropy.
  Tensor forward_logits(const Tensor& x);
  // Inference with no backward() after it (what Trainer::predict and evaluate run): eval-mode results
  // whichever mode the model is in, faster where layers fold into the ones before them (a BatchNormalization
  // into its Conv2D). It keeps nothing for a backward(): backward() needs a forward() after it.
  Tensor infer(const Tensor& x);
  Tensor infer_logits(const Tensor& x);
  // The activation of the last layer when it is an activation layer, else Linear.
  cohort::Activation final_activation() const;
  // The last layer's name ("dense_2"), or "input" for a model without layers.
  std::string last_layer_name() const;
  // Called during backward() with the trainable variables whose gradients have just become final, layer
  // by layer from the last one, so that a strategy can start moving them while the rest is computed.
  using GradientsReady = std::function<void(std::span<const VariablePtr>)>;
  // Back-propagates dL/d(output of the last forward call); fills every trainable variable's gradient.
  void backward(const Tensor& doutput, const GradientsReady& on_ready = {});

  // The sum over replicas that layers computing over every replica's batch use while training (set by the
  // training strategy; null: this process's batch is the whole batch). Not owned.
  void set_replica_sum(ReplicaSum* replica_sum) { replica_sum_ = replica_sum; }
  ReplicaSum* replica_sum() const { return replica_sum_; }
  // The most elements a layer of this model sums over the replicas at once; 0 when none does.
  std::int64_t replica_sum_elements() const;
  // A training pass of a replica with no samples in it: every sum over the replicas the layers make in
  // forward() and backward(), in the same order, contributing nothing; `on_ready` is told of each layer's
  // trainable variables where backward() would tell of them (their gradients are left to the caller).
  void forward_without_batch();
  void backward_without_batch(const GradientsReady& on_ready = {});

  const Shape& input_shape() const { return input_shape_; }
  const Shape& output_shape() const { return output_shapes_.empty() ? input_shape_ : output_shapes_.back(); }
  std::size_t size() const { return layers_.size(); }
  Layer& layer(std::size_t index) { return *layers_.at(index); }
  const Layer& layer(std::size_t index) const { return *layers_.at(index); }
  std::span<const std::unique_ptr<Layer>> layers() const { return layers_; }

  // All variables in creation order; trainable ones only.
  std::vector<VariablePtr> variables() const;
  std::vector<VariablePtr> trainable_variables() const;
  VariablePtr variable(const std::string& name) const;
  std::int64_t parameter_count() const;
  // Multiply-adds of one sample's forward pass, over the layers (Layer::multiply_adds_per_sample).
  std::int64_t multiply_adds_per_sample() const;

  // Counter of training steps taken by forward(); it seeds dropout masks and is saved in checkpoints.
  std::uint64_t step() const { return step_; }
  void set_step(std::uint64_t step) { step_ = step; }
  // Forward passes run so far, in any mode: a pass may have made new buffers in the layers.
  std::uint64_t passes() const { return passes_; }
  // The first layer that may not be captured (Layer::capturable), or null where every layer may.
  const Layer* first_uncapturable_layer() const;
  std::uint64_t seed() const { return seed_; }

  // The table Keras' model.summary() prints for the same model.
  std::string summary(const std::string& model_name = "sequential") const;

 private:
  Tensor run(const Tensor& x, std::size_t end, const ForwardContext& asked);
  std::size_t logits_end() const;

  Shape input_shape_;
  std::uint64_t seed_;
  Device device_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Shape> output_shapes_;
  std::map<std::string, int> names_used_;
  int next_creation_order_ = 0;
  bool training_ = false;
  std::uint64_t step_ = 0;
  Tensor step_counter_;  // step_ on the device, for the layers that draw from it
  std::uint64_t passes_ = 0;
  Precision precision_ = Precision::Float32;
  ReplicaSum* replica_sum_ = nullptr;
  // The layers whose forward() the last forward call ran (the others were absorbed into them), for backward(),
  // and the element type of each one's output, which its backward() takes the gradient in.
  std::vector<std::size_t> ran_;
  std::vector<DType> ran_output_types_;
  Shape last_output_shape_;
};

}  // namespace cohort::nn
