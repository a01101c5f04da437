// Convolutions on cuDNN. A plan holds, per element type and batch size, the descriptors and the three
// algorithms (forward, data and filter gradients) that rank first within the workspace cap: by cuDNN's
// heuristics, deterministic ones preferred so that a run repeats, or, where the fastest are allowed
// (devices.hpp use_deterministic_algorithms), by timing each algorithm once on the shape (cudnnFind*). Float32 runs on TF32 tensor cores unless strict
// FP32 was asked for (devices.hpp allow_tf32), then with math type FMA; bfloat16 and float16 run on tensor cores with float32
// accumulation (cuDNN's PSEUDO_BFLOAT16 and PSEUDO_HALF configurations). cuDNN's filter gradient takes one
// element type for input, output gradient and filter, so a 16-bit kernel gradient is rounded to its type
// before it is widened into the float32 gradient, one rounding more than the CPU's. Kernels are HWIO (Keras)
// in the model and OHWI (cuDNN's NHWC filter layout) for the calls: a transpose each way costs one small
// kernel. Padding cuDNN cannot express (asymmetric "same" padding) goes through an explicitly padded copy
// of the input. A convolution with a bias and a ReLU after it runs as one cuDNN call
// (cudnnConvolutionBiasActivationForward) where cuDNN takes the shape and algorithm, else as the convolution
// and one pass of bias and activation (a 16-bit output then rounded twice, after the convolution and after
// bias and activation, where the fused call and the CPU round once); the plan remembers a refusal per element
// type and batch size, and the log names it once per layer and element type.
#include <atomic>
#include <climits>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "cohort/core/logging.hpp"

#include "cuda_backend.hpp"
#include "cuda_check.hpp"
#include "element_type.hpp"
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

// The first of cuDNN's ranked results (deterministic ones first unless the fastest are allowed) that runs in
// the operands' own type (tensor cores for float32 only when TF32 is allowed, never a down-conversion to half
// precision) and whose workspace under the descriptor's math type, asked for again, fits the cap.
template <class Perf, class Workspace>
auto pick(const Perf* results, int count, bool tensor_ops, bool deterministic_first, Workspace&& workspace_of,
          const char* what, const Conv2dGeometry& g) -> Choice<decltype(Perf{}.algo)> {
  for (bool need_deterministic : {deterministic_first, false}) {
    for (int i = 0; i < count; ++i) {
      const Perf& p = results[i];
      if (p.status != CUDNN_STATUS_SUCCESS || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
      if (!tensor_ops && p.mathType == CUDNN_TENSOR_OP_MATH) continue;
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
  // The descriptors and algorithms of one element type and batch size.
  struct Shapes {
    Shapes() = default;
    Shapes(const Shapes&) = delete;
    Shapes& operator=(const Shapes&) = delete;
    ~Shapes() {
      if (x != nullptr) cudnnDestroyTensorDescriptor(x);
      if (y != nullptr) cudnnDestroyTensorDescriptor(y);
      if (bias != nullptr) cudnnDestroyTensorDescriptor(bias);
      if (filter != nullptr) cudnnDestroyFilterDescriptor(filter);
      if (convolution != nullptr) cudnnDestroyConvolutionDescriptor(convolution);
      if (relu != nullptr) cudnnDestroyActivationDescriptor(relu);
    }
    cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
    cudnnActivationDescriptor_t relu = nullptr;
    mutable std::atomic<bool> fusion_refused{false};
    cudnnFilterDescriptor_t filter = nullptr;
    cudnnConvolutionDescriptor_t convolution = nullptr;
    Choice<cudnnConvolutionFwdAlgo_t> forward;
    Choice<cudnnConvolutionBwdDataAlgo_t> data;
    Choice<cudnnConvolutionBwdFilterAlgo_t> filter_gradient;
  };

  ConvPlan(CudaBackend& backend, const Conv2dGeometry& g) : backend_(backend), padded_(!symmetric_padding_fits(g)) {}

  // The descriptors and algorithms for elements of type T and g's batch size, chosen on first use, which a
  // capture cannot hold (cudnnFind* times the algorithms, allocating and waiting). Call under the handle lock.
  template <class T>
  const Shapes& shapes(const Conv2dGeometry& g) const {
    std::lock_guard lock(mutex_);
    auto& slot = shapes_[{cudnn_type<T>(), g.batch}];
    if (!slot) {
      if (backend_.capturing().is_this_thread())
        throw DeviceError(fmt::format("a Conv2D with {} has no algorithms chosen for {} yet, and choosing them cannot "
                                      "be captured: run it once before capturing",
                                      describe(g), dtype_name(dtype_of<T>())));
      slot = make_shapes(g, cudnn_type<T>());
    }
    return *slot;
  }

  kernels::PaddedImage padding(const Conv2dGeometry& g) const {
    return {g.batch, g.in_h, g.in_w, g.in_c, (g.out_h - 1) * g.stride_h + g.kernel_h,
            (g.out_w - 1) * g.stride_w + g.kernel_w, g.pad_top, g.pad_left};
  }
  bool padded() const { return padded_; }
  // True the first time cuDNN refuses to fuse this layer's convolution in `type`, for one log line per layer.
  bool first_refusal(cudnnDataType_t type) const {
    std::lock_guard lock(mutex_);
    return refusals_logged_.insert(type).second;
  }

 private:
  std::unique_ptr<Shapes> make_shapes(const Conv2dGeometry& g, cudnnDataType_t type) const {
    const auto active = backend_.activate();
    auto made = std::make_unique<Shapes>();
    const auto context = [&] { return describe(g); };
    // Tensor cores: always for 16-bit operands, for float32 only where TF32 is allowed.
    const bool tensor_ops = type != CUDNN_DATA_FLOAT || backend_.allow_tf32();
    COHORT_CUDA_CHECK(cudnnCreateFilterDescriptor(&made->filter), "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnSetFilter4dDescriptor(made->filter, type, CUDNN_TENSOR_NHWC, as_int(g.out_c, g),
                                                 as_int(g.in_c, g), as_int(g.kernel_h, g), as_int(g.kernel_w, g)),
                      "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnCreateConvolutionDescriptor(&made->convolution), "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnSetConvolution2dDescriptor(made->convolution, padded_ ? 0 : as_int(g.pad_top, g),
                                                      padded_ ? 0 : as_int(g.pad_left, g), as_int(g.stride_h, g),
                                                      as_int(g.stride_w, g), 1, 1, CUDNN_CROSS_CORRELATION,
                                                      CUDNN_DATA_FLOAT),
                      "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnSetConvolutionMathType(made->convolution, tensor_ops ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH),
                      "planning Conv2D {}", context());
    const kernels::PaddedImage p = padding(g);
    COHORT_CUDA_CHECK(cudnnCreateTensorDescriptor(&made->x), "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnCreateTensorDescriptor(&made->y), "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnSetTensor4dDescriptor(made->x, CUDNN_TENSOR_NHWC, type, as_int(g.batch, g), as_int(g.in_c, g),
                                                 as_int(padded_ ? p.padded_h : g.in_h, g),
                                                 as_int(padded_ ? p.padded_w : g.in_w, g)),
                      "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnSetTensor4dDescriptor(made->y, CUDNN_TENSOR_NHWC, type, as_int(g.batch, g), as_int(g.out_c, g),
                                                 as_int(g.out_h, g), as_int(g.out_w, g)),
                      "planning Conv2D {}", context());
    // For the fused call: a bias of y's type, one value per channel, and ReLU as cohort's (NaN gives 0).
    COHORT_CUDA_CHECK(cudnnCreateTensorDescriptor(&made->bias), "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnSetTensor4dDescriptor(made->bias, CUDNN_TENSOR_NHWC, type, 1, as_int(g.out_c, g), 1, 1),
                      "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnCreateActivationDescriptor(&made->relu), "planning Conv2D {}", context());
    COHORT_CUDA_CHECK(cudnnSetActivationDescriptor(made->relu, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0),
                      "planning Conv2D {}", context());
    const cudnnHandle_t handle = backend_.cudnn();
    const bool timed = !backend_.deterministic();
    int count = 0;
    cudnnConvolutionFwdAlgoPerf_t forward[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    COHORT_CUDA_CHECK(timed ? cudnnFindConvolutionForwardAlgorithm(handle, made->x, made->filter, made->convolution, made->y,
                                                                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, forward)
                            : cudnnGetConvolutionForwardAlgorithm_v7(handle, made->x, made->filter, made->convolution,
                                                                     made->y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count,
                                                                     forward),
                      "choosing the forward algorithm of Conv2D {}", context());
    made->forward = pick(
        forward, count, tensor_ops, !timed,
        [&](cudnnConvolutionFwdAlgo_t algo, std::size_t* bytes) {
          return cudnnGetConvolutionForwardWorkspaceSize(handle, made->x, made->filter, made->convolution, made->y, algo,
                                                         bytes);
        },
        "forward", g);
    cudnnConvolutionBwdDataAlgoPerf_t data[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    COHORT_CUDA_CHECK(timed ? cudnnFindConvolutionBackwardDataAlgorithm(handle, made->filter, made->y, made->convolution,
                                                                        made->x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                                                        &count, data)
                            : cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, made->filter, made->y, made->convolution,
                                                                          made->x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                                                          &count, data),
                      "choosing the data-gradient algorithm of Conv2D {}", context());
    made->data = pick(
        data, count, tensor_ops, !timed,
        [&](cudnnConvolutionBwdDataAlgo_t algo, std::size_t* bytes) {
          return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, made->filter, made->y, made->convolution, made->x,
                                                              algo, bytes);
        },
        "data-gradient", g);
    cudnnConvolutionBwdFilterAlgoPerf_t filter[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    COHORT_CUDA_CHECK(timed ? cudnnFindConvolutionBackwardFilterAlgorithm(handle, made->x, made->y, made->convolution,
                                                                          made->filter,
                                                                          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count,
                                                                          filter)
                            : cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, made->x, made->y, made->convolution,
                                                                            made->filter,
                                                                            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                                                                            &count, filter),
                      "choosing the filter-gradient algorithm of Conv2D {}", context());
    made->filter_gradient = pick(
        filter, count, tensor_ops, !timed,
        [&](cudnnConvolutionBwdFilterAlgo_t algo, std::size_t* bytes) {
          return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, made->x, made->y, made->convolution, made->filter,
                                                                algo, bytes);
        },
        "filter-gradient", g);
    return made;
  }

  CudaBackend& backend_;
  bool padded_;
  mutable std::mutex mutex_;
  mutable std::map<std::pair<cudnnDataType_t, std::int64_t>, std::unique_ptr<Shapes>> shapes_;
  mutable std::set<cudnnDataType_t> refusals_logged_;
};

std::int64_t taps(const Conv2dGeometry& g) { return g.kernel_h * g.kernel_w; }

std::size_t padded_bytes(const kernels::PaddedImage& p, const ConvPlan& plan, const Tensor& x) {
  return plan.padded() ? static_cast<std::size_t>(p.batch * p.padded_h * p.padded_w * p.channels) * element_size(x.dtype())
                       : 0;
}

}  // namespace

std::shared_ptr<const PlanState> CudaBackend::plan(const Conv2dGeometry& geometry) {
  return std::make_shared<ConvPlan>(*this, geometry);
}

void CudaBackend::conv2d_forward(const PlanState* state, const Conv2dGeometry& g, const Tensor& x, const Tensor& kernel,
                                 const Tensor& bias, const Tensor& y) {
  conv2d_forward_activated(state, g, x, kernel, bias, Activation::Linear, y);
}

void CudaBackend::conv2d_forward_activated(const PlanState* state, const Conv2dGeometry& g, const Tensor& x,
                                           const Tensor& kernel, const Tensor& bias, Activation activation,
                                           const Tensor& y) {
  const auto active = activate();
  if (g.batch == 0) return;
  const auto& plan = static_cast<const ConvPlan&>(*state);
  // Whether cuDNN applied the bias and the activation itself.
  const bool fused = [&] {
    std::lock_guard lock(handle_mutex_);
    return with_element_type(x.dtype(), [&]<class T>(std::type_identity<T>) {
      const ConvPlan::Shapes& shapes = plan.shapes<T>(g);
      Scratch ohwi(*allocator_, kernel.bytes());
      kernels::hwio_to_ohwi(in_as<T>(kernel), ohwi.as<T>(), taps(g), g.in_c, g.out_c, compute_);
      const kernels::PaddedImage p = plan.padding(g);
      Scratch padded(*allocator_, padded_bytes(p, plan, x));
      const T* input = in_as<T>(x);
      if (plan.padded()) {
        kernels::pad_images(p, input, padded.as<T>(), compute_);
        input = padded.as<T>();
      }
      Scratch workspace(*allocator_, shapes.forward.workspace);
      const float one = 1.0f, zero = 0.0f;
      if (activation == Activation::Relu && bias.defined() && bias.dtype() == y.dtype() &&
          !shapes.fusion_refused.load()) {
        // z is y with a weight of zero: y = relu(conv(x) + bias).
        const cudnnStatus_t status = cudnnConvolutionBiasActivationForward(
            cudnn_, &one, shapes.x, input, shapes.filter, ohwi.as<T>(), shapes.convolution, shapes.forward.algo,
            workspace.as<void>(), shapes.forward.workspace, &zero, shapes.y, out_as<T>(y), shapes.bias, in_as<T>(bias),
            shapes.relu, shapes.y, out_as<T>(y));
        if (status == CUDNN_STATUS_SUCCESS) return true;
        // A refusal (CUDNN_STATUS_NOT_SUPPORTED and its sub-codes) falls back; any other failure is an error.
        if (CUDNN_STATUS_CATEGORY(status) != CUDNN_STATUS_NOT_SUPPORTED)
          COHORT_CUDA_CHECK(status, "conv2d_forward (fused with bias and ReLU) of {} {}", dtype_name(x.dtype()),
                            describe(g));
        cudaGetLastError();  // what the refused call may have left behind is not the fallback's failure
        shapes.fusion_refused = true;
        if (plan.first_refusal(cudnn_type<T>()))
          log::warning("cuDNN does not fuse Conv2D {} ({}) with its bias and ReLU ({}): they run as two passes",
                       describe(g), dtype_name(x.dtype()), cudnnGetErrorString(status));
      }
      COHORT_CUDA_CHECK(cudnnConvolutionForward(cudnn_, &one, shapes.x, input, shapes.filter, ohwi.as<T>(),
                                                shapes.convolution, shapes.forward.algo, workspace.as<void>(),
                                                shapes.forward.workspace, &zero, shapes.y, out_as<T>(y)),
                        "conv2d_forward of {} {}", dtype_name(x.dtype()), describe(g));
      return false;
    });
  }();
  COHORT_CUDA_CHECK(cudaGetLastError(), "conv2d_forward of {} {}", dtype_name(x.dtype()), describe(g));
  if (fused) return;
  if (bias.defined()) bias_activation_forward(y, bias, activation);
  else if (activation != Activation::Linear) activation_forward(activation, y, y);
}

void CudaBackend::conv2d_backward(const PlanState* state, const Conv2dGeometry& g, const Tensor& x,
                                  const Tensor& kernel, const Tensor& dy, const Tensor& dx, const Tensor& dkernel,
                                  const Tensor& dbias) {
  const auto active = activate();
  if (dbias.defined()) bias_gradient(dy, dbias);
  if (g.batch == 0) {
    if (dkernel.defined()) fill(dkernel, 0.0f);
    return;
  }
  const auto& plan = static_cast<const ConvPlan&>(*state);
  std::lock_guard lock(handle_mutex_);
  with_element_type(x.dtype(), [&]<class T>(std::type_identity<T>) {
    const ConvPlan::Shapes& shapes = plan.shapes<T>(g);
    const kernels::PaddedImage p = plan.padding(g);
    const float one = 1.0f, zero = 0.0f;
    if (dkernel.defined()) {
      Scratch padded(*allocator_, padded_bytes(p, plan, x));
      const T* input = in_as<T>(x);
      if (plan.padded()) {
        kernels::pad_images(p, input, padded.as<T>(), compute_);
        input = padded.as<T>();
      }
      Scratch ohwi_gradient(*allocator_, static_cast<std::size_t>(dkernel.numel()) * sizeof(T));
      Scratch workspace(*allocator_, shapes.filter_gradient.workspace);
      COHORT_CUDA_CHECK(cudnnConvolutionBackwardFilter(cudnn_, &one, shapes.x, input, shapes.y, in_as<T>(dy),
                                                       shapes.convolution, shapes.filter_gradient.algo,
                                                       workspace.as<void>(), shapes.filter_gradient.workspace, &zero,
                                                       shapes.filter, ohwi_gradient.as<T>()),
                        "conv2d_backward (kernel gradient) of {} {}", dtype_name(x.dtype()), describe(g));
      kernels::ohwi_to_hwio(ohwi_gradient.as<T>(), out_as<float>(dkernel), taps(g), g.in_c, g.out_c, compute_);
    }
    if (dx.defined()) {
      Scratch ohwi(*allocator_, kernel.bytes());
      kernels::hwio_to_ohwi(in_as<T>(kernel), ohwi.as<T>(), taps(g), g.in_c, g.out_c, compute_);
      Scratch padded_gradient(*allocator_, padded_bytes(p, plan, x));
      Scratch workspace(*allocator_, shapes.data.workspace);
      COHORT_CUDA_CHECK(cudnnConvolutionBackwardData(cudnn_, &one, shapes.filter, ohwi.as<T>(), shapes.y, in_as<T>(dy),
                                                     shapes.convolution, shapes.data.algo, workspace.as<void>(),
                                                     shapes.data.workspace, &zero, shapes.x,
                                                     plan.padded() ? padded_gradient.as<T>() : out_as<T>(dx)),
                        "conv2d_backward (input gradient) of {} {}", dtype_name(x.dtype()), describe(g));
      if (plan.padded()) kernels::crop_images(p, padded_gradient.as<const T>(), out_as<T>(dx), compute_);
    }
  });
  COHORT_CUDA_CHECK(cudaGetLastError(), "conv2d_backward of {} {}", dtype_name(x.dtype()), describe(g));
}

}  // namespace cohort::cuda
