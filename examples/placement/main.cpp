// Where the flagship CIFAR-10 model's variables land on 1 to 4 parameter servers under each built-in
// placement policy, with per-server bytes and the imbalance ratio; --json prints the plans as JSON,
// --servers N and --policy NAME pick one, --max-shard-bytes B partitions large variables.
#include <cohort/app/command_line.hpp>
#include <cohort/app/training_options.hpp>
#include <cohort/cohort.hpp>

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
  CLI::App cli{"Prints the flagship CIFAR-10 model's placement under each policy for 1 to 4 servers (Adam state counted "
               "as load)."};
  cli.add_option("--servers", only_servers, "only this many servers")->check(app::whole_number(1, 4));
  cli.add_option("--policy", only_policy, "only this policy")->check(CLI::IsMember({"round-robin", "size-balanced", "tensorflow-greedy"}));
  cli.add_option("--max-shard-bytes", options.max_shard_bytes, "partition variables larger than B bytes")
      ->check(app::whole_number(0, std::int64_t{1} << 62));
  cli.add_flag("--json", json, "print the plans as JSON");
  app::parse_or_exit(cli, argc, argv);
  app::check_settings_or_exit();
  const nn::Sequential model = nn::cifar10_cnn({32, 32, 3});
  const auto variables = train::variable_infos(model);
  const bool brief = only_servers == 0 && only_policy.empty() && !json;
  for (int servers = 1; servers <= 4; ++servers) {
    if (only_servers != 0 && servers != only_servers) continue;
    if (only_policy.empty() || only_policy == "round-robin") show(variables, servers, ps::placement::RoundRobin{}, options, json, brief);
    if (only_policy.empty() || only_policy == "size-balanced") show(variables, servers, ps::placement::SizeBalanced{}, options, json, brief);
    if (only_policy.empty() || only_policy == "tensorflow-greedy")
      show(variables, servers, ps::placement::TensorFlowGreedy{}, options, json, brief);
  }
  if (brief) fmt::print("\n(--servers N --policy NAME prints a plan's full table; --json exports it)\n");
  return 0;
}
