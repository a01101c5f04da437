// The capacity planner's cost model on cases worked by hand, its profile files and its refusals.
#include <catch2/catch.hpp>

#include "cohort/comm/inproc.hpp"
#include "cohort/core/error.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/train/planner.hpp"
#include "comm/comm_test_util.hpp"

using namespace cohort;
namespace plan = train::plan;

namespace {

// Four Dense(8) layers on 8 inputs: eight variables, kernels of 256 bytes and biases of 32, 1152 bytes in all;
// two servers (or four) take equal shares.
nn::Sequential four_dense() {
  nn::Sequential model({8});
  for (int i = 0; i < 4; ++i) model.add(nn::Dense(8));
  return model;
}

// Every gradient final when backward ends, nothing to update: the communication stands alone.
plan::ComputeProfile profile_ready_at_end(const nn::Sequential& model, double backward) {
  plan::ComputeProfile profile{.batch_size = 32, .threads = 1, .forward_seconds = 0.01, .backward_seconds = backward};
  for (const auto& variable : model.trainable_variables())
    profile.ready.push_back({variable->name, variable->value.numel() * 4, backward});
  return profile;
}

plan::Prediction named(const std::vector<plan::Prediction>& predictions, const std::string& strategy) {
  for (const auto& p : predictions)
    if (p.strategy == strategy) return p;
  FAIL("no prediction for " << strategy);
  throw;
}

}  // namespace

TEST_CASE("the planner's collectives cost what the alpha-beta model says", "[plan]") {
  const plan::Link link{.bandwidth = 1e9, .latency = 1e-4};
  // Ring: 2(n-1) alpha + 2(n-1)/n M/B = 6e-4 + 1.5 x 8e-3 (BytePS's allreduce optimum, 2(n-1)M/(nB), plus latency).
  CHECK(plan::ring_allreduce_seconds(8e6, 4, link) == Approx(0.0126));
  CHECK(plan::ring_allreduce_seconds(8e6, 1, link) == 0);
  // Recursive doubling: ceil(log2 n) rounds of the whole vector.
  CHECK(plan::recursive_doubling_seconds(8e6, 4, link) == Approx(2 * 8.1e-3));
  CHECK(plan::recursive_doubling_seconds(8e6, 5, link) == Approx(3 * 8.1e-3));
}

TEST_CASE("parameter servers are bounded by BytePS's max(M/B, nM/(kB)) each way", "[plan]") {
  nn::Sequential model = four_dense();
  const auto profile = profile_ready_at_end(model, 0.05);
  plan::Job job{.model = &model, .batch_size = 32, .workers = 4, .link = {.bandwidth = 1e6, .latency = 0}, .optimizer_slots = 0};
  const double M = 1152, B = 1e6;
  {
    // n = 4 workers, k = 2 servers: the servers' links bind, n M / (k B) = 2.304 ms each way.
    const auto& p = named(plan::predict(job, profile), "parameter servers (2, size-balanced)");
    CHECK(p.exposed_seconds == Approx(2 * 4 * M / (2 * B)));
    REQUIRE(p.servers.size() == 2);
    CHECK(p.servers[0].bytes == 576);
    CHECK(p.servers[0].bytes_per_step == Approx(2 * 4 * 576));
    CHECK(p.step_seconds == Approx(0.01 + 0.05 + 2 * 4 * M / (2 * B)));
  }
  {
    // n = 2 workers, k = 4 servers: a worker's own link binds, M / B each way.
    job.workers = 2;
    const auto& p = named(plan::predict(job, profile), "parameter servers (2, size-balanced)");
    CHECK(p.exposed_seconds == Approx(2 * M / B));
    job.max_servers = 4;
    const auto& four = named(plan::predict(job, profile), "parameter servers (4, size-balanced)");
    CHECK(four.exposed_seconds == Approx(2 * M / B));
  }
  // Round-robin on one server is the one server's link: n M / B each way, and latency per message.
  job.workers = 4;
  job.link.latency = 1e-3;
  const auto& one = named(plan::predict(job, profile), "parameter servers (1, round-robin)");
  CHECK(one.exposed_seconds == Approx(2 * (4 * M / B + 1e-3)));
}

TEST_CASE("allreduce buckets hide behind the backward that is still running", "[plan]") {
  nn::Sequential model = four_dense();
  plan::Job job{.model = &model, .batch_size = 32, .workers = 4, .link = {.bandwidth = 1e6, .latency = 0}};
  const double ring = plan::ring_allreduce_seconds(1152, 4, job.link);  // one bucket: the model is small
  // Ready at backward's end: all of it is exposed.
  const auto late = named(plan::predict(job, profile_ready_at_end(model, 0.05)), "ring allreduce");
  CHECK(late.communication_seconds == Approx(ring));
  CHECK(late.exposed_seconds == Approx(ring));
  CHECK(late.images_per_second == Approx(4 * 32 / late.step_seconds));
  // Ready at once, with a backward longer than the allreduce: none of it.
  auto early = profile_ready_at_end(model, 0.05);
  for (auto& ready : early.ready) ready.seconds = 0;
  CHECK(named(plan::predict(job, early), "ring allreduce").exposed_seconds == 0);
  // A batch twice the profile's doubles the compute, and so do 4 one-thread workers sharing 2 cores.
  job.batch_size = 64;
  CHECK(named(plan::predict(job, early), "ring allreduce").compute_seconds == Approx(2 * (0.01 + 0.05)));
  job.shared_cores = 2;
  CHECK(named(plan::predict(job, early), "ring allreduce").compute_seconds == Approx(4 * (0.01 + 0.05)));
  job.shared_cores = 8;
  CHECK(named(plan::predict(job, early), "ring allreduce").compute_seconds == Approx(2 * (0.01 + 0.05)));
}

TEST_CASE("hosts of several workers: hierarchical allreduce, and a host's link shared by its workers", "[plan]") {
  const plan::Link link{.bandwidth = 1e6, .latency = 1e-4}, host_link{.bandwidth = 1e8, .latency = 1e-6};
  // 2 hosts of 2: to the host's first rank and back, 2(g-1)(alpha_h + M/B_h), and a ring of 2 among hosts.
  CHECK(plan::hierarchical_allreduce_seconds(8e6, 4, 2, link, host_link) ==
        Approx(2 * (1e-6 + 0.08) + plan::ring_allreduce_seconds(8e6, 2, link)));
  CHECK(plan::hierarchical_allreduce_seconds(8e6, 4, 1, link, host_link) == Approx(plan::ring_allreduce_seconds(8e6, 4, link)));
  nn::Sequential model = four_dense();
  const auto profile = profile_ready_at_end(model, 0.05);
  const double M = 1152;
  plan::Job job{.model = &model, .batch_size = 32, .workers = 4, .link = link, .optimizer_slots = 0, .max_servers = 4,
                .workers_per_host = 2, .host_link = host_link};
  const auto predictions = plan::predict(job, profile);
  const auto hierarchical = named(predictions, "hierarchical allreduce");
  CHECK(hierarchical.exposed_seconds == Approx(plan::hierarchical_allreduce_seconds(M, 4, 2, link, host_link)));
  // Across hosts the flat ring's slowest hops cross them, one stream each way: the plain ring over `link`.
  CHECK(named(predictions, "ring allreduce").exposed_seconds == Approx(plan::ring_allreduce_seconds(M, 4, link)));
  // Four servers of a quarter each: a host's link carries both its workers' pushes, 2 M/B each way.
  CHECK(named(predictions, "parameter servers (4, size-balanced)").exposed_seconds == Approx(2 * (2 * M / 1e6 + 1e-4)));
  // All four on one host: everything over the host's link, and no hierarchy to build.
  job.workers_per_host = 4;
  const auto one_host = plan::predict(job, profile);
  CHECK(named(one_host, "ring allreduce").exposed_seconds == Approx(plan::ring_allreduce_seconds(M, 4, host_link)));
  CHECK(std::none_of(one_host.begin(), one_host.end(), [](const auto& p) { return p.strategy == "hierarchical allreduce"; }));
  job.workers_per_host = 0;
  CHECK_THROWS_WITH(plan::predict(job, profile), Catch::Contains("the workers per host must be at least 1, got 0"));
}

TEST_CASE("the planner recommends the fastest, and says why", "[plan]") {
  nn::Sequential model = four_dense();
  plan::Job job{.model = &model, .batch_size = 32, .workers = 4, .link = {.bandwidth = 1e6, .latency = 1e-5}};
  const auto profile = profile_ready_at_end(model, 0.05);
  const auto predictions = plan::predict(job, profile);
  for (std::size_t i = 1; i < predictions.size(); ++i) CHECK(predictions[i - 1].step_seconds <= predictions[i].step_seconds);
  const std::string text = plan::report(job, profile, predictions);
  CHECK_THAT(text, Catch::Contains("recommended: " + predictions.front().strategy));
  CHECK_THAT(text, Catch::Contains("8 Mbit/s and 10 us"));
  const std::string json = plan::report_json(job, profile, predictions);
  CHECK_THAT(json, Catch::Contains("\"recommended\": \"" + predictions.front().strategy + "\""));
}

TEST_CASE("a measured compute profile lists every gradient in the order backward makes it final, and round-trips", "[plan]") {
  nn::Sequential model = four_dense();
  const auto profile = plan::measure_compute(model, 16, 2);
  CHECK(profile.forward_seconds > 0);
  CHECK(profile.backward_seconds > 0);
  REQUIRE(profile.ready.size() == 8);
  CHECK(profile.ready.front().variable.starts_with("dense_3/"));  // the last layer's, first
  for (std::size_t i = 1; i < profile.ready.size(); ++i) CHECK(profile.ready[i - 1].seconds <= profile.ready[i].seconds);
  CHECK(profile.ready.back().seconds == Approx(profile.backward_seconds));
  const auto again = plan::parse_profile(plan::profile_json(profile));
  CHECK(again.backward_seconds == profile.backward_seconds);
  CHECK(again.ready.size() == 8);
  CHECK(again.ready[3].variable == profile.ready[3].variable);
}

TEST_CASE("the planner refuses what cannot be planned, naming it", "[plan]") {
  CHECK(plan::parse_bandwidth("10Gbit") == Approx(1.25e9));
  CHECK(plan::parse_bandwidth("100Mbit") == Approx(12.5e6));
  CHECK(plan::parse_bandwidth("500MB/s") == Approx(5e8));
  CHECK(plan::parse_latency("50us") == Approx(5e-5));
  CHECK(plan::parse_latency("0") == 0);
  CHECK_THROWS_WITH(plan::parse_bandwidth("0"), Catch::Contains("a link must carry more than 0 bytes per second"));
  CHECK_THROWS_WITH(plan::parse_bandwidth("fast"), Catch::Contains("'fast' is not a bandwidth (10Gbit, 100Mbit"));
  CHECK_THROWS_WITH(plan::parse_latency("-1ms"), Catch::Contains("'-1ms' is not a latency"));
  nn::Sequential model = four_dense();
  const auto profile = profile_ready_at_end(model, 0.05);
  CHECK_THROWS_WITH(plan::predict({.model = &model, .batch_size = 32, .workers = 0, .link = {.bandwidth = 1e6}}, profile),
                    Catch::Contains("the worker count must be at least 1, got 0"));
  CHECK_THROWS_WITH(plan::predict({.model = &model, .batch_size = 32, .workers = 2, .link = {.bandwidth = 0}}, profile),
                    Catch::Contains("the link's bandwidth must be above 0"));
  CHECK_THROWS_AS(plan::predict({.model = nullptr, .batch_size = 32, .workers = 2, .link = {.bandwidth = 1}}, profile),
                  InvalidArgument);
  CHECK_THROWS_WITH(plan::parse_profile("{\"batch_size\": 8}"), Catch::Contains("threads is missing"));
  CHECK_THROWS_WITH(plan::parse_profile("not json"), Catch::Contains("a compute profile is a JSON object"));
}

TEST_CASE("a link is measured between the two ends of a cluster, and only there", "[plan]") {
  comm::InProcessGroup pair(2, std::chrono::seconds(20));
  std::vector<std::optional<plan::Link>> links(2);
  comm_test::run_ranks(2, [&](int r) { links[static_cast<std::size_t>(r)] = plan::measure_link(pair.transport(r), 1 << 20, 2); });
  REQUIRE(links[0].has_value());
  CHECK_FALSE(links[1].has_value());
  CHECK(links[0]->bandwidth > 0);
  CHECK(std::isfinite(links[0]->bandwidth));
  CHECK(links[0]->latency >= 0);
  CHECK(links[0]->latency < 1);
  plan::check_link(*links[0]);
  comm::InProcessGroup three(3, std::chrono::seconds(20));
  CHECK_THROWS_WITH(plan::measure_link(three.transport(0)),
                    Catch::Contains("measuring a link takes 2 processes, one on each of its ends; this cluster has 3"));
}
