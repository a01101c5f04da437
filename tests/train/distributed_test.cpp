// Data-parallel training: sharded epochs and the ring-allreduce strategy against a single process.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <set>

#include "cohort/comm/inproc.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/data/synthetic.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/batch_normalization.hpp"
#include "cohort/nn/conv2d.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/flatten.hpp"
#include "cohort/nn/model_file.hpp"
#include "cohort/nn/pooling2d.hpp"
#include "cohort/nn/sync_batch_normalization.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/train/parameter_server.hpp"
#include "cohort/train/ring_allreduce.hpp"
#include "cohort/train/strategy_for.hpp"
#include "cohort/train/trainer.hpp"
#include "comm/comm_test_util.hpp"
#include "ps/ps_test_util.hpp"
#include "test_util.hpp"

using namespace cohort;

namespace {

// Sample i holds the value i.
struct IndexDataset : data::Dataset {
  std::int64_t count;
  explicit IndexDataset(std::int64_t n) : count(n) {}
  std::int64_t size() const override { return count; }
  Shape sample_shape() const override { return {1}; }
  int num_classes() const override { return 2; }
  std::string description() const override { return "index"; }
  int load(std::int64_t index, float* out) const override {
    out[0] = static_cast<float>(index);
    return 0;
  }
};

std::vector<std::vector<std::int64_t>> batches_of(const data::DataLoader& loader, std::int64_t epoch) {
  std::vector<std::vector<std::int64_t>> out;
  auto batches = loader.epoch(epoch);
  while (auto batch = batches->next()) {
    std::vector<std::int64_t> ids;
    for (float v : batch->images.values()) ids.push_back(static_cast<std::int64_t>(v));
    out.push_back(ids);
  }
  return out;
}

nn::Sequential small_model() {
  nn::Sequential model({8, 8, 2}, 5);
  model.add(nn::Conv2D(4, 3, nn::Padding::Same)).add(nn::ReLU()).add(nn::MaxPooling2D(2));
  model.add(nn::Flatten()).add(nn::Dense(4)).add(nn::Softmax());
  return model;
}

// A batch-normalized model: its moving statistics are what replicas would let drift apart.
nn::Sequential normalized_model() {
  nn::Sequential model({8, 8, 2}, 5);
  model.add(nn::Conv2D(4, 3, nn::Padding::Same)).add(nn::BatchNormalization()).add(nn::ReLU());
  model.add(nn::Flatten()).add(nn::Dense(4)).add(nn::Softmax());
  return model;
}

// The same with the statistics of the global batch: a second SyncBatchNormalization in a deeper layer,
// so that the first one's input gradient goes through the cross-replica terms of both.
nn::Sequential synchronized_model() {
  nn::Sequential model({8, 8, 2}, 5);
  model.add(nn::Conv2D(4, 3, nn::Padding::Same)).add(nn::SyncBatchNormalization()).add(nn::ReLU());
  model.add(nn::Conv2D(4, 3, nn::Padding::Same)).add(nn::SyncBatchNormalization()).add(nn::ReLU());
  model.add(nn::Flatten()).add(nn::Dense(4)).add(nn::Softmax());
  return model;
}

}  // namespace

TEST_CASE("replicas share one pass per epoch: every sample exactly once, equal step counts", "[train][distributed]") {
  const IndexDataset set(103);
  for (int replicas : {1, 2, 3, 4}) {
    std::vector<std::vector<std::vector<std::int64_t>>> per_replica;
    for (int r = 0; r < replicas; ++r)
      per_replica.push_back(batches_of(data::DataLoader(set, {.batch_size = 8, .seed = 9, .prefetch = 0, .replica = r, .replicas = replicas}), 2));
    const data::DataLoader single(set, {.batch_size = 8 * replicas, .seed = 9, .prefetch = 0});
    const auto global = batches_of(single, 2);
    INFO("replicas " << replicas);
    std::multiset<std::int64_t> seen;
    for (int r = 0; r < replicas; ++r) {
      REQUIRE(per_replica[static_cast<std::size_t>(r)].size() == global.size());
      for (const auto& batch : per_replica[static_cast<std::size_t>(r)]) seen.insert(batch.begin(), batch.end());
    }
    CHECK(seen.size() == 103);
    CHECK(std::set<std::int64_t>(seen.begin(), seen.end()).size() == 103);
    // Step k of all replicas together is step k of one process at replicas x the batch.
    for (std::size_t k = 0; k < global.size(); ++k) {
      std::vector<std::int64_t> joined;
      for (int r = 0; r < replicas; ++r)
        joined.insert(joined.end(), per_replica[static_cast<std::size_t>(r)][k].begin(), per_replica[static_cast<std::size_t>(r)][k].end());
      CHECK(joined == global[k]);
    }
  }
}

TEST_CASE("ring-allreduce with W workers at batch B takes the steps of one process at batch W x B", "[train][distributed]") {
  // 44 samples, 2 x 8 per step: steps of 16, 16 and 12 samples, the last shared 8 + 4, so the average must
  // weight the replicas by their sample counts. Then 41 samples: the last step leaves replica 1 empty.
  // Buckets of one variable each, of a few variables, and one bucket for all.
  const std::size_t bucket_bytes = GENERATE(std::size_t{0}, std::size_t{300}, std::size_t{1} << 30);
  INFO("bucket_bytes " << bucket_bytes);
  const train::RingAllreduceOptions ring_options{.first_bucket_bytes = bucket_bytes / 3, .bucket_bytes = bucket_bytes};
  for (std::int64_t samples : {44, 41}) {
    const auto set = data::make_synthetic({.samples = samples, .sample_shape = {8, 8, 2}, .classes = 4, .seed = 3});

    nn::Sequential reference = small_model();
    Trainer single(reference, ps_test::momentum_sgd());
    single.fit(set, {.max_steps = 7, .batch_size = 16, .seed = 4, .verbosity = train::Verbosity::Silent});

    comm::InProcessGroup group(2);
    std::vector<nn::Sequential> models;
    models.push_back(small_model());
    models.push_back(small_model());
    // Different starting values on the second replica: initialize() must replace them with the chief's.
    for (float& v : models[1].variable("dense/kernel")->value.values()) v += 1.0f;
    comm_test::run_ranks(2, [&](int r) {
      Trainer trainer(models[static_cast<std::size_t>(r)], ps_test::momentum_sgd(),
                      std::make_shared<train::RingAllreduce>(group.transport(r), ring_options));
      trainer.fit(set, {.max_steps = 7, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Silent});
    });
    for (const auto& model : models) ps_test::require_same_variables(reference, model);
  }
}

TEST_CASE("hierarchical ring allreduce: 4 ranks on 2 hosts take the steps of one process", "[train][distributed]") {
  const auto set = data::make_synthetic({.samples = 44, .sample_shape = {8, 8, 2}, .classes = 4, .seed = 3});
  nn::Sequential reference = small_model();
  Trainer single(reference, ps_test::momentum_sgd());
  single.fit(set, {.max_steps = 4, .batch_size = 16, .seed = 4, .verbosity = train::Verbosity::Silent});

  comm::InProcessGroup group(4);
  std::vector<nn::Sequential> models;
  for (int r = 0; r < 4; ++r) models.push_back(small_model());
  comm_test::run_ranks(4, [&](int r) {
    std::shared_ptr<comm::Communicator> ring = comm::make_ring_communicator(group.transport(r), {0, 1, 0, 1});
    CHECK(ring->name() == "hierarchical ring");
    Trainer trainer(models[static_cast<std::size_t>(r)], ps_test::momentum_sgd(), std::make_shared<train::RingAllreduce>(std::move(ring)));
    trainer.fit(set, {.max_steps = 4, .batch_size = 4, .seed = 4, .verbosity = train::Verbosity::Silent});
  });
  for (const auto& model : models) ps_test::require_same_variables(reference, model);
}

TEST_CASE("gradient buckets: reverse creation order, a smaller first bucket, large variables alone", "[train][distributed]") {
  // small_model's trainable variables in creation order: conv2d/kernel 72, conv2d/bias 4, dense/kernel 64,
  // dense/bias 4 floats.
  const nn::Sequential model = small_model();
  const auto plan_for = [&](std::size_t first, std::size_t rest) {
    comm::InProcessGroup group(1);
    train::RingAllreduce ring(group.transport(0), {.first_bucket_bytes = first, .bucket_bytes = rest});
    nn::Sequential copy = small_model();
    optim::SGD sgd;
    ring.initialize(copy, sgd);
    return ring.bucket_plan();
  };
  using Plan = std::vector<std::vector<std::string>>;
  CHECK(plan_for(0, 0) == Plan{{"dense/bias"}, {"dense/kernel"}, {"conv2d/bias"}, {"conv2d/kernel"}});
  CHECK(plan_for(16, 1 << 20) == Plan{{"dense/bias"}, {"dense/kernel", "conv2d/bias", "conv2d/kernel"}});
  CHECK(plan_for(17, 256) == Plan{{"dense/bias", "dense/kernel"}, {"conv2d/bias", "conv2d/kernel"}});
  CHECK(plan_for(1 << 20, 1 << 20) == Plan{{"dense/bias", "dense/kernel", "conv2d/bias", "conv2d/kernel"}});
  CHECK(model.trainable_variables().size() == 4);
}

TEST_CASE("EachWorkerFullPass: every replica reads the whole set in its own order", "[train][distributed]") {
  comm::InProcessGroup group(2);
  const train::RingAllreduce zero(group.transport(0), {.data = train::DataPolicy::EachWorkerFullPass});
  const train::RingAllreduce one(group.transport(1), {.data = train::DataPolicy::EachWorkerFullPass});
  CHECK(zero.data_share().replicas == 1);
  CHECK(zero.data_share().seed_offset != one.data_share().seed_offset);
  const train::RingAllreduce sharded(group.transport(1));
  CHECK(sharded.data_share().replica == 1);
  CHECK(sharded.data_share().replicas == 2);
}

TEST_CASE("learning rates scale with the replicas after a linear warm-up", "[optim][distributed]") {
  const auto linear = optim::scaled_for_replicas(optim::constant(0.1), 4, optim::ReplicaScaling::Linear, 10);
  CHECK(linear(0) == Approx(0.1));
  CHECK(linear(5) == Approx(0.25));
  CHECK(linear(10) == Approx(0.4));
  CHECK(optim::scaled_for_replicas(optim::constant(0.1), 4, optim::ReplicaScaling::Sqrt)(0) == Approx(0.2));
  CHECK(optim::scaled_for_replicas(optim::constant(0.1), 4, optim::ReplicaScaling::None, 10)(20) == Approx(0.1));
}

TEST_CASE("an unknown COHORT_COMMUNICATOR is refused by name", "[train][distributed]") {
  cluster::Cluster single;
  ::setenv("COHORT_COMMUNICATOR", "carrier-pigeon", 1);
  CHECK_THROWS_WITH(train::strategy_for(single), Catch::Contains("COHORT_COMMUNICATOR='carrier-pigeon': use ring, mpi"));
  ::setenv("COHORT_COMMUNICATOR", "Ring", 1);  // the spellings are exact
  CHECK_THROWS_WITH(train::strategy_for(single), Catch::Contains("COHORT_COMMUNICATOR='Ring'"));
  ::setenv("COHORT_COMMUNICATOR", "ring", 1);
  CHECK(train::strategy_for(single)->name() == "local");
  ::unsetenv("COHORT_COMMUNICATOR");
}

TEST_CASE("a ring-allreduce process goes by the cluster's name of it, as in its logs and errors", "[train][distributed]") {
  comm::InProcessGroup group(2, std::chrono::seconds(10), {"chief 0 (127.0.0.1:4000)", "worker 0 (127.0.0.1:4001)"});
  CHECK(train::RingAllreduce(group.transport(0)).process_name() == "chief 0");
  CHECK(train::RingAllreduce(group.transport(1)).process_name() == "worker 0");
}

TEST_CASE("ring allreduce averages the moving statistics over the replicas at every step", "[train][distributed]") {
  const auto set = data::make_synthetic({.samples = 48, .sample_shape = {8, 8, 2}, .classes = 4, .seed = 3});
  const std::vector<std::string> statistics{"batch_normalization/moving_mean", "batch_normalization/moving_variance"};
  const train::FitOptions fit{.max_steps = 1, .batch_size = 8, .shuffle = false, .verbosity = train::Verbosity::Silent};

  // Without shuffling, step 1 gives replica r the r-th batch of 8: what each replica moves its statistics by.
  std::vector<std::vector<float>> alone[2];
  {
    const data::DataLoader loader(set, {.batch_size = 8, .shuffle = false, .prefetch = 0});
    auto batches = loader.epoch(0);
    for (auto& own : alone) {
      nn::Sequential model = normalized_model();
      model.train();
      model.forward(batches->next()->images);
      for (const auto& name : statistics) own.push_back(model.variable(name)->value.to_vector());
    }
  }
  comm::InProcessGroup group(2);
  std::vector<nn::Sequential> models;
  models.push_back(normalized_model());
  models.push_back(normalized_model());
  comm_test::run_ranks(2, [&](int r) {
    Trainer trainer(models[static_cast<std::size_t>(r)], ps_test::momentum_sgd(),
                    std::make_shared<train::RingAllreduce>(group.transport(r)));
    trainer.fit(set, fit);
  });
  for (std::size_t s = 0; s < statistics.size(); ++s) {
    const auto got = models[0].variable(statistics[s])->value.to_vector();
    CHECK(got == models[1].variable(statistics[s])->value.to_vector());
    REQUIRE(alone[0][s] != alone[1][s]);  // the replicas' batches did move them differently
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO(statistics[s] << "[" << i << "]");
      CHECK(got[i] == Approx((alone[0][s][i] + alone[1][s][i]) / 2).epsilon(1e-6));
    }
  }

  // Over more steps every variable of the replicas stays the same, bit for bit.
  comm::InProcessGroup second_group(2);
  std::vector<nn::Sequential> longer;
  longer.push_back(normalized_model());
  longer.push_back(normalized_model());
  comm_test::run_ranks(2, [&](int r) {
    Trainer trainer(longer[static_cast<std::size_t>(r)], ps_test::momentum_sgd(),
                    std::make_shared<train::RingAllreduce>(second_group.transport(r)));
    trainer.fit(set, {.max_steps = 6, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Silent});
  });
  for (const auto& v : longer[0].variables()) {
    INFO(v->name);
    CHECK(v->value.to_vector() == longer[1].variable(v->name)->value.to_vector());
  }
}

TEST_CASE("SyncBatchNormalization: 2 replicas at batch B take the steps of one process at 2B", "[train][distributed]") {
  // 44 samples: a last step shared 8 + 4; 40: a last step in which replica 1 has no sample and still takes
  // part in every sum. Over 2 epochs of momentum SGD, moving statistics included.
  for (std::int64_t samples : {44, 40}) {
    INFO(samples << " samples");
    const auto set = data::make_synthetic({.samples = samples, .sample_shape = {8, 8, 2}, .classes = 4, .seed = 3});
    nn::Sequential reference = synchronized_model();
    Trainer single(reference, ps_test::momentum_sgd());
    single.fit(set, {.epochs = 2, .batch_size = 16, .seed = 4, .verbosity = train::Verbosity::Silent});

    comm::InProcessGroup group(2);
    std::vector<nn::Sequential> models;
    models.push_back(synchronized_model());
    models.push_back(synchronized_model());
    comm_test::run_ranks(2, [&](int r) {
      Trainer trainer(models[static_cast<std::size_t>(r)], ps_test::momentum_sgd(),
                      std::make_shared<train::RingAllreduce>(group.transport(r)));
      trainer.fit(set, {.epochs = 2, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Silent});
    });
    for (const auto& model : models) ps_test::require_same_variables(reference, model, 2e-5);
    // Plain batch normalization on the same replicas does not: the test can tell the two apart.
    comm::InProcessGroup plain_group(2);
    std::vector<nn::Sequential> plain;
    for (int r = 0; r < 2; ++r) plain.push_back(normalized_model());
    nn::Sequential plain_reference = normalized_model();
    Trainer plain_single(plain_reference, ps_test::momentum_sgd());
    plain_single.fit(set, {.epochs = 2, .batch_size = 16, .seed = 4, .verbosity = train::Verbosity::Silent});
    comm_test::run_ranks(2, [&](int r) {
      Trainer trainer(plain[static_cast<std::size_t>(r)], ps_test::momentum_sgd(),
                      std::make_shared<train::RingAllreduce>(plain_group.transport(r)));
      trainer.fit(set, {.epochs = 2, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Silent});
    });
    double most = 0;
    for (const auto& v : plain_reference.variables()) {
      const auto want = v->value.to_vector(), got = plain[0].variable(v->name)->value.to_vector();
      for (std::size_t i = 0; i < want.size(); ++i) most = std::max(most, std::abs(static_cast<double>(want[i] - got[i])));
    }
    INFO("plain batch normalization differs by " << most);
    CHECK(most > 1e-3);
  }
}

TEST_CASE("SyncBatchNormalization: a model file keeps the layer, parameter servers refuse it by name", "[train][distributed]") {
  test_util::ScratchDirectory dir("sync-bn");
  nn::Sequential model = synchronized_model();
  nn::save_model(model, dir.path() / "sync.model");
  const nn::Sequential loaded = nn::load_model(dir.path() / "sync.model");
  CHECK(loaded.layer(1).type_name() == "SyncBatchNormalization");
  CHECK(loaded.layer(1).name() == "sync_batch_normalization");

  comm::InProcessGroup group(3);
  Trainer trainer(model, ps_test::momentum_sgd(), std::make_shared<train::ParameterServer>(group.transport(0), 2));
  const auto set = data::make_synthetic({.samples = 16, .sample_shape = {8, 8, 2}, .classes = 4, .seed = 3});
  CHECK_THROWS_WITH(trainer.fit(set, {.epochs = 1, .batch_size = 8, .verbosity = train::Verbosity::Silent}),
                    Catch::Contains("layer 'sync_batch_normalization' (SyncBatchNormalization)") &&
                        Catch::Contains("use BatchNormalization, or train with ring allreduce"));
}
