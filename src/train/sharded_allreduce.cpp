#include "cohort/train/sharded_allreduce.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "cohort/core/check.hpp"
#include "cohort/core/format.hpp"
#include "cohort/core/timeline.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/train/update.hpp"
#include "train/optimizer_shards.hpp"

namespace cohort::train {
ShardedAllreduce::ShardedAllreduce(ProcessGroup& group, ShardedAllreduceOptions options)
    : BucketedSynchronizer(group, options.buckets, group.size(), true), options_(options) {
  COHORT_CHECK(options_.stage == 1 || options_.stage == 2, "ZeRO stage {}: the sharded stages are 1 and 2", options_.stage);
  COHORT_CHECK(options_.stage == 1 || options_.gradient_dtype == DType::Float32,
               "zero2 reduce-scatters float32 gradients; {} gradients take zero1 or no sharding",
               dtype_name(options_.gradient_dtype));
}

std::string ShardedAllreduce::name_for(int stage, const std::string& communicator) {
  return fmt::format("zero{} over {}", stage, communicator);
}

std::vector<ShardedAllreduce::Piece> ShardedAllreduce::pieces_of(int rank) const {
  std::vector<Piece> pieces;
  const auto& variables = buckets_.variables();
  for (const GradientBucket& bucket : buckets_.buckets()) {
    const std::int64_t block = (bucket.end - bucket.begin) / group_.size();
    const std::int64_t own_begin = bucket.begin + rank * block, own_end = own_begin + block;
    for (std::size_t member : bucket.members) {
      const std::int64_t offset = buckets_.slot_of(*variables[member]).offset;
      const std::int64_t begin = std::max(offset, own_begin), end = std::min(offset + variables[member]->value.numel(), own_end);
      if (begin < end) pieces.push_back({member, begin - offset, end - offset, begin});
    }
  }
  return pieces;
}

void ShardedAllreduce::planned() {
  pieces_ = pieces_of(group_.rank());
  state_cut_to_pieces_ = false;
  gathered_ = Tensor({buckets_.elements()}, fused_.device());
  gathered_staging_ = staged_ ? Tensor::pinned({buckets_.elements()}) : Tensor();
}

std::vector<VariablePiece> ShardedAllreduce::pieces() const {
  std::vector<VariablePiece> pieces;
  for (const Piece& piece : pieces_) pieces.push_back({buckets_.variables()[piece.variable]->name, piece.begin, piece.end});
  return pieces;
}

comm::WorkPtr ShardedAllreduce::start_bucket(const Tensor& values, const Tensor& staging) {
  if (values.numel() == 0) return nullptr;
  return group_.start(options_.stage == 2 ? ProcessGroup::Collective::ReduceScatter : ProcessGroup::Collective::Allreduce, values,
                      staging, options_.gradient_dtype);
}

void ShardedAllreduce::update(nn::Sequential& model, optim::Optimizer& optimizer, LossScale* loss_scale) {
  const float inverse = 1.0f / static_cast<float>(wait_for_buckets());
  count_reduced(options_.gradient_dtype);
  if (!state_cut_to_pieces_) {
    keep_only_pieces(optimizer, model, pieces());
    state_cut_to_pieces_ = true;
  }
  const auto& variables = buckets_.variables();
  std::vector<optim::Optimizer::Gradient> gradients;
  if (options_.stage == 1) {
    // Every rank holds the whole reduced gradients, as without sharding, and so agrees on a skipped step.
    ops::scale(gradient_values(), inverse);
    if (loss_scale != nullptr) {
      std::vector<Tensor> whole;
      for (const auto& v : variables) whole.push_back(v->gradient);
      const auto not_finite = unscale_gradients(whole, *loss_scale);
      loss_scale->record(!not_finite, not_finite ? variables[*not_finite]->name : std::string());
      if (not_finite) return;
    }
  } else {
    // Each rank holds the reduced gradients of its pieces only.
    std::vector<Tensor> own;
    for (const Piece& piece : pieces_) {
      const Tensor gradient = variables[piece.variable]->gradient.flat().slice(piece.begin, piece.end);
      ops::scale(gradient, inverse);
      own.push_back(gradient);
    }
    std::string culprit;
    if (loss_scale != nullptr) {
      const bool finite = pieces_finite_everywhere(own, *loss_scale, culprit);
      loss_scale->record(finite, culprit);
      if (!finite) return;
    }
  }
  for (const Piece& piece : pieces_) {
    const auto& v = variables[piece.variable];
    gradients.push_back({v->name, v->value.flat().slice(piece.begin, piece.end), v->gradient.flat().slice(piece.begin, piece.end)});
  }
  optimizer.apply(gradients);
  optimizer.finish_step();
  gather_variables();
}

bool ShardedAllreduce::pieces_finite_everywhere(const std::vector<Tensor>& gradients, const LossScale& loss_scale,
                                                std::string& culprit) {
  const auto not_finite = unscale_gradients(gradients, loss_scale);
  // Each replica's first variable (1-based, 0: none) whose piece is not finite, so that all skip alike and
  // name the same variable.
  std::vector<double> first(static_cast<std::size_t>(group_.size()), 0.0);
  if (not_finite) first[static_cast<std::size_t>(group_.rank())] = static_cast<double>(pieces_[*not_finite].variable + 1);
  group_.sum_over_replicas(first);
  double earliest = 0;
  for (double index : first)
    if (index > 0 && (earliest == 0 || index < earliest)) earliest = index;
  if (earliest == 0) return true;
  culprit = buckets_.variables()[static_cast<std::size_t>(earliest) - 1]->name;
  return false;
}

void ShardedAllreduce::gather_variables() {
  const auto& variables = buckets_.variables();
  for (const Piece& piece : pieces_)
    ops::copy(variables[piece.variable]->value.flat().slice(piece.begin, piece.end),
              gathered_.slice(piece.offset, piece.offset + piece.end - piece.begin));
  {
    const timeline::Span span("communication", "allgather the updated pieces");
    const auto started = std::chrono::steady_clock::now();
    std::vector<comm::WorkPtr> works;
    for (const GradientBucket& bucket : buckets_.buckets())
      if (bucket.end > bucket.begin)
        works.push_back(group_.start(ProcessGroup::Collective::Allgather, gathered_.slice(bucket.begin, bucket.end),
                                     staged_ ? gathered_staging_.slice(bucket.begin, bucket.end) : Tensor()));
    for (const auto& work : works) work->wait(group_.timeout());
    add_exposed(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }
  if (staged_) ops::copy(gathered_staging_, gathered_);
  for (const auto& v : variables) {
    const std::int64_t offset = buckets_.slot_of(*v).offset;
    ops::copy(gathered_.slice(offset, offset + v->value.numel()), v->value.flat());
  }
}

std::string ShardedAllreduce::setup_report() const {
  const int ranks = group_.size();
  std::int64_t fewest = buckets_.elements(), most = 0, total = 0;
  for (const auto& v : buckets_.variables()) total += v->value.numel();
  for (int rank = 0; rank < ranks; ++rank) {
    std::int64_t elements = 0;
    for (const Piece& piece : pieces_of(rank)) elements += piece.end - piece.begin;
    fewest = std::min(fewest, elements);
    most = std::max(most, elements);
  }
  return fmt::format("zero{}: each of the {} ranks keeps the optimizer state of {} to {} of the {} trainable elements{}\n",
                     options_.stage, ranks, with_thousands(fewest), with_thousands(most), with_thousands(total),
                     options_.stage == 2 ? ", and receives their reduced gradients only (a reduce-scatter)" : "");
}

}  // namespace cohort::train
