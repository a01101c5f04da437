#pragma once
// Communicator: the collectives of data-parallel training over buffers on a device, asynchronous in the
// style of c10d: each call returns a Work at once, the collectives of one communicator run one after the
// other in call order (which must be the same on every rank), and a failure is rethrown by wait().
// Implementations: the ring over any Transport (make_ring_communicator, host memory), Open MPI
// (comm/mpi.hpp, host memory, the cluster's own fabric), and for GPUs, NCCL. A strategy picks the one that
// accepts the device its gradients live on, and stages through pinned host memory when none does.
//
//   auto communicator = comm::make_ring_communicator(cluster.transport());
//   communicator->allreduce(comm::Buffer::of(std::span(gradients)), comm::ReduceOp::Sum)->wait(timeout);

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cohort/comm/collectives.hpp"
#include "cohort/comm/transport.hpp"
#include "cohort/comm/work.hpp"
#include "cohort/core/device.hpp"
#include "cohort/core/device_event.hpp"

namespace cohort::comm {

// A run of elements of one type on one device. The memory must stay valid until the collective has run,
// which may be after a caller gave up waiting: `owner`, when set, keeps it alive that long (communicators
// hold a copy of the Buffer until their job is done).
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;
  DType type = DType::Float32;
  Device device = Device::CPU;
  std::shared_ptr<const void> owner;
  // What float32 elements travel as in an allreduce: bfloat16 halves the bytes (AllreduceOptions::wire);
  // communicators that cannot carry it refuse it by name.
  DType wire = DType::Float32;
  // The point in its device's work after which the bytes are there (a GPU's gradients, or their copy into
  // pinned memory, still queued when the collective was started); null: there now. The collective reads
  // them only after it: a GPU communicator's stream waits for it, a host communicator's thread within
  // timeout(); the caller goes on at once.
  DeviceEventPtr ready{};

  std::size_t bytes() const { return count * element_size(type); }
  static Buffer of(std::span<float> values) { return {values.data(), values.size(), DType::Float32, Device::CPU, {}}; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // "ring", "mpi", ...
  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // How the job names `rank` ("worker 0"): the transport's name without its address where the
  // communicator has one, else "rank N".
  virtual std::string process_name(int rank) const { return "rank " + std::to_string(rank); }
  // Whether buffers on `device` can be handed over as they are.
  virtual bool accepts(Device device) const = 0;
  // How long a caller should wait for one whole collective before declaring the group stuck.
  virtual std::chrono::milliseconds timeout() const = 0;
  // No buffer of this run's collectives is larger than `bytes`: a transport that buffers early messages
  // refuses a larger one from then on (Transport::expect_messages_up_to).
  virtual void expect_buffers_up_to(std::uint64_t bytes) = 0;
  // This rank ends because of `reason`: the others are told it (Transport::announce_failure) where the
  // communicator can tell them.
  virtual void announce_failure(const std::string& reason) = 0;

  // Element-wise sum (or mean) across ranks, in place; every rank ends with identical values.
  virtual WorkPtr allreduce(Buffer data, ReduceOp op) = 0;
  // Copies root's data into every rank's (the same count everywhere).
  virtual WorkPtr broadcast(Buffer data, int root) = 0;
  // all = the `mine` of rank 0, then rank 1, ...; all.count must be size() * mine.count. `mine` may be this
  // rank's block of `all` (in place).
  virtual WorkPtr allgather(Buffer mine, Buffer all) = 0;
  // In place: `data` holds size() equal blocks, and afterwards block rank() holds the sum (or mean) over the
  // ranks of their block rank(); what the other blocks hold is unspecified. With allgather, the two halves
  // of an allreduce, between which each rank works on its own block (ZeRO's sharded updates).
  virtual WorkPtr reduce_scatter(Buffer data, ReduceOp op) = 0;
};

// The ring algorithms of collectives.hpp over `transport`, on a thread of their own so that calls
// return at once. The transport must outlive the communicator and be used by no other collective on
// kCollectiveTag meanwhile. With `host_of` (each rank's host) spanning several hosts of which one has
// several ranks, allreduce is hierarchical (hierarchical_allreduce): one rank per host talks across hosts.
std::unique_ptr<Communicator> make_ring_communicator(Transport& transport, std::vector<int> host_of = {});

}  // namespace cohort::comm
