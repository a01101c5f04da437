#include "cohort/optim/optimizer.hpp"

#include <cmath>

#include <cereal/types/map.hpp>
#include <istream>
#include <iterator>
#include <ostream>

#include "cohort/tensor/capture.hpp"
#include "cohort/tensor/ops.hpp"
#include "core/bounded_archive.hpp"
#include "tensor/tensor_archive.hpp"

namespace cohort::optim {

template <class Archive>
void serialize(Archive& archive, SlotState& state) {
  archive(state.slots);
}

namespace {
constexpr std::uint32_t kStateFormatVersion = 2;  // 2: tensors record their element type
}

Optimizer::Optimizer(Schedule learning_rate, double decay) : schedule_(std::move(learning_rate)), decay_(decay) {
  COHORT_CHECK(static_cast<bool>(schedule_), "optimizer needs a learning-rate schedule");
  COHORT_CHECK(decay >= 0, "decay must be >= 0, got {}", decay);
}

double Optimizer::learning_rate() const {
  return learning_rate_factor_ * schedule_(iterations_) / (1.0 + decay_ * static_cast<double>(iterations_));
}

void Optimizer::set_learning_rate(double learning_rate) {
  const double scheduled = schedule_(iterations_) / (1.0 + decay_ * static_cast<double>(iterations_));
  COHORT_CHECK(scheduled > 0, "cannot set the learning rate at iteration {}: its schedule gives {}", iterations_, scheduled);
  set_learning_rate_factor(learning_rate / scheduled);
}

void Optimizer::set_learning_rate_factor(double factor) {
  COHORT_CHECK(std::isfinite(factor) && factor > 0, "a learning-rate factor must be positive and finite, got {}", factor);
  learning_rate_factor_ = factor;
}

void Optimizer::apply(const std::string& variable_name, const Tensor& value, const Tensor& gradient) {
  apply(std::vector<Gradient>{{variable_name, value, gradient}});
}

void Optimizer::apply(const std::vector<Gradient>& gradients) {
  if (gradients.empty()) return;
  std::vector<VariableState> variables;
  variables.reserve(gradients.size());
  for (const Gradient& g : gradients) variables.push_back({&g.value, &g.gradient, &slots_for(g.name, g.value)});
  const Device device = gradients.front().value.device();
  Tensor& step = step_sizes_[device];
  if (!step.defined()) step = ops::scalar(0.0f, device);
  ops::set_step_scalar(step, [this] { return static_cast<float>(step_size(learning_rate())); });
  update(variables, step);
}

std::vector<Tensor>& Optimizer::slots_for(const std::string& variable_name, const Tensor& value) {
  SlotState& state = state_[variable_name];
  const auto wanted = static_cast<std::size_t>(slots_per_variable());
  if (state.slots.empty() && wanted > 0) {
    for (std::size_t i = 0; i < wanted; ++i) state.slots.emplace_back(value.shape(), value.device());
  }
  COHORT_CHECK(state.slots.size() == wanted, "{}: state of '{}' has {} slots, expected {}", name(), variable_name,
               state.slots.size(), wanted);
  for (const Tensor& slot : state.slots) {
    COHORT_CHECK(slot.shape() == value.shape(), "{}: state of '{}' has shape {}, the variable {}", name(), variable_name,
                 slot.shape(), value.shape());
    if (slot.device() != value.device())
      throw DeviceError(fmt::format("{}: the state of '{}' {} is on {}, the variable on {}; move it with optimizer.to()",
                                    name(), variable_name, slot.shape(), device_name(slot.device()),
                                    device_name(value.device())));
  }
  return state.slots;
}

std::uint64_t Optimizer::state_bytes() const {
  std::uint64_t bytes = 0;
  for (const auto& [name, state] : state_)
    for (const Tensor& slot : state.slots) bytes += slot.bytes();
  return bytes;
}

void Optimizer::to(Device device) {
  for (auto& [name, state] : state_)
    for (Tensor& slot : state.slots) slot = slot.to(device);
}

void Optimizer::save_state(std::ostream& out, bool with_slots) const {
  cereal::PortableBinaryOutputArchive archive(out);
  archive(kStateFormatVersion, name(), iterations_, with_slots ? state_ : std::map<std::string, SlotState>{});
}

void Optimizer::load_state(std::istream& in) {
  const std::string bytes(std::istreambuf_iterator<char>(in), {});
  std::uint32_t version = 0;
  std::string kind;
  std::int64_t iterations = 0;
  std::map<std::string, SlotState> state;
  try {
    BoundedInputArchive archive(bytes);
    archive(version);
    COHORT_CHECK_AS(DataError, version == kStateFormatVersion, "optimizer state has format version {}, expected {}",
                    version, kStateFormatVersion);
    archive(kind, iterations, state);
  } catch (const cereal::Exception& e) {
    throw DataError(fmt::format("optimizer state is truncated or corrupt: {}", e.what()));
  }
  COHORT_CHECK_AS(DataError, kind == name(), "optimizer state was saved by {}, cannot load it into {}", kind, name());
  iterations_ = iterations;
  state_ = std::move(state);
}

}  // namespace cohort::optim
