// The flagship CIFAR-10 CNN's training and inference throughput on one device, for the GPU comparison
// (benchmarks/gpu_compare.sh) and for quick checks of any device:
//   flagship_throughput --device cuda --batch 128 --seconds 10 [--precision mixed_bfloat16]
// prints
//   cohort device=cuda precision=float32 batch=128 train_images/s=X inference_images/s=Y train_tflop/s=A inference_tflop/s=B captured=yes
// counting 2 FLOPs per multiply-add of the convolutions and products (nn::Sequential::multiply_adds_per_sample),
// 3 passes' worth per training step (forward, and the data and weight gradients).
// A training step is forward, the fused softmax cross-entropy (its loss summed on the device, read by no one,
// as fit() does between progress-bar redraws), backward
// and Adam; inference is a forward pass in evaluation mode. Inputs live on the device, as after the
// trainer's asynchronous copy. Under mixed_bfloat16 the layers compute in bfloat16 from float32 variables,
// as fit() runs them; mixed_float16 is left to fit(), whose loss scaling a bare step would leave out. On a device
// that records work (a GPU, the emulated device), each step and each inference is captured after the warm-up and
// replayed (tensor/capture.hpp), as fit() replays its steps; --no-capture runs them op by op.
//   flagship_throughput --device cuda --largest-batch [--precision mixed_bfloat16]
// instead finds the largest batch whose training step and inference fit in the device's memory, within 1/64
// (doubling from --batch, then halving the gap; each try a fresh model), and prints
//   cohort device=cuda precision=float32 largest_batch=N step_peak_MiB=M
#include <cohort/cohort.hpp>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "cohort/train/update.hpp"

using namespace cohort;

namespace {

using Clock = std::chrono::steady_clock;

// The flagship model on a device with a batch of inputs there, its optimizer and its gradient buffer.
struct Flagship {
  Flagship(Device device, nn::Precision precision, std::int64_t batch)
      : model(nn::cifar10_cnn({32, 32, 3}, 1, device)), gradient({batch, 10}, device), loss_sum(device, 1) {
    model.set_precision(precision);
    adam.to(device);
    Tensor host_images({batch, 32, 32, 3}), host_labels({batch});
    for (std::int64_t i = 0; i < host_images.numel(); ++i) host_images.data()[i] = static_cast<float>(i % 255) / 255.0f;
    for (std::int64_t i = 0; i < batch; ++i) host_labels.data()[i] = static_cast<float>(i % 10);
    images = host_images.to(device);
    labels = host_labels.to(device);
  }

  void train_step() {
    model.train();
    const Tensor logits = model.forward_logits(images);
    ops::softmax_cross_entropy(logits, labels, gradient, loss_sum, 0);
    model.backward(gradient);
    train::update_variables(adam, model.trainable_variables());
  }
  void infer() {
    model.eval();
    model.infer(images);
  }

  nn::Sequential model;
  optim::Adam adam;
  Tensor images, labels, gradient;
  RunningSums loss_sum;
};

// The most bytes in use during a training step and an inference at `batch`, or nothing where the device ran
// out of memory (its cached blocks are returned either way, so that the next try starts clean).
std::optional<std::size_t> step_peak(Device device, nn::Precision precision, std::int64_t batch) {
  Allocator& allocator = allocator_for(device);
  std::optional<std::size_t> peak;
  try {
    allocator.reset_peak();
    Flagship flagship(device, precision, batch);
    flagship.train_step();
    flagship.infer();
    ops::synchronize(device);
    peak = allocator.stats().peak;
  } catch (const DeviceError& error) {
    if (std::string(error.what()).find("out of memory") == std::string::npos) throw;
  }
  allocator.release_cached();
  return peak;
}

struct LargestBatch {
  std::int64_t batch;
  std::size_t step_peak;
};

// The largest batch that fits, within 1/64 (exact below 128): doubling from `start` to the first that does
// not, then halving the gap.
LargestBatch largest_batch(Device device, nn::Precision precision, std::int64_t start) {
  std::optional<std::size_t> peak = step_peak(device, precision, 1);
  if (!peak) throw DeviceError(fmt::format("{} cannot train the flagship even at batch 1", cohort::device_name(device)));
  LargestBatch fits{1, *peak};
  std::int64_t fails = std::max<std::int64_t>(start, 2);
  while ((peak = step_peak(device, precision, fails))) {
    fits = {fails, *peak};
    if (fails > (std::int64_t{1} << 40)) throw DeviceError("the device's memory seems to have no end");
    fails *= 2;
  }
  while (fails - fits.batch > std::max<std::int64_t>(1, fits.batch / 64)) {
    const std::int64_t middle = fits.batch + (fails - fits.batch) / 2;
    if ((peak = step_peak(device, precision, middle))) fits = {middle, *peak};
    else fails = middle;
  }
  return fits;
}

// `step` images/s: op by op, or captured after the warm-up and replayed, `after_replay` doing on the host what the
// recorded step did there.
template <class Step>
double images_per_second(Device device, std::int64_t batch, double seconds, bool capture, Step&& step,
                         const std::function<void()>& after_replay = {}) {
  for (int i = 0; i < 3; ++i) step();  // warm-up: plans, algorithm choice, the caching allocator
  std::function<void()> timed = step;
  std::shared_ptr<CapturedWork> work;
  if (capture) {
    work = ops::capture(device, step);
    work->replay();  // the recorded step itself, whose host part ran while it was recorded
    timed = [&] {
      work->replay();
      if (after_replay) after_replay();
    };
  }
  ops::synchronize(device);
  std::int64_t steps = 0;
  const auto start = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - start).count() < seconds || steps < 5) {
    timed();
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
  bool find_largest_batch = false, capture = true;
  nn::Precision precision = nn::Precision::Float32;
  constexpr const char* kUsage =
      "usage: flagship_throughput [--device cpu|cuda|emulated|auto] [--batch N] [--seconds S] "
      "[--precision float32|mixed_bfloat16] [--no-capture] [--largest-batch]\n"
      "  --batch N        images per step (128); with --largest-batch, where its doubling starts\n"
      "  --seconds S      how long each of training and inference is measured (5)\n"
      "  --precision P    float32 (the default) or mixed_bfloat16\n"
      "  --no-capture     run each step op by op, not as the replay of its capture\n"
      "  --largest-batch  instead find the largest batch that trains in the device's memory, within 1/64 (the\n"
      "                   emulated device's memory is COHORT_EMULATED_MEMORY bytes)";
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      fmt::print("{}\n", kUsage);
      return 0;
    }
    if (flag == "--largest-batch" || flag == "--no-capture") {
      if (flag == "--largest-batch") find_largest_batch = true;
      else capture = false;
      --i;  // a flag without a value
      continue;
    }
    if (flag != "--device" && flag != "--batch" && flag != "--seconds" && flag != "--precision")
      throw InvalidArgument(fmt::format("unknown option '{}'; {}", flag, kUsage));
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
      }
    } catch (const std::logic_error&) {  // std::stoll / std::stod: not a number
      throw InvalidArgument(fmt::format("{} needs a number, got '{}'", flag, value));
    }
    if (batch < 1 || !(seconds > 0)) throw InvalidArgument("--batch and --seconds must be positive");
  }
  const Device device = choose_device(device_name);
  if (find_largest_batch) {
    if (device == Device::CPU) throw InvalidArgument("--largest-batch probes a device's memory, not the host's");
    if (device == Device::Emulated && std::getenv("COHORT_EMULATED_MEMORY") == nullptr)
      throw InvalidArgument("--largest-batch on the emulated device needs its memory set (COHORT_EMULATED_MEMORY=BYTES): "
                            "without it the host's memory is the limit");
    const LargestBatch largest = largest_batch(device, precision, batch);
    fmt::print("cohort device={} precision={} largest_batch={} step_peak_MiB={:.0f}\n", cohort::device_name(device),
               nn::precision_name(precision), largest.batch, static_cast<double>(largest.step_peak) / (1024.0 * 1024.0));
    return 0;
  }
  capture = capture && device != Device::CPU;  // the CPU runs each op as it is called
  Flagship flagship(device, precision, batch);
  const double train = images_per_second(device, batch, seconds, capture, [&] { flagship.train_step(); }, [&] {
    flagship.model.set_step(flagship.model.step() + 1);
    flagship.adam.finish_step();
  });
  const double inference = images_per_second(device, batch, seconds, capture, [&] { flagship.infer(); });
  const double forward_flops = 2.0 * static_cast<double>(flagship.model.multiply_adds_per_sample());
  fmt::print("cohort device={} precision={} batch={} train_images/s={:.1f} inference_images/s={:.1f} "
             "train_tflop/s={:.2f} inference_tflop/s={:.2f} captured={}\n",
             cohort::device_name(device), nn::precision_name(precision), batch, train, inference,
             3 * forward_flops * train * 1e-12, forward_flops * inference * 1e-12, capture ? "yes" : "no");
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "flagship_throughput: {}\n", e.what());
  return 1;
}
