#include "cpu_backend.hpp"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "onednn.hpp"
#include "tensor/backend_access.hpp"

namespace cohort::cpu {
namespace {

// Copies run in order on a thread of the stream's own, so that the caller overlaps them with compute.
class ThreadStream final : public BackendStream {
 public:
  ThreadStream() : worker_([this] { run(); }) {}
  ~ThreadStream() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    worker_.join();
  }

  void enqueue_copy(const Tensor& source, const Tensor& destination) override {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back({source, destination});
    }
    changed_.notify_all();
  }

  void synchronize() override {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return queue_.empty() && !busy_; });
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  }

 private:
  struct Job {
    Tensor source, destination;
  };

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Job job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      try {
        if (job.source.numel() > 0) std::memcpy(device_data(job.destination), device_data(job.source), job.source.bytes());
      } catch (...) {
        std::lock_guard relock(mutex_);
        if (!failure_) failure_ = std::current_exception();
      }
      job = {};
      lock.lock();
      busy_ = false;
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> queue_;
  bool busy_ = false, stopping_ = false;
  std::exception_ptr failure_;
  std::thread worker_;
};

}  // namespace

CpuBackend::CpuBackend(Device device, std::unique_ptr<Allocator> allocator)
    : device_(device), allocator_(std::move(allocator)) {}

std::unique_ptr<BackendStream> CpuBackend::make_stream() { return std::make_unique<ThreadStream>(); }

bool CpuBackend::computes(Kernel16, DType type) const {
  return type == DType::BFloat16 && onednn::bf16_kernels() == onednn::Bf16Kernels::Native;
}

std::string CpuBackend::kernels_for(DType type) const {
  if (type == DType::BFloat16) return onednn::bf16_kernels_description();
  return fmt::format("float32 stand-ins: the CPU computes {} in float32", dtype_name(type));
}

void CpuBackend::copy_from_host(const void* source, const Tensor& destination) {
  if (destination.numel() > 0) std::memcpy(device_bytes(destination), source, destination.bytes());
}

void CpuBackend::copy_to_host(const Tensor& source, void* destination) {
  copies_to_host_.fetch_add(1, std::memory_order_relaxed);
  if (source.numel() > 0) std::memcpy(destination, device_bytes(source), source.bytes());
}

namespace {

// Lands in a destination it holds, so that the bytes never go into memory given to another tensor.
class DeferredCopy final : public DeviceEvent {
 public:
  DeferredCopy(std::vector<std::byte> bytes, Tensor destination) : bytes_(std::move(bytes)), destination_(std::move(destination)) {}
  bool finished() const override {
    std::call_once(landed_, [this] {
      if (!bytes_.empty()) std::memcpy(destination_.host_bytes().data(), bytes_.data(), bytes_.size());
    });
    return true;
  }

 private:
  std::vector<std::byte> bytes_;
  Tensor destination_;
  mutable std::once_flag landed_;
};

}  // namespace

DeviceEventPtr CpuBackend::copy_to_host_async(const Tensor& source, const Tensor& destination) {
  const auto* bytes = static_cast<const std::byte*>(device_bytes(source));
  std::vector<std::byte> taken;
  if (source.numel() > 0) taken.assign(bytes, bytes + source.bytes());
  return std::make_shared<DeferredCopy>(std::move(taken), destination);
}

std::shared_ptr<const PlanState> CpuBackend::plan(const Pool2dGeometry&) { return std::make_shared<NoPlan>(); }
std::shared_ptr<const PlanState> CpuBackend::plan(const BatchNormGeometry&) { return std::make_shared<NoPlan>(); }

void CpuBackend::matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& c,
                        float alpha, float beta) {
  if (a.dtype() == DType::BFloat16) return onednn::matmul(a, transpose_a, b, transpose_b, c, alpha, beta);
  const std::int64_t k = transpose_a ? a.dim(0) : a.dim(1);
  gemm(transpose_a, transpose_b, c.dim(0), c.dim(1), k, alpha, device_data(a), a.dim(1), device_data(b), b.dim(1), beta,
       device_data(c), c.dim(1));
}

}  // namespace cohort::cpu
