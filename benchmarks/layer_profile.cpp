// Where the flagship CIFAR-10 model spends its time, layer by layer (median milliseconds over the steps):
// a training step's forward and backward, then the loss and the Adam update, and inference's eval-mode
// forward, at batch 128 unless told.
//
//   ./build/benchmarks/cohort_layer_profile [THREADS] [STEPS] [BATCH]   (make bench: 1 and 2 threads)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include <cohort/cohort.hpp>

using namespace cohort;

namespace {

using Clock = std::chrono::steady_clock;

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 10;
  const std::int64_t batch = argc > 3 ? std::atoll(argv[3]) : 128;
  if (threads < 1 || steps < 1 || batch < 1) {
    fmt::print(stderr, "usage: cohort_layer_profile [THREADS >= 1] [STEPS >= 1] [BATCH >= 1]\n");
    return 2;
  }
  set_num_threads(threads);
  nn::Sequential model = nn::cifar10_cnn({32, 32, 3}, 1);
  optim::Adam adam;
  const Tensor images = Tensor::full({batch, 32, 32, 3}, 0.5f);
  Tensor labels({batch});
  for (std::int64_t i = 0; i < batch; ++i) labels.data()[i] = static_cast<float>(i % 10);
  Tensor gradient({batch, 10});
  const std::size_t layers = model.size() - 1;  // the final Softmax is fused into the loss
  std::vector<std::vector<double>> forward(layers), backward(layers), inference(layers);
  std::vector<double> loss, update;
  for (int step = -2; step < steps; ++step) {  // two warm-up steps
    const nn::ForwardContext context{true, static_cast<std::uint64_t>(step + 2)};
    Tensor activation = images;
    for (std::size_t i = 0; i < layers; ++i) {
      const auto start = Clock::now();
      activation = model.layer(i).forward(activation, context);
      if (step >= 0) forward[i].push_back(milliseconds_since(start));
    }
    auto start = Clock::now();
    ops::softmax_cross_entropy(activation, labels, gradient);
    if (step >= 0) loss.push_back(milliseconds_since(start));
    Tensor upstream = gradient;
    for (std::size_t i = layers; i-- > 0;) {
      start = Clock::now();
      upstream = model.layer(i).backward(upstream, i > 0);
      if (step >= 0) backward[i].push_back(milliseconds_since(start));
    }
    start = Clock::now();
    train::update_variables(adam, model.trainable_variables());
    if (step >= 0) update.push_back(milliseconds_since(start));
    activation = images;
    for (std::size_t i = 0; i < layers; ++i) {
      start = Clock::now();
      activation = model.layer(i).forward(activation, nn::ForwardContext{false, 0});
      if (step >= 0) inference[i].push_back(milliseconds_since(start));
    }
  }
  fmt::print("flagship CIFAR-10 model at batch {}, {} thread(s), matrix products through {}: median ms per layer\n",
             batch, threads, gemm_path_name(gemm_path()));
  fmt::print("{:<24}{:>10}{:>10}{:>8}{:>12}\n", "layer", "forward", "backward", "share", "inference");
  double total = median(loss) + median(update), inference_total = 0.0;
  for (std::size_t i = 0; i < layers; ++i) {
    total += median(forward[i]) + median(backward[i]);
    inference_total += median(inference[i]);
  }
  for (std::size_t i = 0; i < layers; ++i) {
    const double f = median(forward[i]), b = median(backward[i]);
    fmt::print("{:<24}{:>10.2f}{:>10.2f}{:>7.1f}%{:>12.3f}\n", model.layer(i).name(), f, b, 100.0 * (f + b) / total,
               median(inference[i]));
  }
  fmt::print("{:<24}{:>10.2f}{:>10}{:>7.1f}%\n", "softmax cross-entropy", median(loss), "", 100.0 * median(loss) / total);
  fmt::print("{:<24}{:>10.2f}{:>10}{:>7.1f}%\n", "adam update", median(update), "", 100.0 * median(update) / total);
  fmt::print("training: {:.2f} ms per step, {:.0f} images/s; inference: {:.2f} ms per batch, {:.0f} images/s\n", total,
             1000.0 * batch / total, inference_total, 1000.0 * batch / inference_total);
}
