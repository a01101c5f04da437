// Collectives through NCCL on the GPU, on a stream and a thread of the communicator's own. NCCL is used in
// its non-blocking mode so that a collective can be watched and aborted: the executor thread polls the
// stream and NCCL's asynchronous error state until the collective finishes, fails, or outlives the
// timeout.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#include "cohort/core/check.hpp"
#include "cohort/core/config.hpp"
#include "comm/reduce_scatter_checks.hpp"
#include "comm/serial_executor.hpp"
#include "nccl_plugin.hpp"

namespace cohort::comm {
namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  throw DeviceError(fmt::format("NCCL communicator: {} failed: {}", call, cudaGetErrorString(status)));
}

void check_nccl(ncclResult_t result, const char* call) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  throw IoError(fmt::format("{} failed: {} ({})", call, ncclGetErrorString(result), ncclGetLastError(nullptr)));
}

ncclDataType_t nccl_type(DType type) {
  switch (type) {
    case DType::Float32: return ncclFloat32;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float16: return ncclFloat16;
    case DType::Int32: return ncclInt32;
    case DType::UInt8: return ncclUint8;
  }
  throw InvalidArgument(fmt::format("NCCL communicator: no element type has code {}", static_cast<int>(type)));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, int gpu, const ncclUniqueId& id, std::chrono::milliseconds timeout)
      : rank_(rank), size_(size), gpu_(gpu), timeout_(timeout) {
    executor_.submit("NCCL initialization", [this, id] {
      check_cuda(cudaSetDevice(gpu_), "cudaSetDevice");
      check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t started = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
      if (started != ncclSuccess && started != ncclInProgress) abort();
      check_nccl(started, "ncclCommInitRankConfig");
      watch("ncclCommInitRankConfig", /*stream_work=*/false);
    })->wait(timeout_ + std::chrono::seconds(5));
  }

  ~NcclCommunicator() override {
    executor_.submit("NCCL teardown", [this] {
      cudaSetDevice(gpu_);
      if (comm_ != nullptr && !aborted_) {
        ncclCommFinalize(comm_);
        ncclResult_t state = ncclInProgress;
        const auto deadline = Clock::now() + timeout_;
        while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress && Clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (state == ncclSuccess) ncclCommDestroy(comm_); else ncclCommAbort(comm_);
      }
      if (stream_ != nullptr) cudaStreamDestroy(stream_);
    });
  }

  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool accepts(Device device) const override { return device == Device::CUDA; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void expect_buffers_up_to(std::uint64_t) override {}  // NCCL reads into the buffers themselves
  void announce_failure(const std::string&) override {}  // its host communicator tells the others

  WorkPtr allreduce(Buffer data, ReduceOp op) override {
    check_gpu("allreduce", data);
    COHORT_CHECK(data.wire == data.type, "NCCL communicator: carries {} as it is, not as {}; bfloat16 on the wire takes the "
                 "ring communicator", dtype_name(data.type), dtype_name(data.wire));
    return executor_.submit(fmt::format("ncclAllReduce of {} bytes", data.bytes()), [this, data, op] {
      run("ncclAllReduce", data.ready, [&] {
        return ncclAllReduce(data.data, data.data, data.count, nccl_type(data.type),
                             op == ReduceOp::Mean ? ncclAvg : ncclSum, comm_, stream_);
      });
    });
  }

  WorkPtr broadcast(Buffer data, int root) override {
    check_gpu("broadcast", data);
    COHORT_CHECK(root >= 0 && root < size_, "broadcast root {} outside a group of {}", root, size_);
    return executor_.submit(fmt::format("ncclBroadcast of {} bytes from rank {}", data.bytes(), root), [this, data, root] {
      run("ncclBroadcast", data.ready, [&] {
        return ncclBroadcast(data.data, data.data, data.count, nccl_type(data.type), root, comm_, stream_);
      });
    });
  }

  WorkPtr allgather(Buffer mine, Buffer all) override {
    check_gpu("allgather", mine);
    check_gpu("allgather", all);
    COHORT_CHECK(mine.type == all.type && all.count == mine.count * static_cast<std::size_t>(size_),
                 "allgather: {} elements cannot hold {} blocks of {}", all.count, size_, mine.count);
    return executor_.submit(fmt::format("ncclAllGather of {} bytes", all.bytes()), [this, mine, all] {
      run("ncclAllGather", mine.ready, [&] {
        return ncclAllGather(mine.data, all.data, mine.count, nccl_type(mine.type), comm_, stream_);
      });
    });
  }

  WorkPtr reduce_scatter(Buffer data, ReduceOp op) override {
    check_gpu("reduce_scatter", data);
    check_reduce_scatter_buffer("NCCL", data, size_);
    return executor_.submit(fmt::format("ncclReduceScatter of {} bytes", data.bytes()), [this, data, op] {
      const std::size_t block = data.count / static_cast<std::size_t>(size_);
      // In place: NCCL's result buffer may be the sender's own block.
      auto* mine = static_cast<std::byte*>(data.data) + static_cast<std::size_t>(rank_) * block * element_size(data.type);
      run("ncclReduceScatter", data.ready, [&] {
        return ncclReduceScatter(data.data, mine, block, nccl_type(data.type), op == ReduceOp::Mean ? ncclAvg : ncclSum,
                                 comm_, stream_);
      });
    });
  }

 private:
  static void check_gpu(const char* op, const Buffer& buffer) {
    if (buffer.device != Device::CUDA)
      throw DeviceError(fmt::format("NCCL communicator {}: a buffer on {}; NCCL reduces GPU memory", op,
                                    device_name(buffer.device)));
  }

  // Enqueues the call on the communicator's stream, after the point its buffer is written at (`ready`, an
  // event of the compute stream that the stream waits for: this thread does not), and watches it finish.
  template <class Enqueue>
  void run(const char* call, const DeviceEventPtr& ready, Enqueue&& enqueue) {
    if (aborted_) throw IoError(fmt::format("{}: the NCCL communicator was aborted after an earlier failure", call));
    check_cuda(cudaSetDevice(gpu_), "cudaSetDevice");
    if (ready != nullptr && ready->cuda_event() != nullptr)
      check_cuda(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(ready->cuda_event()), 0), "cudaStreamWaitEvent");
    else wait_until_finished(ready, timeout_, call);
    check_nccl(enqueue(), call);
    watch(call, /*stream_work=*/true, ready);
  }

  // Waits until NCCL has finished the call (and its stream work), polling for errors; aborts on an error
  // or when the timeout passes, so that a dead peer never hangs this thread. The timeout counts from the point
  // `ready`, which the stream waits for first: until then the GPU's own work is what the call waits for.
  void watch(const char* call, bool stream_work, const DeviceEventPtr& ready = nullptr) {
    auto deadline = Clock::now() + timeout_;
    bool buffer_written = ready == nullptr;
    for (;;) {
      if (!buffer_written && ready->finished()) {
        buffer_written = true;
        deadline = Clock::now() + timeout_;
      }
      ncclResult_t state = ncclSuccess;
      const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
      if (queried != ncclSuccess) state = queried;
      if (state != ncclSuccess && state != ncclInProgress) {
        abort();
        throw IoError(fmt::format("{} failed on rank {} of {}: {} ({}); a peer may have left the group", call, rank_,
                                  size_, ncclGetErrorString(state), ncclGetLastError(nullptr)));
      }
      if (state == ncclSuccess) {
        if (!stream_work) return;
        const cudaError_t done = cudaStreamQuery(stream_);
        if (done == cudaSuccess) return;
        if (done != cudaErrorNotReady) {
          abort();
          check_cuda(done, call);
        }
      }
      if (Clock::now() > deadline) {
        abort();
        if (!buffer_written)
          throw TimeoutError(fmt::format("{} on rank {} of {}: the GPU did not finish the work that writes its buffer "
                                         "within {} ms; the NCCL communicator was aborted",
                                         call, rank_, size_, timeout_.count()));
        throw TimeoutError(fmt::format("{} on rank {} of {} did not finish within {} ms: a peer stopped joining the "
                                       "collective; the NCCL communicator was aborted",
                                       call, rank_, size_, timeout_.count()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void abort() {
    if (aborted_ || comm_ == nullptr) return;
    ncclCommAbort(comm_);
    aborted_ = true;
  }

  int rank_, size_, gpu_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool aborted_ = false;
  SerialExecutor executor_{"nccl communicator"};  // last: its thread stops before the members it uses go away
};

NcclPlugin::Uuid gpu_uuid(int gpu) {
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, gpu), "cudaGetDeviceProperties");
  NcclPlugin::Uuid uuid{};
  std::memcpy(uuid.data(), properties.uuid.bytes, uuid.size());
  return uuid;
}

void make_unique_id(std::span<std::byte> id) {
  ncclUniqueId made{};
  check_nccl(ncclGetUniqueId(&made), "ncclGetUniqueId");
  std::memcpy(id.data(), &made, sizeof made);
}

std::unique_ptr<Communicator> create_communicator(int rank, int size, int gpu, std::span<const std::byte> id,
                                                  std::chrono::milliseconds timeout) {
  ncclUniqueId unique{};
  std::memcpy(&unique, id.data(), sizeof unique);
  return std::make_unique<NcclCommunicator>(rank, size, gpu, unique, timeout);
}

static_assert(sizeof(ncclUniqueId) == NcclPlugin::kUniqueIdBytes);
constexpr NcclPlugin kPlugin{{COHORT_VERSION_STRING, kNcclPluginLayout}, gpu_uuid, make_unique_id, create_communicator};

}  // namespace
}  // namespace cohort::comm

extern "C" __attribute__((visibility("default"))) const cohort::PluginHeader* cohort_nccl_plugin() {
  return &cohort::comm::kPlugin.header;
}
