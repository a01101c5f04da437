// The Communicator over any Transport: the ring algorithms of collectives.cpp, run on the executor's
// thread so that a strategy can go on while a collective is in flight.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "cohort/comm/communicator.hpp"
#include "cohort/core/check.hpp"
#include "comm/serial_executor.hpp"

namespace cohort::comm {
namespace {

std::span<std::byte> bytes_of(const Buffer& buffer) { return {static_cast<std::byte*>(buffer.data), buffer.bytes()}; }

class RingCommunicator final : public Communicator {
 public:
  RingCommunicator(Transport& transport, std::vector<int> host_of)
      : transport_(transport), host_of_(std::move(host_of)), hierarchical_(spans_hosts_with_several_ranks(host_of_)) {
    COHORT_CHECK(host_of_.empty() || static_cast<int>(host_of_.size()) == transport_.size(),
                 "ring communicator: {} hosts given for {} ranks", host_of_.size(), transport_.size());
  }

  std::string name() const override { return hierarchical_ ? "hierarchical ring" : "ring"; }
  int rank() const override { return transport_.rank(); }
  int size() const override { return transport_.size(); }
  bool accepts(Device device) const override { return device == Device::CPU; }
  // Each of the ring's 2 (n - 1) steps may take the transport's timeout; a lost peer is reported by the
  // transport long before.
  std::chrono::milliseconds timeout() const override { return transport_.timeout() * (2 * std::max(1, size())); }

  WorkPtr allreduce(Buffer data, ReduceOp op) override {
    check_host("allreduce", data);
    const std::string_view algorithm = hierarchical_ ? "hierarchical" : allreduce_algorithm(data.bytes(), size());
    return executor_.submit(fmt::format("{} allreduce of {} bytes", algorithm, data.bytes()), [this, data, op] {
      if (hierarchical_) comm::hierarchical_allreduce(transport_, host_of_, bytes_of(data), {.op = op, .type = data.type});
      else comm::allreduce(transport_, bytes_of(data), {.op = op, .type = data.type});
    });
  }

  WorkPtr broadcast(Buffer data, int root) override {
    check_host("broadcast", data);
    return executor_.submit(fmt::format("broadcast of {} bytes from rank {}", data.bytes(), root),
                            [this, data, root] { comm::broadcast(transport_, root, bytes_of(data)); });
  }

  WorkPtr allgather(Buffer mine, Buffer all) override {
    check_host("allgather", mine);
    check_host("allgather", all);
    COHORT_CHECK(mine.type == all.type, "allgather: elements of different types");
    return executor_.submit(fmt::format("allgather of {} bytes", all.bytes()),
                            [this, mine, all] { comm::allgather(transport_, bytes_of(mine), bytes_of(all)); });
  }

 private:
  static void check_host(const char* op, const Buffer& buffer) {
    if (buffer.device != Device::CPU)
      throw DeviceError(fmt::format("ring communicator {}: a buffer on {}; the ring reduces host memory only, stage "
                                    "device buffers through the host",
                                    op, device_name(buffer.device)));
  }

  Transport& transport_;
  std::vector<int> host_of_;
  bool hierarchical_;
  SerialExecutor executor_{"ring communicator"};  // last: its thread stops before the members it uses go away
};

}  // namespace

std::unique_ptr<Communicator> make_ring_communicator(Transport& transport, std::vector<int> host_of) {
  return std::make_unique<RingCommunicator>(transport, std::move(host_of));
}

}  // namespace cohort::comm
