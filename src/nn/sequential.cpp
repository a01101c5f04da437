#include "cohort/nn/sequential.hpp"

#include <algorithm>
#include <utility>

#include "cohort/core/check.hpp"
#include "cohort/core/format.hpp"
#include "cohort/core/timeline.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/tensor/allocator.hpp"
#include "cohort/tensor/capture.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::nn {
namespace {

// Fails at once, naming the build option, for a device this build has no backend for.
void backend_device_check(Device device) { allocator_for(device); }

std::string batch_shape(const Shape& sample) {
  std::string out = "(None";
  for (auto d : sample.dims()) out += ", " + std::to_string(d);
  return out + ")";
}

std::int64_t count(const std::vector<VariablePtr>& variables, bool trainable) {
  std::int64_t n = 0;
  for (const auto& v : variables)
    if (v->trainable == trainable) n += v->value.numel();
  return n;
}

}  // namespace

Sequential::Sequential(Shape input_shape, std::uint64_t seed, Device device)
    : input_shape_(std::move(input_shape)), seed_(seed), device_(device) {
  backend_device_check(device);
  for (auto d : input_shape_.dims())
    COHORT_CHECK(d > 0, "Sequential input shape must have positive extents, got {}", input_shape_);
}

Sequential& Sequential::add(std::unique_ptr<Layer> layer) {
  COHORT_CHECK(layer != nullptr, "Sequential::add got a null layer");
  if (layer->name().empty()) {
    // Keras naming: the first layer of a kind is "conv2d", then "conv2d_1", "conv2d_2", ...
    const int used = names_used_[layer->name_stem()]++;
    layer->set_name(used == 0 ? layer->name_stem() : fmt::format("{}_{}", layer->name_stem(), used));
  }
  for (const auto& existing : layers_)
    COHORT_CHECK(existing->name() != layer->name(), "a layer named '{}' is already in the model", layer->name());
  VariableFactory factory(layer->name(), seed_, next_creation_order_, device_);
  output_shapes_.push_back(layer->build(output_shape(), factory));
  next_creation_order_ = factory.next_creation_order();
  layers_.push_back(std::move(layer));
  return *this;
}

Tensor Sequential::run(const Tensor& x, std::size_t end, const ForwardContext& asked) {
  COHORT_CHECK(!layers_.empty(), "the model has no layers");
  COHORT_CHECK(x.shape() == input_shape_.batched(x.rank() > 0 ? x.dim(0) : 0),
               "model input must be a batch of {}, got {}", input_shape_, x.shape());
  if (x.device() != device_)
    throw DeviceError(fmt::format("the model is on {}, its input batch {} on {}: copy the batch with to()",
                                  device_name(device_), x.shape(), device_name(x.device())));
  ForwardContext context = asked;
  if (context.training && std::ranges::any_of(layers_, [](const auto& layer) { return layer->draws_each_step(); })) {
    if (!step_counter_.defined() || step_counter_.device() != device_) step_counter_ = ops::step_counter(device_);
    ops::set_step_counter(step_counter_, [this] { return step_; });
    context.step_counter = &step_counter_;
  }
  ++passes_;
  ran_.clear();  // a forward that throws leaves nothing for backward()
  std::vector<std::size_t> ran;
  std::vector<DType> output_types;
  const DType compute = compute_dtype(precision_);
  // Under a mixed policy a final softmax or sigmoid runs in float32, so no layer may absorb it.
  const std::size_t low_end = compute == DType::Float32 ? end : std::min(end, logits_end());
  Tensor activation = x.to(compute);
  for (std::size_t i = 0; i < end;) {
    if (i == low_end) activation = activation.to(DType::Float32);
    const auto following = layers().subspan(i + 1, (i < low_end ? low_end : end) - i - 1);
    const std::size_t absorbed = layers_[i]->absorb(following, context);
    COHORT_CHECK(absorbed <= following.size(), "layer '{}' absorbed {} of the {} layers after it", layers_[i]->name(),
                 absorbed, following.size());
    {
      const timeline::Span span(context.training ? "forward" : "inference", layers_[i]->name());
      activation = layers_[i]->forward(activation, context);
    }
    ran.push_back(i);
    output_types.push_back(activation.dtype());
    i += 1 + absorbed;
  }
  if (context.training) ++step_;
  if (!context.inference_only) {
    ran_ = std::move(ran);
    ran_output_types_ = std::move(output_types);
  }
  last_output_shape_ = activation.shape();
  return activation.to(DType::Float32);
}

const Layer* Sequential::first_uncapturable_layer() const {
  for (const auto& layer : layers_)
    if (!layer->capturable()) return layer.get();
  return nullptr;
}

Tensor Sequential::forward(const Tensor& x) {
  return run(x, layers_.size(), {.training = training_, .step = step_, .replica_sum = replica_sum_});
}

Tensor Sequential::infer(const Tensor& x) {
  return run(x, layers_.size(), {.training = false, .step = step_, .inference_only = true});
}

Tensor Sequential::infer_logits(const Tensor& x) {
  return run(x, logits_end(), {.training = false, .step = step_, .inference_only = true});
}

Sequential& Sequential::to(Device device) {
  backend_device_check(device);
  for (const auto& v : variables()) {
    v->value = v->value.to(device);
    if (v->gradient.defined()) v->gradient = v->gradient.to(device);
  }
  device_ = device;
  return *this;
}

cohort::Activation Sequential::final_activation() const {
  const auto* last = layers_.empty() ? nullptr : dynamic_cast<const ActivationLayer*>(layers_.back().get());
  return last == nullptr ? cohort::Activation::Linear : last->activation();
}

std::string Sequential::last_layer_name() const { return layers_.empty() ? "input" : layers_.back()->name(); }

std::size_t Sequential::logits_end() const {
  const cohort::Activation last = final_activation();
  const bool strip = last == cohort::Activation::Softmax || last == cohort::Activation::Sigmoid;
  return strip ? layers_.size() - 1 : layers_.size();
}

Tensor Sequential::forward_logits(const Tensor& x) {
  return run(x, logits_end(), {.training = training_, .step = step_, .replica_sum = replica_sum_});
}

std::int64_t Sequential::replica_sum_elements() const {
  std::int64_t most = 0;
  for (const auto& layer : layers_) most = std::max(most, layer->replica_sum_elements());
  return most;
}

void Sequential::forward_without_batch() {
  const ForwardContext context{.training = training_, .step = step_, .replica_sum = replica_sum_};
  for (const auto& layer : layers_) layer->forward_without_batch(context);
  if (training_) ++step_;
}

void Sequential::backward_without_batch(const GradientsReady& on_ready) {
  // Layer by layer from the last, as backward() goes: no layer that sums absorbs or is absorbed while training,
  // so the sums and the announcements interleave as they do there.
  std::vector<VariablePtr> ready;
  for (std::size_t i = layers_.size(); i-- > 0;) {
    layers_[i]->backward_without_batch();
    if (!on_ready) continue;
    ready.clear();
    for (const auto& v : layers_[i]->variables())
      if (v->trainable) ready.push_back(v);
    if (!ready.empty()) on_ready(ready);
  }
}

void Sequential::backward(const Tensor& doutput, const GradientsReady& on_ready) {
  COHORT_CHECK(!ran_.empty(), "backward() needs a forward() first (an infer() since keeps nothing for it)");
  COHORT_CHECK(doutput.shape() == last_output_shape_, "backward() got a gradient of shape {} for an output of shape {}",
               doutput.shape(), last_output_shape_);
  if (doutput.device() != device_)
    throw DeviceError(fmt::format("the model is on {}, the gradient {} passed to backward() on {}: copy it with to()",
                                  device_name(device_), doutput.shape(), device_name(doutput.device())));
  Tensor gradient = doutput;
  std::vector<VariablePtr> ready;
  std::size_t group_end = layers_.size();
  for (std::size_t k = ran_.size(); k-- > 0;) {
    const auto i = ran_.begin() + static_cast<std::ptrdiff_t>(k);
    {
      const timeline::Span span("backward", layers_[*i]->name());
      gradient = layers_[*i]->backward(gradient.to(ran_output_types_[k]), *i > 0);
    }
    if (!on_ready) continue;
    // The layer's backward stood for the layers it absorbed too.
    ready.clear();
    for (std::size_t layer = *i; layer < group_end; ++layer)
      for (const auto& v : layers_[layer]->variables())
        if (v->trainable) ready.push_back(v);
    group_end = *i;
    if (!ready.empty()) on_ready(ready);
  }
}

std::vector<VariablePtr> Sequential::variables() const {
  std::vector<VariablePtr> all;
  for (const auto& layer : layers_) all.insert(all.end(), layer->variables().begin(), layer->variables().end());
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a->creation_order < b->creation_order; });
  return all;
}

std::vector<VariablePtr> Sequential::trainable_variables() const {
  auto all = variables();
  std::erase_if(all, [](const VariablePtr& v) { return !v->trainable; });
  return all;
}

VariablePtr Sequential::variable(const std::string& name) const {
  for (const auto& v : variables())
    if (v->name == name) return v;
  throw InvalidArgument(fmt::format("the model has no variable named '{}'", name));
}

std::int64_t Sequential::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& v : variables()) n += v->value.numel();
  return n;
}

std::int64_t Sequential::multiply_adds_per_sample() const {
  std::int64_t n = 0;
  for (const auto& layer : layers_) n += layer->multiply_adds_per_sample();
  return n;
}

std::string Sequential::summary(const std::string& model_name) const {
  std::vector<std::string> names;
  std::size_t name_width = 28;
  for (const auto& layer : layers_) {
    names.push_back(fmt::format("{} ({})", layer->name(), layer->type_name()));
    name_width = std::max(name_width, names.back().size() + 1);
  }
  constexpr std::size_t kShapeWidth = 26, kParamWidth = 10;
  const std::size_t width = 1 + name_width + kShapeWidth + kParamWidth;
  const std::string thin(width, '_'), thick(width, '=');
  std::string out = fmt::format("Model: \"{}\"\n{}\n", model_name, thin);
  out += fmt::format(" {:<{}}{:<{}}{:<{}}\n{}\n", "Layer (type)", name_width, "Output Shape", kShapeWidth, "Param #",
                     kParamWidth, thick);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    std::int64_t params = 0;
    for (const auto& v : layers_[i]->variables()) params += v->value.numel();
    out += fmt::format(" {:<{}}{:<{}}{:<{}}\n", names[i], name_width, batch_shape(output_shapes_[i]), kShapeWidth,
                       with_thousands(params), kParamWidth);
    out += i + 1 < layers_.size() ? "\n" : "";
  }
  const auto all = variables();
  out += fmt::format("{}\nTotal params: {}\nTrainable params: {}\nNon-trainable params: {}\n{}\n", thick,
                     with_thousands(parameter_count()), with_thousands(count(all, true)),
                     with_thousands(count(all, false)), thin);
  return out;
}

}  // namespace cohort::nn
