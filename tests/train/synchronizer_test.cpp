// The parts data parallelism is built from: the process group's agreement, the synchronizers used on their
// own (bucketed: gradients that view their buckets, weighting by samples; the parameter store), the state
// stores, a strategy of the caller's own composed from them, and serving as its own entry point.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

#include "cohort/comm/inproc.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/synthetic.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/ps/server.hpp"
#include "cohort/ps/verify_plan.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/train/bucketed_allreduce.hpp"
#include "cohort/train/parameter_server.hpp"
#include "cohort/train/parameter_store_synchronizer.hpp"
#include "cohort/train/process_group.hpp"
#include "cohort/train/ring_allreduce.hpp"
#include "cohort/train/sharded_allreduce.hpp"
#include "cohort/train/state_store.hpp"
#include "cohort/train/trainer.hpp"
#include "cohort/train/variable_infos.hpp"
#include "comm/comm_test_util.hpp"
#include "ps/ps_test_util.hpp"
#include "test_util.hpp"

using namespace cohort;

namespace {

nn::Sequential dense_model() {
  nn::Sequential model({6}, 3);
  model.add(nn::Dense(5)).add(nn::Dense(3));
  return model;
}

nn::Sequential classifier() {
  nn::Sequential model = dense_model();
  model.add(nn::Softmax());
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

// Data parallelism in a few lines, from the parts: ranks and agreement, bucketed allreduce, the chief's
// checkpoints. `broadcast` false forgets to start the replicas from the chief's variables.
class CallersAllreduce final : public train::Strategy {
 public:
  explicit CallersAllreduce(comm::Transport& transport, bool broadcast = true)
      : group_({comm::make_ring_communicator(transport)}), synchronizer_(group_, {}), state_(group_.is_chief()), broadcast_(broadcast) {}
  std::string name() const override { return "the caller's allreduce"; }
  train::Replicas& replica_group() const override { return group_; }
  train::GradientSynchronizer& synchronizer() const override { return synchronizer_; }
  train::StateStore& state_store() override { return state_; }
  void initialize(nn::Sequential& model, optim::Optimizer&) override {
    synchronizer_.prepare(model);
    if (broadcast_) group_.broadcast_from_chief(model.variables());
  }

 private:
  mutable train::ProcessGroup group_;
  mutable train::BucketedAllreduce synchronizer_;
  train::WholeModelState state_;
  bool broadcast_;
};

const data::ImageDataset& small_set() {
  static const auto set = data::make_synthetic({.samples = 24, .sample_shape = {6}, .classes = 3, .seed = 4});
  return set;
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

TEST_CASE("a parameter store synchronizer steps a loop of the caller's own, and the servers update, weighting each worker by its samples",
          "[train][ps]") {
  comm::InProcessGroup processes(3, std::chrono::seconds(20), ps_test::process_names(2, 1));
  const Values start = values_of(dense_model());
  comm_test::run_ranks(3, [&](int r) {
    nn::Sequential model = dense_model();
    auto sgd = plain_sgd();
    const ps::Plan plan = ps::make_plan(train::variable_infos(model), 1, ps::placement::RoundRobin{});
    ps::verify_same_plan(processes.transport(r), plan);
    if (r == 2) {
      CHECK_THROWS_WITH(train::ParameterStoreSynchronizer(processes.transport(r), 2, {}).connect(model, sgd, plan, false),
                        Catch::Contains("ps 0 is a parameter server here (ranks 2 to 2 serve)"));
      ps::Server(processes.transport(r), plan, 0, {0, 1}, sgd).serve();
      return;
    }
    train::ParameterStoreSynchronizer synchronizer(processes.transport(r), 2, {});
    CHECK(synchronizer.updates_elsewhere());
    synchronizer.connect(model, sgd, plan, /*servers_hold_values=*/false);
    step_with_uneven_samples(synchronizer, model, r);
    require_moved_by(start, model, 5.0f / 3.0f);
    CHECK(synchronizer.steps_taken() == 1);
    synchronizer.disconnect(sgd);
  });

  // Backup workers' servers could disagree on a skipped step: no loss scaling.
  comm::InProcessGroup backups(3);
  CHECK_THROWS_WITH(train::ParameterStoreSynchronizer(backups.transport(0), 3, {}),
                    Catch::Contains("needs at least one worker and one server: 3 workers among 3 processes"));
  train::ParameterStoreSynchronizer with_backups(backups.transport(0), 2, {.consistency = ps::Sync{.backup_workers = 1}});
  train::LossScale scale;
  CHECK_FALSE(with_backups.set_loss_scale(&scale));
}

TEST_CASE("a strategy of the caller's own, composed from the parts, trains as RingAllreduce does", "[train][distributed]") {
  comm::InProcessGroup callers(2), rings(2);
  std::vector<nn::Sequential> composed, ring;
  for (int r = 0; r < 2; ++r) {
    composed.push_back(classifier());
    ring.push_back(classifier());
  }
  const train::FitOptions fit{.epochs = 2, .batch_size = 4, .verbosity = train::Verbosity::Silent};
  comm_test::run_ranks(2, [&](int r) {
    const auto k = static_cast<std::size_t>(r);
    Trainer mine(composed[k], plain_sgd(), std::make_shared<CallersAllreduce>(callers.transport(r)));
    const train::History history = mine.fit(small_set(), fit);
    CHECK(history.epochs.size() == 2);
    Trainer theirs(ring[k], plain_sgd(), std::make_shared<train::RingAllreduce>(rings.transport(r)));
    theirs.fit(small_set(), fit);
  });
  for (int r = 0; r < 2; ++r) CHECK(values_of(composed[static_cast<std::size_t>(r)]) == values_of(ring[0]));
}

TEST_CASE("replicas that a strategy's initialize() left apart are refused at the start, naming the strategy", "[train][distributed]") {
  comm::InProcessGroup processes(2);
  std::vector<std::string> errors(2);
  std::atomic<int> refused_here{0};
  comm_test::run_ranks(2, [&](int r) {
    nn::Sequential model({6}, 3 + static_cast<std::uint64_t>(r));  // each replica drawn from a seed of its own
    model.add(nn::Dense(3)).add(nn::Softmax());
    Trainer trainer(model, plain_sgd(), std::make_shared<CallersAllreduce>(processes.transport(r), /*broadcast=*/false));
    try {
      trainer.fit(small_set(), {.epochs = 1, .batch_size = 4, .verbosity = train::Verbosity::Silent});
    } catch (const InvalidArgument& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
      ++refused_here;
    } catch (const IoError& e) {
      // The other replica refused first and left the group before this one took its share of the check: its
      // reason reaches this one.
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  CHECK(refused_here >= 1);
  for (const auto& error : errors)
    CHECK_THAT(error, Catch::Contains("the replicas start from different variables after strategy 'the caller's allreduce'"));
}

TEST_CASE("a parameter server's entry point is serve(), fit() hands over to it, and each role refuses the other's",
          "[train][ps]") {
  comm::InProcessGroup processes(2, std::chrono::seconds(20), ps_test::process_names(1, 1));
  std::vector<std::size_t> epochs(2);
  ps_test::run_cluster(processes, 1, 1, {}, [&](int r, auto strategy) {
    nn::Sequential model = classifier();
    Trainer trainer(model, plain_sgd(), strategy);
    if (r == 1) {
      CHECK(strategy->service() == strategy.get());
      auto sgd = plain_sgd();
      CHECK_THROWS_WITH(strategy->initialize(model, sgd), Catch::Contains("ps 0 is a parameter server: it runs serve()"));
      epochs[1] = trainer.serve({}).epochs.size();  // the chief's history, sent at the end
      return;
    }
    CHECK(strategy->service() == nullptr);
    epochs[0] = trainer.fit(small_set(), {.epochs = 2, .batch_size = 4, .verbosity = train::Verbosity::Silent}).epochs.size();
  });
  CHECK(epochs == std::vector<std::size_t>{2, 2});

  // A worker that calls serve() fails, and the server learns why.
  comm::InProcessGroup misused(2, std::chrono::seconds(20), ps_test::process_names(1, 1));
  std::vector<std::string> errors(2);
  ps_test::run_cluster(misused, 1, 1, {}, [&](int r, auto strategy) {
    nn::Sequential model = classifier();
    Trainer trainer(model, plain_sgd(), strategy);
    try {
      trainer.serve({});
    } catch (const Error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  const std::string refusal = "chief 0 trains under strategy 'parameter-server (sync, 1 server)': serve() is for the processes that serve";
  CHECK_THAT(errors[0], Catch::StartsWith(refusal));
  CHECK_THAT(errors[1], Catch::Contains("chief 0 failed: " + refusal));
}
