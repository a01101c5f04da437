// The parts data parallelism is built from: the process group's agreement, the bucketed synchronizers
// used on their own (gradients that view their buckets, weighting by samples), and the state stores.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>

#include "cohort/comm/inproc.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/train/bucketed_allreduce.hpp"
#include "cohort/train/process_group.hpp"
#include "cohort/train/sharded_allreduce.hpp"
#include "cohort/train/state_store.hpp"
#include "comm/comm_test_util.hpp"
#include "test_util.hpp"

using namespace cohort;

namespace {

nn::Sequential dense_model() {
  nn::Sequential model({6}, 3);
  model.add(nn::Dense(5)).add(nn::Dense(3));
  return model;
}

optim::SGD plain_sgd() { return optim::SGD({.learning_rate = optim::constant(1.0)}); }

train::ProcessGroup group_of(comm::InProcessGroup& processes, int rank) {
  return train::ProcessGroup({comm::make_ring_communicator(processes.transport(rank))});
}

// Rank r's gradients are all r + 1, over r + 1 samples: the mean over the 3 samples of 2 ranks is 5/3.
void step_with_uneven_samples(train::GradientSynchronizer& synchronizer, nn::Sequential& model, int rank) {
  const std::int64_t samples = rank + 1;
  for (const auto& v : model.trainable_variables()) ops::fill(v->gradient, static_cast<float>(rank + 1));
  auto sgd = plain_sgd();
  synchronizer.begin(model, samples);
  synchronizer.gradients_ready(model.trainable_variables());
  synchronizer.finish(model, sgd);
}

using Values = std::vector<std::vector<float>>;

Values values_of(const nn::Sequential& model) {
  Values values;
  for (const auto& v : model.trainable_variables()) values.emplace_back(v->value.values().begin(), v->value.values().end());
  return values;
}

void require_moved_by(const Values& before, const nn::Sequential& after, float step) {
  const Values got = values_of(after);
  REQUIRE(got.size() == before.size());
  for (std::size_t i = 0; i < before.size(); ++i)
    for (std::size_t k = 0; k < before[i].size(); ++k) REQUIRE(got[i][k] == Approx(before[i][k] - step).margin(1e-6));
}

}  // namespace

TEST_CASE("a process group sums over the ranks exactly, in rank order, the same bits on every rank", "[train][distributed]") {
  comm::InProcessGroup processes(3);
  std::array<std::array<double, 2>, 3> sums{};
  comm_test::run_ranks(3, [&](int r) {
    train::ProcessGroup group = group_of(processes, r);
    // In rank order (1e16 + 1) - 1e16 is 0; summed in another order, or in float, it is not.
    const std::array<double, 3> first{1e16, 1.0, -1e16};
    auto& mine = sums[static_cast<std::size_t>(r)];
    mine = {first[static_cast<std::size_t>(r)], 0.1 * (r + 1)};
    group.sum_over_replicas(mine);
  });
  for (const auto& rank : sums) {
    CHECK(rank[0] == 0.0);
    CHECK(rank[1] == (0.1 + 0.2) + 0.30000000000000004);
    CHECK(rank == sums[0]);
  }
}

TEST_CASE("a bucketed allreduce's gradients view its buffer, and a step weights each rank by its samples",
          "[train][distributed]") {
  comm::InProcessGroup processes(2);
  const Values start = values_of(dense_model());
  comm_test::run_ranks(2, [&](int r) {
    train::ProcessGroup group = group_of(processes, r);
    train::BucketedAllreduce synchronizer(group, {.buckets = {.first_bucket_bytes = 0, .bucket_bytes = 0}});
    nn::Sequential model = dense_model();
    synchronizer.prepare(model);
    const auto& variables = model.trainable_variables();
    for (const auto& v : variables) {
      // One buffer, each slot as aligned as a tensor of its own.
      CHECK(v->gradient.shares_storage_with(variables.front()->gradient));
      CHECK(reinterpret_cast<std::uintptr_t>(v->gradient.device_pointer()) % 64 == 0);
    }
    CHECK(synchronizer.bucket_plan().size() == variables.size());
    step_with_uneven_samples(synchronizer, model, r);
    require_moved_by(start, model, 5.0f / 3.0f);

    // A gradient the caller replaced goes back into its slot.
    const Values before = values_of(model);
    variables.front()->gradient = Tensor(variables.front()->gradient.shape());
    step_with_uneven_samples(synchronizer, model, r);
    require_moved_by(before, model, 5.0f / 3.0f);
    CHECK(variables.front()->gradient.shares_storage_with(variables.back()->gradient));
    CHECK(synchronizer.traffic().reduced_bytes == synchronizer.traffic().gradient_bytes);
  });
}

TEST_CASE("a sharded allreduce's ranks own every element once, and step as the plain allreduce does", "[train][distributed][zero]") {
  for (int stage : {1, 2}) {
    comm::InProcessGroup processes(3);
    const Values start = values_of(dense_model());
    std::vector<std::vector<train::VariablePiece>> pieces(3);
    comm_test::run_ranks(3, [&](int r) {
      train::ProcessGroup group = group_of(processes, r);
      train::ShardedAllreduce synchronizer(group, {.stage = stage});
      nn::Sequential model = dense_model();
      // Rank r: gradients r + 1 over r + 1 samples; the mean over 6 samples is 14/6.
      step_with_uneven_samples(synchronizer, model, r);
      require_moved_by(start, model, 14.0f / 6.0f);
      pieces[static_cast<std::size_t>(r)] = synchronizer.pieces();
    });
    const nn::Sequential model = dense_model();
    for (const auto& v : model.trainable_variables()) {
      std::vector<int> owners(static_cast<std::size_t>(v->value.numel()), 0);
      for (const auto& rank : pieces)
        for (const auto& piece : rank)
          if (piece.variable == v->name)
            for (std::int64_t i = piece.begin; i < piece.end; ++i) ++owners[static_cast<std::size_t>(i)];
      CHECK(std::all_of(owners.begin(), owners.end(), [](int n) { return n == 1; }));
    }
  }
}

TEST_CASE("the whole-model state store: one process writes, any reads, an empty directory holds nothing", "[train][checkpoint]") {
  test_util::ScratchDirectory scratch("state_store");
  nn::Sequential model = dense_model();
  auto sgd = plain_sgd();
  train::WholeModelState reader(false);
  CHECK_FALSE(reader.restore(scratch.path(), model, sgd).has_value());
  reader.save(scratch.path(), model, sgd, {.epoch = 3});
  CHECK_FALSE(reader.restore(scratch.path(), model, sgd).has_value());
  train::WholeModelState writer(true);
  writer.save(scratch.path(), model, sgd, {.epoch = 3, .global_step = 12});
  nn::Sequential other({6}, 99);
  other.add(nn::Dense(5)).add(nn::Dense(3));
  const auto position = reader.restore(scratch.path(), other, sgd);
  REQUIRE(position.has_value());
  CHECK(position->global_step == 12);
  CHECK(other.trainable_variables().front()->value.values()[0] == model.trainable_variables().front()->value.values()[0]);
}
