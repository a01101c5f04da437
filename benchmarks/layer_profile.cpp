// Where the flagship CIFAR-10 model spends its time, layer by layer (median milliseconds over the steps):
// a training step's forward and backward, then the loss and the Adam update, and inference's eval-mode
// forward, at batch 128 unless told.
//
//   ./build/benchmarks/cohort_layer_profile [THREADS] [STEPS] [BATCH] [PRECISION]   (make bench: 1 and 2 threads)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <span>
#include <string>
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

// The model's layers as Sequential runs them: each group is one layer's forward() and backward() with the
// layers it absorbed (fused passes), timed as one.
struct Group {
  std::size_t first = 0, absorbed = 0;
  std::vector<double> forward, backward;
};

std::string group_name(const nn::Sequential& model, const Group& group) {
  std::string name = model.layer(group.first).name();
  for (std::size_t i = 1; i <= group.absorbed; ++i) name += "+" + model.layer(group.first + i).name();
  return name;
}

// Runs the first `end` layers forward with fusion, timing each group; `groups` is filled on the first call.
Tensor timed_forward(nn::Sequential& model, std::size_t end, const nn::ForwardContext& context, Tensor activation,
                     std::vector<Group>& groups, bool record) {
  const bool first_call = groups.empty();
  std::size_t g = 0;
  for (std::size_t i = 0; i < end; ++g) {
    nn::Layer& layer = model.layer(i);
    const auto start = Clock::now();
    const std::size_t absorbed = layer.absorb(model.layers().subspan(i + 1, end - i - 1), context);
    activation = layer.forward(activation, context);
    if (first_call) groups.push_back({i, absorbed, {}, {}});
    if (record) groups[g].forward.push_back(milliseconds_since(start));
    i += 1 + absorbed;
  }
  return activation;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 10;
  const std::int64_t batch = argc > 3 ? std::atoll(argv[3]) : 128;
  const auto precision = nn::parse_precision(argc > 4 ? argv[4] : "float32");
  if (!precision) {
    std::fprintf(stderr, "precision: float32, mixed_bfloat16 or mixed_float16\n");
    return 2;
  }
  if (threads < 1 || steps < 1 || batch < 1) {
    fmt::print(stderr, "usage: cohort_layer_profile [THREADS >= 1] [STEPS >= 1] [BATCH >= 1] [PRECISION]\n");
    return 2;
  }
  set_num_threads(threads);
  nn::Sequential model = nn::cifar10_cnn({32, 32, 3}, 1);
  model.set_precision(*precision);
  optim::Adam adam;
  // The layers are driven one by one, so they get what Sequential hands them: the batch in the compute type.
  const DType compute = nn::compute_dtype(*precision);
  const Tensor images = Tensor::full({batch, 32, 32, 3}, 0.5f).to(compute);
  Tensor labels({batch});
  for (std::int64_t i = 0; i < batch; ++i) labels.data()[i] = static_cast<float>(i % 10);
  Tensor gradient({batch, 10});
  const std::size_t layers = model.size() - 1;  // the final Softmax is fused into the loss
  std::vector<Group> training, inference;
  std::vector<double> loss, update;
  for (int step = -2; step < steps; ++step) {  // two warm-up steps
    const bool record = step >= 0;
    const nn::ForwardContext context{true, static_cast<std::uint64_t>(step + 2)};
    Tensor activation = timed_forward(model, layers, context, images, training, record);
    auto start = Clock::now();
    ops::softmax_cross_entropy(activation.to(DType::Float32), labels, gradient);
    if (record) loss.push_back(milliseconds_since(start));
    Tensor upstream = gradient.to(compute);
    for (auto group = training.rbegin(); group != training.rend(); ++group) {
      start = Clock::now();
      upstream = model.layer(group->first).backward(upstream, group->first > 0);
      if (record) group->backward.push_back(milliseconds_since(start));
    }
    start = Clock::now();
    train::update_variables(adam, model.trainable_variables());
    if (record) update.push_back(milliseconds_since(start));
    timed_forward(model, layers, {.training = false, .step = 0, .inference_only = true}, images, inference, record);
  }
  fmt::print("flagship CIFAR-10 model at batch {}, {} thread(s), matrix products through {}: median ms per layer "
             "(a+b: b fused into a)\n",
             batch, threads, gemm_path_name(gemm_path()));
  fmt::print("{:<48}{:>10}{:>10}{:>8}\n", "training", "forward", "backward", "share");
  double total = median(loss) + median(update);
  for (const Group& group : training) total += median(group.forward) + median(group.backward);
  for (const Group& group : training) {
    const double f = median(group.forward), b = median(group.backward);
    fmt::print("{:<48}{:>10.2f}{:>10.2f}{:>7.1f}%\n", group_name(model, group), f, b, 100.0 * (f + b) / total);
  }
  fmt::print("{:<48}{:>10.2f}{:>10}{:>7.1f}%\n", "softmax cross-entropy", median(loss), "", 100.0 * median(loss) / total);
  fmt::print("{:<48}{:>10.2f}{:>10}{:>7.1f}%\n", "adam update", median(update), "", 100.0 * median(update) / total);
  double inference_total = 0.0;
  for (const Group& group : inference) inference_total += median(group.forward);
  fmt::print("{:<48}{:>10}{:>18}\n", "inference", "forward", "share");
  for (const Group& group : inference)
    fmt::print("{:<48}{:>10.2f}{:>17.1f}%\n", group_name(model, group), median(group.forward),
               100.0 * median(group.forward) / inference_total);
  fmt::print("training: {:.2f} ms per step, {:.0f} images/s; inference: {:.2f} ms per batch, {:.0f} images/s\n", total,
             1000.0 * batch / total, inference_total, 1000.0 * batch / inference_total);
}
