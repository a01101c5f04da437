#pragma once
// The contract every Communicator meets, run on each rank of a group: allreduce of sizes that do not
// divide evenly (and zero) with exact sums and means, broadcast from every root, allgather (also in place),
// reduce-scatter of several block lengths (and zero), calls in flight at once completing in call order, buffers
// read only once their device has written them (Buffer::ready), and a device buffer it does not accept
// refused by name.
// Rank bodies check with comm_test::expect, which throws (Catch2 assertions are not thread-safe).

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "cohort/comm/communicator.hpp"
#include "cohort/core/error.hpp"
#include "comm/comm_test_util.hpp"

namespace comm_test {

// A device's point that its test passes by hand (open()): until then the buffer's bytes are not there.
class GatedEvent final : public cohort::DeviceEvent {
 public:
  bool finished() const override { return open_.load(); }
  void open() { open_ = true; }

 private:
  std::atomic<bool> open_{false};
};

// Each collective started on a buffer that its device has yet to write: the call returns, the collective
// waits, and the bytes written before the gate opens are the ones reduced.
inline void check_reads_after_ready(cohort::comm::Communicator& communicator) {
  using namespace cohort;
  const int n = communicator.size(), r = communicator.rank();
  const auto timeout = communicator.timeout();
  constexpr std::size_t kBlock = 1000;
  const auto count = kBlock * static_cast<std::size_t>(n);
  const float ranks = static_cast<float>(n * (n + 1) / 2);
  enum class Kind { Allreduce, Broadcast, Allgather, ReduceScatter };
  for (Kind kind : {Kind::Allreduce, Kind::Broadcast, Kind::Allgather, Kind::ReduceScatter}) {
    const std::string what = "collective " + std::to_string(static_cast<int>(kind)) + " after its ready point";
    std::vector<float> values(count, std::numeric_limits<float>::quiet_NaN());
    auto gate = std::make_shared<GatedEvent>();
    comm::Buffer buffer = comm::Buffer::of(values);
    buffer.ready = gate;
    comm::Buffer mine = buffer;
    mine.data = values.data() + static_cast<std::size_t>(r) * kBlock;
    mine.count = kBlock;
    comm::WorkPtr work = kind == Kind::Allreduce   ? communicator.allreduce(buffer, comm::ReduceOp::Sum)
                         : kind == Kind::Broadcast ? communicator.broadcast(buffer, 0)
                         : kind == Kind::Allgather ? communicator.allgather(mine, buffer)
                                                   : communicator.reduce_scatter(buffer, comm::ReduceOp::Sum);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    expect(!work->done(), what + " has not run before it");
    for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<float>((r + 1) * (i % 7));
    gate->open();
    work->wait(timeout);
    for (std::size_t i = 0; i < count; ++i) {
      const auto block = static_cast<int>(i / kBlock);
      const float pattern = static_cast<float>(i % 7);
      const float expected = kind == Kind::Allreduce || (kind == Kind::ReduceScatter && block == r) ? ranks * pattern
                             : kind == Kind::Broadcast                                              ? pattern
                             : kind == Kind::Allgather                                              ? (block + 1) * pattern
                                                                                                    : values[i];
      if (values[i] != expected) expect(false, what + ": element " + std::to_string(i));
    }
  }
}

inline void check_communicator_contract(cohort::comm::Communicator& communicator) {
  using namespace cohort;
  const int n = communicator.size(), r = communicator.rank();
  const auto timeout = communicator.timeout();
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1000}, std::size_t{65537}}) {
    std::vector<float> values(count), mean(count);
    for (std::size_t i = 0; i < count; ++i) values[i] = mean[i] = static_cast<float>((r + 1) * (i % 17));
    auto sum = communicator.allreduce(comm::Buffer::of(values), comm::ReduceOp::Sum);
    auto averaged = communicator.allreduce(comm::Buffer::of(mean), comm::ReduceOp::Mean);  // both in flight
    sum->wait(timeout);
    averaged->wait(timeout);
    const float ranks = static_cast<float>(n * (n + 1) / 2);
    for (std::size_t i = 0; i < count; ++i) {
      expect(values[i] == ranks * static_cast<float>(i % 17), "allreduce sum of " + std::to_string(count));
      expect(std::abs(mean[i] - ranks * static_cast<float>(i % 17) / static_cast<float>(n)) < 1e-4f,
             "allreduce mean of " + std::to_string(count));
    }
  }
  for (int root = 0; root < n; ++root) {
    std::vector<float> data(257, static_cast<float>(r == root ? root + 10 : -1));
    communicator.broadcast(comm::Buffer::of(data), root)->wait(timeout);
    for (float v : data) expect(v == static_cast<float>(root + 10), "broadcast from " + std::to_string(root));
  }
  std::vector<float> mine{static_cast<float>(r), static_cast<float>(r * 10)}, all(2 * static_cast<std::size_t>(n));
  communicator.allgather(comm::Buffer::of(mine), comm::Buffer::of(all))->wait(timeout);
  for (int k = 0; k < n; ++k)
    expect(all[2 * k] == static_cast<float>(k) && all[2 * k + 1] == static_cast<float>(k * 10), "allgather block");
  for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{20001}}) {
    const auto count = block * static_cast<std::size_t>(n);
    std::vector<float> values(count), mean(count);
    for (std::size_t i = 0; i < count; ++i) values[i] = mean[i] = static_cast<float>((r + 1) * (i % 13));
    auto sum = communicator.reduce_scatter(comm::Buffer::of(values), comm::ReduceOp::Sum);
    auto averaged = communicator.reduce_scatter(comm::Buffer::of(mean), comm::ReduceOp::Mean);
    sum->wait(timeout);
    averaged->wait(timeout);
    const float ranks = static_cast<float>(n * (n + 1) / 2);
    const std::size_t own = static_cast<std::size_t>(r) * block;
    for (std::size_t i = own; i < own + block; ++i) {
      expect(values[i] == ranks * static_cast<float>(i % 13), "reduce_scatter sum of blocks of " + std::to_string(block));
      expect(std::abs(mean[i] - ranks * static_cast<float>(i % 13) / static_cast<float>(n)) < 1e-4f,
             "reduce_scatter mean of blocks of " + std::to_string(block));
    }
    // In place: this rank's block is already in `values`; the others arrive around it.
    comm::Buffer mine_in_place = comm::Buffer::of(std::span(values).subspan(own, block));
    communicator.allgather(mine_in_place, comm::Buffer::of(values))->wait(timeout);
    for (std::size_t i = 0; i < count; ++i)
      expect(values[i] == ranks * static_cast<float>(i % 13), "allgather in place of blocks of " + std::to_string(block));
  }
  check_reads_after_ready(communicator);
  std::vector<float> device_values(4);
  comm::Buffer on_device = comm::Buffer::of(device_values);
  on_device.device = Device::Emulated;
  expect(!communicator.accepts(Device::Emulated), "host communicators do not accept device buffers");
  expect_throws<DeviceError>([&] { communicator.allreduce(on_device, comm::ReduceOp::Sum); }, "device buffer refused");
}

}  // namespace comm_test
