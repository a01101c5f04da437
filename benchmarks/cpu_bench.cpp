// CPU performance of cohort: the machine's SGEMM through each GEMM path the build has (the layers use the
// one gemm_path() chose, printed first), per-layer convolution GFLOP/s of the flagship CIFAR-10 model, its
// end-to-end training throughput (forward, backward and Adam update at batch 128) and its inference
// throughput (eval mode at batch 128 and batch 1), each on 1 and 2 threads, and the data loader's batches per
// second with the host's transforms against 8-bit batches for a device to expand. Convolution GFLOP/s count the FLOPs
// of a direct convolution (2 x outputs x 9 x in_channels), so layers on the Winograd path, which does
// fewer multiplications, can show more than the SGEMM peak.
//
//   ./build/benchmarks/cohort_bench                       # everything
//   ./build/benchmarks/cohort_bench --benchmark_filter=Train
// benchmarks/run_all.sh puts the training figures beside PyTorch's from the same run.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>

#include <cohort/cohort.hpp>

#include "tensor/cpu/onednn.hpp"
#include "tensor/cpu/winograd.hpp"

using namespace cohort;

namespace {

Tensor filled(const Shape& shape, float value) { return Tensor::full(shape, value); }

// SGEMM through one path (0: Eigen, 1: OpenBLAS); the path the layers use is restored afterwards.
void BM_Sgemm(benchmark::State& state) {
  const auto path = static_cast<GemmPath>(state.range(0));
  const std::vector<GemmPath> paths = available_gemm_paths();
  if (std::find(paths.begin(), paths.end(), path) == paths.end()) {
    state.SkipWithError("this build lacks the path");
    for (auto _ : state) {
    }
    return;
  }
  const std::int64_t n = state.range(1);
  set_num_threads(static_cast<int>(state.range(2)));
  const GemmPath chosen = gemm_path();
  set_gemm_path(path);
  const Tensor a = filled({n, n}, 0.5f), b = filled({n, n}, 0.25f);
  Tensor c({n, n});
  for (auto _ : state) {
    ops::matmul(a, false, b, false, c);
    benchmark::DoNotOptimize(c.data());
  }
  set_gemm_path(chosen);
  state.SetLabel(std::string(gemm_path_name(path)));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * n * n * static_cast<double>(state.iterations()) * 1e-9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Sgemm)->ArgsProduct({{0, 1}, {1024}, {1, 2}})->ArgNames({"path", "n", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);

// The six convolutions of the flagship model at batch 128 on 32x32x3 input.
struct ConvLayer {
  std::int64_t in_h, in_c, out_c;
  bool same;
};
constexpr ConvLayer kFlagshipConvs[] = {{32, 3, 32, true},   {32, 32, 32, false}, {15, 32, 64, true},
                                        {15, 64, 64, false}, {6, 64, 128, true},  {6, 128, 128, false}};

Conv2dGeometry geometry(const ConvLayer& layer, std::int64_t batch) {
  const std::int64_t out = layer.same ? layer.in_h : layer.in_h - 2;
  return {batch, layer.in_h, layer.in_h, layer.in_c, out, out, layer.out_c, 3, 3, 1, 1, layer.same ? 1 : 0,
          layer.same ? 1 : 0};
}

double conv_flops(const Conv2dGeometry& g) {
  return 2.0 * static_cast<double>(g.batch * g.out_h * g.out_w * g.out_c * g.kernel_h * g.kernel_w * g.in_c);
}

void BM_Conv2dForward(benchmark::State& state) {
  const Conv2dGeometry g = geometry(kFlagshipConvs[state.range(0)], 128);
  set_num_threads(static_cast<int>(state.range(1)));
  const Tensor x = filled({g.batch, g.in_h, g.in_w, g.in_c}, 0.1f), w = filled({3, 3, g.in_c, g.out_c}, 0.01f),
               bias = filled({g.out_c}, 0.0f);
  Tensor y({g.batch, g.out_h, g.out_w, g.out_c});
  Conv2dPlan plan(g, Device::CPU);
  for (auto _ : state) ops::conv2d_forward(plan, x, w, bias, y);
  state.counters["GFLOP/s"] = benchmark::Counter(conv_flops(g) * static_cast<double>(state.iterations()) * 1e-9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Conv2dForward)->ArgsProduct({{0, 1, 2, 3, 4, 5}, {1, 2}})->ArgNames({"layer", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_Conv2dBackward(benchmark::State& state) {
  const Conv2dGeometry g = geometry(kFlagshipConvs[state.range(0)], 128);
  set_num_threads(static_cast<int>(state.range(1)));
  const Tensor x = filled({g.batch, g.in_h, g.in_w, g.in_c}, 0.1f), w = filled({3, 3, g.in_c, g.out_c}, 0.01f);
  const Tensor dy = filled({g.batch, g.out_h, g.out_w, g.out_c}, 0.01f);
  Tensor dx(x.shape()), dw(w.shape()), db({g.out_c});
  Conv2dPlan plan(g, Device::CPU);
  for (auto _ : state) ops::conv2d_backward(plan, x, w, dy, dx, dw, db);
  // data and filter gradients: two products of the forward's size
  state.counters["GFLOP/s"] = benchmark::Counter(2 * conv_flops(g) * static_cast<double>(state.iterations()) * 1e-9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Conv2dBackward)->ArgsProduct({{0, 1, 2, 3, 4, 5}, {1, 2}})->ArgNames({"layer", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);

// The precision policy of a benchmark's second argument: 0 float32, 1 mixed_bfloat16.
nn::Precision precision_of(std::int64_t arg) { return arg == 1 ? nn::Precision::MixedBFloat16 : nn::Precision::Float32; }

// One training step of the flagship model: forward, fused softmax cross-entropy, backward, Adam.
void BM_FlagshipTrainStep(benchmark::State& state) {
  set_num_threads(static_cast<int>(state.range(0)));
  constexpr std::int64_t kBatch = 128;
  nn::Sequential model = nn::cifar10_cnn({32, 32, 3}, 1);
  model.set_precision(precision_of(state.range(1)));
  optim::Adam adam;
  const Tensor images = filled({kBatch, 32, 32, 3}, 0.5f);
  Tensor labels({kBatch});
  for (std::int64_t i = 0; i < kBatch; ++i) labels.data()[i] = static_cast<float>(i % 10);
  Tensor gradient({kBatch, 10});
  model.train();
  for (auto _ : state) {
    const Tensor logits = model.forward_logits(images);
    ops::softmax_cross_entropy(logits, labels, gradient);
    model.backward(gradient);
    train::update_variables(adam, model.trainable_variables());
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.counters["images/s"] = benchmark::Counter(static_cast<double>(state.iterations() * kBatch), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_FlagshipTrainStep)->ArgsProduct({{1, 2}, {0, 1}})->ArgNames({"threads", "bf16"})->UseRealTime()->MinTime(3.0)->Unit(benchmark::kMillisecond);

// Inference with the flagship model: Sequential::infer, what Trainer::predict runs per batch.
void BM_FlagshipPredict(benchmark::State& state) {
  const std::int64_t batch = state.range(0);
  set_num_threads(static_cast<int>(state.range(1)));
  nn::Sequential model = nn::cifar10_cnn({32, 32, 3}, 1);
  model.set_precision(precision_of(state.range(2)));
  const Tensor images = filled({batch, 32, 32, 3}, 0.5f);
  for (auto _ : state) benchmark::DoNotOptimize(model.infer(images).data());
  state.counters["images/s"] = benchmark::Counter(static_cast<double>(state.iterations() * batch), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_FlagshipPredict)->ArgsProduct({{128, 1}, {1, 2}, {0, 1}})->ArgNames({"batch", "threads", "bf16"})->UseRealTime()->MinTime(2.0)->Unit(benchmark::kMillisecond);

// One CIFAR-10 batch of 128 from the loader on one thread, augmented (crop 4, flip) and normalized: mode 0 by the
// host transforms (float32 batches), 1 as 8-bit images and draws for a device to expand (what a GPU run copies),
// 2 the same expanded on the CPU afterwards.
void BM_LoaderBatch(benchmark::State& state) {
  set_num_threads(1);
  constexpr std::int64_t kBatch = 128;
  const auto set = data::make_synthetic({.samples = 4096, .sample_shape = {32, 32, 3}, .classes = 10});
  const data::ImageAugmentation augmentation{
      .crop_padding = 4, .flip_horizontal = true, .mean = {0.49f, 0.48f, 0.45f}, .stddev = {0.25f, 0.24f, 0.26f}};
  const std::int64_t mode = state.range(0);
  data::LoaderOptions options{.batch_size = kBatch, .seed = 1};
  if (mode == 0) options.transforms = data::transforms_of(augmentation);
  else options.byte_images = augmentation;
  const data::DataLoader loader(set, options);
  const data::ImageExpander expand(augmentation, 3, Device::CPU);
  const std::vector<std::int64_t> order = data::ShuffleSampler(set.size(), 1).indices(0);
  std::int64_t batch = 0;
  for (auto _ : state) {
    const data::Batch made = loader.make_batch(order, 0, batch++ % loader.batches_per_epoch());
    if (mode == 2) benchmark::DoNotOptimize(expand(made.images, {}, made.draws).data());
    benchmark::DoNotOptimize(made.images.bytes());
  }
  state.counters["images/s"] = benchmark::Counter(static_cast<double>(state.iterations() * kBatch), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_LoaderBatch)->ArgsProduct({{0, 1, 2}})->ArgNames({"mode"})->UseRealTime()->MinTime(1.0)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::fprintf(stderr, "matrix products: %s (COHORT_GEMM=eigen|openblas|fastest chooses)\n",
               std::string(gemm_path_name(gemm_path())).c_str());
  std::fprintf(stderr, "Winograd kernels: %s (the best this processor runs; COHORT_CPU_ISA overrides)\n",
               std::string(cpu::winograd_isa_name(cpu::winograd_isa())).c_str());
  std::fprintf(stderr, "float32 convolutions forward: %s\n", cpu::onednn::float32_forward_convolutions_description().c_str());
  std::fprintf(stderr, "bfloat16 (bf16:1 rows): %s (COHORT_BF16_KERNELS overrides)\n",
               cpu::onednn::bf16_kernels_description().c_str());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
