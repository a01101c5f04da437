// The Communicator over any Transport: the ring algorithms of collectives.cpp, run on the executor's
// thread so that a strategy can go on while a collective is in flight. Each rank reports through the
// transport how many collectives it has started, so that a timed-out wait names the peer that never
// started the collective (alive, its heartbeats going on, but stuck) rather than the neighbour waited on.
// A rank hears only the peers it is connected to (connections on demand): one that finds none of them
// behind waits a moment for the verdict of a rank that does, which reaches the whole group.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <vector>

#include "cohort/comm/allreduce_timings.hpp"
#include "cohort/comm/communicator.hpp"
#include "cohort/comm/progress_deadline.hpp"
#include "cohort/core/check.hpp"
#include "comm/serial_executor.hpp"

namespace cohort::comm {
namespace {

std::span<std::byte> bytes_of(const Buffer& buffer) { return {static_cast<std::byte*>(buffer.data), buffer.bytes()}; }

constexpr Tag kVerdictTag = 0xC011EC7100FFFFFFull;  // nothing is sent on it: its receive fails with the group

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
  std::string process_name(int rank) const override { return process_name_of(transport_, rank); }
  bool accepts(Device device) const override { return device == Device::CPU; }
  // Each of the ring's 2 (n - 1) steps may take the transport's timeout; a lost peer is reported by the
  // transport long before.
  std::chrono::milliseconds timeout() const override { return transport_.timeout() * (2 * std::max(1, size())); }
  // The ring's messages are pieces of the buffers, a broadcast's the whole buffer.
  void expect_buffers_up_to(std::uint64_t bytes) override { transport_.expect_messages_up_to(bytes); }
  void announce_failure(const std::string& reason) override { transport_.announce_failure(reason); }

  WorkPtr allreduce(Buffer data, ReduceOp op) override {
    check_host("allreduce", data);
    const AllreduceOptions options{.op = op, .type = data.type, .wire = data.wire, .timings = &timings_};
    const std::string_view algorithm = hierarchical_ ? "hierarchical" : allreduce_algorithm(transport_, data.bytes(), options);
    return run(fmt::format("{} allreduce of {} bytes", algorithm, data.bytes()), data.ready, [this, data, options] {
      if (hierarchical_) comm::hierarchical_allreduce(transport_, host_of_, bytes_of(data), options);
      else comm::allreduce(transport_, bytes_of(data), options);
    });
  }

  WorkPtr broadcast(Buffer data, int root) override {
    check_host("broadcast", data);
    return run(fmt::format("broadcast of {} bytes from rank {}", data.bytes(), root), data.ready,
               [this, data, root] { comm::broadcast(transport_, root, bytes_of(data)); });
  }

  WorkPtr allgather(Buffer mine, Buffer all) override {
    check_host("allgather", mine);
    check_host("allgather", all);
    COHORT_CHECK(mine.type == all.type, "allgather: elements of different types");
    return run(fmt::format("allgather of {} bytes", all.bytes()), mine.ready,
               [this, mine, all] { comm::allgather(transport_, bytes_of(mine), bytes_of(all)); });
  }

  // Over the flat ring, also in a hierarchy: a reduce-scatter moves (n - 1) / n of the vector whatever the layout.
  WorkPtr reduce_scatter(Buffer data, ReduceOp op) override {
    check_host("reduce_scatter", data);
    return run(fmt::format("reduce-scatter of {} bytes", data.bytes()), data.ready, [this, data, op] {
      comm::reduce_scatter(transport_, bytes_of(data), {.op = op, .type = data.type, .wire = data.wire, .timings = &timings_});
    });
  }

 private:
  static void check_host(const char* op, const Buffer& buffer) {
    if (buffer.device != Device::CPU)
      throw DeviceError(fmt::format("ring communicator {}: a buffer on {}; the ring reduces host memory only, stage "
                                    "device buffers through the host",
                                    op, device_name(buffer.device)));
  }

  // Runs `collective` as the next job once its buffer is `ready`, counted in the progress the transport tells
  // the peers; when one of its waits times out, the peers that never started it are the stuck ones.
  WorkPtr run(std::string what, DeviceEventPtr ready, std::function<void()> collective) {
    return executor_.submit(what, [this, what, collective = std::move(collective)] {
      transport_.report_progress(++started_);
      try {
        collective();
      } catch (const TimeoutError&) {
        name_the_stuck(what);
        throw;
      }
    }, std::move(ready), timeout());
  }

  // After a wait in the current collective timed out: declares the peers that have not started it stuck
  // and throws naming them, so that every rank names them rather than the neighbour it waited on.
  void name_the_stuck(const std::string& what) {
    std::vector<int> behind;
    for (int peer = 0; peer < size(); ++peer)
      if (const auto progress = peer == rank() ? std::nullopt : transport_.progress_of(peer); progress && *progress < started_)
        behind.push_back(peer);
    if (behind.empty()) return await_verdict();
    std::vector<std::string> stuck;
    for (int peer : behind) stuck.push_back(transport_.describe(peer) + " is stuck");
    const std::string reason = stuck_message(
        fmt::format("{}", fmt::join(stuck, ", ")),
        fmt::format("{} waited for {} in collective {} ({}), which {} did not start", transport_.describe(rank()),
                    behind.size() == 1 ? "it" : "them", started_, what, behind.size() == 1 ? "it" : "they"),
        transport_.timeout());
    for (int peer : behind) transport_.declare_stuck(peer, reason);
    throw TimeoutError(reason);
  }

  // Gives the ranks linked to the one that is stuck a moment to name it: the group then breaks with their
  // verdict, which this throws. Returns when none comes (then the timeout stands as it is).
  void await_verdict() {
    if (size() < 2) return;
    const auto grace = std::min<std::chrono::milliseconds>(transport_.timeout() / 2, std::chrono::seconds(5));
    // Throws the verdict when the group breaks; an empty message on the tag (a stray peer's) is none.
    transport_.recv((rank() + 1) % size(), kVerdictTag, {})->wait_for(grace);
  }

  Transport& transport_;
  std::vector<int> host_of_;
  bool hierarchical_;
  std::uint64_t started_ = 0;  // collectives begun; the executor's thread alone
  AllreduceTimings timings_;    // which allreduce two ranks on one host keep, per size; the group's cores
  SerialExecutor executor_{"ring communicator"};  // last: its thread stops before the members it uses go away
};

}  // namespace

std::unique_ptr<Communicator> make_ring_communicator(Transport& transport, std::vector<int> host_of) {
  return std::make_unique<RingCommunicator>(transport, std::move(host_of));
}

}  // namespace cohort::comm
