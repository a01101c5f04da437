#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/batch_normalization.hpp"
#include "cohort/nn/conv2d.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/dropout.hpp"
#include "cohort/nn/flatten.hpp"
#include "cohort/nn/pooling2d.hpp"
#include "cohort/nn/sequential.hpp"
#include "cohort/nn/zoo.hpp"
#include "test_util.hpp"

using namespace cohort;

TEST_CASE("same and valid padding give Keras' output shapes", "[nn][shapes]") {
  nn::Sequential model({7, 8, 3});
  model.add(nn::Conv2D(4, 3, nn::Padding::Same));
  CHECK(model.output_shape() == Shape({7, 8, 4}));
  model.add(nn::Conv2D(4, 3, nn::Padding::Same, 2));
  CHECK(model.output_shape() == Shape({4, 4, 4}));
  model.add(nn::Conv2D(2, 3, nn::Padding::Valid));
  CHECK(model.output_shape() == Shape({2, 2, 2}));
  model.add(nn::MaxPooling2D(2));
  CHECK(model.output_shape() == Shape({1, 1, 2}));
  model.add(nn::Flatten()).add(nn::Dense(3));
  CHECK(model.output_shape() == Shape({3}));
  Tensor y = model.forward(Tensor({5, 7, 8, 3}));
  CHECK(y.shape() == Shape({5, 3}));
}

TEST_CASE("impossible layer configurations fail when added, naming the problem", "[nn][shapes]") {
  nn::Sequential model({2, 2, 1});
  CHECK_THROWS_AS(model.add(nn::Conv2D(1, 3, nn::Padding::Valid)), InvalidArgument);
  CHECK_THROWS_AS(nn::Conv2D(0, 3), InvalidArgument);
  CHECK_THROWS_AS(nn::Dropout(1.0f), InvalidArgument);
  nn::Sequential flat({10});
  CHECK_THROWS_AS(flat.add(nn::Conv2D(1, 1)), InvalidArgument);
  CHECK_THROWS_AS(nn::Sequential({0, 3}), InvalidArgument);
  nn::Sequential ok({4});
  ok.add(nn::Dense(2));
  CHECK_THROWS_AS(ok.forward(Tensor({3, 5})), InvalidArgument);
}

TEST_CASE("variables have Keras names, creation order, trainable flags and default values", "[nn][keras]") {
  nn::Sequential model({6, 6, 2}, 3);
  model.add(nn::Conv2D(4, 3, nn::Padding::Same)).add(nn::BatchNormalization()).add(nn::ReLU());
  model.add(nn::Conv2D(4, 3)).add(nn::BatchNormalization()).add(nn::Flatten()).add(nn::Dense(3));
  const auto variables = model.variables();
  std::vector<std::string> names;
  for (const auto& v : variables) names.push_back(v->name);
  const std::vector<std::string> expected = {
      "conv2d/kernel", "conv2d/bias", "batch_normalization/gamma", "batch_normalization/beta",
      "batch_normalization/moving_mean", "batch_normalization/moving_variance", "conv2d_1/kernel", "conv2d_1/bias",
      "batch_normalization_1/gamma", "batch_normalization_1/beta", "batch_normalization_1/moving_mean",
      "batch_normalization_1/moving_variance", "dense/kernel", "dense/bias"};
  CHECK(names == expected);
  for (std::size_t i = 0; i < variables.size(); ++i) CHECK(variables[i]->creation_order == static_cast<int>(i));
  CHECK_FALSE(model.variable("batch_normalization/moving_mean")->trainable);
  CHECK(model.variable("batch_normalization/gamma")->trainable);
  CHECK(model.trainable_variables().size() == 10);
  for (float v : model.variable("batch_normalization/gamma")->value.values()) CHECK(v == 1.0f);
  for (float v : model.variable("batch_normalization/moving_variance")->value.values()) CHECK(v == 1.0f);
  for (float v : model.variable("conv2d/bias")->value.values()) CHECK(v == 0.0f);
  // glorot_uniform: |w| <= sqrt(6 / (fan_in + fan_out)), fan = 3*3*channels
  const float limit = std::sqrt(6.0f / (9 * 2 + 9 * 4));
  float largest = 0;
  for (float v : model.variable("conv2d/kernel")->value.values()) largest = std::max(largest, std::abs(v));
  CHECK(largest <= limit);
  CHECK(largest > 0.8f * limit);
  const nn::BatchNormalization defaults;
  CHECK(defaults.options().momentum == 0.99f);
  CHECK(defaults.options().epsilon == 1e-3f);
  CHECK_THROWS_AS(model.variable("nope"), InvalidArgument);
}

TEST_CASE("initial values depend on the seed and the variable name only", "[nn]") {
  auto kernel = [](std::uint64_t seed, bool extra_layer) {
    nn::Sequential model({4}, seed);
    if (extra_layer) model.add(nn::Activation(Activation::Tanh));
    model.add(nn::Dense(3));
    return model.variable("dense/kernel")->value.to_vector();
  };
  CHECK(kernel(1, false) == kernel(1, true));
  CHECK(kernel(1, false) != kernel(2, false));
}

TEST_CASE("counts in summaries and tables are grouped by thousands", "[nn]") {
  CHECK(with_thousands(0) == "0");
  CHECK(with_thousands(999) == "999");
  CHECK(with_thousands(1000) == "1,000");
  CHECK(with_thousands(-1234567) == "-1,234,567");
  CHECK(with_thousands(-100) == "-100");
  CHECK(with_thousands(INT64_MIN) == "-9,223,372,036,854,775,808");
}

TEST_CASE("the flagship model's summary has Keras' shapes and parameter counts", "[nn][keras]") {
  const nn::Sequential model = nn::cifar10_cnn({32, 32, 3});
  const std::string summary = model.summary();
  // Keras: Total params: 556,586; Trainable params: 555,690; Non-trainable params: 896
  CHECK(model.parameter_count() == 556586);
  CHECK(summary.find("Total params: 556,586") != std::string::npos);
  CHECK(summary.find("Trainable params: 555,690") != std::string::npos);
  CHECK(summary.find("Non-trainable params: 896") != std::string::npos);
  CHECK(summary.find("conv2d_1 (Conv2D)") != std::string::npos);
  CHECK(summary.find("(None, 30, 30, 32)") != std::string::npos);
  CHECK(summary.find("(None, 2, 2, 128)") != std::string::npos);
  CHECK(summary.find("dense_1 (Dense)") != std::string::npos);
  CHECK(summary.find("activation_7 (Activation)") != std::string::npos);
  CHECK(model.final_activation() == Activation::Softmax);
}

TEST_CASE("BatchNormalization uses batch statistics in training and moving ones in inference", "[nn]") {
  nn::Sequential model({3});
  model.add(nn::BatchNormalization());
  const Tensor x = Tensor::from_values({4, 3}, std::vector<float>{1, 2, 3, 3, 2, 1, 5, 2, 0, 7, 2, 4});
  model.train();
  const Tensor y = model.forward(x).clone();
  // channel 0: mean 4, biased variance 5 -> (1 - 4) / sqrt(5 + 1e-3)
  CHECK(y.data()[0] == Approx(-3.0 / std::sqrt(5.001)).epsilon(1e-5));
  const auto moving_mean = model.variable("batch_normalization/moving_mean")->value.to_vector();
  const auto moving_variance = model.variable("batch_normalization/moving_variance")->value.to_vector();
  CHECK(moving_mean[0] == Approx(0.01 * 4));
  CHECK(moving_variance[0] == Approx(0.99 + 0.01 * 5));
  model.eval();
  const Tensor z = model.forward(x);
  CHECK(z.data()[0] == Approx((1 - moving_mean[0]) / std::sqrt(moving_variance[0] + 1e-3)).epsilon(1e-5));
  CHECK(model.variable("batch_normalization/moving_mean")->value.to_vector() == moving_mean);  // inference does not update
}

TEST_CASE("Dropout acts only in training, and the same step gives the same mask", "[nn]") {
  nn::Sequential model({1000}, 5);
  model.add(nn::Dropout(0.5f));
  const Tensor x = Tensor::full({2, 1000}, 1.0f);
  model.eval();
  CHECK(model.forward(x).to_vector() == x.to_vector());
  model.train();
  const auto first = model.forward(x).to_vector();
  const auto second = model.forward(x).to_vector();
  CHECK(first != second);  // a new step draws a new mask
  const auto zeros = std::count(first.begin(), first.end(), 0.0f);
  CHECK(zeros == Approx(1000).margin(100));
  model.set_step(0);
  CHECK(model.forward(x).to_vector() == first);
}

TEST_CASE("a model counts the multiply-adds of one sample's forward pass", "[nn]") {
  nn::Sequential model({6, 6, 2});
  model.add(nn::Conv2D(4, 3, nn::Padding::Same)).add(nn::BatchNormalization()).add(nn::ReLU());
  model.add(nn::Conv2D(3, 3, nn::Padding::Valid, 2)).add(nn::MaxPooling2D(2)).add(nn::Flatten()).add(nn::Dense(5));
  // 6x6x4 outputs of 3x3x2 taps; 2x2x3 outputs of 3x3x4; after pooling 1x1x3 into 5 units.
  CHECK(model.multiply_adds_per_sample() == 6 * 6 * 4 * 9 * 2 + 2 * 2 * 3 * 9 * 4 + 3 * 5);
  nn::Sequential rows({7, 8});  // a Dense layer on every row of its sample
  rows.add(nn::Dense(2));
  CHECK(rows.multiply_adds_per_sample() == 7 * 8 * 2);
}

TEST_CASE("backward needs a forward pass first", "[nn]") {
  nn::Sequential model({3});
  model.add(nn::Dense(2));
  CHECK_THROWS_AS(model.backward(Tensor({1, 2})), InvalidArgument);
  nn::Sequential empty({3});
  CHECK_THROWS_AS(empty.forward(Tensor({1, 3})), InvalidArgument);
}

namespace {

// Layers that fuse in every way Sequential offers: Conv2D + BatchNormalization + ReLU (folded in inference;
// the RGB input's direct kernel, then Winograd without a bias), Conv2D + ReLU (stride 2: im2col),
// BatchNormalization + Sigmoid, Dense + BatchNormalization + Tanh, Dense + ReLU, and a final Softmax that
// none absorbs.
nn::Sequential fusing_model() {
  nn::Sequential model({10, 10, 3}, 11);
  model.add(nn::Conv2D(8, 3, nn::Padding::Same)).add(nn::BatchNormalization()).add(nn::ReLU());
  model.add(nn::Conv2D(8, 3, nn::Padding::Same, 1, false)).add(nn::BatchNormalization()).add(nn::ReLU());
  model.add(nn::Conv2D(8, 3, nn::Padding::Valid, 2)).add(nn::ReLU()).add(nn::MaxPooling2D(2));
  model.add(nn::BatchNormalization()).add(nn::Sigmoid()).add(nn::Flatten());
  model.add(nn::Dense(16)).add(nn::BatchNormalization()).add(nn::Activation(cohort::Activation::Tanh));
  model.add(nn::Dense(12)).add(nn::ReLU()).add(nn::Dense(4)).add(nn::Softmax());
  return model;
}

// Every layer's forward() in turn, none absorbing another: the unfused reference.
Tensor forward_one_by_one(nn::Sequential& model, const Tensor& x, bool training) {
  Tensor activation = x;
  for (std::size_t i = 0; i < model.size(); ++i) activation = model.layer(i).forward(activation, {training, 0});
  return activation.clone();
}

void backward_one_by_one(nn::Sequential& model, const Tensor& dy) {
  Tensor gradient = dy;
  for (std::size_t i = model.size(); i-- > 0;) gradient = model.layer(i).backward(gradient, i > 0);
}

void check_same_variables(const nn::Sequential& a, const nn::Sequential& b, float tolerance) {
  for (const auto& v : a.variables()) {
    INFO(v->name);
    CHECK(test_util::max_abs_difference(v->value, b.variable(v->name)->value) <= tolerance);
    if (v->trainable) CHECK(test_util::max_abs_difference(v->gradient, b.variable(v->name)->gradient) <= tolerance);
  }
}

}  // namespace

TEST_CASE("a Sequential's fused layers give the results of its layers run one by one", "[nn][fused]") {
  nn::Sequential fused = fusing_model(), reference = fusing_model();
  const Tensor x = test_util::random_tensor({6, 10, 10, 3}, 12);
  const Tensor dy = test_util::random_tensor({6, 4}, 13);
  REQUIRE(fused.output_shape() == Shape({4}));

  SECTION("training, forward and backward") {
    fused.train();
    for (int step = 0; step < 2; ++step) {
      const Tensor y = fused.forward(x).clone();
      CHECK(test_util::max_abs_difference(y, forward_one_by_one(reference, x, true)) < 1e-6f);
      fused.backward(dy);
      backward_one_by_one(reference, dy);
      check_same_variables(fused, reference, 1e-5f);  // gradients and moving statistics
    }
  }
  SECTION("eval mode keeps a backward") {
    fused.eval();
    CHECK(test_util::max_abs_difference(fused.forward(x).clone(), forward_one_by_one(reference, x, false)) < 1e-6f);
    fused.backward(dy);
    backward_one_by_one(reference, dy);
    check_same_variables(fused, reference, 1e-5f);
  }
  SECTION("inference folds BatchNormalization into the Conv2D before it and allows no backward") {
    // Statistics away from their initial values, so that the folding has something to fold.
    fused.train();
    reference.train();
    for (int step = 0; step < 3; ++step) {
      fused.forward(x);
      forward_one_by_one(reference, x, true);
    }
    const std::uint64_t step = fused.step();
    const Tensor inferred = fused.infer(x).clone();
    CHECK(fused.step() == step);
    CHECK(test_util::max_abs_difference(inferred, forward_one_by_one(reference, x, false)) < 1e-5f);
    CHECK_THROWS_AS(fused.backward(dy), InvalidArgument);
    // What the layers absorbed held for that call only: run one by one, they compute themselves alone.
    CHECK(test_util::max_abs_difference(forward_one_by_one(fused, x, false), forward_one_by_one(reference, x, false)) ==
          0.0f);
    // Logits: all but the Softmax.
    const Tensor logits = fused.infer_logits(x).clone();
    Tensor probabilities(logits.shape());
    ops::activation_forward(cohort::Activation::Softmax, logits, probabilities);
    CHECK(test_util::max_abs_difference(probabilities, inferred) < 1e-6f);
  }
}

TEST_CASE("a bias that a BatchNormalization cancels is left out in training, with the moving mean it would give",
          "[nn][fused]") {
  nn::Sequential fused = fusing_model(), reference = fusing_model();
  // Biases away from zero, so that leaving one out shows in the moving mean unless it is counted there.
  for (nn::Sequential* model : {&fused, &reference}) {
    std::uint64_t seed = 30;
    for (const auto& v : model->variables())
      if (v->name.ends_with("/bias")) ops::copy(test_util::random_tensor(v->value.shape(), seed++, 0.5f, 1.5f), v->value);
  }
  const Tensor x = test_util::random_tensor({6, 10, 10, 3}, 12);
  const Tensor dy = test_util::random_tensor({6, 4}, 13);
  fused.train();
  for (int step = 0; step < 3; ++step) {
    CHECK(test_util::max_abs_difference(fused.forward(x).clone(), forward_one_by_one(reference, x, true)) < 1e-5f);
    fused.backward(dy);
    backward_one_by_one(reference, dy);
    check_same_variables(fused, reference, 1e-5f);  // the moving means above all
    // The first Conv2D's bias, which the BatchNormalization after it cancels: exactly zero, not rounding.
    const auto& cancelled = fused.layer(0).variables().back();
    REQUIRE(cancelled->name.ends_with("/bias"));
    CHECK(std::ranges::all_of(cancelled->gradient.to_vector(), [](float g) { return g == 0.0f; }));
  }
  // Inference (the normalization folded into the convolution, with the bias) agrees with the layers one by one.
  CHECK(test_util::max_abs_difference(fused.infer(x).clone(), forward_one_by_one(reference, x, false)) < 1e-5f);
}

namespace {

// A subclass that scales the output of the built-in layer it derives from: it computes something else, so it
// must not be fused as that layer.
template <typename Base>
class ScaledOutput : public Base {
 public:
  ScaledOutput(Base base, float factor) : Base(std::move(base)), factor_(factor) {}
  Tensor forward(const Tensor& x, const nn::ForwardContext& context) override {
    scaled_ = Base::forward(x, context).clone();
    ops::scale(scaled_, factor_);
    return scaled_;
  }

 private:
  float factor_;
  Tensor scaled_;
};

}  // namespace

TEST_CASE("subclasses of the fusable layers are run as themselves, not fused", "[nn][fused]") {
  const auto build = [] {
    nn::Sequential model({6, 6, 2}, 5);
    model.add(nn::Conv2D(4, 3, nn::Padding::Same))
        .add(ScaledOutput<nn::BatchNormalization>(nn::BatchNormalization(), 10.0f))
        .add(nn::Flatten());
    model.add(nn::Dense(3)).add(ScaledOutput<nn::ActivationLayer>(nn::ReLU(), 2.0f));
    return model;
  };
  nn::Sequential fused = build(), reference = build();
  const Tensor x = test_util::random_tensor({2, 6, 6, 2}, 6);
  CHECK(test_util::max_abs_difference(fused.infer(x).clone(), forward_one_by_one(reference, x, false)) < 1e-5f);
  fused.train();
  CHECK(test_util::max_abs_difference(fused.forward(x).clone(), forward_one_by_one(reference, x, true)) == 0.0f);
}

TEST_CASE("backward refuses a gradient that does not have the output's shape", "[nn][fused]") {
  nn::Sequential model({4}, 3);
  model.add(nn::Dense(6)).add(nn::ReLU());  // fused: no activation layer left to compare the shapes
  model.train();
  model.forward(test_util::random_tensor({2, 4}, 4));
  CHECK_THROWS_AS(model.backward(test_util::random_tensor({3, 4}, 5)), InvalidArgument);
  CHECK_NOTHROW(model.backward(test_util::random_tensor({2, 6}, 5)));
}
