#include "cohort/cluster/discovery.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "cohort/core/error.hpp"

namespace cohort::cluster {
namespace {

using nlohmann::json;

std::optional<std::string> first_of(const Environment& environment, std::initializer_list<const char*> names,
                                    std::string* found = nullptr) {
  for (const char* name : names) {
    if (auto value = environment(name)) {
      if (found != nullptr) *found = name;
      return value;
    }
  }
  return std::nullopt;
}

long parse_integer(const std::string& text, const std::string& what, long low, long high) {
  long value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < low || value > high)
    throw InvalidArgument(fmt::format("{}: '{}' is not an integer in [{}, {}]", what, text, low, high));
  return value;
}

std::vector<Endpoint> role_list(const json& value, const std::string& path) {
  if (!value.is_array()) throw InvalidArgument(fmt::format("TF_CONFIG: {} must be a list of \"host:port\" strings", path));
  std::vector<Endpoint> endpoints;
  for (std::size_t i = 0; i < value.size(); ++i) {
    const std::string item_path = fmt::format("TF_CONFIG: {}[{}]", path, i);
    if (!value[i].is_string()) throw InvalidArgument(fmt::format("{}: expected a \"host:port\" string", item_path));
    endpoints.push_back(parse_endpoint(value[i].get<std::string>(), item_path));
  }
  return endpoints;
}

Role role_from_name(const std::string& name, const std::string& path) {
  if (name == "chief" || name == "master") return Role::Chief;
  if (name == "worker") return Role::Worker;
  if (name == "ps") return Role::Ps;
  throw InvalidArgument(fmt::format("TF_CONFIG: {}: role '{}' is not supported (chief, master, worker, ps)", path, name));
}

std::uint16_t port_setting(const Environment& environment, const char* name, std::uint16_t fallback) {
  const auto value = environment(name);
  return value ? static_cast<std::uint16_t>(parse_integer(*value, name, 1, 65535)) : fallback;
}

RendezvousRequest rank_environment(const Environment& environment, const char* rank_name, const char* size_name,
                                   const std::string& source) {
  const auto rank_text = environment(rank_name);
  const auto size_text = environment(size_name);
  if (!size_text) throw InvalidArgument(fmt::format("{}: {} is set but {} is not", source, rank_name, size_name));
  RendezvousRequest request;
  request.source = source;
  request.world_size = static_cast<int>(parse_integer(*size_text, size_name, 1, 1 << 20));
  request.rank = static_cast<int>(parse_integer(*rank_text, rank_name, 0, request.world_size - 1));
  std::string address_name, port_name;
  const auto address = first_of(environment, {"COHORT_MASTER_ADDR", "MASTER_ADDR"}, &address_name);
  const auto port = first_of(environment, {"COHORT_MASTER_PORT", "MASTER_PORT"}, &port_name);
  if (!address || !port)
    throw InvalidArgument(fmt::format("{}: {} names this process's rank, but MASTER_ADDR and MASTER_PORT (or "
                                      "COHORT_MASTER_ADDR/PORT) must give the chief's address for the rendezvous",
                                      source, rank_name));
  if (address->empty()) throw InvalidArgument(fmt::format("{}: {} is empty", source, address_name));
  request.chief = {*address, static_cast<std::uint16_t>(parse_integer(*port, port_name, 1, 65535))};
  if (const auto num_ps = environment("COHORT_NUM_PS"))
    request.num_ps = static_cast<int>(parse_integer(*num_ps, "COHORT_NUM_PS", 0, request.world_size - 1));
  return request;
}

}  // namespace

Environment process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
  };
}

ClusterSpec parse_tf_config(const std::string& text) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    throw InvalidArgument(fmt::format("TF_CONFIG: not valid JSON (byte {}): {}", e.byte, e.what()));
  } catch (const json::exception& e) {  // a number out of range ("index": 1e999)
    throw InvalidArgument(fmt::format("TF_CONFIG: not usable JSON: {}", e.what()));
  }
  if (!root.is_object()) throw InvalidArgument("TF_CONFIG: expected a JSON object at the top level");
  if (!root.contains("cluster") || !root["cluster"].is_object())
    throw InvalidArgument("TF_CONFIG: 'cluster' is missing or not an object");
  if (root.contains("environment") && !root["environment"].is_string())
    throw InvalidArgument("TF_CONFIG: 'environment' must be a string");

  ClusterSpec spec;
  spec.source = "TF_CONFIG";
  bool chief_seen = false;
  for (const auto& [name, value] : root["cluster"].items()) {
    const std::string path = "cluster." + name;
    const Role role = role_from_name(name, path);
    auto endpoints = role_list(value, path);
    if (role == Role::Chief) {
      if (chief_seen) throw InvalidArgument("TF_CONFIG: cluster has both 'chief' and 'master'; give one of them");
      chief_seen = true;
      spec.chief = std::move(endpoints);
    } else if (role == Role::Worker) {
      spec.workers = std::move(endpoints);
    } else {
      spec.ps = std::move(endpoints);
    }
  }

  if (!root.contains("task") || !root["task"].is_object())
    throw InvalidArgument("TF_CONFIG: 'task' is missing or not an object");
  const json& task = root["task"];
  if (!task.contains("type") || !task["type"].is_string())
    throw InvalidArgument("TF_CONFIG: task.type is missing or not a string");
  spec.role = role_from_name(task["type"].get<std::string>(), "task.type");
  if (task.contains("index")) {
    // Read through the widest type of its sign, so that 4294967296 is refused instead of becoming 0.
    const json& index = task["index"];
    constexpr auto kMaxIndex = static_cast<std::int64_t>(std::numeric_limits<int>::max());
    const bool valid = index.is_number_unsigned() ? index.get<std::uint64_t>() <= static_cast<std::uint64_t>(kMaxIndex)
                       : index.is_number_integer() ? index.get<std::int64_t>() >= 0 && index.get<std::int64_t>() <= kMaxIndex
                                                   : false;
    if (!valid)
      throw InvalidArgument(fmt::format("TF_CONFIG: task.index must be an integer from 0 to {}, got {}", kMaxIndex,
                                        index.dump()));
    spec.index = static_cast<int>(index.get<std::int64_t>());
  }
  spec.validate();
  return spec;
}

ClusterSpec parse_sagemaker(const std::string& hosts_json, const std::string& current_host, const Environment& environment) {
  json hosts;
  try {
    hosts = json::parse(hosts_json);
  } catch (const json::parse_error& e) {
    throw InvalidArgument(fmt::format("SM_HOSTS: not valid JSON (byte {}): {}", e.byte, e.what()));
  } catch (const json::exception& e) {
    throw InvalidArgument(fmt::format("SM_HOSTS: not usable JSON: {}", e.what()));
  }
  if (!hosts.is_array() || hosts.empty()) throw InvalidArgument("SM_HOSTS: expected a non-empty JSON list of host names");
  const std::uint16_t worker_port = port_setting(environment, "COHORT_WORKER_PORT", 2222);
  const std::uint16_t ps_port = port_setting(environment, "COHORT_PS_PORT", 2223);
  if (worker_port == ps_port)
    throw InvalidArgument(fmt::format("SM_HOSTS: COHORT_WORKER_PORT and COHORT_PS_PORT are both {}", worker_port));
  ClusterSpec spec;
  spec.source = "SM_HOSTS";
  int current = -1;
  std::set<std::string> seen;
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    if (!hosts[i].is_string() || hosts[i].get<std::string>().empty())
      throw InvalidArgument(fmt::format("SM_HOSTS[{}]: expected a host name", i));
    const std::string host = hosts[i].get<std::string>();
    if (!seen.insert(host).second) throw InvalidArgument(fmt::format("SM_HOSTS[{}]: host '{}' is listed twice", i, host));
    if (host == current_host) current = static_cast<int>(i);
    (i == 0 ? spec.chief : spec.workers).push_back({host, worker_port});
    spec.ps.push_back({host, ps_port});
  }
  if (current < 0)
    throw InvalidArgument(fmt::format("SM_CURRENT_HOST: '{}' is not one of SM_HOSTS {}", current_host, hosts_json));
  const std::string role = environment("COHORT_ROLE").value_or("worker");
  if (role == "ps") {
    spec.role = Role::Ps;
    spec.index = current;
  } else if (role == "worker") {
    spec.role = current == 0 ? Role::Chief : Role::Worker;
    spec.index = current == 0 ? 0 : current - 1;
  } else {
    throw InvalidArgument(fmt::format("COHORT_ROLE: '{}' is not 'worker' or 'ps'", role));
  }
  spec.validate();
  return spec;
}

Discovery discover(const Environment& environment) {
  if (const auto tf_config = environment("TF_CONFIG"); tf_config && !tf_config->empty()) {
    for (const char* other : kDescriptionsBesideTfConfig)
      if (environment(other))
        throw InvalidArgument(fmt::format("TF_CONFIG and {} are both set: describe the cluster one way, unset the other", other));
    return parse_tf_config(*tf_config);
  }
  const auto hosts = environment("SM_HOSTS");
  const auto current = environment("SM_CURRENT_HOST");
  if (hosts || current) {
    if (environment("COHORT_NUM_PS"))  // SageMaker runs a parameter server on every host
      throw InvalidArgument("SageMaker's SM_HOSTS and COHORT_NUM_PS are both set: every host runs a parameter server there; "
                            "unset COHORT_NUM_PS");
    if (!hosts || !current)
      throw InvalidArgument(fmt::format("SageMaker: {} is set but {} is not", hosts ? "SM_HOSTS" : "SM_CURRENT_HOST",
                                        hosts ? "SM_CURRENT_HOST" : "SM_HOSTS"));
    return parse_sagemaker(*hosts, *current, environment);
  }
  if (environment("OMPI_COMM_WORLD_RANK"))
    return rank_environment(environment, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI");
  // torchrun started by srun: RANK numbers the processes, SLURM_PROCID only the torchrun per node.
  if (environment("RANK")) return rank_environment(environment, "RANK", "WORLD_SIZE", "torchrun");
  if (environment("SLURM_PROCID")) return rank_environment(environment, "SLURM_PROCID", "SLURM_NTASKS", "Slurm");
  return SingleProcess{};
}

}  // namespace cohort::cluster
