// Where the flagship CIFAR-10 model's variables land on 1 to 4 parameter servers under each built-in
// placement policy, with per-server bytes and the imbalance ratio; --json prints the plans as JSON,
// --servers N and --policy NAME pick one, --max-shard-bytes B partitions large variables.
#include <cohort/cohort.hpp>

#include <cstdlib>
#include <cstring>

using namespace cohort;

namespace {

template <ps::PlacementPolicy Policy>
void show(const std::vector<ps::VariableInfo>& variables, int servers, const Policy& policy, const ps::PlanOptions& options,
          bool json, bool brief) {
  const ps::Plan plan = ps::make_plan(variables, servers, policy, options);
  if (json) {
    fmt::print("{}\n", plan.json());
  } else if (brief) {
    std::string bytes;
    for (auto b : plan.bytes_per_server()) bytes += fmt::format(" {:>9}", b);
    fmt::print("{:<17} {} servers  imbalance {:.3f}  bytes per server:{}\n", plan.policy(), servers, plan.imbalance(), bytes);
  } else {
    fmt::print("{}\n", plan.table());
  }
}

}  // namespace

int main(int argc, char** argv) {
  int only_servers = 0;
  std::string only_policy;
  bool json = false;
  ps::PlanOptions options{.optimizer_slots = optim::Adam().slots_per_variable()};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") json = true;
    else if (arg == "--servers" && i + 1 < argc) only_servers = std::atoi(argv[++i]);
    else if (arg == "--policy" && i + 1 < argc) only_policy = argv[++i];
    else if (arg == "--max-shard-bytes" && i + 1 < argc) options.max_shard_bytes = std::atoll(argv[++i]);
    else {
      fmt::print(arg == "--help" ? stdout : stderr,
                 "usage: {} [--servers N] [--policy RoundRobin|SizeBalanced|TensorFlowGreedy] [--max-shard-bytes B] [--json]\n"
                 "Prints the flagship CIFAR-10 model's placement under each policy for 1 to 4 servers (Adam state "
                 "counted as load).\n",
                 argv[0]);
      return arg == "--help" ? 0 : 2;
    }
  }
  const nn::Sequential model = nn::cifar10_cnn({32, 32, 3});
  const auto variables = train::variable_infos(model);
  const bool brief = only_servers == 0 && only_policy.empty() && !json;
  for (int servers = 1; servers <= 4; ++servers) {
    if (only_servers != 0 && servers != only_servers) continue;
    if (only_policy.empty() || only_policy == "RoundRobin") show(variables, servers, ps::placement::RoundRobin{}, options, json, brief);
    if (only_policy.empty() || only_policy == "SizeBalanced") show(variables, servers, ps::placement::SizeBalanced{}, options, json, brief);
    if (only_policy.empty() || only_policy == "TensorFlowGreedy")
      show(variables, servers, ps::placement::TensorFlowGreedy{}, options, json, brief);
  }
  if (brief) fmt::print("\n(--servers N --policy NAME prints a plan's full table; --json exports it)\n");
  return 0;
}
