// Convolutions on cuDNN. A plan holds the filter and convolution descriptors made once per layer (math
// type FMA, i.e. true FP32, unless COHORT_ALLOW_TF32=1 allows tensor cores), and per batch size the tensor
// descriptors and the three algorithms (forward, data and filter gradients) that cuDNN's heuristics rank
// first within the workspace cap, deterministic ones preferred so that a run repeats. Kernels are HWIO (Keras) in the model and OHWI (cuDNN's NHWC filter layout) for the calls: a
// transpose each way costs one small kernel. Padding cuDNN cannot express (asymmetric "same" padding)
// goes through an explicitly padded copy of the input.
#include <climits>
#include <map>
#include <memory>
#include <mutex>

#include "cuda_backend.hpp"
#include "cuda_check.hpp"
#include "kernels.hpp"
#include "tensor/backend_access.hpp"

namespace cohort::cuda {
namespace {

constexpr std::size_t kWorkspaceCap = std::size_t{256} << 20;

int as_int(std::int64_t value, const Conv2dGeometry& g) {
  COHORT_CHECK(value <= INT_MAX, "Conv2D with input ({}, {}, {}, {}) is too large for cuDNN", g.batch, g.in_h, g.in_w,
               g.in_c);
  return static_cast<int>(value);
}

std::string describe(const Conv2dGeometry& g) {
  return fmt::format("input ({}, {}, {}, {}), kernel {}x{}x{}x{}, stride {}x{}, output ({}, {}, {}, {})", g.batch,
                     g.in_h, g.in_w, g.in_c, g.kernel_h, g.kernel_w, g.in_c, g.out_c, g.stride_h, g.stride_w, g.batch,
                     g.out_h, g.out_w, g.out_c);
}

// cuDNN pads both sides equally; that gives our windows exactly when it yields our output size.
bool symmetric_padding_fits(const Conv2dGeometry& g) {
  const auto size = [](std::int64_t in, std::int64_t pad, std::int64_t kernel, std::int64_t stride) {
    const std::int64_t span = in + 2 * pad - kernel;
    return span < 0 ? -1 : span / stride + 1;
  };
  return size(g.in_h, g.pad_top, g.kernel_h, g.stride_h) == g.out_h &&
         size(g.in_w, g.pad_left, g.kernel_w, g.stride_w) == g.out_w;
}

// An algorithm and the workspace it needs under the plan's math type.
template <class Algorithm>
struct Choice {
  Algorithm algo{};
  std::size_t workspace = 0;
};

// The first of cuDNN's ranked results, deterministic ones first, that runs in FP32 (TF32 only when
// allowed, never a down-conversion to half precision) and whose workspace under the descriptor's math
// type, asked for again, fits the cap.
template <class Perf, class Workspace>
auto pick(const Perf* results, int count, bool allow_tf32, Workspace&& workspace_of, const char* what,
          const Conv2dGeometry& g) -> Choice<decltype(Perf{}.algo)> {
  for (bool need_deterministic : {true, false}) {
    for (int i = 0; i < count; ++i) {
      const Perf& p = results[i];
      if (p.status != CUDNN_STATUS_SUCCESS || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
      if (!allow_tf32 && p.mathType == CUDNN_TENSOR_OP_MATH) continue;
      if (need_deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
      std::size_t bytes = 0;
      if (workspace_of(p.algo, &bytes) != CUDNN_STATUS_SUCCESS || bytes > kWorkspaceCap) continue;
      return {p.algo, bytes};
    }
  }
  throw DeviceError(fmt::format("cuDNN offers no {} algorithm for {} within a {} MiB workspace", what, describe(g),
                                kWorkspaceCap >> 20));
}

class ConvPlan final : public PlanState {
 public:
  struct ForBatch {
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    Choice<cudnnConvolutionFwdAlgo_t> forward;
    Choice<cudnnConvolutionBwdDataAlgo_t> data;
    Choice<cudnnConvolutionBwdFilterAlgo_t> filter;
  };

  ConvPlan(CudaBackend& backend, const Conv2dGeometry& g)
      : backend_(backend), padded_(!symmetric_padding_fits(g)) {
    backend_.activate();
    const auto context = [&] { return describe(g); };
    COHORT_CUDA_CHECK(cudnnCreateFilterDescriptor(&filter_), "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnSetFilter4dDescriptor(filter_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, as_int(g.out_c, g),
                                                 as_int(g.in_c, g), as_int(g.kernel_h, g), as_int(g.kernel_w, g)),
                      "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnCreateConvolutionDescriptor(&convolution_), "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnSetConvolution2dDescriptor(convolution_, padded_ ? 0 : as_int(g.pad_top, g),
                                                      padded_ ? 0 : as_int(g.pad_left, g), as_int(g.stride_h, g),
                                                      as_int(g.stride_w, g), 1, 1, CUDNN_CROSS_CORRELATION,
                                                      CUDNN_DATA_FLOAT),
                      "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnSetConvolutionMathType(convolution_, backend_.allow_tf32() ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH),
                      "planning Conv2D {}", context());
  }

  ~ConvPlan() override {
    for (auto& [batch, shapes] : per_batch_) {
      cudnnDestroyTensorDescriptor(shapes->x);
      cudnnDestroyTensorDescriptor(shapes->y);
    }
    cudnnDestroyConvolutionDescriptor(convolution_);
    cudnnDestroyFilterDescriptor(filter_);
  }

  // The descriptors and algorithms for one batch size, chosen on first use. Call under the handle lock.
  const ForBatch& for_batch(const Conv2dGeometry& g) const {
    std::lock_guard lock(mutex_);
    auto& slot = per_batch_[g.batch];
    if (slot) return *slot;
    auto made = std::make_unique<ForBatch>();
    const auto context = [&] { return describe(g); };
    const kernels::PaddedImage p = padding(g);
    COHORT_CUDA_CHECK(cudnnCreateTensorDescriptor(&made->x), "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnCreateTensorDescriptor(&made->y), "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnSetTensor4dDescriptor(made->x, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, as_int(g.batch, g),
                                                 as_int(g.in_c, g), as_int(padded_ ? p.padded_h : g.in_h, g),
                                                 as_int(padded_ ? p.padded_w : g.in_w, g)),
                      "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnSetTensor4dDescriptor(made->y, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, as_int(g.batch, g),
                                                 as_int(g.out_c, g), as_int(g.out_h, g), as_int(g.out_w, g)),
                      "planning Conv2D {}", context());
    const cudnnHandle_t handle = backend_.cudnn();
    int count = 0;
    cudnnConvolutionFwdAlgoPerf_t forward[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    COHORT_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, made->x, filter_, convolution_, made->y,
                                                             CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, forward),
                      "choosing the forward algorithm of Conv2D {}", context());
    made->forward = pick(
        forward, count, backend_.allow_tf32(),
        [&](cudnnConvolutionFwdAlgo_t algo, std::size_t* bytes) {
          return cudnnGetConvolutionForwardWorkspaceSize(handle, made->x, filter_, convolution_, made->y, algo, bytes);
        },
        "forward", g);
    cudnnConvolutionBwdDataAlgoPerf_t data[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    COHORT_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, filter_, made->y, convolution_, made->x,
                                                                  CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, data),
                      "choosing the data-gradient algorithm of Conv2D {}", context());
    made->data = pick(
        data, count, backend_.allow_tf32(),
        [&](cudnnConvolutionBwdDataAlgo_t algo, std::size_t* bytes) {
          return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, filter_, made->y, convolution_, made->x, algo, bytes);
        },
        "data-gradient", g);
    cudnnConvolutionBwdFilterAlgoPerf_t filter[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    COHORT_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, made->x, made->y, convolution_, filter_,
                                                                    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count,
                                                                    filter),
                      "choosing the filter-gradient algorithm of Conv2D {}", context());
    made->filter = pick(
        filter, count, backend_.allow_tf32(),
        [&](cudnnConvolutionBwdFilterAlgo_t algo, std::size_t* bytes) {
          return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, made->x, made->y, convolution_, filter_, algo,
                                                                bytes);
        },
        "filter-gradient", g);
    slot = std::move(made);
    return *slot;
  }

  kernels::PaddedImage padding(const Conv2dGeometry& g) const {
    return {g.batch, g.in_h, g.in_w, g.in_c, (g.out_h - 1) * g.stride_h + g.kernel_h,
            (g.out_w - 1) * g.stride_w + g.kernel_w, g.pad_top, g.pad_left};
  }
  bool padded() const { return padded_; }
  cudnnFilterDescriptor_t filter() const { return filter_; }
  cudnnConvolutionDescriptor_t convolution() const { return convolution_; }

 private:
  CudaBackend& backend_;
  bool padded_;
  cudnnFilterDescriptor_t filter_ = nullptr;
  cudnnConvolutionDescriptor_t convolution_ = nullptr;
  mutable std::mutex mutex_;
  mutable std::map<std::int64_t, std::unique_ptr<ForBatch>> per_batch_;
};

std::int64_t taps(const Conv2dGeometry& g) { return g.kernel_h * g.kernel_w; }

}  // namespace

std::shared_ptr<const PlanState> CudaBackend::plan(const Conv2dGeometry& geometry) {
  return std::make_shared<ConvPlan>(*this, geometry);
}

void CudaBackend::conv2d_forward(const PlanState* state, const Conv2dGeometry& g, const Tensor& x, const Tensor& kernel,
                                 const Tensor& bias, const Tensor& y) {
  activate();
  if (g.batch == 0) return;
  const auto& plan = static_cast<const ConvPlan&>(*state);
  std::lock_guard lock(handle_mutex_);
  const ConvPlan::ForBatch& shapes = plan.for_batch(g);
  Scratch ohwi(*allocator_, kernel.bytes());
  kernels::hwio_to_ohwi(device_data(kernel), ohwi.as<float>(), taps(g), g.in_c, g.out_c, compute_);
  const kernels::PaddedImage p = plan.padding(g);
  Scratch padded(*allocator_, plan.padded() ? p.batch * p.padded_h * p.padded_w * p.channels * sizeof(float) : 0);
  const float* input = device_data(x);
  if (plan.padded()) {
    kernels::pad_images(p, input, padded.as<float>(), compute_);
    input = padded.as<float>();
  }
  Scratch workspace(*allocator_, shapes.forward.workspace);
  const float one = 1.0f, zero = 0.0f;
  COHORT_CUDA_CHECK(cudnnConvolutionForward(cudnn_, &one, shapes.x, input, plan.filter(), ohwi.as<float>(),
                                            plan.convolution(), shapes.forward.algo, workspace.as<void>(),
                                            shapes.forward.workspace, &zero, shapes.y, device_data(y)),
                    "conv2d_forward of {}", describe(g));
  if (bias.defined()) kernels::add_bias(device_data(y), device_data(bias), y.numel() / g.out_c, g.out_c, compute_);
  COHORT_CUDA_CHECK(cudaGetLastError(), "conv2d_forward of {}", describe(g));
}

void CudaBackend::conv2d_backward(const PlanState* state, const Conv2dGeometry& g, const Tensor& x,
                                  const Tensor& kernel, const Tensor& dy, const Tensor& dx, const Tensor& dkernel,
                                  const Tensor& dbias) {
  activate();
  if (dbias.defined()) bias_gradient(dy, dbias);
  if (g.batch == 0) {
    if (dkernel.defined()) fill(dkernel, 0.0f);
    return;
  }
  const auto& plan = static_cast<const ConvPlan&>(*state);
  std::lock_guard lock(handle_mutex_);
  const ConvPlan::ForBatch& shapes = plan.for_batch(g);
  const kernels::PaddedImage p = plan.padding(g);
  const std::size_t padded_bytes = plan.padded() ? p.batch * p.padded_h * p.padded_w * p.channels * sizeof(float) : 0;
  const float one = 1.0f, zero = 0.0f;
  if (dkernel.defined()) {
    Scratch padded(*allocator_, padded_bytes);
    const float* input = device_data(x);
    if (plan.padded()) {
      kernels::pad_images(p, input, padded.as<float>(), compute_);
      input = padded.as<float>();
    }
    Scratch ohwi_gradient(*allocator_, dkernel.bytes());
    Scratch workspace(*allocator_, shapes.filter.workspace);
    COHORT_CUDA_CHECK(cudnnConvolutionBackwardFilter(cudnn_, &one, shapes.x, input, shapes.y, device_data(dy),
                                                     plan.convolution(), shapes.filter.algo, workspace.as<void>(),
                                                     shapes.filter.workspace, &zero, plan.filter(),
                                                     ohwi_gradient.as<float>()),
                      "conv2d_backward (kernel gradient) of {}", describe(g));
    kernels::ohwi_to_hwio(ohwi_gradient.as<float>(), device_data(dkernel), taps(g), g.in_c, g.out_c, compute_);
  }
  if (dx.defined()) {
    Scratch ohwi(*allocator_, kernel.bytes());
    kernels::hwio_to_ohwi(device_data(kernel), ohwi.as<float>(), taps(g), g.in_c, g.out_c, compute_);
    Scratch padded_gradient(*allocator_, padded_bytes);
    Scratch workspace(*allocator_, shapes.data.workspace);
    COHORT_CUDA_CHECK(cudnnConvolutionBackwardData(cudnn_, &one, plan.filter(), ohwi.as<float>(), shapes.y,
                                                   device_data(dy), plan.convolution(), shapes.data.algo,
                                                   workspace.as<void>(), shapes.data.workspace, &zero, shapes.x,
                                                   plan.padded() ? padded_gradient.as<float>() : device_data(dx)),
                      "conv2d_backward (input gradient) of {}", describe(g));
    if (plan.padded()) kernels::crop_images(p, padded_gradient.as<float>(), device_data(dx), compute_);
  }
  COHORT_CUDA_CHECK(cudaGetLastError(), "conv2d_backward of {}", describe(g));
}

}  // namespace cohort::cuda
