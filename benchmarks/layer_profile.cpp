// Where a training step of the flagship CIFAR-10 model spends its time, layer by layer: forward and
// backward milliseconds per layer at batch 128 (median over the steps), then the loss and the Adam update.
//
//   ./build/benchmarks/cohort_layer_profile [THREADS] [STEPS]      (make bench prints it for 1 and 2 threads)
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
  set_num_threads(threads);
  constexpr std::int64_t kBatch = 128;
  nn::Sequential model = nn::cifar10_cnn({32, 32, 3}, 1);
  optim::Adam adam;
  const Tensor images = Tensor::full({kBatch, 32, 32, 3}, 0.5f);
  Tensor labels({kBatch});
  for (std::int64_t i = 0; i < kBatch; ++i) labels.data()[i] = static_cast<float>(i % 10);
  Tensor gradient({kBatch, 10});
  const std::size_t layers = model.size() - 1;  // the final Softmax is fused into the loss
  std::vector<std::vector<double>> forward(layers), backward(layers);
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
  }
  fmt::print("flagship training step at batch {}, {} thread(s), matrix products through {}: median ms per layer\n",
             kBatch, threads, gemm_path_name(gemm_path()));
  fmt::print("{:<28}{:>10}{:>10}{:>10}\n", "layer", "forward", "backward", "share");
  double total = median(loss) + median(update);
  for (std::size_t i = 0; i < layers; ++i) total += median(forward[i]) + median(backward[i]);
  for (std::size_t i = 0; i < layers; ++i) {
    const double f = median(forward[i]), b = median(backward[i]);
    fmt::print("{:<28}{:>10.2f}{:>10.2f}{:>9.1f}%\n", model.layer(i).name(), f, b, 100.0 * (f + b) / total);
  }
  fmt::print("{:<28}{:>10.2f}{:>10}{:>9.1f}%\n", "softmax cross-entropy", median(loss), "", 100.0 * median(loss) / total);
  fmt::print("{:<28}{:>10.2f}{:>10}{:>9.1f}%\n", "adam update", median(update), "", 100.0 * median(update) / total);
  fmt::print("{:<28}{:>10.2f} ms per step, {:.0f} images/s\n", "total", total, 1000.0 * kBatch / total);
}
