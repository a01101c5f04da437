#pragma once
// ShardedAllreduce: sharded updates (ZeRO, Rajbhandari et al. 2020). Each bucket of gradients is cut into
// one block per rank (bucketed_synchronizer.hpp), and a rank keeps the optimizer state of its blocks alone,
// updates only those elements of the variables and allgathers the updated blocks, so that the optimizer
// state per rank falls by the rank count. Stage 1 still allreduces the gradients (every rank holds the
// whole reduced gradients, as without sharding); stage 2 reduce-scatters them, so each rank receives the
// sum of its blocks only. The optimizer must update each element from its own gradient and state (SGD,
// Adam, RMSprop do). ShardedState (state_store.hpp) checkpoints what each rank keeps.

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/train/bucketed_synchronizer.hpp"
#include "cohort/train/variable_pieces.hpp"

namespace cohort::train {

struct ShardedAllreduceOptions {
  BucketSizes buckets{};
  int stage = 1;  // 1 or 2
  // What the gradients travel as (stage 1 only: a reduce-scatter takes float32).
  DType gradient_dtype = DType::Float32;
};

class ShardedAllreduce final : public BucketedSynchronizer {
 public:
  // `group` must outlive the synchronizer.
  ShardedAllreduce(ProcessGroup& group, ShardedAllreduceOptions options);

  std::string name() const override { return name_for(options_.stage, group_.communicator_name()); }
  // The name of one at `stage` over `communicator`, before it is built.
  static std::string name_for(int stage, const std::string& communicator);
  std::string setup_report() const override;

  // This rank's pieces of the variables: the elements of each that fall in its blocks of the buckets
  // (after the first begin()).
  std::vector<VariablePiece> pieces() const;
  // The optimizer holds the whole state again (a resumed run): the next step cuts out this rank's pieces.
  void optimizer_state_replaced() override { state_cut_to_pieces_ = false; }

 private:
  void update(nn::Sequential& model, optim::Optimizer& optimizer, LossScale* loss_scale) override;
  comm::WorkPtr start_bucket(const Tensor& values, const Tensor& staging) override;
  void planned() override;
  // The pieces of rank `rank`, in elements of the buffer.
  struct Piece {
    std::size_t variable;     // into buckets_.variables()
    std::int64_t begin, end;  // elements of the variable
    std::int64_t offset;      // of its first element in the buffer
  };
  std::vector<Piece> pieces_of(int rank) const;
  // Whether any replica's pieces hold a gradient that is not finite, the first such variable named.
  bool pieces_finite_everywhere(const std::vector<Tensor>& gradients, const LossScale& loss_scale, std::string& culprit);
  // Every rank's updated pieces into every replica's variables.
  void gather_variables();

  ShardedAllreduceOptions options_;
  std::vector<Piece> pieces_;  // this rank's
  bool state_cut_to_pieces_ = false;
  Tensor gathered_, gathered_staging_;  // the variables' values in bucket order, for the allgather
};

}  // namespace cohort::train
