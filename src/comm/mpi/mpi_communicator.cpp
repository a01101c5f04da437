// Collectives through Open MPI. MPI is initialized with MPI_THREAD_SERIALIZED on the executor's thread,
// which then makes every MPI call of this process, so no two calls ever overlap.
#include <mpi.h>

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "cohort/core/check.hpp"
#include "cohort/core/config.hpp"
#include "comm/reduce_scatter_checks.hpp"
#include "comm/serial_executor.hpp"
#include "mpi_plugin.hpp"

namespace cohort::comm {
namespace {

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw IoError(fmt::format("{} failed: {}", call, std::string_view(text, static_cast<std::size_t>(length))));
}

MPI_Datatype mpi_type(DType type) {
  if (type == DType::Float32) return MPI_FLOAT;
  if (type == DType::Int32) return MPI_INT32_T;
  throw InvalidArgument(fmt::format("MPI communicator: MPI has no {} type to reduce", dtype_name(type)));
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MpiOptions options) : options_(options) {
    executor_.submit("MPI initialization", [this] {
      int initialized = 0, finalized = 0;
      MPI_Initialized(&initialized);
      MPI_Finalized(&finalized);
      if (finalized)
        throw InvalidArgument("MPI was already finalized in this process; keep one MPI communicator for the whole run");
      if (!initialized) {
        int provided = 0;
        check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
        initialized_here_ = true;
        if (provided < MPI_THREAD_SERIALIZED)
          throw InvalidArgument("this MPI library cannot be called from a thread other than main "
                                "(MPI_THREAD_SERIALIZED not provided)");
      }
      // Errors come back as codes, which check_mpi turns into exceptions, instead of aborting the job.
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
      MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
      MPI_Comm_size(MPI_COMM_WORLD, &size_);
    })->wait(options_.timeout);
  }

  ~MpiCommunicator() override {
    if (!initialized_here_) return;
    try {
      executor_.submit("MPI_Finalize", [] { MPI_Finalize(); })->wait(options_.timeout);
    } catch (...) {
      // A collective that never returns (a peer died inside it) holds the MPI thread: waiting for it would
      // hang this process, so the job is ended through mpirun, which names the rank.
      std::fprintf(stderr, "cohort: MPI did not finalize within %lld ms; aborting the MPI job\n",
                   static_cast<long long>(options_.timeout.count()));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }

  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool accepts(Device device) const override { return device == Device::CPU; }
  std::chrono::milliseconds timeout() const override { return options_.timeout; }
  void expect_buffers_up_to(std::uint64_t) override {}  // MPI's own transport buffers on its own terms
  void announce_failure(const std::string&) override {}  // mpirun ends the job and names the rank that failed

  WorkPtr allreduce(Buffer data, ReduceOp op) override {
    check_host("allreduce", data);
    COHORT_CHECK(data.wire == data.type, "MPI communicator: carries {} as it is, not as {}; bfloat16 on the wire takes the "
                 "ring communicator", dtype_name(data.type), dtype_name(data.wire));
    return executor_.submit(fmt::format("MPI_Allreduce of {} bytes", data.bytes()), [this, data, op] {
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, data.data, count_of(data), mpi_type(data.type), MPI_SUM, MPI_COMM_WORLD),
                "MPI_Allreduce");
      if (op == ReduceOp::Mean) {
        auto* values = static_cast<float*>(data.data);
        const float inverse = 1.0f / static_cast<float>(size_);
        for (std::size_t i = 0; i < data.count; ++i) values[i] *= inverse;
      }
    }, data.ready, options_.timeout);
  }

  WorkPtr broadcast(Buffer data, int root) override {
    check_host("broadcast", data);
    COHORT_CHECK(root >= 0 && root < size_, "broadcast root {} outside a group of {}", root, size_);
    return executor_.submit(fmt::format("MPI_Bcast of {} bytes from rank {}", data.bytes(), root), [data, root] {
      check_mpi(MPI_Bcast(data.data, count_of(data), mpi_type(data.type), root, MPI_COMM_WORLD), "MPI_Bcast");
    }, data.ready, options_.timeout);
  }

  WorkPtr allgather(Buffer mine, Buffer all) override {
    check_host("allgather", mine);
    check_host("allgather", all);
    COHORT_CHECK(mine.type == all.type && all.count == mine.count * static_cast<std::size_t>(size_),
                 "allgather: {} elements cannot hold {} blocks of {}", all.count, size_, mine.count);
    const bool in_place = mine.data == static_cast<std::byte*>(all.data) + static_cast<std::size_t>(rank_) * mine.bytes();
    return executor_.submit(fmt::format("MPI_Allgather of {} bytes", all.bytes()), [mine, all, in_place] {
      check_mpi(MPI_Allgather(in_place ? MPI_IN_PLACE : mine.data, count_of(mine), mpi_type(mine.type), all.data,
                              count_of(mine), mpi_type(all.type), MPI_COMM_WORLD),
                "MPI_Allgather");
    }, mine.ready, options_.timeout);
  }

  WorkPtr reduce_scatter(Buffer data, ReduceOp op) override {
    check_host("reduce_scatter", data);
    check_reduce_scatter_buffer("MPI", data, size_);
    return executor_.submit(fmt::format("MPI_Reduce_scatter_block of {} bytes", data.bytes()), [this, data, op] {
      Buffer block = data;
      block.count = data.count / static_cast<std::size_t>(size_);
      // MPI puts an in-place result at the start of the buffer: it is received apart and moved to this rank's block.
      reduced_.resize(block.bytes());
      check_mpi(MPI_Reduce_scatter_block(data.data, reduced_.data(), count_of(block), mpi_type(data.type), MPI_SUM,
                                         MPI_COMM_WORLD),
                "MPI_Reduce_scatter_block");
      auto* mine = static_cast<float*>(data.data) + static_cast<std::size_t>(rank_) * block.count;
      std::memcpy(mine, reduced_.data(), block.bytes());
      if (op == ReduceOp::Mean)
        for (std::size_t i = 0; i < block.count; ++i) mine[i] *= 1.0f / static_cast<float>(size_);
    }, data.ready, options_.timeout);
  }

 private:
  static int count_of(const Buffer& buffer) {
    COHORT_CHECK(buffer.count <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
                 "MPI collectives take at most 2^31 - 1 elements, got {}", buffer.count);
    return static_cast<int>(buffer.count);
  }
  static void check_host(const char* op, const Buffer& buffer) {
    if (buffer.device != Device::CPU)
      throw DeviceError(fmt::format("MPI communicator {}: a buffer on {}; this communicator reduces host memory",
                                    op, device_name(buffer.device)));
  }

  MpiOptions options_;
  int rank_ = 0, size_ = 1;
  bool initialized_here_ = false;
  std::vector<std::byte> reduced_;  // reduce_scatter's result, on the MPI thread
  SerialExecutor executor_{"mpi communicator"};  // last: its thread stops before the members it uses go away
};

std::shared_ptr<Communicator> create_communicator(MpiOptions options) {
  // MPI can be initialized once per process: one communicator serves every caller.
  static std::mutex mutex;
  static std::weak_ptr<Communicator> current;
  std::lock_guard lock(mutex);
  if (auto existing = current.lock()) return existing;
  auto made = std::make_shared<MpiCommunicator>(options);
  current = made;
  return made;
}

constexpr MpiPlugin kPlugin{{COHORT_VERSION_STRING, kMpiPluginLayout}, create_communicator};

}  // namespace
}  // namespace cohort::comm

extern "C" __attribute__((visibility("default"))) const cohort::PluginHeader* cohort_mpi_plugin() {
  return &cohort::comm::kPlugin.header;
}
