// Parameter-server training end to end, with every process a thread: Sync against one process, Async and
// BoundedStaleness, backup workers, BatchNorm statistics on the servers, checkpoints across topologies,
// lost processes.
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <thread>

#include "cohort/core/error.hpp"
#include "cohort/optim/adam.hpp"
#include "cohort/optim/sgd.hpp"
#include "ps/ps_test_util.hpp"
#include "test_util.hpp"

using namespace cohort;
using ps_test::momentum_sgd;
using ps_test::require_same_variables;
using ps_test::small_model;

namespace {

// Sleeps after every batch: a slow worker.
struct Slowdown : train::Callback {
  std::chrono::milliseconds delay;
  explicit Slowdown(std::chrono::milliseconds d) : delay(d) {}
  void on_batch_end(std::int64_t, const train::Logs&, train::TrainingControl&) override { std::this_thread::sleep_for(delay); }
};

// Blocks the training thread once, after the third batch: a process stuck while its transport goes on.
struct BlockAtThirdBatch : train::Callback {
  std::chrono::milliseconds block;
  int batches = 0;
  explicit BlockAtThirdBatch(std::chrono::milliseconds b) : block(b) {}
  void on_batch_end(std::int64_t, const train::Logs&, train::TrainingControl&) override {
    if (++batches == 3) std::this_thread::sleep_for(block);
  }
};

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name) : path(std::filesystem::temp_directory_path() / (name + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace

TEST_CASE("Sync: W workers at batch B take the steps of one process at batch W x B", "[ps][train]") {
  nn::Sequential reference = small_model();
  Trainer single(reference, momentum_sgd());
  single.fit(ps_test::small_set(), {.epochs = 1000, .max_steps = 7, .batch_size = 16, .seed = 4, .verbosity = train::Verbosity::Silent});

  // Two servers, and the dense kernel cut into shards: the worker must see whole variables.
  for (const std::int64_t max_shard_bytes : {std::int64_t{0}, std::int64_t{256}}) {
    INFO("max_shard_bytes " << max_shard_bytes);
    comm::InProcessGroup group(4);
    std::vector<nn::Sequential> models;
    for (int r = 0; r < 4; ++r) models.push_back(small_model());
    // Other starting values elsewhere: the chief's must win.
    for (float& v : models[1].variable("dense/kernel")->value.values()) v += 1.0f;
    ps_test::run_cluster(group, 2, 2, {.max_shard_bytes = max_shard_bytes}, [&](int r, auto strategy) {
      Trainer trainer(models[static_cast<std::size_t>(r)], momentum_sgd(), strategy);
      trainer.fit(ps_test::small_set(), {.epochs = 1000, .max_steps = 7, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Silent});
    });
    require_same_variables(reference, models[0]);
    require_same_variables(reference, models[1]);
  }
}

TEST_CASE("bfloat16 pushes train as float32 ones do, within bfloat16's rounding", "[ps][train][dtype]") {
  nn::Sequential reference = small_model();
  const std::vector<float> start = reference.variable("dense/kernel")->value.to_vector();
  Trainer single(reference, momentum_sgd());
  single.fit(ps_test::small_set(), {.epochs = 1000, .max_steps = 7, .batch_size = 16, .seed = 4, .verbosity = train::Verbosity::Silent});
  comm::InProcessGroup group(4);
  std::vector<nn::Sequential> models;
  for (int r = 0; r < 4; ++r) models.push_back(small_model());
  ps_test::run_cluster(group, 2, 2, {.gradient_dtype = DType::BFloat16}, [&](int r, auto strategy) {
    Trainer trainer(models[static_cast<std::size_t>(r)], momentum_sgd(), strategy);
    trainer.fit(ps_test::small_set(), {.epochs = 1000, .max_steps = 7, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Silent});
  });
  require_same_variables(models[0], models[1]);
  // The kernel's change over the 7 steps: each step's gradients rounded once to bfloat16 on the way.
  const std::vector<float> exact = reference.variable("dense/kernel")->value.to_vector();
  const std::vector<float> pushed = models[0].variable("dense/kernel")->value.to_vector();
  double difference = 0, magnitude = 0;
  for (std::size_t i = 0; i < start.size(); ++i) {
    difference = std::max(difference, std::abs(static_cast<double>(pushed[i]) - exact[i]));
    magnitude = std::max(magnitude, std::abs(static_cast<double>(exact[i]) - start[i]));
  }
  CHECK(difference > 0);
  CHECK(difference < 7 * 4 * unit_roundoff(DType::BFloat16) * magnitude);
}

TEST_CASE("a rate cut after the last push still reaches the servers", "[ps][train]") {
  comm::InProcessGroup group(3);
  std::vector<nn::Sequential> models;
  for (int r = 0; r < 3; ++r) models.push_back(small_model());
  std::vector<double> rates(3);
  ps_test::run_cluster(group, 2, 1, {}, [&](int r, auto strategy) {
    Trainer trainer(models[static_cast<std::size_t>(r)], momentum_sgd(), strategy);
    train::FitOptions options{.epochs = 2, .batch_size = 4, .seed = 4, .verbosity = train::Verbosity::Silent};
    auto cutter = std::make_shared<train::LambdaCallback>();
    cutter->epoch_end = [](std::int64_t epoch, const train::Logs&, train::TrainingControl& control) {
      if (epoch == 1) control.set_learning_rate(0.01);  // after the run's last push
    };
    options.callbacks.push_back(cutter);
    trainer.fit(ps_test::small_set(), options);
    rates[static_cast<std::size_t>(r)] = trainer.optimizer().learning_rate();
  });
  CHECK(rates[0] == Approx(0.01));
  CHECK(rates[1] == Approx(0.01));
  CHECK(rates[2] == Approx(0.01));  // the server's optimizer
}

TEST_CASE("BatchNorm moving statistics are kept on the servers and agree everywhere", "[ps][train]") {
  comm::InProcessGroup group(3);
  std::vector<nn::Sequential> models;
  for (int r = 0; r < 3; ++r) models.push_back(small_model(true));
  ps_test::run_cluster(group, 2, 1, {}, [&](int r, auto strategy) {
    Trainer trainer(models[static_cast<std::size_t>(r)], optim::Adam(), strategy);
    trainer.fit(ps_test::small_set(), {.epochs = 1000, .max_steps = 6, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Silent});
  });
  const auto moving_mean = models[0].variable("batch_normalization/moving_mean")->value.to_vector();
  bool moved = false;
  for (float v : moving_mean) moved = moved || v != 0.0f;
  CHECK(moved);
  // Both workers read the servers' values at the last step: one model, not one per worker.
  require_same_variables(models[0], models[1], 0.0);
}

TEST_CASE("Async and BoundedStaleness converge, the bound holds while Async runs ahead", "[ps][train]") {
  const auto set = data::make_synthetic({.samples = 512, .sample_shape = {8, 8, 2}, .classes = 4, .seed = 7});
  struct Case {
    ps::Consistency consistency;
    std::int64_t lead_at_most;
  };
  for (const auto& [consistency, lead_at_most] : {Case{ps::Async{}, -1}, Case{ps::BoundedStaleness{2}, 2}}) {
    INFO(ps::describe(consistency));
    comm::InProcessGroup group(4);
    std::vector<nn::Sequential> models;
    for (int r = 0; r < 4; ++r) models.push_back(small_model());
    double accuracy = 0;
    auto strategies = ps_test::run_cluster(group, 2, 2, {.consistency = consistency}, [&](int r, auto strategy) {
      Trainer trainer(models[static_cast<std::size_t>(r)], optim::Adam({.learning_rate = optim::constant(0.01)}), strategy);
      train::FitOptions options{.epochs = 3, .batch_size = 16, .seed = 2, .verbosity = train::Verbosity::Silent};
      // Worker 1 is slow (by far more than a loaded sanitizer build slows the chief): under Async the chief
      // runs far ahead of it.
      if (r == 1) options.callbacks.push_back(std::make_shared<Slowdown>(std::chrono::milliseconds(40)));
      trainer.fit(set, options);
      if (r == 0) accuracy = trainer.evaluate(set).at("accuracy");
    });
    CHECK(accuracy > 0.9);
    const auto& stats = strategies[0]->final_server_stats();
    REQUIRE(stats.size() == 2);
    const std::int64_t chief_lead = stats[0].workers[0].max_lead;
    if (lead_at_most >= 0) {
      CHECK(chief_lead <= lead_at_most);
      CHECK(stats[0].workers[1].max_lead <= lead_at_most);
    } else {
      CHECK(chief_lead > 4);  // without a bound the fast worker pulls away
    }
    CHECK(stats[0].updates == stats[0].workers[0].pushes + stats[0].workers[1].pushes);
  }
}

TEST_CASE("under asynchronous servers a stop asked for mid-epoch waits for the epoch's end, and the asker is told",
          "[ps][train]") {
  for (const ps::Consistency consistency : {ps::Consistency{ps::Async{}}, ps::Consistency{ps::BoundedStaleness{2}}}) {
    INFO(ps::describe(consistency));
    comm::InProcessGroup group(3, std::chrono::seconds(20), ps_test::process_names(2, 1));
    std::vector<nn::Sequential> models;
    for (int r = 0; r < 3; ++r) models.push_back(small_model());
    test_util::CapturedOutput log(STDERR_FILENO);
    std::vector<train::History> histories(3);
    ps_test::run_cluster(group, 2, 1, {.consistency = consistency}, [&](int r, auto strategy) {
      Trainer trainer(models[static_cast<std::size_t>(r)], momentum_sgd(), strategy);
      train::FitOptions options{.epochs = 3, .batch_size = 4, .seed = 4, .verbosity = train::Verbosity::Silent};
      if (r == 1) {
        auto stopper = std::make_shared<train::LambdaCallback>();
        stopper->batch_end = [](std::int64_t step, const train::Logs&, train::TrainingControl& control) {
          if (step >= 2) control.stop();
        };
        options.callbacks.push_back(stopper);
      }
      histories[static_cast<std::size_t>(r)] = trainer.fit(ps_test::small_set(), options);
    });
    const std::string said = log.text();
    INFO(said);
    CHECK(said.find(fmt::format("worker 1 asked to stop after step 2: under parameter-server ({}, 1 server) the processes "
                                "agree only at the end of an epoch, so it takes effect after epoch 1",
                                ps::describe(consistency))) != std::string::npos);
    CHECK(said.find("worker 1 asked to stop after step 3") == std::string::npos);  // told once
    for (int worker : {0, 1}) CHECK(histories[static_cast<std::size_t>(worker)].epochs.size() == 1);
  }
}

TEST_CASE("under asynchronous servers a rate asked for mid-epoch enters every History at the same epoch", "[ps][train]") {
  comm::InProcessGroup group(3, std::chrono::seconds(20), ps_test::process_names(2, 1));
  std::vector<nn::Sequential> models;
  for (int r = 0; r < 3; ++r) models.push_back(small_model());
  std::vector<train::History> histories(3);
  ps_test::run_cluster(group, 2, 1, {.consistency = ps::Async{}}, [&](int r, auto strategy) {
    Trainer trainer(models[static_cast<std::size_t>(r)], momentum_sgd(), strategy);
    train::FitOptions options{.epochs = 3, .batch_size = 4, .seed = 4, .verbosity = train::Verbosity::Silent};
    if (r == 1) {
      auto asker = std::make_shared<train::LambdaCallback>();
      asker->batch_end = [](std::int64_t step, const train::Logs&, train::TrainingControl& control) {
        if (step == 2) control.set_learning_rate(1e-5);
      };
      options.callbacks.push_back(asker);
    }
    histories[static_cast<std::size_t>(r)] = trainer.fit(ps_test::small_set(), options);
  });
  const auto rates = [&](int worker) {
    std::vector<double> column;
    for (const auto& logs : histories[static_cast<std::size_t>(worker)].epochs) column.push_back(logs.at("learning_rate"));
    return column;
  };
  REQUIRE(rates(0).size() == 3);
  CHECK(rates(1) == rates(0));  // the asker's own History too: the rate is agreed after epoch 1
  CHECK(rates(0)[0] != 1e-5);
  CHECK(rates(0)[1] == Approx(1e-5));
  CHECK(rates(0)[2] == Approx(1e-5));
}

TEST_CASE("Sync with a backup worker: late gradients are dropped and counted, training goes on", "[ps][train]") {
  // Three workers, one a backup: every step takes the first two gradients; worker 2 is slow and late.
  comm::InProcessGroup group(4);
  std::vector<nn::Sequential> models;
  for (int r = 0; r < 4; ++r) models.push_back(small_model());
  auto strategies = ps_test::run_cluster(group, 3, 1, {.consistency = ps::Sync{.backup_workers = 1}}, [&](int r, auto strategy) {
    Trainer trainer(models[static_cast<std::size_t>(r)], momentum_sgd(), strategy);
    train::FitOptions options{.epochs = 1000, .max_steps = 20, .batch_size = 4, .seed = 4, .verbosity = train::Verbosity::Silent};
    options.callbacks.push_back(std::make_shared<Slowdown>(std::chrono::milliseconds(r == 2 ? 60 : 5)));
    trainer.fit(ps_test::small_set(), options);
  });
  const auto& stats = strategies[0]->final_server_stats();
  REQUIRE(stats.size() == 1);
  CHECK(stats[0].workers[2].dropped > 0);
  // What the workers cannot agree on, a callback's request, is said where it is asked.
  comm::InProcessGroup named(3, std::chrono::seconds(20), ps_test::process_names(2, 1));
  std::vector<nn::Sequential> two;
  for (int r = 0; r < 3; ++r) two.push_back(small_model());
  test_util::CapturedOutput log(STDERR_FILENO);
  std::vector<train::History> histories(3);
  ps_test::run_cluster(named, 2, 1, {.consistency = ps::Sync{.backup_workers = 1}}, [&](int r, auto strategy) {
    Trainer trainer(two[static_cast<std::size_t>(r)], momentum_sgd(), strategy);
    train::FitOptions options{.epochs = 2, .batch_size = 4, .seed = 4, .verbosity = train::Verbosity::Silent};
    options.validation = &ps_test::small_set();
    if (r == 1) {
      auto stopper = std::make_shared<train::LambdaCallback>();
      stopper->epoch_end = [](std::int64_t, const train::Logs&, train::TrainingControl& control) {
        control.set_learning_rate(0.5);
        control.stop();
      };
      options.callbacks.push_back(stopper);
    }
    histories[static_cast<std::size_t>(r)] = trainer.fit(ps_test::small_set(), options);
  });
  // Each worker's figures are its own, its validation over the whole set (a share of 44 samples in batches
  // of 256 would leave worker 1 none).
  for (int worker : {0, 1}) {
    const train::Logs& logs = histories[static_cast<std::size_t>(worker)].epochs.front();
    CHECK(logs.at("val_loss") > 0);
    CHECK(logs.at("val_accuracy") > 0);
  }
  const std::string said = log.text();
  INFO(said);
  CHECK(said.find("worker 1 asked to stop after epoch 1, but under parameter-server (sync, 1 backup worker") != std::string::npos);
  CHECK(said.find("it applies to this process alone") != std::string::npos);
  // Its rate would not: the servers update with the chief's.
  CHECK(said.find("worker 1 asked for learning rate 0.5 after epoch 1, but under parameter-server (sync, 1 backup worker") !=
        std::string::npos);
  CHECK(said.find("the servers update with the chief's rate: the request has no effect") != std::string::npos);
  CHECK(stats[0].workers[2].pushes < 20);  // the steps did not wait for it
  CHECK(stats[0].updates >= 20);

  // The chief's rate request reaches the servers, and through their replies the other worker's logs.
  {
    comm::InProcessGroup rated(3, std::chrono::seconds(20), ps_test::process_names(2, 1));
    std::vector<nn::Sequential> models;
    for (int r = 0; r < 3; ++r) models.push_back(small_model());
    std::vector<double> rates(3);
    ps_test::run_cluster(rated, 2, 1, {.consistency = ps::Sync{.backup_workers = 1}}, [&](int r, auto strategy) {
      Trainer trainer(models[static_cast<std::size_t>(r)], momentum_sgd(), strategy);
      train::FitOptions options{.epochs = 2, .batch_size = 4, .seed = 4, .verbosity = train::Verbosity::Silent};
      if (r == 0) {
        auto cutter = std::make_shared<train::LambdaCallback>();
        cutter->epoch_end = [](std::int64_t epoch, const train::Logs&, train::TrainingControl& control) {
          if (epoch == 0) control.set_learning_rate(0.004);
        };
        options.callbacks.push_back(cutter);
      } else if (r == 1) {
        // Slow, so that it pushes after the chief's first push at the new rate.
        options.callbacks.push_back(std::make_shared<Slowdown>(std::chrono::milliseconds(40)));
      }
      trainer.fit(ps_test::small_set(), options);
      rates[static_cast<std::size_t>(r)] = trainer.optimizer().learning_rate();
    });
    CHECK(rates[0] == Approx(0.004));
    CHECK(rates[1] == Approx(0.004));
    CHECK(rates[2] == Approx(0.004));  // the server's optimizer
  }

  // The chief's stop, though, ends the run: it says so, and the worker says why its run ended.
  comm::InProcessGroup again(3, std::chrono::seconds(20), ps_test::process_names(2, 1));
  std::vector<nn::Sequential> three;
  for (int r = 0; r < 3; ++r) three.push_back(small_model());
  test_util::CapturedOutput chief_log(STDERR_FILENO);
  ps_test::run_cluster(again, 2, 1, {.consistency = ps::Sync{.backup_workers = 1}}, [&](int r, auto strategy) {
    Trainer trainer(three[static_cast<std::size_t>(r)], momentum_sgd(), strategy);
    train::FitOptions options{.epochs = 50, .batch_size = 4, .seed = 4, .verbosity = train::Verbosity::Silent};
    if (r == 0) {
      auto stopper = std::make_shared<train::LambdaCallback>();
      stopper->epoch_end = [](std::int64_t, const train::Logs&, train::TrainingControl& control) { control.stop(); };
      options.callbacks.push_back(stopper);
    }
    trainer.fit(ps_test::small_set(), options);
  });
  const std::string chief_said = chief_log.text();
  INFO(chief_said);
  CHECK(chief_said.find("chief 0 asked to stop after epoch 1: under parameter-server (sync, 1 backup worker, 1 server) the "
                        "processes do not wait for each other to agree, and the chief's stop ends the run for every process") !=
        std::string::npos);
  CHECK(chief_said.find("worker 1: the chief ended the run after step") != std::string::npos);
}

TEST_CASE("a worker whose share is done waits for a chief that trains on, and names one that is stuck", "[ps][train]") {
  // Worker 1 is fast and ends its share long before the chief, which takes a step every 150 ms while the
  // progress deadline is 600 ms (room for a loaded sanitizer build): the wait is legitimate. Then the chief stops taking steps (its training
  // thread blocked for 2 s, its transport alive): worker 1 must not report success.
  const auto run = [](const train::ParameterServerOptions& options, std::chrono::milliseconds chief_delay,
                      std::chrono::milliseconds chief_block) {
    comm::InProcessGroup group(3, std::chrono::seconds(20), ps_test::process_names(2, 1));
    std::vector<nn::Sequential> models;
    for (int r = 0; r < 3; ++r) models.push_back(small_model());
    std::vector<std::string> errors(3);
    ps_test::run_cluster(group, 2, 1, options, [&](int r, auto strategy) {
      try {
        Trainer trainer(models[static_cast<std::size_t>(r)], momentum_sgd(), strategy);
        train::FitOptions fit{.epochs = 1, .batch_size = 4, .seed = 4, .verbosity = train::Verbosity::Silent};
        if (r == 0) {
          fit.callbacks.push_back(std::make_shared<Slowdown>(chief_delay));
          fit.callbacks.push_back(std::make_shared<BlockAtThirdBatch>(chief_block));
        }
        trainer.fit(ps_test::small_set(), fit);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
    return errors;
  };
  const std::chrono::milliseconds deadline(600);
  for (const ps::Consistency consistency : {ps::Consistency{ps::Async{}}, ps::Consistency{ps::Sync{.backup_workers = 1}}}) {
    INFO(ps::describe(consistency));
    const train::ParameterServerOptions options{.consistency = consistency, .wait_timeout = deadline};
    const auto slow = run(options, std::chrono::milliseconds(150), std::chrono::milliseconds(0));
    for (const auto& error : slow) CHECK(error.empty());
    const auto stuck = run(options, std::chrono::milliseconds(5), std::chrono::milliseconds(2000));
    INFO("worker 1: " << stuck[1]);
    CHECK(stuck[1].find("chief 0 is stuck") != std::string::npos);
  }
}

TEST_CASE("checkpoints restore onto another number of servers and another placement", "[ps][train]") {
  const auto options = [](std::int64_t steps, const std::filesystem::path& dir) {
    return train::FitOptions{.epochs = 1000, .max_steps = steps, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Silent,
                             .checkpoint_dir = dir, .checkpoint_every_steps = 4, .resume = true};
  };
  const auto adam = [] { return optim::Adam({.learning_rate = optim::constant(0.01)}); };
  // Uninterrupted: 8 steps on 2 workers + 2 servers.
  TempDir straight_dir("cohort_ps_straight_");
  std::vector<nn::Sequential> straight;
  {
    comm::InProcessGroup group(4);
    for (int r = 0; r < 4; ++r) straight.push_back(small_model());
    ps_test::run_cluster(group, 2, 2, {}, [&](int r, auto strategy) {
      Trainer(straight[static_cast<std::size_t>(r)], adam(), strategy).fit(ps_test::small_set(), options(8, straight_dir.path));
    });
  }
  // 4 steps on 2 + 2, then the rest on 2 workers + 3 servers placed round-robin with partitioning.
  TempDir dir("cohort_ps_moved_");
  {
    comm::InProcessGroup group(4);
    std::vector<nn::Sequential> models;
    for (int r = 0; r < 4; ++r) models.push_back(small_model());
    ps_test::run_cluster(group, 2, 2, {}, [&](int r, auto strategy) {
      Trainer(models[static_cast<std::size_t>(r)], adam(), strategy).fit(ps_test::small_set(), options(4, dir.path));
    });
  }
  REQUIRE(std::filesystem::exists(dir.path / ps::kManifestName));
  comm::InProcessGroup group(5);
  std::vector<nn::Sequential> models;
  for (int r = 0; r < 5; ++r) models.push_back(small_model(false));
  for (float& v : models[0].variable("dense/kernel")->value.values()) v = 0;  // must come from the snapshots
  const train::ParameterServerOptions moved{.placement = ps::placement::RoundRobin{}, .max_shard_bytes = 200};
  ps_test::run_cluster(group, 2, 3, moved, [&](int r, auto strategy) {
    Trainer(models[static_cast<std::size_t>(r)], adam(), strategy).fit(ps_test::small_set(), options(8, dir.path));
  });
  require_same_variables(straight[0], models[0]);
  require_same_variables(straight[0], models[1]);
}

TEST_CASE("a lost worker or server ends every process of a 2 + 2 run with an error naming it", "[ps][train]") {
  for (const int victim : {1, 3}) {
    INFO("victim rank " << victim);
    comm::InProcessGroup group(4, std::chrono::seconds(20), ps_test::process_names(2, 2));
    std::vector<nn::Sequential> models;
    for (int r = 0; r < 4; ++r) models.push_back(small_model());
    std::vector<std::string> errors(4);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::shared_ptr<train::ParameterServer>> strategies;
    for (int r = 0; r < 4; ++r) strategies.push_back(std::make_shared<train::ParameterServer>(group.transport(r), 2));
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r)
      threads.emplace_back([&, r] {
        try {
          Trainer trainer(models[static_cast<std::size_t>(r)], momentum_sgd(), strategies[static_cast<std::size_t>(r)]);
          trainer.fit(ps_test::small_set(), {.epochs = 1000, .batch_size = 8, .verbosity = train::Verbosity::Silent});
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    group.kill(victim);
    for (auto& t : threads) t.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(seconds < 10);
    const std::string name = ps_test::process_names(2, 2)[static_cast<std::size_t>(victim)];
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r << ": " << errors[static_cast<std::size_t>(r)]);
      CHECK(errors[static_cast<std::size_t>(r)].find(name) != std::string::npos);
    }
  }
}

TEST_CASE("consistency and placement names parse, and bad ones are refused", "[ps]") {
  CHECK(ps::describe(ps::parse_consistency("sync")) == "sync");
  CHECK(ps::describe(ps::parse_consistency("sync:backup=1")) == "sync, 1 backup worker");
  CHECK(ps::describe(ps::parse_consistency("async")) == "async");
  CHECK(ps::describe(ps::parse_consistency("stale:3")) == "bounded staleness 3");
  CHECK_THROWS_AS(ps::parse_consistency("stale:-1"), InvalidArgument);
  CHECK_THROWS_AS(ps::parse_consistency("eventually"), InvalidArgument);
  CHECK(ps::parse_policy("round-robin").name() == "round-robin");
  CHECK(ps::parse_policy("size-balanced").name() == "size-balanced");
  CHECK(ps::parse_policy("tensorflow-greedy").name() == "tensorflow-greedy");
  CHECK_THROWS_AS(ps::parse_policy("random"), InvalidArgument);
}
