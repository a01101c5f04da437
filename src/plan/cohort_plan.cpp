// cohort-plan: what a data-parallel job's step would cost under each strategy, and which to choose, before it
// runs (train/planner.hpp holds the model).
//   cohort-plan --model cifar10_cnn --workers 4 --bandwidth 10Gbit --latency 50us [--batch-size 128] [--json]
//   cohort-launch --workers 2 -- cohort-plan --measure-link --workers 4     (the link measured between two processes)
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <cohort/app/command_line.hpp>
#include <cohort/cohort.hpp>
#include <cohort/core/settings.hpp>

using namespace cohort;

namespace {

[[noreturn]] void refuse(const std::string& message) {
  std::fprintf(stderr, "cohort-plan: %s\n", message.c_str());
  std::exit(2);
}

nn::Sequential model_named(const std::string& name) {
  if (name == "cifar10_cnn") return nn::cifar10_cnn();
  if (name == "small_cnn") return nn::small_cnn();
  std::error_code error;
  if (!std::filesystem::is_regular_file(name, error))
    refuse(fmt::format("--model {}: neither a zoo model (cifar10_cnn, small_cnn) nor a model file", name));
  try {
    return nn::load_model(name);
  } catch (const std::exception& e) {
    refuse(fmt::format("--model {}: {}", name, e.what()));
  }
}

// The link between the two processes of the cluster in the environment, on the chief (said on stderr, so
// that --json stays JSON); nothing on the other.
std::optional<train::plan::Link> measured_link() {
  try {
    auto cluster = cluster::Cluster::from_environment();
    comm::Transport& transport = cluster.transport();
    const auto link = train::plan::measure_link(transport);
    if (link)
      std::fprintf(stderr, "cohort-plan: the link to %s measured %.1f MB/s each way (the slower way), %.1f us per message\n",
                   comm::process_name_of(transport, 1).c_str(), link->bandwidth / 1e6, 1e6 * link->latency);
    return link;
  } catch (const std::exception& e) {
    refuse(fmt::format("--measure-link: {}", e.what()));
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) refuse(fmt::format("--profile {}: cannot be read", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "cifar10_cnn", bandwidth, latency = "50us", host_bandwidth = "10GB/s", host_latency = "5us",
              profile_path, save_profile, optimizer = "adam";
  std::int64_t batch_size = 128;
  int workers = 0, max_servers = 0, threads = 1, steps = 10, shared_cores = 0, workers_per_host = 1;
  bool json = false, measure = false;
  CLI::App cli{"Predicts a data-parallel job's step time, communication and per-server load under each strategy "
               "(ring allreduce, recursive doubling, hierarchical allreduce, parameter servers under each placement), and "
               "recommends one.",
               "cohort-plan"};
  cli.add_option("--model", model_name, "a zoo model (cifar10_cnn, small_cnn) or a model file")->capture_default_str();
  cli.add_option("--batch-size", batch_size, "per worker")->check(app::whole_number(1, 1 << 20))->capture_default_str();
  cli.add_option("--workers", workers, "training processes")->required()->check(app::whole_number(1, 4096));
  cli.add_option("--max-servers", max_servers, "parameter-server counts to try: 1 to N (default: up to the workers)")
      ->check(app::whole_number(0, 4096));
  auto* bandwidth_option =
      cli.add_option("--bandwidth", bandwidth, "each process's link, each way: 10Gbit, 100Mbit, 4GB/s, 500MB/s");
  auto* latency_option = cli.add_option("--latency", latency, "per message: 50us, 1ms")->capture_default_str();
  cli.add_flag("--measure-link", measure,
               "measure the link instead: run on two hosts as a 2-process cluster (TF_CONFIG, or under cohort-launch); "
               "the chief plans with what it measured")
      ->excludes(bandwidth_option, latency_option);
  cli.add_option("--workers-per-host", workers_per_host,
                 "workers sharing a host and its link (as GPUs of one machine); they talk among themselves over the "
                 "host's own link")
      ->check(app::whole_number(1, 4096))
      ->capture_default_str();
  cli.add_option("--host-bandwidth", host_bandwidth, "within a host, each way (shared memory, NVLink)")->capture_default_str();
  cli.add_option("--host-latency", host_latency, "within a host, per message")->capture_default_str();
  cli.add_option("--optimizer", optimizer, "adam, momentum or sgd: the slots a server keeps per variable")
      ->check(CLI::IsMember({"adam", "momentum", "sgd"}))
      ->capture_default_str();
  cli.add_option("--profile", profile_path, "a compute profile (from --save-profile) instead of measuring here");
  cli.add_option("--save-profile", save_profile, "write the measured compute profile to this file");
  cli.add_option("--threads", threads, "threads of the measured steps")->check(app::whole_number(1, 1024))->capture_default_str();
  cli.add_option("--profile-steps", steps, "measured steps")->check(app::whole_number(1, 1000))->capture_default_str();
  cli.add_option("--shared-cores", shared_cores,
                 "every worker on one machine of N cores, as on loopback (default: a machine per worker)")
      ->check(app::whole_number(1, 1 << 20));
  cli.add_flag("--json", json, "the predictions as JSON, for tools");
  app::parse_or_exit(cli, argc, argv);

  if (!measure && bandwidth.empty()) refuse("--bandwidth is required (or --measure-link between two hosts)");
  train::plan::Job job;
  try {
    check_settings();
    if (measure) {
      // The other end serves the measurement and is done.
      const std::optional<train::plan::Link> link = measured_link();
      if (!link) return 0;
      job.link = *link;
    } else {
      job.link = {.bandwidth = train::plan::parse_bandwidth(bandwidth), .latency = train::plan::parse_latency(latency)};
    }
    job.host_link = {.bandwidth = train::plan::parse_bandwidth(host_bandwidth),
                     .latency = train::plan::parse_latency(host_latency)};
  } catch (const InvalidArgument& e) {
    refuse(e.what());
  }
  nn::Sequential model = model_named(model_name);
  job.model = &model;
  job.batch_size = batch_size;
  job.workers = workers;
  job.max_servers = max_servers;
  job.shared_cores = shared_cores;
  job.workers_per_host = workers_per_host;
  job.optimizer_slots = optimizer == "adam" ? 2 : optimizer == "momentum" ? 1 : 0;
  try {
    train::plan::ComputeProfile profile;
    if (!profile_path.empty()) {
      profile = train::plan::parse_profile(read_file(profile_path));
    } else {
      set_num_threads(threads);
      profile = train::plan::measure_compute(model, batch_size, steps);
    }
    if (!save_profile.empty()) {
      std::ofstream out(save_profile);
      out << train::plan::profile_json(profile);
      if (!out) refuse(fmt::format("--save-profile {}: cannot be written", save_profile));
    }
    const auto predictions = train::plan::predict(job, profile);
    fmt::print("{}", json ? train::plan::report_json(job, profile, predictions) : train::plan::report(job, profile, predictions));
  } catch (const InvalidArgument& e) {
    refuse(e.what());
  }
  return 0;
}
