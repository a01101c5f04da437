// Optimizer steps against values computed by hand from the Keras update rules.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <sstream>

#include "cohort/core/error.hpp"
#include "cohort/optim/adam.hpp"
#include "cohort/optim/rmsprop.hpp"
#include "cohort/optim/sgd.hpp"

using namespace cohort;

namespace {

struct Param {
  Tensor value = Tensor::from_values({2}, std::vector<float>{1.0f, -2.0f});
  Tensor gradient = Tensor::from_values({2}, std::vector<float>{0.5f, 0.25f});
};

}  // namespace

TEST_CASE("Keras default hyper-parameters", "[optim][keras]") {
  CHECK(optim::SGD().learning_rate() == Approx(0.01));
  CHECK(optim::Adam().learning_rate() == Approx(1e-3));
  CHECK(optim::RMSprop().learning_rate() == Approx(1e-3));
  CHECK(optim::AdamOptions{}.beta_1 == 0.9);
  CHECK(optim::AdamOptions{}.beta_2 == 0.999);
  CHECK(optim::AdamOptions{}.epsilon == 1e-7);
  CHECK(optim::RMSpropOptions{}.rho == 0.9);
  CHECK(optim::Adam().slots_per_variable() == 2);
}

TEST_CASE("plain SGD and L2 weight decay", "[optim]") {
  Param p;
  optim::SGD sgd({.learning_rate = optim::constant(0.1), .weight_decay = 0.01});
  sgd.apply("w", p.value, p.gradient);
  // w - lr * (g + wd * w)
  CHECK(p.value.data()[0] == Approx(1.0 - 0.1 * (0.5 + 0.01 * 1.0)));
  CHECK(p.value.data()[1] == Approx(-2.0 - 0.1 * (0.25 - 0.02)));
}

TEST_CASE("SGD momentum and Nesterov over two steps", "[optim]") {
  for (bool nesterov : {false, true}) {
    Param p;
    optim::SGD sgd({.learning_rate = optim::constant(0.1), .momentum = 0.9, .nesterov = nesterov});
    double w = 1.0, v = 0.0;
    for (int step = 0; step < 2; ++step) {
      sgd.apply("w", p.value, p.gradient);
      sgd.finish_step();
      v = 0.9 * v - 0.1 * 0.5;
      w += nesterov ? 0.9 * v - 0.1 * 0.5 : v;
      CHECK(p.value.data()[0] == Approx(w));
    }
  }
}

TEST_CASE("each optimizer updates a long vector as it updates each of its elements alone", "[optim]") {
  // 70001 elements: spread over threads, in full vector registers and a tail; one element alone takes the
  // scalar path. Every form of each rule, two steps (the slots carry over).
  const std::int64_t n = 70001;
  const auto lr = optim::constant(0.01);
  std::vector<std::pair<std::string, std::function<std::unique_ptr<optim::Optimizer>()>>> optimizers{
      {"SGD", [&] { return std::make_unique<optim::SGD>(optim::SGDOptions{.learning_rate = lr, .weight_decay = 0.01}); }},
      {"SGD momentum", [&] { return std::make_unique<optim::SGD>(optim::SGDOptions{.learning_rate = lr, .momentum = 0.9}); }},
      {"SGD Nesterov", [&] { return std::make_unique<optim::SGD>(optim::SGDOptions{.learning_rate = lr, .momentum = 0.9, .nesterov = true}); }},
      {"Adam", [&] { return std::make_unique<optim::Adam>(optim::AdamOptions{.learning_rate = lr, .weight_decay = 0.01}); }},
      {"RMSprop", [&] { return std::make_unique<optim::RMSprop>(optim::RMSpropOptions{.learning_rate = lr}); }},
      {"RMSprop momentum", [&] { return std::make_unique<optim::RMSprop>(optim::RMSpropOptions{.learning_rate = lr, .momentum = 0.5}); }},
      {"RMSprop centered", [&] { return std::make_unique<optim::RMSprop>(optim::RMSpropOptions{.learning_rate = lr, .centered = true}); }},
      {"RMSprop centered momentum",
       [&] { return std::make_unique<optim::RMSprop>(optim::RMSpropOptions{.learning_rate = lr, .momentum = 0.5, .centered = true}); }}};
  std::vector<float> w(n), g(n);
  for (std::int64_t i = 0; i < n; ++i) {
    w[static_cast<std::size_t>(i)] = std::sin(0.37f * static_cast<float>(i));
    g[static_cast<std::size_t>(i)] = std::cos(0.11f * static_cast<float>(i));
  }
  const std::vector<std::int64_t> sampled{0, 1, 15, 16, 17, 31, 4096, 35000, 69983, 69999, 70000};
  for (const auto& [name, make] : optimizers) {
    auto whole = make(), alone = make();
    Tensor value = Tensor::from_values({n}, w), gradient = Tensor::from_values({n}, g);
    std::vector<Tensor> values, gradients;
    for (const std::int64_t i : sampled) {
      values.push_back(Tensor::from_values({1}, std::vector<float>{w[static_cast<std::size_t>(i)]}));
      gradients.push_back(Tensor::from_values({1}, std::vector<float>{g[static_cast<std::size_t>(i)]}));
    }
    for (int step = 0; step < 2; ++step) {
      whole->apply("w", value, gradient);
      whole->finish_step();
      for (std::size_t k = 0; k < sampled.size(); ++k) alone->apply("w" + std::to_string(k), values[k], gradients[k]);
      alone->finish_step();
    }
    for (std::size_t k = 0; k < sampled.size(); ++k) {
      INFO(name << ", element " << sampled[k]);
      CHECK(value.data()[sampled[k]] == Approx(values[k].data()[0]).epsilon(1e-6).margin(1e-7));
    }
  }
}

TEST_CASE("Adam over two steps with bias correction in the step size", "[optim]") {
  Param p;
  optim::Adam adam({.learning_rate = optim::constant(0.01)});
  double w = 1.0, m = 0, v = 0;
  for (int t = 1; t <= 2; ++t) {
    adam.apply("w", p.value, p.gradient);
    adam.finish_step();
    m = 0.9 * m + 0.1 * 0.5;
    v = 0.999 * v + 0.001 * 0.25;
    const double lr_t = 0.01 * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t));
    w -= lr_t * m / (std::sqrt(v) + 1e-7);
    CHECK(p.value.data()[0] == Approx(w).epsilon(1e-6));
  }
  CHECK(adam.iterations() == 2);
}

TEST_CASE("RMSprop plain, centered, with momentum, and both", "[optim]") {
  {
    Param p;
    optim::RMSprop rms({.learning_rate = optim::constant(0.01)});
    rms.apply("w", p.value, p.gradient);
    const double ms = 0.1 * 0.25;
    CHECK(p.value.data()[0] == Approx(1.0 - 0.01 * 0.5 / (std::sqrt(ms) + 1e-7)));
  }
  {
    Param p;
    optim::RMSprop rms({.learning_rate = optim::constant(0.01), .momentum = 0.5, .centered = true});
    CHECK(rms.slots_per_variable() == 3);
    rms.apply("w", p.value, p.gradient);
    const double ms = 0.1 * 0.25, mg = 0.1 * 0.5;
    const double mom = 0.01 * 0.5 / std::sqrt(ms - mg * mg + 1e-7);
    CHECK(p.value.data()[0] == Approx(1.0 - mom));
  }
  {
    Param p;
    optim::RMSprop rms({.learning_rate = optim::constant(0.01), .momentum = 0.5});
    rms.apply("w", p.value, p.gradient);
    const double ms = 0.1 * 0.25;
    CHECK(p.value.data()[0] == Approx(1.0 - 0.01 * 0.5 / std::sqrt(ms + 1e-7)));
  }
  {
    Param p;
    optim::RMSprop rms({.learning_rate = optim::constant(0.01), .centered = true});
    rms.apply("w", p.value, p.gradient);
    const double ms = 0.1 * 0.25, mg = 0.1 * 0.5;
    CHECK(p.value.data()[0] == Approx(1.0 - 0.01 * 0.5 / (std::sqrt(ms - mg * mg) + 1e-7)));
  }
}

TEST_CASE("legacy decay and schedules", "[optim]") {
  optim::SGD sgd({.learning_rate = optim::constant(0.1), .decay = 0.5});
  sgd.set_iterations(4);
  CHECK(sgd.learning_rate() == Approx(0.1 / (1 + 0.5 * 4)));
  const auto step = optim::step_decay(1.0, 0.5, 10);
  CHECK(step(9) == Approx(1.0));
  CHECK(step(10) == Approx(0.5));
  CHECK(step(25) == Approx(0.25));
  const auto cosine = optim::cosine_decay(1.0, 100, 0.1);
  CHECK(cosine(0) == Approx(1.0));
  CHECK(cosine(50) == Approx(0.55));
  CHECK(cosine(100) == Approx(0.1));
  CHECK(cosine(500) == Approx(0.1));
  const auto warm = optim::linear_warmup(optim::constant(0.4), 4);
  CHECK(warm(0) == Approx(0.0));
  CHECK(warm(2) == Approx(0.2));
  CHECK(warm(4) == Approx(0.4));
  CHECK_THROWS_AS(optim::step_decay(1.0, 0.5, 0), InvalidArgument);
}

TEST_CASE("optimizer state round-trips and refuses foreign or damaged state", "[optim]") {
  Param p;
  optim::Adam adam;
  adam.apply("w", p.value, p.gradient);
  adam.finish_step();
  std::stringstream saved;
  adam.save_state(saved);
  const std::string bytes = saved.str();

  optim::Adam restored;
  std::istringstream in(bytes);
  restored.load_state(in);
  CHECK(restored.iterations() == 1);
  CHECK(restored.state().at("w").slots[0].to_vector() == adam.state().at("w").slots[0].to_vector());
  CHECK(restored.state().at("w").slots[1].to_vector() == adam.state().at("w").slots[1].to_vector());

  optim::SGD sgd;
  std::istringstream for_sgd(bytes);
  CHECK_THROWS_AS(sgd.load_state(for_sgd), DataError);
  std::istringstream truncated(bytes.substr(0, bytes.size() / 2));
  CHECK_THROWS_AS(restored.load_state(truncated), DataError);
  CHECK(restored.iterations() == 1);  // a failed load changes nothing

  // A slot of the wrong shape (state for another model) is refused at the next update.
  Tensor wide({3});
  CHECK_THROWS_AS(restored.apply("w", wide, Tensor({3})), InvalidArgument);
}
