#pragma once
// Optimizer: applies gradients to variables, one variable at a time, keeping per-variable state
// ("slots": Adam's moments, SGD's velocity) keyed by the variable's name. Because every update touches
// only its own variable's slots, a parameter server can own any subset of the variables and their state.
//
// Learning rate at iteration t: factor * schedule(t) / (1 + decay * t), Keras' legacy `decay`; the factor
// (1 by default) is what a callback changes, and the trainer saves it with the position in training.
// The state (slots and iteration count) serializes to a versioned binary archive. Slots live on the
// device of their variable; to() moves them (after loading state saved on another device).
//
//   optim::Adam adam({.learning_rate = optim::constant(1e-3)});
//   adam.apply("dense/kernel", kernel, kernel_gradient);
//   adam.finish_step();
// (train::update_variables(optimizer, model.trainable_variables()) does one step over a model.)

#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "cohort/optim/schedule.hpp"
#include "cohort/tensor/tensor.hpp"

namespace cohort::optim {

// The state an optimizer keeps for one variable.
struct SlotState {
  std::vector<Tensor> slots;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  virtual std::string name() const = 0;
  // Slots kept per trainable variable, each the variable's size: placement counts them as load.
  virtual int slots_per_variable() const = 0;

  // Updates one variable from its gradient with the current iteration's learning rate. State kept on
  // another device than the variable's is a DeviceError (move it with to()).
  void apply(const std::string& variable_name, const Tensor& value, const Tensor& gradient);
  // Updates several variables at once, as one op (one launch on a GPU for all of them).
  struct Gradient {
    std::string name;
    Tensor value, gradient;
  };
  void apply(const std::vector<Gradient>& gradients);
  void finish_step() { ++iterations_; }
  // Moves every slot to `device`.
  void to(Device device);

  std::int64_t iterations() const { return iterations_; }
  void set_iterations(std::int64_t iterations) { iterations_ = iterations; }
  // The current iteration's learning rate: the schedule's, times a factor (1 until changed).
  double learning_rate() const;
  // Sets the factor so that the current iteration's rate is `learning_rate`; later iterations follow
  // the schedule scaled by the same factor (Keras' ReduceLROnPlateau over a schedule).
  void set_learning_rate(double learning_rate);
  double learning_rate_factor() const { return learning_rate_factor_; }
  void set_learning_rate_factor(double factor);

  const std::map<std::string, SlotState>& state() const { return state_; }
  // The bytes of every slot kept.
  std::uint64_t state_bytes() const;
  // Replaces one variable's state (a parameter server restoring its shards from a checkpoint).
  void set_slots(const std::string& variable_name, SlotState state) { state_[variable_name] = std::move(state); }
  // Replaces every variable's state (a sharded update keeping the pieces of its own rank only).
  void replace_state(std::map<std::string, SlotState> state) { state_ = std::move(state); }
  // Binary, versioned; load() replaces the state and checks that the optimizer kind matches. Without
  // `with_slots`, only the kind and the iteration count (the slots are kept elsewhere: optimizer shards).
  void save_state(std::ostream& out, bool with_slots = true) const;
  void load_state(std::istream& in);

 protected:
  Optimizer(Schedule learning_rate, double decay);
  // What update() gets per variable: its value, its gradient and its slots (shapes and devices checked).
  struct VariableState {
    const Tensor* value;
    const Tensor* gradient;
    std::vector<Tensor>* slots;
  };
  // The step the update rule takes at this iteration for `learning_rate` (Adam folds its bias correction in).
  virtual double step_size(double learning_rate) const { return learning_rate; }
  // `step_size` is a float32 scalar on the variables' device, written before the update runs: a captured
  // step (tensor/capture.hpp) writes it anew for each replay.
  virtual void update(const std::vector<VariableState>& variables, const Tensor& step_size) = 0;

 private:
  std::vector<Tensor>& slots_for(const std::string& variable_name, const Tensor& value);

 private:
  Schedule schedule_;
  double decay_;
  std::int64_t iterations_ = 0;
  double learning_rate_factor_ = 1.0;
  std::map<std::string, SlotState> state_;
  std::map<Device, Tensor> step_sizes_;  // the step-size scalar of each device updated so far
};

}  // namespace cohort::optim
