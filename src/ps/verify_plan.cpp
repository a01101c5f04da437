#include "cohort/ps/verify_plan.hpp"

#include <fmt/format.h>

#include <memory>
#include <vector>

#include "cohort/comm/communicator.hpp"
#include "cohort/core/error.hpp"

namespace cohort::ps {

void verify_same_plan(comm::Transport& transport, const Plan& plan) {
  // Through a communicator, whose progress names a process stuck before its first step, rather than the
  // neighbour each waited on. Fingerprints travel as raw bytes: a u64 is two float slots.
  auto mine = std::make_shared<std::uint64_t>(plan.fingerprint());
  auto gathered = std::make_shared<std::vector<std::uint64_t>>(static_cast<std::size_t>(transport.size()));
  const auto communicator = comm::make_ring_communicator(transport);
  constexpr std::size_t kSlots = sizeof(std::uint64_t) / sizeof(float);
  communicator
      ->allgather({mine.get(), kSlots, DType::Float32, Device::CPU, mine},
                  {gathered->data(), kSlots * gathered->size(), DType::Float32, Device::CPU, gathered})
      ->wait(communicator->timeout());
  const std::vector<std::uint64_t>& all = *gathered;
  std::string differing;
  for (int r = 0; r < transport.size(); ++r)
    if (all[static_cast<std::size_t>(r)] != all[0])
      differing += fmt::format("{}{} has {:016x}", differing.empty() ? "" : ", ", transport.describe(r), all[static_cast<std::size_t>(r)]);
  if (!differing.empty())
    throw InvalidArgument(fmt::format("placement plans differ between processes: {} has {:016x} ({} on {} servers), {}; "
                                      "every process must build the same model with the same policy and server count",
                                      transport.describe(0), all[0], plan.policy(), plan.servers(), differing));
}

}  // namespace cohort::ps
