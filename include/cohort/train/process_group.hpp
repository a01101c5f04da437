#pragma once
// ProcessGroup: the processes that train together, as data parallelism sees them. Ranks and names;
// agreement (sums over the replicas that are exact and the same on every rank, which metrics, callbacks'
// requests and checks of matching settings use); failures told to the others; and the map from a device
// to the communicator that carries its buffers. Of the communicators given, in order of preference, the
// first that accepts a device carries its buffers as they are (NCCL for GPU memory, the ring or Open MPI
// for host memory); when none does (a GPU without NCCL, the emulated device), the first one carries a
// copy in pinned host memory. Gradient synchronizers and layers that sum over the replicas
// (SyncBatchNormalization) start their collectives here.
//
//   train::ProcessGroup group({comm::make_ring_communicator(transport)});
//   std::array<double, 2> votes{stop ? 1.0 : 0.0, 1.0};
//   group.sum_over_replicas(votes);  // votes[1] == group.size() on every rank

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cohort/comm/communicator.hpp"
#include "cohort/nn/variable.hpp"
#include "cohort/tensor/tensor.hpp"
#include "cohort/train/gradient_codec.hpp"
#include "cohort/train/replicas.hpp"

namespace cohort::train {

class ProcessGroup final : public ReplicaReduction, public Replicas {
 public:
  // All communicators span the same ranks; the first that takes host memory carries the agreement.
  explicit ProcessGroup(std::vector<std::shared_ptr<comm::Communicator>> communicators);

  int rank() const override { return communicators_.front()->rank(); }
  int size() const { return communicators_.front()->size(); }
  int replicas() const override { return size(); }
  // How the job names `rank` ("chief 0", "worker 1").
  std::string process_name(int rank) const override { return communicators_.front()->process_name(rank); }
  // The preferred communicator's name ("ring", "mpi", "hierarchical ring").
  std::string communicator_name() const { return communicators_.front()->name(); }
  // How long one collective may take before the group is declared stuck.
  std::chrono::milliseconds timeout() const { return communicators_.front()->timeout(); }

  // Sums `values` element-wise over the ranks, added in rank order from the exact doubles: the same bits
  // on every rank. Every rank calls it at the same point.
  bool sum_over_replicas(std::span<double> values) override;
  // This rank ends because of `reason`: every communicator tells the others.
  void announce_failure(const std::string& reason) override;
  // SyncBatchNormalization's moments, summed in the order the layers ask; null for a lone rank.
  nn::ReplicaSum* replica_sum() override { return size() > 1 ? this : nullptr; }

  // Puts NCCL first when every rank's buffers on `device` live on a GPU of its own. Collective: every rank
  // calls it, and all reach the same verdict. `wire` other than float32 keeps the host path (NCCL would
  // need 16-bit buffers of their own).
  void prefer_gpu_communicator(Device device, DType wire);
  // Whether buffers on `device` travel through pinned host memory.
  bool staged(Device device) const { return !communicator_for(device).second; }
  // No buffer of this run's collectives is larger than the largest `bytes` any caller gave (each part that
  // starts collectives says its own).
  void expect_buffers_up_to(std::uint64_t bytes);

  enum class Collective { Allreduce, Broadcast, ReduceScatter, Allgather };
  // Starts `collective` (sums; a broadcast from rank 0; an allgather of this rank's equal block) on the
  // float32 `buffer`, on any device, through `staging` (pinned host memory of the same size) where
  // staged(buffer.device()); the caller copies the staging back once the work is done. `wire`: the type the
  // values travel as. Returns without waiting for the device: the communicator awaits the ops that wrote
  // `buffer` (Buffer::ready).
  comm::WorkPtr start(Collective collective, const Tensor& buffer, const Tensor& staging, DType wire = DType::Float32);

  // Every rank's `variables` take rank 0's values.
  void broadcast_from_chief(const std::vector<nn::VariablePtr>& variables);
  // nn::ReplicaSum: `values` summed over the ranks in place, float32, waited for.
  void sum(const Tensor& values) override;

 private:
  // The communicator that carries buffers on `device`, and whether it takes them as they are.
  std::pair<comm::Communicator*, bool> communicator_for(Device device) const;
  // Pinned host memory of at least `elements` floats, grown as needed, for the blocking collectives.
  Tensor scratch_staging(std::int64_t elements);

  std::vector<std::shared_ptr<comm::Communicator>> communicators_;
  comm::Communicator* host_ = nullptr;  // the first that takes host memory
  Tensor scratch_;
  std::uint64_t largest_buffer_ = 0;
};

}  // namespace cohort::train
