#pragma once
// Layer: the contract every layer of a Sequential model fulfils.
//
// A layer is built once for a known input sample shape (no batch axis): build() creates its variables
// through the VariableFactory and returns the output sample shape. forward() maps a batch (N, ...) and
// keeps what backward() needs; backward() receives dL/dy, writes dL/dw into each trainable variable's
// gradient and returns dL/dx (an undefined tensor when the caller does not need it).
// Layers compute through tensor/ops.hpp only, so they run on any device with a backend: variables come
// from the factory on the model's device, buffers follow the device of the tensors passed in (reuse()),
// and host values are never read or written on a device path.
//
//   class Square : public nn::Layer { ... };   // see docs/adding_a_layer.md

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cohort/nn/variable.hpp"
#include "cohort/tensor/tensor.hpp"

namespace cohort::nn {

class ReplicaSum;  // nn/replica_sum.hpp

// Per-call facts a layer may need: training or inference, and a counter that changes every training step
// (dropout masks are drawn from it, so a restored counter replays the same masks).
struct ForwardContext {
  bool training = false;
  std::uint64_t step = 0;
  // No backward() follows (Sequential::infer): layers may fold the layers after them in ways that have no
  // gradient, such as a BatchNormalization into the Conv2D before it.
  bool inference_only = false;
  // The sum over the replicas of a data-parallel job, for layers that compute over every replica's batch;
  // null for one process.
  ReplicaSum* replica_sum = nullptr;
  // `step` on the model's device (ops::step_counter), in training where a layer draws from it: a layer that
  // reads its step there draws each replay's own values in a captured step (tensor/capture.hpp).
  const Tensor* step_counter = nullptr;
};

// Creates the variables of one layer with scoped names and a reproducible per-variable random stream.
class VariableFactory {
 public:
  VariableFactory(std::string scope, std::uint64_t seed, int first_creation_order, Device device = Device::CPU)
      : scope_(std::move(scope)), seed_(seed), next_order_(first_creation_order), device_(device) {}

  // The model's device: variables and a layer's plans are made there.
  Device device() const { return device_; }
  VariablePtr create(const std::string& name, Shape shape, bool trainable);
  // A random stream for initializing the variable created last; depends only on the model seed and the
  // variable's full name, so adding a layer elsewhere does not change this one's initial values.
  std::mt19937_64 rng_for(const VariablePtr& variable) const;
  std::uint64_t seed_for(const std::string& purpose) const;
  int next_creation_order() const { return next_order_; }
  const std::vector<VariablePtr>& created() const { return created_; }

 private:
  std::string scope_;
  std::uint64_t seed_;
  int next_order_;
  Device device_;
  std::vector<VariablePtr> created_;
};

// A layer's constructor arguments by name, enough for nn::load_model to build it again.
using LayerConfig = std::map<std::string, double>;

class Layer {
 public:
  virtual ~Layer() = default;

  // Keras class name ("Conv2D") and the snake_case stem of auto-generated names ("conv2d").
  virtual std::string type_name() const = 0;
  virtual std::string name_stem() const = 0;

  virtual Shape build(const Shape& input_sample_shape, VariableFactory& factory) = 0;
  virtual Tensor forward(const Tensor& x, const ForwardContext& context) = 0;
  virtual Tensor backward(const Tensor& dy, bool need_input_gradient) = 0;
  // Fusion: before each forward(), Sequential offers a layer the layers that follow it. A layer that computes
  // the first n of them within its own passes over memory (an activation in a BatchNormalization's pass, a
  // folded BatchNormalization in a Conv2D's kernel) returns n; its forward() and backward() then stand for all
  // n + 1 and Sequential calls neither for the n. What a layer absorbed holds for the next forward() only.
  // The default absorbs none.
  virtual std::size_t absorb(std::span<const std::unique_ptr<Layer>> following, const ForwardContext& context);
  // Layers that sum over the replicas (SyncBatchNormalization): the most elements one sum of theirs holds,
  // 0 for the others. A replica whose share of a step is empty still takes part in every sum of it, in the
  // order the others do: forward_without_batch() for the forward pass, backward_without_batch() for the
  // backward pass, each contributing nothing. Such a layer neither absorbs nor is absorbed while training.
  virtual std::int64_t replica_sum_elements() const { return 0; }
  virtual void forward_without_batch(const ForwardContext&) {}
  virtual void backward_without_batch() {}
  // What nn::save_model stores to build the layer again; layers without one cannot be saved as a model
  // file (their weights still can).
  virtual std::optional<LayerConfig> config() const { return std::nullopt; }
  // Multiply-adds of one sample's forward pass once built (convolutions and matrix products; 0 for layers
  // whose work is elementwise), for FLOP rates: a forward pass is 2 FLOPs each, a training step about 6.
  virtual std::int64_t multiply_adds_per_sample() const { return 0; }
  // Whether forward() in training draws random values from the step (ForwardContext::step_counter).
  virtual bool draws_each_step() const { return false; }
  // Whether fit() may capture this layer's forward and backward once and replay them for later batches of the
  // same shape (tensor/capture.hpp): every host value its ops take is the same at every step (a per-step value
  // is read on the device, as Dropout reads ForwardContext::step_counter), and nothing is read back to the
  // host. False unless a layer says so: a model with such a layer trains op by op.
  virtual bool capturable() const { return false; }

  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  const std::vector<VariablePtr>& variables() const { return variables_; }

 protected:
  // Reuses `buffer` when it already has `shape` on `device` (float32), so steady-state steps allocate nothing.
  static const Tensor& reuse(Tensor& buffer, const Shape& shape, Device device);
  // The same with `like`'s device and element type: a layer's outputs and gradients take its input's type.
  static const Tensor& reuse(Tensor& buffer, const Shape& shape, const Tensor& like);
  // `value` in element type `dtype`: itself when it has that type, else converted into `buffer`. Layers
  // compute with their float32 variables in their input's type this way, as Keras casts variables under a
  // mixed precision policy; gradients still go to the float32 variables.
  static const Tensor& in_type(const Tensor& value, DType dtype, Tensor& buffer);

  std::vector<VariablePtr> variables_;

 private:
  std::string name_;
};

}  // namespace cohort::nn
