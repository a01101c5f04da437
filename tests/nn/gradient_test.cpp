// Every layer and the loss against central finite differences (nn::check_gradients).
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/batch_normalization.hpp"
#include "cohort/nn/conv2d.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/dropout.hpp"
#include "cohort/nn/flatten.hpp"
#include "cohort/nn/gradcheck.hpp"
#include "cohort/nn/loss.hpp"
#include "cohort/nn/metric.hpp"
#include "cohort/nn/pooling2d.hpp"
#include "test_util.hpp"

using namespace cohort;

namespace {
constexpr double kTolerance = 1e-2;

void require_gradients(nn::Layer&& layer, const Shape& sample, nn::GradientCheckOptions options = {}) {
  const auto report = nn::check_gradients(layer, sample, options);
  INFO(layer.type_name() << " on " << sample.to_string() << ": worst " << report.worst);
  CHECK(report.max_relative_error < kTolerance);
}
}  // namespace

TEST_CASE("Conv2D gradients", "[nn][gradcheck]") {
  require_gradients(nn::Conv2D(4, 3, nn::Padding::Same), {5, 6, 3});
  require_gradients(nn::Conv2D(3, 3, nn::Padding::Valid), {5, 5, 2});
  require_gradients(nn::Conv2D(2, 3, nn::Padding::Same, 2), {7, 6, 2});
  require_gradients(nn::Conv2D(2, 2, nn::Padding::Valid, 1, false), {4, 4, 3});
  require_gradients(nn::Conv2D(3, 1), {3, 3, 4}, {.batch = 5});
  require_gradients(nn::Conv2D(8, 3, nn::Padding::Same), {5, 4, 8});    // Winograd
  require_gradients(nn::Conv2D(9, 3, nn::Padding::Valid), {5, 6, 10});  // Winograd
}

TEST_CASE("Dense gradients, on flat and on higher-rank input", "[nn][gradcheck]") {
  require_gradients(nn::Dense(5), {7});
  require_gradients(nn::Dense(3, false), {4, 6});
}

TEST_CASE("BatchNormalization gradients in training mode", "[nn][gradcheck]") {
  require_gradients(nn::BatchNormalization(), {3, 3, 4}, {.batch = 4});
  require_gradients(nn::BatchNormalization(), {6}, {.batch = 8});
}

TEST_CASE("BatchNormalization gradients in inference mode", "[nn][gradcheck]") {
  require_gradients(nn::BatchNormalization(), {2, 2, 3}, {.batch = 3, .training = false});
}

TEST_CASE("activation gradients", "[nn][gradcheck]") {
  for (auto activation : {Activation::Relu, Activation::Sigmoid, Activation::Tanh, Activation::Softmax, Activation::Linear}) {
    INFO("activation " << static_cast<int>(activation));
    require_gradients(nn::Activation(activation), {3, 5}, {.batch = 3});
  }
}

TEST_CASE("pooling gradients", "[nn][gradcheck]") {
  require_gradients(nn::MaxPooling2D(2), {6, 6, 3});
  require_gradients(nn::MaxPooling2D(3, 2, nn::Padding::Same), {5, 7, 2});
  require_gradients(nn::AveragePooling2D(2), {4, 6, 2});
  require_gradients(nn::AveragePooling2D(3, 2, nn::Padding::Same), {5, 5, 2});
}

TEST_CASE("Dropout and Flatten gradients", "[nn][gradcheck]") {
  require_gradients(nn::Dropout(0.4f), {4, 5});
  require_gradients(nn::Dropout(0.4f), {4, 5}, {.training = false});
  require_gradients(nn::Flatten(), {2, 3, 4});
}

TEST_CASE("cross-entropy gradients, fused with softmax and on probabilities", "[nn][gradcheck][loss]") {
  const std::int64_t rows = 4, classes = 5;
  for (bool from_logits : {true, false}) {
    Tensor prediction = test_util::random_tensor({rows, classes}, 11, from_logits ? -3.0f : 0.05f, from_logits ? 3.0f : 0.95f);
    for (bool sparse : {true, false}) {
      Tensor labels = sparse ? Tensor::from_values({rows}, std::vector<float>{0, 4, 2, 2})
                             : test_util::random_tensor({rows, classes}, 12, 0.0f, 1.0f);
      const nn::CategoricalCrossentropy loss{.from_logits = from_logits};
      Tensor gradient({rows, classes});
      loss.compute(prediction, labels, gradient);
      for (std::int64_t i = 0; i < prediction.numel(); ++i) {
        const float saved = prediction.data()[i];
        const double h = 1e-3;
        prediction.data()[i] = static_cast<float>(saved + h);
        const double plus = loss.compute(prediction, labels);
        prediction.data()[i] = static_cast<float>(saved - h);
        const double minus = loss.compute(prediction, labels);
        prediction.data()[i] = saved;
        INFO("from_logits " << from_logits << " sparse " << sparse << " entry " << i);
        CHECK(gradient.data()[i] == Approx((plus - minus) / (2 * h)).epsilon(2e-2).margin(1e-3));
      }
    }
  }
}

TEST_CASE("binary cross-entropy and regression losses: values and gradients", "[nn][gradcheck][loss]") {
  const std::int64_t rows = 3, outputs = 2;
  Tensor targets = Tensor::from_values({rows, outputs}, std::vector<float>{1, 0, 0, 1, 1, 1});
  const std::vector<std::pair<std::string, nn::Loss>> losses{
      {"bce logits", nn::BinaryCrossentropy{.from_logits = true}},
      {"bce probabilities", nn::BinaryCrossentropy{}},
      {"mse", nn::MeanSquaredError{}},
      {"mae", nn::MeanAbsoluteError{}}};
  for (const auto& [name, loss] : losses) {
    const bool probabilities = name == "bce probabilities";
    Tensor prediction = test_util::random_tensor({rows, outputs}, 21, probabilities ? 0.05f : -2.0f, probabilities ? 0.95f : 2.0f);
    const bool logits = nn::expects_logits(loss);
    Tensor gradient({rows, outputs});
    nn::compute_loss(loss, prediction, logits, targets, gradient);
    for (std::int64_t i = 0; i < prediction.numel(); ++i) {
      const float saved = prediction.data()[i];
      const double h = 1e-3;
      prediction.data()[i] = static_cast<float>(saved + h);
      const double plus = nn::compute_loss(loss, prediction, logits, targets);
      prediction.data()[i] = static_cast<float>(saved - h);
      const double minus = nn::compute_loss(loss, prediction, logits, targets);
      prediction.data()[i] = saved;
      INFO(name << " entry " << i);
      CHECK(gradient.data()[i] == Approx((plus - minus) / (2 * h)).epsilon(2e-2).margin(1e-3));
    }
  }
  // Known values: the logits form equals the probability form after a sigmoid.
  const Tensor logits = Tensor::from_values({1, 2}, std::vector<float>{0.5f, -1.0f});
  const Tensor probabilities = Tensor::from_values({1, 2}, std::vector<float>{1 / (1 + std::exp(-0.5f)), 1 / (1 + std::exp(1.0f))});
  const Tensor z = Tensor::from_values({1, 2}, std::vector<float>{1, 0});
  const double expected = (std::log1p(std::exp(-0.5)) + std::log1p(std::exp(-1.0))) / 2;
  CHECK(nn::BinaryCrossentropy{.from_logits = true}.compute(logits, z) == Approx(expected).epsilon(1e-6));
  CHECK(nn::BinaryCrossentropy{}.compute(probabilities, z) == Approx(expected).epsilon(1e-5));
  CHECK(nn::MeanSquaredError{}.compute(logits, z) == Approx((0.25 + 1.0) / 2));
  CHECK(nn::MeanAbsoluteError{}.compute(logits, z) == Approx((0.5 + 1.0) / 2));
  CHECK_THROWS_WITH(nn::MeanSquaredError{}.compute(logits, Tensor({1, 3})), Catch::Contains("shaped like the prediction"));
  CHECK(nn::MeanSquaredError{}.compute(Tensor({4, 0}), Tensor({4, 0})) == 0.0);  // rows of no outputs
}

TEST_CASE("metrics sum per sample: top-k counts ties against the label, the others average over outputs", "[nn][loss]") {
  const nn::Loss categorical = nn::SparseCategoricalCrossentropy{};
  const Tensor scores = Tensor::from_values({3, 4}, std::vector<float>{0.1f, 0.7f, 0.1f, 0.1f,    // label 0 ties two others
                                                                       0.4f, 0.3f, 0.2f, 0.1f,    // label 1 second
                                                                       0.25f, 0.25f, 0.25f, 0.25f});  // all tied
  const Tensor labels = Tensor::from_values({3}, std::vector<float>{0, 1, 3});
  CHECK(nn::Metric("accuracy").batch_sum(categorical, scores, false, labels) == 0.0);
  CHECK(nn::Metric::top_k_accuracy(1).batch_sum(categorical, scores, false, labels) == 0.0);
  CHECK(nn::Metric::top_k_accuracy(2).batch_sum(categorical, scores, false, labels) == 1.0);
  CHECK(nn::Metric::top_k_accuracy(3).batch_sum(categorical, scores, false, labels) == 1.0);
  CHECK(nn::Metric::top_k_accuracy(4).batch_sum(categorical, scores, false, labels) == 3.0);
  CHECK_THROWS_WITH(nn::Metric::top_k_accuracy(2).batch_sum(categorical, scores, false, Tensor::from_values({3}, std::vector<float>{0, 4, 1})),
                    Catch::Contains("label 4 of row 1 is not a class index in [0, 4)"));

  const nn::Loss binary = nn::BinaryCrossentropy{};
  const Tensor outputs = Tensor::from_values({2, 2}, std::vector<float>{0.6f, 0.4f, 0.5f, 0.9f});
  const Tensor targets = Tensor::from_values({2, 2}, std::vector<float>{1, 1, 0, 1});
  CHECK(nn::Metric("accuracy").batch_sum(binary, outputs, false, targets) == 0.5 + 1.0);  // 0.5 is not above 0.5
  const Tensor logits = Tensor::from_values({2, 2}, std::vector<float>{0.1f, -0.1f, 0.0f, 2.0f});
  CHECK(nn::Metric("accuracy").batch_sum(binary, logits, true, targets) == 0.5 + 1.0);
  CHECK(nn::Metric("mae").batch_sum(binary, outputs, false, targets) == Approx((0.4 + 0.6) / 2 + (0.5 + 0.1) / 2));
  CHECK(nn::Metric("mse").batch_sum(binary, outputs, false, targets) == Approx((0.16 + 0.36) / 2 + (0.25 + 0.01) / 2));
  // Given the logits of a sigmoid the loss took into itself, mae measures the model's output, the probabilities;
  // given a from_logits loss's logits, which are the output, the logits themselves.
  const auto sigmoid = [](double x) { return 1 / (1 + std::exp(-x)); };
  CHECK(nn::Metric("mae").batch_sum(binary, logits, true, targets) ==
        Approx((2 - sigmoid(0.1) - sigmoid(-0.1)) / 2 + (sigmoid(0.0) + 1 - sigmoid(2.0)) / 2));
  CHECK(nn::Metric("mae").batch_sum(nn::BinaryCrossentropy{.from_logits = true}, logits, true, targets) ==
        Approx((0.9 + 1.1) / 2 + (0.0 + 1.0) / 2));
  // A label whose score is not finite is in no top k; one elsewhere in the row does not rank.
  const Tensor broken = Tensor::from_values({2, 3}, std::vector<float>{NAN, 0, 0, 0.5f, NAN, 0.2f});
  const Tensor broken_labels = Tensor::from_values({2}, std::vector<float>{0, 2});
  CHECK(nn::Metric::top_k_accuracy(1).batch_sum(categorical, broken, false, broken_labels) == 0.0);
  CHECK(nn::Metric::top_k_accuracy(2).batch_sum(categorical, broken, false, broken_labels) == 1.0);
  CHECK(nn::Metric::top_k_accuracy(3).batch_sum(categorical, broken, false, broken_labels) == 1.0);
  CHECK_THROWS_WITH(nn::Metric("mse").batch_sum(binary, outputs, false, Tensor({2, 3})),
                    Catch::Contains("mse needs targets shaped like the prediction"));
}

TEST_CASE("the gradient checker catches a wrong gradient", "[nn][gradcheck]") {
  // A layer whose backward is off by a factor must fail the check: the check itself can fail.
  struct Wrong : nn::ActivationLayer {
    Wrong() : nn::ActivationLayer(Activation::Tanh) {}
    Tensor backward(const Tensor& dy, bool need) override {
      Tensor dx = nn::ActivationLayer::backward(dy, need).clone();
      for (float& v : dx.values()) v *= 1.5f;
      return dx;
    }
  } wrong;
  CHECK(nn::check_gradients(wrong, {4}).max_relative_error > 0.1);
}
