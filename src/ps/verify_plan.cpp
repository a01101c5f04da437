#include "cohort/ps/verify_plan.hpp"

#include <fmt/format.h>

#include <vector>

#include "cohort/comm/collectives.hpp"
#include "cohort/core/error.hpp"

namespace cohort::ps {

void verify_same_plan(comm::Transport& transport, const Plan& plan) {
  const std::uint64_t mine = plan.fingerprint();
  std::vector<std::uint64_t> all(static_cast<std::size_t>(transport.size()));
  comm::allgather(transport, std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all)));
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
