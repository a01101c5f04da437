// The flagship CIFAR-10 CNN's training and inference throughput on one device, for the GPU comparison
// (benchmarks/gpu_compare.sh) and for quick checks of any device:
//   flagship_throughput --device cuda --batch 128 --seconds 10 [--precision mixed_bfloat16]
// prints
//   cohort device=cuda precision=float32 batch=128 train_images/s=X inference_images/s=Y train_tflop/s=A inference_tflop/s=B
// counting 2 FLOPs per multiply-add of the convolutions and products (nn::Sequential::multiply_adds_per_sample),
// 3 passes' worth per training step (forward, and the data and weight gradients).
// A training step is forward, the fused softmax cross-entropy (its loss read back, as fit() does), backward
// and Adam; inference is a forward pass in evaluation mode. Inputs live on the device, as after the
// trainer's asynchronous copy. Under mixed_bfloat16 the layers compute in bfloat16 from float32 variables,
// as fit() runs them; mixed_float16 is left to fit(), whose loss scaling a bare step would leave out.
#include <cohort/cohort.hpp>

#include <chrono>
#include <cstdlib>
#include <string>

#include "cohort/train/update.hpp"

using namespace cohort;

namespace {

using Clock = std::chrono::steady_clock;

template <class Step>
double images_per_second(Device device, std::int64_t batch, double seconds, Step&& step) {
  for (int i = 0; i < 3; ++i) step();  // warm-up: plans, algorithm choice, the caching allocator
  ops::synchronize(device);
  std::int64_t steps = 0;
  const auto start = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - start).count() < seconds || steps < 5) {
    step();
    ++steps;
  }
  ops::synchronize(device);
  return static_cast<double>(steps * batch) / std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) try {
  std::string device_name = "auto";
  std::int64_t batch = 128;
  double seconds = 5.0;
  nn::Precision precision = nn::Precision::Float32;
  constexpr const char* kUsage =
      "usage: flagship_throughput [--device cpu|cuda|emulated|auto] [--batch N] [--seconds S] "
      "[--precision float32|mixed_bfloat16]";
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      fmt::print("{}\n", kUsage);
      return 0;
    }
    if (i + 1 >= argc) throw InvalidArgument(fmt::format("{} needs a value; {}", flag, kUsage));
    const std::string value = argv[i + 1];
    try {
      if (flag == "--device") device_name = value;
      else if (flag == "--batch") batch = std::stoll(value);
      else if (flag == "--seconds") seconds = std::stod(value);
      else if (flag == "--precision") {
        const auto parsed = nn::parse_precision(value);
        if (!parsed || *parsed == nn::Precision::MixedFloat16)
          throw InvalidArgument(fmt::format("--precision takes float32 or mixed_bfloat16, got '{}'", value));
        precision = *parsed;
      } else throw InvalidArgument(fmt::format("unknown option '{}'; {}", flag, kUsage));
    } catch (const std::logic_error&) {  // std::stoll / std::stod: not a number
      throw InvalidArgument(fmt::format("{} needs a number, got '{}'", flag, value));
    }
    if (batch < 1 || !(seconds > 0)) throw InvalidArgument("--batch and --seconds must be positive");
  }
  const Device device = choose_device(device_name);
  nn::Sequential model = nn::cifar10_cnn({32, 32, 3}, 1, device);
  model.set_precision(precision);
  optim::Adam adam;
  adam.to(device);
  Tensor host_images({batch, 32, 32, 3}), host_labels({batch});
  for (std::int64_t i = 0; i < host_images.numel(); ++i) host_images.data()[i] = static_cast<float>(i % 255) / 255.0f;
  for (std::int64_t i = 0; i < batch; ++i) host_labels.data()[i] = static_cast<float>(i % 10);
  const Tensor images = host_images.to(device), labels = host_labels.to(device);
  const Tensor gradient({batch, 10}, device);

  model.train();
  const double train = images_per_second(device, batch, seconds, [&] {
    const Tensor logits = model.forward_logits(images);
    ops::softmax_cross_entropy(logits, labels, gradient);
    model.backward(gradient);
    train::update_variables(adam, model.trainable_variables());
  });
  const double inference = images_per_second(device, batch, seconds, [&] { model.infer(images); });
  const double forward_flops = 2.0 * static_cast<double>(model.multiply_adds_per_sample());
  fmt::print("cohort device={} precision={} batch={} train_images/s={:.1f} inference_images/s={:.1f} "
             "train_tflop/s={:.2f} inference_tflop/s={:.2f}\n",
             cohort::device_name(device), nn::precision_name(precision), batch, train, inference,
             3 * forward_flops * train * 1e-12, forward_flops * inference * 1e-12);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "flagship_throughput: {}\n", e.what());
  return 1;
}
