#include "cohort/nn/layer.hpp"

#include "cohort/core/check.hpp"
#include "cohort/core/seed.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::nn {

VariablePtr VariableFactory::create(const std::string& name, Shape shape, bool trainable) {
  auto variable = std::make_shared<Variable>();
  variable->name = scope_ + "/" + name;
  variable->value = Tensor(shape, device_);
  if (trainable) variable->gradient = Tensor(shape, device_);
  variable->trainable = trainable;
  variable->creation_order = next_order_++;
  created_.push_back(variable);
  return variable;
}

std::mt19937_64 VariableFactory::rng_for(const VariablePtr& variable) const {
  return std::mt19937_64(derive_seed(seed_, variable->name));
}

std::uint64_t VariableFactory::seed_for(const std::string& purpose) const {
  return derive_seed(seed_, scope_ + "#" + purpose);
}

std::size_t Layer::absorb(std::span<const std::unique_ptr<Layer>>, const ForwardContext&) { return 0; }

const Tensor& Layer::reuse(Tensor& buffer, const Shape& shape, Device device) {
  if (!buffer.defined() || buffer.shape() != shape || buffer.device() != device || buffer.dtype() != DType::Float32)
    buffer = Tensor(shape, device);
  return buffer;
}

const Tensor& Layer::reuse(Tensor& buffer, const Shape& shape, const Tensor& like) {
  if (!buffer.defined() || buffer.shape() != shape || buffer.device() != like.device() || buffer.dtype() != like.dtype())
    buffer = Tensor(shape, like.dtype(), like.device());
  return buffer;
}

const Tensor& Layer::in_type(const Tensor& value, DType dtype, Tensor& buffer) {
  if (value.dtype() == dtype) return value;
  if (!buffer.defined() || buffer.shape() != value.shape() || buffer.device() != value.device() || buffer.dtype() != dtype)
    buffer = Tensor::uninitialized(value.shape(), dtype, value.device());
  ops::convert(value, buffer);
  return buffer;
}

}  // namespace cohort::nn
