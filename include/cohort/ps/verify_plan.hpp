#pragma once
// Every process of a parameter-server run must compute the same placement plan: this compares the plan's
// fingerprint across all ranks of a transport at start-up.
//
//   ps::verify_same_plan(cluster.transport(), plan);

#include "cohort/comm/transport.hpp"
#include "cohort/ps/placement.hpp"

namespace cohort::ps {

// Throws InvalidArgument naming the ranks that disagree (they built another model, policy or server count).
void verify_same_plan(comm::Transport& transport, const Plan& plan);

}  // namespace cohort::ps
