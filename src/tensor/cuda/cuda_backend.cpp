// The CUDA backend's set-up, memory, streams, products and the ops that run on kernels.cu.
#include "cuda_backend.hpp"

#include <array>
#include <atomic>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cohort/core/config.hpp"
#include "cuda_check.hpp"
#include "cuda_plugin.hpp"
#include "element_type.hpp"
#include "kernels.hpp"
#include "tensor/backend_access.hpp"

namespace cohort::cuda {

[[noreturn]] void throw_device_error(std::string_view call, std::string_view reason, const std::string& context) {
  throw DeviceError(fmt::format("{}: {} failed: {}", context, call, reason));
}

std::string_view cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED (out of device memory)";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
  }
}

namespace {

std::string_view environment(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string_view() : std::string_view(value);
}

// The whole of `text` as a non-negative integer.
std::optional<int> index_in(std::string_view text) {
  int value = -1;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

// COHORT_CUDA_DEVICE when set; else the process's local rank (torchrun, Open MPI) spread over the GPUs,
// as Horovod does; else the first GPU.
int choose_ordinal(int count) {
  if (const std::string_view chosen = environment("COHORT_CUDA_DEVICE"); !chosen.empty()) {
    const std::optional<int> ordinal = index_in(chosen);
    if (!ordinal || *ordinal >= count)
      throw DeviceError(fmt::format("COHORT_CUDA_DEVICE={} is not a GPU of this process (it sees {})", chosen, count));
    return *ordinal;
  }
  for (const char* name : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"})
    if (const std::optional<int> rank = index_in(environment(name))) return *rank % count;
  return 0;
}

// What cudaGetDeviceCount's failure means to a user: no driver at all, a driver too old for this build, or
// what the runtime says.
std::string why_no_gpu(cudaError_t status) {
  if (status == cudaSuccess) return "the driver reports no GPU";
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  cudaGetLastError();
  if (driver == 0) return "no NVIDIA driver is installed (libcuda.so.1 not found)";
  if (status == cudaErrorInsufficientDriver)
    return fmt::format("the NVIDIA driver supports CUDA {}.{}, this build needs {}.{}", driver / 1000,
                       driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
  return cudaGetErrorString(status);
}

std::string describe_visible_devices() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr) return "CUDA_VISIBLE_DEVICES is unset";
  if (*visible == '\0') return "CUDA_VISIBLE_DEVICES is empty, which hides every GPU";
  return fmt::format("CUDA_VISIBLE_DEVICES={}", visible);
}

const float* in(const Tensor& t) { return device_data(t); }
float* out(const Tensor& t) { return t.defined() ? device_data(t) : nullptr; }

// Copies run on a stream of their own, each after the compute work queued before it; the tensors stay
// referenced until synchronize().
class CopyStreamImpl final : public BackendStream {
 public:
  explicit CopyStreamImpl(CudaBackend& backend) : backend_(backend) {
    const auto active = backend_.activate();
    COHORT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating a copy stream");
    COHORT_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming), "creating a copy stream event");
  }
  ~CopyStreamImpl() override {
    cudaSetDevice(backend_.ordinal());  // no throwing here: a failure was reported by synchronize()
    cudaStreamSynchronize(stream_);
    cudaEventDestroy(compute_done_);
    cudaStreamDestroy(stream_);
  }

  void enqueue_copy(const Tensor& source, const Tensor& destination) override {
    const auto active = backend_.activate();
    backend_.capturing().refuse_copy_stream("CopyStream::copy");
    COHORT_CUDA_CHECK(cudaEventRecord(compute_done_, backend_.compute_stream()), "ordering a copy of {}", source.shape());
    COHORT_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_done_, 0), "ordering a copy of {}", source.shape());
    if (source.numel() > 0)
      COHORT_CUDA_CHECK(cudaMemcpyAsync(device_data(destination), device_data(source), source.bytes(), cudaMemcpyDefault,
                                        stream_),
                        "copying {} from {} to {}", source.shape(), device_name(source.device()),
                        device_name(destination.device()));
    held_.push_back(source);
    held_.push_back(destination);
  }

  void synchronize() override {
    const auto active = backend_.activate();
    backend_.capturing().refuse_copy_stream("CopyStream::synchronize");
    const cudaError_t status = cudaStreamSynchronize(stream_);
    held_.clear();
    COHORT_CUDA_CHECK(status, "waiting for asynchronous copies");
  }

 private:
  CudaBackend& backend_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_done_ = nullptr;
  std::vector<Tensor> held_;
};

// A point on the compute stream, holding the tensors that the work before it uses. Polled and destroyed on
// other threads (a communicator's), which it points at its GPU first: a thread without a current device
// would otherwise open a context on GPU 0.
class CudaEvent final : public DeviceEvent {
 public:
  CudaEvent(CudaBackend& backend, std::vector<Tensor> held) : backend_(backend), held_(std::move(held)) {
    COHORT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "creating an event");
    const cudaError_t recorded = cudaEventRecord(event_, backend.compute_stream());
    if (recorded != cudaSuccess) cudaEventDestroy(event_);
    COHORT_CUDA_CHECK(recorded, "recording an event");
  }
  ~CudaEvent() override {
    // Never queried on a capturing thread: the query would break its capture.
    const bool passed = cudaSetDevice(backend_.ordinal()) != cudaSuccess || held_.empty() ||
                        (!backend_.capturing().is_this_thread() && cudaEventQuery(event_) == cudaSuccess);
    cudaGetLastError();
    if (passed) cudaEventDestroy(event_);
    else backend_.hold_until_passed(event_, std::move(held_));
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  // Queues no work, so it holds no op's place (capturing_thread.hpp); the capturing thread may not query.
  bool finished() const override {
    backend_.capturing().refuse_host_wait("an event's query");
    COHORT_CUDA_CHECK(cudaSetDevice(backend_.ordinal()), "selecting cuda:{}", backend_.ordinal());
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      cudaGetLastError();  // not an error: nothing for this thread's next check to find
      return false;
    }
    COHORT_CUDA_CHECK(status, "waiting for the GPU's queued work (an earlier kernel may have failed)");
    return true;
  }
  void* cuda_event() const override { return event_; }

 private:
  CudaBackend& backend_;
  std::vector<Tensor> held_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace

CudaBackend::CudaBackend() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw DeviceError(fmt::format("no CUDA device is visible to this process ({}; {})", why_no_gpu(status),
                                  describe_visible_devices()));
  }
  ordinal_ = choose_ordinal(count);
  capturing_.name_device(fmt::format("cuda:{}", ordinal_));
  const GpuChoices choices = gpu_choices_from_now_on();
  allow_tf32_ = choices.tf32;
  deterministic_ = choices.deterministic;
  const auto active = activate();
  allocator_ = std::make_unique<CachingAllocator>(std::make_unique<CudaAllocator>(CudaAllocator::Memory::Device, ordinal_));
  pinned_ = std::make_unique<CachingAllocator>(std::make_unique<CudaAllocator>(CudaAllocator::Memory::PinnedHost, ordinal_));
  COHORT_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), "creating the compute stream of cuda:{}",
                    ordinal_);
  COHORT_CUDA_CHECK(cublasCreate(&cublas_), "initializing cuBLAS on cuda:{}", ordinal_);
  COHORT_CUDA_CHECK(cublasSetStream(cublas_, compute_), "initializing cuBLAS on cuda:{}", ordinal_);
  // A workspace of cuBLAS's own for the process's life: otherwise cuBLAS allocates one as it goes, inside a
  // capture too, where the graph would then hold an allocation of its own. 32 MiB is cuBLAS's advice for Hopper.
  constexpr std::size_t kCublasWorkspace = std::size_t{32} << 20;
  void* cublas_workspace = nullptr;
  COHORT_CUDA_CHECK(cudaMalloc(&cublas_workspace, kCublasWorkspace), "allocating cuBLAS's workspace on cuda:{}", ordinal_);
  COHORT_CUDA_CHECK(cublasSetWorkspace(cublas_, cublas_workspace, kCublasWorkspace), "initializing cuBLAS on cuda:{}",
                    ordinal_);
  COHORT_CUDA_CHECK(cublasSetMathMode(cublas_, allow_tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
                    "initializing cuBLAS on cuda:{}", ordinal_);
  COHORT_CUDA_CHECK(cudnnCreate(&cudnn_), "initializing cuDNN on cuda:{}", ordinal_);
  COHORT_CUDA_CHECK(cudnnSetStream(cudnn_, compute_), "initializing cuDNN on cuda:{}", ordinal_);
}

CapturingThread::OpScope CudaBackend::activate() const {
  COHORT_CUDA_CHECK(cudaSetDevice(ordinal_), "selecting cuda:{}", ordinal_);
  return capturing_.enter_op();
}

// Every kernel of a mixed-precision step, on tensor cores where cuDNN and cuBLAS have them (compute
// capability 8.0 and up; older GPUs run the same calls on slower engines).
bool CudaBackend::computes(Kernel16, DType type) const { return type == DType::BFloat16 || type == DType::Float16; }

std::string CudaBackend::kernels_for(DType type) const {
  return fmt::format("{} operands on the GPU: cuDNN convolutions and cuBLAS products with float32 accumulation, "
                     "own kernels computing in float32",
                     dtype_name(type));
}

void CudaBackend::wait(const char* what) {
  capturing_.refuse_host_wait(what);
  COHORT_CUDA_CHECK(cudaStreamSynchronize(compute_), "{} (an earlier kernel may have failed)", what);
}

void CudaBackend::synchronize() {
  const auto active = activate();
  wait("synchronize");
}

std::unique_ptr<BackendStream> CudaBackend::make_stream() { return std::make_unique<CopyStreamImpl>(*this); }

void CudaBackend::copy_from_host(const void* source, const Tensor& destination) {
  const auto active = activate();
  capturing_.refuse_host_wait("copy_from_host");
  if (destination.numel() == 0) return;
  COHORT_CUDA_CHECK(cudaMemcpyAsync(device_bytes(destination), source, destination.bytes(), cudaMemcpyHostToDevice, compute_),
                    "copying {} to the GPU", destination.shape());
  wait("copying to the GPU");
}

void CudaBackend::copy_to_host(const Tensor& source, void* destination) {
  const auto active = activate();
  capturing_.refuse_host_wait("copy_to_host");
  if (source.numel() == 0) return;
  COHORT_CUDA_CHECK(cudaMemcpyAsync(destination, device_bytes(source), source.bytes(), cudaMemcpyDeviceToHost, compute_),
                    "copying {} from the GPU", source.shape());
  wait("copying from the GPU");
}

DeviceEventPtr CudaBackend::copy_to_host_async(const Tensor& source, const Tensor& destination) {
  const auto active = activate();
  capturing_.refuse_host_wait("copy_to_host_async");
  release_passed_holds();
  if (source.numel() > 0)
    COHORT_CUDA_CHECK(cudaMemcpyAsync(destination.host_bytes().data(), device_bytes(source), source.bytes(),
                                      cudaMemcpyDeviceToHost, compute_),
                      "copying {} from the GPU", source.shape());
  return std::make_shared<CudaEvent>(*this, std::vector<Tensor>{source, destination});
}

DeviceEventPtr CudaBackend::record_event() {
  const auto active = activate();
  capturing_.refuse_host_wait("record_event");
  release_passed_holds();
  return std::make_shared<CudaEvent>(*this, std::vector<Tensor>{});
}

namespace {

// Captured work, instantiated. It holds the private pool of the blocks the work was recorded with.
class CudaGraph final : public BackendGraph {
 public:
  CudaGraph(CudaBackend& backend, cudaGraphExec_t graph, std::shared_ptr<void> pool)
      : backend_(backend), graph_(graph), pool_(std::move(pool)) {}
  ~CudaGraph() override {
    cudaSetDevice(backend_.ordinal());  // not activate(): a destructor must not throw, even after a device fault
    cudaGraphExecDestroy(graph_);       // a launch still in flight completes first
    cudaGetLastError();
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void launch() override {
    const auto active = backend_.activate();
    COHORT_CUDA_CHECK(cudaGraphLaunch(graph_, backend_.compute_stream()), "launching captured work on cuda:{}",
                      backend_.ordinal());
  }

 private:
  CudaBackend& backend_;
  cudaGraphExec_t graph_;
  std::shared_ptr<void> pool_;  // released after the graph: the pool's blocks stay its until it is gone
};

}  // namespace

void CudaBackend::begin_capture() {
  capturing_.claim();
  try {
    COHORT_CUDA_CHECK(cudaSetDevice(ordinal_), "selecting cuda:{}", ordinal_);
    capture_pool_ = allocator_->begin_private_pool();
  } catch (...) {
    capturing_.release();
    throw;
  }
  const cudaError_t started = cudaStreamBeginCapture(compute_, cudaStreamCaptureModeThreadLocal);
  if (started != cudaSuccess) {
    allocator_->end_private_pool();
    capture_pool_.reset();
    capturing_.release();
    COHORT_CUDA_CHECK(started, "starting to capture work on cuda:{}", ordinal_);
  }
}

std::unique_ptr<BackendGraph> CudaBackend::end_capture() {
  capturing_.check_claimed();
  // The capture ends whatever happens next: nothing here may throw before the stream leaves capture mode.
  cudaSetDevice(ordinal_);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(compute_, &graph);
  std::shared_ptr<void> pool = std::exchange(capture_pool_, nullptr);
  allocator_->end_private_pool();
  capturing_.release();
  if (ended != cudaSuccess || graph == nullptr) {
    cudaGetLastError();
    throw DeviceError(fmt::format("capturing work on cuda:{} failed: {} ({}); an op of the work made the host wait, or "
                                  "a library call could not be captured",
                                  ordinal_, cudaGetErrorString(ended), cudaGetErrorName(ended)));
  }
  cudaGraphExec_t instance = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&instance, graph, 0);
  cudaGraphDestroy(graph);
  COHORT_CUDA_CHECK(made, "instantiating the work captured on cuda:{}", ordinal_);
  return std::make_unique<CudaGraph>(*this, instance, std::move(pool));
}

void CudaBackend::hold_until_passed(cudaEvent_t event, std::vector<Tensor> tensors) {
  release_passed_holds();
  const std::lock_guard lock(held_mutex_);
  held_.push_back({event, std::move(tensors)});
}

void CudaBackend::release_passed_holds() {
  if (capturing_.is_this_thread()) return;  // an event query would break the capture
  const std::lock_guard lock(held_mutex_);
  std::erase_if(held_, [](const Held& held) {
    if (cudaEventQuery(held.event) == cudaErrorNotReady) return false;
    cudaGetLastError();  // a failed GPU keeps the tensors no longer: its work is over
    cudaEventDestroy(held.event);
    return true;
  });
}

std::shared_ptr<const PlanState> CudaBackend::plan(const Pool2dGeometry&) { return std::make_shared<NoPlan>(); }
std::shared_ptr<const PlanState> CudaBackend::plan(const BatchNormGeometry&) { return std::make_shared<NoPlan>(); }

// Kernel launches report configuration errors at once; faults inside a kernel surface at the next wait.
#define COHORT_CUDA_LAUNCHED(...) COHORT_CUDA_CHECK(cudaGetLastError(), __VA_ARGS__)

void CudaBackend::write_bits(const Tensor& destination, std::uint64_t bits) {
  const auto active = activate();
  kernels::write_bits(device_bytes(destination), bits, static_cast<int>(destination.bytes()), compute_);
  COHORT_CUDA_LAUNCHED("write_bits of {} bytes", destination.bytes());
}

void CudaBackend::zero(const Tensor& x) {
  const auto active = activate();
  if (x.numel() == 0) return;
  COHORT_CUDA_CHECK(cudaMemsetAsync(device_bytes(x), 0, x.bytes(), compute_), "zeroing {} on the GPU", x.shape());
}

void CudaBackend::convert(const Tensor& source, const Tensor& destination) {
  const auto active = activate();
  const auto half_type = [](DType type) {
    return type == DType::BFloat16 ? kernels::HalfType::BFloat16 : kernels::HalfType::Float16;
  };
  const auto* from = static_cast<const std::uint16_t*>(device_bytes(source));
  if (source.dtype() == DType::Float32)
    kernels::narrow(device_data(source), static_cast<std::uint16_t*>(device_bytes(destination)), source.numel(),
                    half_type(destination.dtype()), compute_);
  else if (source.dtype() == DType::Int32)
    kernels::int_to_float(static_cast<const std::int32_t*>(device_bytes(source)), out(destination), source.numel(), compute_);
  else
    kernels::widen(from, out(destination), source.numel(), half_type(source.dtype()), compute_);
  COHORT_CUDA_LAUNCHED("converting {} from {} to {}", source.shape(), dtype_name(source.dtype()),
                       dtype_name(destination.dtype()));
}

void CudaBackend::fill(const Tensor& x, float value) {
  const auto active = activate();
  kernels::fill(out(x), x.numel(), value, compute_);
  COHORT_CUDA_LAUNCHED("fill of {}", x.shape());
}

void CudaBackend::copy(const Tensor& source, const Tensor& destination) {
  const auto active = activate();
  if (source.numel() == 0 || device_data(source) == device_data(destination)) return;
  COHORT_CUDA_CHECK(cudaMemcpyAsync(device_data(destination), device_data(source), source.bytes(), cudaMemcpyDeviceToDevice,
                                    compute_),
                    "copy of {}", source.shape());
}

void CudaBackend::axpy(float alpha, const Tensor& x, const Tensor& y) {
  const auto active = activate();
  kernels::axpy(alpha, in(x), out(y), x.numel(), compute_);
  COHORT_CUDA_LAUNCHED("axpy of {}", x.shape());
}

void CudaBackend::scale(const Tensor& x, float alpha) {
  const auto active = activate();
  kernels::scale(out(x), x.numel(), alpha, compute_);
  COHORT_CUDA_LAUNCHED("scale of {}", x.shape());
}

void CudaBackend::multiply(const Tensor& a, const Tensor& b, const Tensor& result) {
  const auto active = activate();
  with_element_type(a.dtype(), [&]<class T>(std::type_identity<T>) {
    kernels::multiply(in_as<T>(a), in_as<T>(b), out_as<T>(result), a.numel(), compute_);
  });
  COHORT_CUDA_LAUNCHED("multiply of {} {}", dtype_name(a.dtype()), a.shape());
}

double CudaBackend::reduce(const Tensor& x, bool squares, const char* what) {
  const auto active = activate();
  capturing_.refuse_host_wait(what);  // before its kernel is queued
  if (x.numel() == 0) return 0.0;
  Scratch partials(*allocator_, kernels::kMaxPartials * sizeof(double));
  const int count = kernels::partial_sums(in(x), x.numel(), squares, partials.as<double>(), compute_);
  COHORT_CUDA_LAUNCHED("{} of {}", what, x.shape());
  std::vector<double> host(static_cast<std::size_t>(count));
  COHORT_CUDA_CHECK(cudaMemcpyAsync(host.data(), partials.as<double>(), host.size() * sizeof(double),
                                    cudaMemcpyDeviceToHost, compute_),
                    "{} of {}", what, x.shape());
  wait(what);
  double total = 0;
  for (double partial : host) total += partial;
  return total;
}

double CudaBackend::sum(const Tensor& x) { return reduce(x, false, "sum"); }
double CudaBackend::sum_of_squares(const Tensor& x) { return reduce(x, true, "sum_of_squares"); }

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the operands swap, the layouts stay.
// 16-bit A and B accumulate in float32 into C of either type (cublasGemmEx), float32 ones in cublasSgemm.
void CudaBackend::matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& c,
                         float alpha, float beta) {
  const auto active = activate();
  const std::int64_t m = c.dim(0), n = c.dim(1), k = transpose_a ? a.dim(0) : a.dim(1);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // cuBLAS refuses the zero leading dimension this implies; C = beta * C
    if (beta == 0.0f) {
      zero(c);
    } else if (c.dtype() == DType::Float32) {
      scale(c, beta);
    } else {  // the scale kernel takes float32: through a widened copy
      const Tensor wide = Tensor::uninitialized(c.shape(), DType::Float32, c.device());
      convert(c, wide);
      scale(wide, beta);
      convert(wide, c);
    }
    return;
  }
  COHORT_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && a.dim(1) <= INT_MAX && b.dim(1) <= INT_MAX,
               "matmul: {} x {} is too large for one cuBLAS call", a.shape(), b.shape());
  std::lock_guard lock(handle_mutex_);
  const cublasOperation_t op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int rows = static_cast<int>(n), columns = static_cast<int>(m), depth = static_cast<int>(k);
  const auto context = [&] {
    return fmt::format("matmul of {} {}{} and {}{} into {} {}", dtype_name(a.dtype()), a.shape(), transpose_a ? "^T" : "",
                       b.shape(), transpose_b ? "^T" : "", dtype_name(c.dtype()), c.shape());
  };
  if (a.dtype() == DType::Float32) {
    COHORT_CUDA_CHECK(cublasSgemm(cublas_, op_b, op_a, rows, columns, depth, &alpha, in(b), static_cast<int>(b.dim(1)),
                                  in(a), static_cast<int>(a.dim(1)), &beta, out(c), static_cast<int>(c.dim(1))),
                      "{}", context());
    return;
  }
  const cudaDataType_t operands = a.dtype() == DType::BFloat16 ? CUDA_R_16BF : CUDA_R_16F;
  const cudaDataType_t result = c.dtype() == DType::Float32 ? CUDA_R_32F : operands;
  COHORT_CUDA_CHECK(cublasGemmEx(cublas_, op_b, op_a, rows, columns, depth, &alpha, device_bytes(b), operands,
                                 static_cast<int>(b.dim(1)), device_bytes(a), operands, static_cast<int>(a.dim(1)), &beta,
                                 device_bytes(c), result, static_cast<int>(c.dim(1)), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT),
                    "{}", context());
}

void CudaBackend::add_bias(const Tensor& y, const Tensor& bias) { bias_activation_forward(y, bias, Activation::Linear); }

void CudaBackend::bias_activation_forward(const Tensor& y, const Tensor& bias, Activation activation) {
  const auto active = activate();
  const Rows layout = rows_of(y);
  with_element_type(y.dtype(), [&]<class T>(std::type_identity<T>) {
    if (bias.dtype() == DType::Float32)
      kernels::bias_activation(out_as<T>(y), in(bias), activation, layout.count, layout.width, compute_);
    else
      kernels::bias_activation(out_as<T>(y), in_as<T>(bias), activation, layout.count, layout.width, compute_);
  });
  COHORT_CUDA_LAUNCHED("bias and {} of {} {} on {} {}", activation_name(activation), dtype_name(bias.dtype()),
                       bias.shape(), dtype_name(y.dtype()), y.shape());
}

void CudaBackend::bias_gradient(const Tensor& dy, const Tensor& dbias) {
  const auto active = activate();
  const Rows layout = rows_of(dy);
  Scratch scratch(*allocator_, kernels::channel_sums_scratch(layout.count, layout.width) * sizeof(double));
  with_element_type(dy.dtype(), [&]<class T>(std::type_identity<T>) {
    kernels::ChannelSums<T> sums;
    sums.a = in_as<T>(dy);
    sums.rows = layout.count;
    sums.channels = layout.width;
    kernels::channel_sums(sums, scratch.as<double>(), out(dbias), nullptr, compute_);
  });
  COHORT_CUDA_LAUNCHED("bias_gradient of {} {}", dtype_name(dy.dtype()), dy.shape());
}

void CudaBackend::activation_forward(Activation activation, const Tensor& x, const Tensor& y) {
  const auto active = activate();
  COHORT_CHECK(x.dtype() == DType::Float32 || activation != Activation::Softmax,
               "activation_forward: softmax of {} takes float32, got {}", x.shape(), dtype_name(x.dtype()));
  with_element_type(x.dtype(), [&]<class T>(std::type_identity<T>) {
    kernels::activation_forward(activation, in_as<T>(x), out_as<T>(y), x.numel(), rows_of(x).width, compute_);
  });
  COHORT_CUDA_LAUNCHED("activation_forward of {} {}", dtype_name(x.dtype()), x.shape());
}

void CudaBackend::activation_backward(Activation activation, const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const auto active = activate();
  COHORT_CHECK(y.dtype() == DType::Float32 || activation != Activation::Softmax,
               "activation_backward: softmax of {} takes float32, got {}", y.shape(), dtype_name(y.dtype()));
  with_element_type(y.dtype(), [&]<class T>(std::type_identity<T>) {
    kernels::activation_backward(activation, in_as<T>(y), in_as<T>(dy), out_as<T>(dx), y.numel(), rows_of(y).width,
                                 compute_);
  });
  COHORT_CUDA_LAUNCHED("activation_backward of {} {}", dtype_name(y.dtype()), y.shape());
}

void CudaBackend::pool2d_forward(const PlanState*, const Pool2dGeometry& g, const Tensor& x, const Tensor& y) {
  const auto active = activate();
  with_element_type(x.dtype(), [&]<class T>(std::type_identity<T>) {
    kernels::pool2d_forward(g, in_as<T>(x), out_as<T>(y), compute_);
  });
  COHORT_CUDA_LAUNCHED("pool2d_forward of {} {} into {}", dtype_name(x.dtype()), x.shape(), y.shape());
}

void CudaBackend::pool2d_backward(const PlanState*, const Pool2dGeometry& g, const Tensor& x, const Tensor& y,
                                  const Tensor& dy, const Tensor& dx) {
  const auto active = activate();
  with_element_type(x.dtype(), [&]<class T>(std::type_identity<T>) {
    kernels::pool2d_backward(g, in_as<T>(x), in_as<T>(y), in_as<T>(dy), out_as<T>(dx), compute_);
  });
  COHORT_CUDA_LAUNCHED("pool2d_backward of {} {} into {}", dtype_name(dy.dtype()), dy.shape(), dx.shape());
}

void CudaBackend::batch_norm_forward_training(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                              const Tensor& gamma, const Tensor& beta, const Tensor& y,
                                              const Tensor& batch_mean, const Tensor& batch_variance) {
  batch_norm_activation_forward_training(plan, g, x, gamma, beta, Activation::Linear, y, batch_mean, batch_variance);
}

void CudaBackend::batch_norm_activation_forward_training(const PlanState*, const BatchNormGeometry& g, const Tensor& x,
                                                         const Tensor& gamma, const Tensor& beta, Activation activation,
                                                         const Tensor& y, const Tensor& batch_mean,
                                                         const Tensor& batch_variance) {
  const auto active = activate();
  const auto [rows, channels] = rows_of(x);
  Scratch sums(*allocator_, kernels::channel_sums_scratch(rows, channels) * sizeof(double));
  with_element_type(x.dtype(), [&]<class T>(std::type_identity<T>) {
    kernels::batch_statistics(in_as<T>(x), rows, channels, sums.as<double>(), out(batch_mean), out(batch_variance),
                              compute_);
    kernels::batch_norm_normalize(in_as<T>(x), in(batch_mean), in(batch_variance), g.epsilon, in(gamma), in(beta),
                                  activation, out_as<T>(y), rows, channels, compute_);
  });
  COHORT_CUDA_LAUNCHED("batch_norm_forward_training ({}) of {} {}", activation_name(activation), dtype_name(x.dtype()),
                       x.shape());
}

void CudaBackend::batch_norm_forward_inference(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                               const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                                               const Tensor& variance, const Tensor& y) {
  batch_norm_activation_forward_inference(plan, g, x, gamma, beta, mean, variance, Activation::Linear, y);
}

void CudaBackend::batch_norm_activation_forward_inference(const PlanState*, const BatchNormGeometry& g, const Tensor& x,
                                                          const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                                                          const Tensor& variance, Activation activation,
                                                          const Tensor& y) {
  const auto active = activate();
  const auto [rows, channels] = rows_of(x);
  with_element_type(x.dtype(), [&]<class T>(std::type_identity<T>) {
    kernels::batch_norm_normalize(in_as<T>(x), in(mean), in(variance), g.epsilon, in(gamma), in(beta), activation,
                                  out_as<T>(y), rows, channels, compute_);
  });
  COHORT_CUDA_LAUNCHED("batch_norm_forward_inference ({}) of {} {}", activation_name(activation), dtype_name(x.dtype()),
                       x.shape());
}

// What both backward passes share: inv_std = 1 / sqrt(variance + epsilon) (left in `inv_std` for the data
// gradient), dbeta = sum(g) and dgamma = sum(g * xhat), g being dy, or dy through the gradient of the
// activation whose output `activated` is (when defined).
void CudaBackend::parameter_gradients(const BatchNormGeometry& g, const Tensor& x, const Tensor& dy,
                                      const Tensor& activated, Activation activation, const Tensor& mean,
                                      const Tensor& variance, float* inv_std, const Tensor& dgamma,
                                      const Tensor& dbeta) {
  const auto [rows, channels] = rows_of(x);
  Scratch sums(*allocator_, kernels::channel_sums_scratch(rows, channels) * sizeof(double));
  kernels::inverse_std(in(variance), g.epsilon, inv_std, channels, compute_);
  with_element_type(x.dtype(), [&]<class T>(std::type_identity<T>) {
    const kernels::ChannelSums<T> terms{kernels::ChannelTerms::kGradients, in_as<T>(dy), in_as<T>(x), in(mean), inv_std,
                                        rows, channels, activated.defined() ? in_as<T>(activated) : nullptr, activation};
    kernels::channel_sums(terms, sums.as<double>(), out(dbeta), out(dgamma), compute_);
  });
}

void CudaBackend::batch_norm_backward(const PlanState* plan, const BatchNormGeometry& g, const Tensor& x,
                                      const Tensor& gamma, const Tensor& dy, const Tensor& batch_mean,
                                      const Tensor& batch_variance, const Tensor& dx, const Tensor& dgamma,
                                      const Tensor& dbeta) {
  batch_norm_activation_backward(plan, g, x, Tensor(), gamma, Tensor(), dy, batch_mean, batch_variance,
                                 Activation::Linear, dx, dgamma, dbeta);
}

// The activation's gradient is taken as each element is read, in the sums and in the data gradient: no pass
// and no buffer of its own.
void CudaBackend::batch_norm_activation_backward(const PlanState*, const BatchNormGeometry& g, const Tensor& x,
                                                 const Tensor& y, const Tensor& gamma, const Tensor&, const Tensor& dy,
                                                 const Tensor& batch_mean, const Tensor& batch_variance,
                                                 Activation activation, const Tensor& dx, const Tensor& dgamma,
                                                 const Tensor& dbeta) {
  const auto active = activate();
  const auto [rows, channels] = rows_of(x);
  const Tensor activated = activation == Activation::Linear ? Tensor() : y;
  Scratch inv_std(*allocator_, channels * sizeof(float));
  parameter_gradients(g, x, dy, activated, activation, batch_mean, batch_variance, inv_std.as<float>(), dgamma, dbeta);
  if (dx.defined()) {
    with_element_type(x.dtype(), [&]<class T>(std::type_identity<T>) {
      kernels::batch_norm_data_gradient(in_as<T>(x), in_as<T>(dy), activated.defined() ? in_as<T>(activated) : nullptr,
                                        activation, in(batch_mean), inv_std.as<float>(), in(gamma), in(dbeta),
                                        in(dgamma), out_as<T>(dx), rows, channels, compute_);
    });
  }
  COHORT_CUDA_LAUNCHED("batch_norm_backward ({}) of {} {}", activation_name(activation), dtype_name(x.dtype()), x.shape());
}

void CudaBackend::batch_norm_backward_inference(const PlanState*, const BatchNormGeometry& g, const Tensor& x,
                                                const Tensor& gamma, const Tensor& dy, const Tensor& mean,
                                                const Tensor& variance, const Tensor& dx, const Tensor& dgamma,
                                                const Tensor& dbeta) {
  const auto active = activate();
  const auto [rows, channels] = rows_of(x);
  Scratch inv_std(*allocator_, channels * sizeof(float));
  parameter_gradients(g, x, dy, Tensor(), Activation::Linear, mean, variance, inv_std.as<float>(), dgamma, dbeta);
  if (dx.defined()) {
    with_element_type(x.dtype(), [&]<class T>(std::type_identity<T>) {
      kernels::batch_norm_data_gradient_inference(in_as<T>(dy), inv_std.as<float>(), in(gamma), out_as<T>(dx), rows,
                                                  channels, compute_);
    });
  }
  COHORT_CUDA_LAUNCHED("batch_norm_backward_inference of {} {}", dtype_name(x.dtype()), x.shape());
}

void CudaBackend::moving_average_update(const Tensor& moving, const Tensor& batch, float momentum) {
  const auto active = activate();
  kernels::moving_average(out(moving), in(batch), moving.numel(), momentum, compute_);
  COHORT_CUDA_LAUNCHED("moving_average_update of {}", moving.shape());
}

void CudaBackend::dropout_mask(const Tensor& mask, float rate, std::uint64_t seed, const Tensor& step) {
  const auto active = activate();
  const auto* device_step = step.defined() ? static_cast<const std::uint64_t*>(device_bytes(step)) : nullptr;
  with_element_type(mask.dtype(), [&]<class T>(std::type_identity<T>) {
    kernels::dropout_mask(out_as<T>(mask), mask.numel(), DropoutRule::of(rate, seed), seed, device_step, compute_);
  });
  COHORT_CUDA_LAUNCHED("dropout_mask of {} {}", dtype_name(mask.dtype()), mask.shape());
}

void CudaBackend::expand_images(const Tensor& images, const Tensor& indices, const Tensor& draws, const Tensor& mean,
                                const Tensor& stddev, const Tensor& expanded) {
  const auto active = activate();
  kernels::expand_images({images.dim(1), images.dim(2), images.dim(3)}, expanded.dim(0), in_as<std::uint8_t>(images),
                         images.dim(0), indices.defined() ? in_as<std::int32_t>(indices) : nullptr,
                         in_as<std::int32_t>(draws), in(mean), in(stddev), out(expanded), compute_);
  COHORT_CUDA_LAUNCHED("expand_images of {} from {}", expanded.shape(), images.shape());
}

namespace {

// Launches `launch` for the variables in lists of at most kMaxTensorsPerLaunch; `operands` gives a
// variable's value, gradient and slots.
template <class Operands, class Pointers, class Launch>
void for_each_list(const std::vector<Operands>& variables, Pointers&& operands, Launch&& launch) {
  kernels::TensorList list;
  const auto flush = [&] {
    if (list.count > 0) launch(list);
    list = {};
  };
  for (const Operands& variable : variables) {
    const auto tensors = operands(variable);
    for (std::size_t k = 0; k < tensors.size(); ++k) list.operand[k][list.count] = out(*tensors[k]);
    list.size[list.count++] = variable.value.numel();
    if (list.count == kernels::kMaxTensorsPerLaunch) flush();
  }
  flush();
}

}  // namespace

void CudaBackend::sgd_update(const std::vector<ops::SgdOperands>& variables, const Tensor& learning_rate, float momentum,
                             bool nesterov, float weight_decay) {
  const auto active = activate();
  for_each_list(
      variables,
      [](const ops::SgdOperands& v) { return std::array<const Tensor*, 3>{&v.value, &v.gradient, &v.velocity}; },
      [&](const kernels::TensorList& list) {
        kernels::sgd_update(list, in(learning_rate), momentum, nesterov, weight_decay, compute_);
      });
  COHORT_CUDA_LAUNCHED("sgd_update of {} variables", variables.size());
}

void CudaBackend::adam_update(const std::vector<ops::AdamOperands>& variables, const Tensor& learning_rate, float beta_1,
                              float beta_2, float epsilon, float weight_decay) {
  const auto active = activate();
  for_each_list(
      variables, [](const ops::AdamOperands& v) { return std::array<const Tensor*, 4>{&v.value, &v.gradient, &v.m, &v.v}; },
      [&](const kernels::TensorList& list) {
        kernels::adam_update(list, in(learning_rate), beta_1, beta_2, epsilon, weight_decay, compute_);
      });
  COHORT_CUDA_LAUNCHED("adam_update of {} variables", variables.size());
}

void CudaBackend::rmsprop_update(const std::vector<ops::RmspropOperands>& variables, const Tensor& learning_rate, float rho,
                                 float momentum, float epsilon, float weight_decay) {
  const auto active = activate();
  for_each_list(
      variables,
      [](const ops::RmspropOperands& v) {
        return std::array<const Tensor*, 5>{&v.value, &v.gradient, &v.mean_square, &v.mean_gradient, &v.velocity};
      },
      [&](const kernels::TensorList& list) {
        kernels::rmsprop_update(list, in(learning_rate), rho, momentum, epsilon, weight_decay, compute_);
      });
  COHORT_CUDA_LAUNCHED("rmsprop_update of {} variables", variables.size());
}

template <class Launch>
void CudaBackend::add_row_sums(const char* what, const Tensor& scores, const Tensor& labels, bool class_indices,
                               const RunningSums& sums, int slot, Launch&& launch) {
  const auto active = activate();
  const SumTarget target = sum_target(sums, slot);
  const std::int64_t rows = scores.dim(0);
  if (rows == 0) return;
  const std::int64_t classes = scores.numel() / rows;  // or outputs per row, for the element-wise losses
  // Freed before the kernels run: the caching allocator hands it out again only to later work on this stream.
  Scratch values(*allocator_, rows * sizeof(double) + sizeof(unsigned long long));
  kernels::LossRows loss{in(scores), in(labels), class_indices, rows, classes, values.as<double>(),
                         reinterpret_cast<unsigned long long*>(values.as<double>() + rows)};
  COHORT_CUDA_CHECK(cudaMemsetAsync(loss.bad_row, 0xFF, sizeof(unsigned long long), compute_), "{} of {}", what,
                    scores.shape());
  launch(loss);
  kernels::add_rows(loss, target.sum, target.bad_label, compute_);
  COHORT_CUDA_LAUNCHED("{} of {}", what, scores.shape());
}

void CudaBackend::softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& dlogits,
                                        const RunningSums& sums, int slot) {
  add_row_sums("softmax_cross_entropy", logits, labels, labels.rank() == 1, sums, slot,
               [&](const kernels::LossRows& rows) { kernels::softmax_cross_entropy(rows, out(dlogits), compute_); });
}

void CudaBackend::categorical_cross_entropy(const Tensor& probabilities, const Tensor& labels,
                                            const Tensor& dprobabilities, const RunningSums& sums, int slot) {
  add_row_sums("categorical_cross_entropy", probabilities, labels, labels.rank() == 1, sums, slot,
               [&](const kernels::LossRows& rows) {
                 kernels::categorical_cross_entropy(rows, out(dprobabilities), compute_);
               });
}

void CudaBackend::count_correct(const Tensor& scores, const Tensor& labels, const RunningSums& sums, int slot) {
  add_row_sums("count_correct", scores, labels, labels.rank() == 1, sums, slot,
               [&](const kernels::LossRows& rows) { kernels::count_correct(rows, compute_); });
}

void CudaBackend::count_top_k(const Tensor& scores, const Tensor& labels, int k, const RunningSums& sums, int slot) {
  add_row_sums("count_top_k", scores, labels, labels.rank() == 1, sums, slot,
               [&](const kernels::LossRows& rows) { kernels::count_top_k(rows, k, compute_); });
}

void CudaBackend::elementwise_loss(ElementwiseLoss loss, const Tensor& prediction, const Tensor& targets,
                                   const Tensor& gradient, const RunningSums& sums, int slot) {
  add_row_sums("elementwise_loss", prediction, targets, false, sums, slot, [&](const kernels::LossRows& rows) {
    kernels::elementwise_loss(loss, rows, out(gradient), compute_);
  });
}

// ---- the plugin's entry points (cuda_plugin.hpp)

namespace {

std::atomic<Allocator*> pinned_allocator{nullptr};

Backend& cuda_backend() {
  static CudaBackend* backend = [] {
    auto* made = new CudaBackend();
    // From now on staging buffers are page-locked: this process uses the GPU.
    pinned_allocator.store(&made->pinned_allocator());
    return made;
  }();
  return *backend;
}

bool cuda_device_visible() {
  int count = 0;
  const bool visible = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return visible;
}

Allocator* cuda_pinned_allocator() { return pinned_allocator.load(); }

int cuda_ordinal() { return static_cast<CudaBackend&>(cuda_backend()).ordinal(); }

constexpr CudaPlugin kPlugin{{COHORT_VERSION_STRING, kCudaPluginLayout}, cuda_backend, cuda_device_visible,
                             cuda_pinned_allocator, cuda_ordinal};

}  // namespace

}  // namespace cohort::cuda

extern "C" __attribute__((visibility("default"))) const cohort::PluginHeader* cohort_cuda_plugin() {
  return &cohort::cuda::kPlugin.header;
}
