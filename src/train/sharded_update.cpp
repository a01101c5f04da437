// RingAllreduce's sharded updates (ZeRO stages 1 and 2): the pieces of the variables each rank owns, their
// update, the allgather of the updated pieces, the sharded checkpoints; and what every run reports of its
// traffic and optimizer state.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>

#include "cohort/core/format.hpp"
#include "cohort/core/timeline.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/train/ring_allreduce.hpp"
#include "cohort/train/update.hpp"
#include "train/optimizer_shards.hpp"

namespace cohort::train {
namespace {

Tensor flat(const Tensor& tensor) { return tensor.view({tensor.numel()}); }

std::string mebibytes(double bytes) { return fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024.0)); }

// The elements of `variables` that fall into block `rank` of each of `buckets`, cut into `ranks` blocks.
template <class Each>
void for_each_piece(const GradientBuckets& buckets, int rank, int ranks, Each&& each) {
  const auto& variables = buckets.variables();
  for (const GradientBucket& bucket : buckets.buckets()) {
    const std::int64_t block = (bucket.end - bucket.begin) / ranks;
    const std::int64_t own_begin = bucket.begin + rank * block, own_end = own_begin + block;
    for (std::size_t member : bucket.members) {
      const std::int64_t offset = buckets.slot_of(*variables[member]).offset;
      const std::int64_t begin = std::max(offset, own_begin), end = std::min(offset + variables[member]->value.numel(), own_end);
      if (begin < end) each(member, begin - offset, end - offset, begin);
    }
  }
}

}  // namespace

void RingAllreduce::plan_pieces() {
  pieces_.clear();
  state_cut_to_pieces_ = false;
  if (!sharded()) return;
  for_each_piece(buckets_, communicators_.front()->rank(), communicators_.front()->size(),
                 [&](std::size_t variable, std::int64_t begin, std::int64_t end, std::int64_t offset) {
                   pieces_.push_back({variable, begin, end, offset});
                 });
}

std::vector<VariablePiece> RingAllreduce::variable_pieces() const {
  std::vector<VariablePiece> pieces;
  for (const Piece& piece : pieces_) pieces.push_back({buckets_.variables()[piece.variable]->name, piece.begin, piece.end});
  return pieces;
}

void RingAllreduce::update_pieces(nn::Sequential& model, optim::Optimizer& optimizer, float inverse) {
  if (!state_cut_to_pieces_) {
    keep_only_pieces(optimizer, model, variable_pieces());
    state_cut_to_pieces_ = true;
  }
  const auto& variables = buckets_.variables();
  std::vector<optim::Optimizer::Gradient> gradients;
  if (options_.zero_stage == 1) {
    // Every rank holds the whole reduced gradients, as without sharding, and so agrees on a skipped step.
    std::vector<Tensor> whole;
    for (const auto& v : variables) {
      const std::int64_t n = v->gradient.numel(), offset = buckets_.slot_of(*v).offset;
      ops::copy(fused_.slice(offset, offset + n), flat(v->gradient));
      ops::scale(v->gradient, inverse);
      whole.push_back(v->gradient);
    }
    if (loss_scale_ != nullptr) {
      const auto not_finite = unscale_gradients(whole, *loss_scale_);
      loss_scale_->record(!not_finite, not_finite ? variables[*not_finite]->name : std::string());
      if (not_finite) return;
    }
    for (const Piece& piece : pieces_) {
      const auto& v = variables[piece.variable];
      gradients.push_back({v->name, flat(v->value).slice(piece.begin, piece.end), flat(v->gradient).slice(piece.begin, piece.end)});
    }
  } else {
    // Each rank holds the reduced gradients of its pieces only, in the buffer they were reduced in.
    std::vector<Tensor> own;
    for (const Piece& piece : pieces_) {
      const auto& v = variables[piece.variable];
      const Tensor gradient = fused_.slice(piece.offset, piece.offset + piece.end - piece.begin);
      ops::scale(gradient, inverse);
      own.push_back(gradient);
      gradients.push_back({v->name, flat(v->value).slice(piece.begin, piece.end), gradient});
    }
    std::string culprit;
    if (loss_scale_ != nullptr) {
      const bool finite = pieces_finite_everywhere(own, culprit);
      loss_scale_->record(finite, culprit);
      if (!finite) return;
    }
  }
  optimizer.apply(gradients);
  optimizer.finish_step();
  optimizer_state_bytes_ = optimizer.state_bytes();
  gather_variables();
}

bool RingAllreduce::pieces_finite_everywhere(const std::vector<Tensor>& gradients, std::string& culprit) {
  const auto not_finite = unscale_gradients(gradients, *loss_scale_);
  // Each replica's first variable (1-based, 0: none) whose piece is not finite, so that all skip alike and
  // name the same variable.
  std::vector<double> first(static_cast<std::size_t>(replicas()), 0.0);
  if (not_finite) first[static_cast<std::size_t>(process_index())] = static_cast<double>(pieces_[*not_finite].variable + 1);
  sum_over_replicas(first);
  double earliest = 0;
  for (double index : first)
    if (index > 0 && (earliest == 0 || index < earliest)) earliest = index;
  if (earliest == 0) return true;
  culprit = buckets_.variables()[static_cast<std::size_t>(earliest) - 1]->name;
  return false;
}

void RingAllreduce::gather_variables() {
  const auto& variables = buckets_.variables();
  for (const Piece& piece : pieces_)
    ops::copy(flat(variables[piece.variable]->value).slice(piece.begin, piece.end),
              fused_.slice(piece.offset, piece.offset + piece.end - piece.begin));
  {
    const timeline::Span span("communication", "allgather the updated pieces");
    const auto started = std::chrono::steady_clock::now();
    std::vector<comm::WorkPtr> works;
    for (const GradientBucket& bucket : buckets_.buckets())
      if (bucket.end > bucket.begin)
        works.push_back(start_collective(fused_.slice(bucket.begin, bucket.end),
                                         staged_ ? staging_.slice(bucket.begin, bucket.end) : Tensor(), Collective::Allgather,
                                         DType::Float32));
    for (const auto& work : works) work->wait(communicators_.front()->timeout());
    exposed_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  }
  if (staged_) ops::copy(staging_, fused_);
  for (const auto& v : variables) {
    const std::int64_t offset = buckets_.slot_of(*v).offset;
    ops::copy(fused_.slice(offset, offset + v->value.numel()), flat(v->value));
  }
}

void RingAllreduce::save_checkpoint(const std::filesystem::path& directory, const nn::Sequential& model,
                                    const optim::Optimizer& optimizer, const TrainingPosition& position) {
  if (!sharded()) {
    Strategy::save_checkpoint(directory, model, optimizer, position);
    return;
  }
  const int ranks = replicas();
  const auto shard_name = [&](int rank) { return optimizer_shard_name(position.global_step, rank, ranks); };
  write_optimizer_shard(directory / shard_name(process_index()), model, optimizer, variable_pieces());
  // Every shard is on disk before the checkpoint that names them replaces the last one.
  std::array<double, 1> written{1.0};
  sum_over_replicas(written);
  if (!is_chief()) return;
  std::vector<std::string> shards;
  for (int rank = 0; rank < ranks; ++rank) shards.push_back(shard_name(rank));
  train::save_checkpoint(directory / kCheckpointFile, model, optimizer, position, shards);
}

std::string RingAllreduce::setup_report() const {
  if (!sharded()) return {};
  const int ranks = replicas();
  std::int64_t fewest = buckets_.elements(), most = 0, total = 0;
  for (const auto& v : buckets_.variables()) total += v->value.numel();
  for (int rank = 0; rank < ranks; ++rank) {
    std::int64_t elements = 0;
    for_each_piece(buckets_, rank, ranks, [&](std::size_t, std::int64_t begin, std::int64_t end, std::int64_t) { elements += end - begin; });
    fewest = std::min(fewest, elements);
    most = std::max(most, elements);
  }
  return fmt::format("zero{}: each of the {} ranks keeps the optimizer state of {} to {} of the {} trainable elements{}\n", options_.zero_stage,
                     ranks, with_thousands(fewest), with_thousands(most), with_thousands(total),
                     options_.zero_stage == 2 ? ", and receives their reduced gradients only (a reduce-scatter)" : "");
}

void RingAllreduce::finish(const History&) {
  optimizer_state_bytes_per_rank_.assign(static_cast<std::size_t>(replicas()), 0.0);
  optimizer_state_bytes_per_rank_[static_cast<std::size_t>(process_index())] = static_cast<double>(optimizer_state_bytes_);
  sum_over_replicas(optimizer_state_bytes_per_rank_);
}

std::string RingAllreduce::final_report() {
  std::string report;
  if (gradient_bytes_ > 0) {
    const std::string how = options_.codec ? options_.codec->name() : std::string(dtype_name(options_.gradient_dtype));
    report = fmt::format("gradients: {} over the run, {} of it reduced over the replicas ({}: {:.1f}x fewer bytes)\n",
                         mebibytes(gradient_bytes_), mebibytes(wire_bytes_), how, gradient_bytes_ / std::max(wire_bytes_, 1.0));
  }
  if (optimizer_state_bytes_per_rank_.empty()) return report;
  std::vector<std::string> ranks;
  double total = 0;
  for (std::size_t r = 0; r < optimizer_state_bytes_per_rank_.size(); ++r) {
    ranks.push_back(fmt::format("{} {}", replica_name(static_cast<int>(r)), mebibytes(optimizer_state_bytes_per_rank_[r])));
    total += optimizer_state_bytes_per_rank_[r];
  }
  return report + fmt::format("optimizer state per rank ({}): {}; {} in all\n",
                              sharded() ? fmt::format("zero{}", options_.zero_stage) : "not sharded", fmt::join(ranks, ", "),
                              mebibytes(total));
}

}  // namespace cohort::train
