// The MPI communicator, run by mpirun with 2 and 3 ranks (ctest mpi_np2, mpi_np3): the communicator
// contract, and data-parallel training through it (plain and sharded) equal to one process at the global batch.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "cohort/comm/mpi.hpp"
#include "cohort/data/synthetic.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/train/ring_allreduce.hpp"
#include "cohort/train/trainer.hpp"
#include "comm/communicator_contract.hpp"
#include "ps/ps_test_util.hpp"

using namespace cohort;

namespace {

std::shared_ptr<comm::Communicator> communicator;

}  // namespace

TEST_CASE("the MPI communicator meets the communicator contract", "[mpi]") {
  REQUIRE(communicator->name() == "mpi");
  REQUIRE(communicator->size() >= 2);
  REQUIRE_NOTHROW(comm_test::check_communicator_contract(*communicator));
}

TEST_CASE("allreduce training over MPI with W ranks at batch B takes the steps of one process at W x B", "[mpi][train]") {
  const int ranks = communicator->size();
  // 44 and 41 samples: the last global step is shared unevenly, and with 41 on 3 ranks some rank gets none.
  for (std::int64_t samples : {44, 41}) {
    INFO(samples << " samples on " << ranks << " ranks");
    const auto set = data::make_synthetic({.samples = samples, .sample_shape = {8, 8, 2}, .classes = 4, .seed = 3});
    const auto sgd = [] { return optim::SGD({.learning_rate = optim::constant(0.1), .momentum = 0.9}); };
    nn::Sequential reference = ps_test::small_model();
    Trainer single(reference, sgd());
    single.fit(set, {.epochs = 100, .max_steps = 7, .batch_size = 8 * ranks, .seed = 4,
                     .verbosity = train::Verbosity::Silent});

    // Plain allreduce, and the sharded updates (zero1, zero2: MPI_Reduce_scatter_block and MPI_Allgather in place).
    for (int stage : {0, 1, 2}) {
      INFO("zero stage " << stage);
      nn::Sequential model = ps_test::small_model();
      // Other starting values off the chief: initialize() must replace them with the chief's.
      if (communicator->rank() != 0)
        for (float& v : model.variable("dense/kernel")->value.values()) v += 1.0f;
      Trainer trainer(model, sgd(), std::make_shared<train::RingAllreduce>(communicator, train::RingAllreduceOptions{.zero_stage = stage}));
      REQUIRE(trainer.fit(set, {.epochs = 100, .max_steps = 7, .batch_size = 8, .seed = 4,
                                .verbosity = train::Verbosity::Silent}).epochs.size() >= 1);
      ps_test::require_same_variables(reference, model, 1e-4);
    }
  }
}

int main(int argc, char** argv) {
  communicator = comm::make_mpi_communicator();
  const int failed = Catch::Session().run(argc, argv);
  communicator.reset();  // finalizes MPI
  return failed;
}
