// Workers and parameter servers on one host read each other's memory instead of sending the floats: the
// same training, bit for bit, as with messages, the same traffic tables, and memory named wrongly (a range
// of the wrong size, an address that cannot be read) refused or failed with the reason, never a hang.
#include <catch2/catch.hpp>

#include <cstring>
#include <thread>

#include "cohort/comm/shared_memory.hpp"
#include "cohort/core/error.hpp"
#include "cohort/ps/parameter_store.hpp"
#include "cohort/ps/server.hpp"
#include "cohort/train/variable_infos.hpp"
#include "comm/shm/shm_transport.hpp"
#include "core/crc32c.hpp"
#include "ps/protocol.hpp"
#include "ps/ps_test_util.hpp"

using namespace cohort;
using namespace std::chrono_literals;
namespace proto = ps::protocol;

namespace {

// `n` ranks of one host over shared memory, each connected on its own thread.
std::vector<std::unique_ptr<comm::Transport>> shared_memory_group(int n) {
  const auto addresses = comm_test::free_addresses(n);
  std::vector<std::unique_ptr<comm::Transport>> transports(static_cast<std::size_t>(n));
  comm_test::run_ranks(n, [&](int r) {
    transports[static_cast<std::size_t>(r)] = comm::connect_group(comm_test::tcp_options(r, addresses, 2s, "in place"));
  });
  return transports;
}

std::uint64_t peer_memory_reads(const std::unique_ptr<comm::Transport>& transport) {
  const auto* shm = dynamic_cast<const comm::shm::ShmTransport*>(transport.get());
  REQUIRE(shm != nullptr);
  return shm->peer_memory_reads();
}

template <typename T>
std::span<const std::byte> bytes_of(const T& value) {
  return std::as_bytes(std::span(&value, 1));
}

proto::RequestHeader request(const ps::Plan& plan, proto::Kind kind, std::span<const std::byte> payload, std::uint32_t flags = 0) {
  proto::RequestHeader header;
  header.kind = static_cast<std::uint16_t>(kind);
  header.plan_fingerprint = plan.fingerprint();
  header.samples = 8;
  header.flags = flags;
  header.payload_bytes = payload.size();
  header.payload_crc = crc32c_of(payload.data(), payload.size());
  return header;
}

void send_request(comm::Transport& transport, int server, const proto::RequestHeader& header, std::span<const std::byte> payload) {
  auto sent = transport.send(server, proto::kRequestTag, bytes_of(header));
  if (!payload.empty()) transport.send(server, proto::kRequestPayloadTag, payload)->wait(10s);
  sent->wait(10s);
}

proto::ReplyHeader receive_reply(comm::Transport& transport, int server, std::vector<std::byte>& payload) {
  proto::ReplyHeader header;
  transport.recv(server, proto::kReplyTag, std::as_writable_bytes(std::span(&header, 1)))->wait(10s);
  payload.resize(header.payload_bytes);
  if (!payload.empty()) transport.recv(server, proto::kReplyPayloadTag, payload)->wait(10s);
  return header;
}

// One range per shard, in plan order, of `floats` (all of a single server's, in that order).
std::vector<proto::MemoryRange> ranges_in(const ps::Plan& plan, const std::vector<float>& floats) {
  std::vector<proto::MemoryRange> ranges;
  std::size_t offset = 0;
  for (const auto& shard : plan.shards()) {
    const auto count = static_cast<std::size_t>(shard.shape.numel());
    ranges.push_back({.address = reinterpret_cast<std::uint64_t>(floats.data() + offset), .bytes = count * sizeof(float)});
    offset += count;
  }
  return ranges;
}

void require_protocol_error(const std::function<void()>& body, const std::string& names, const std::string& says) {
  try {
    body();
  } catch (const ProtocolError& e) {
    CHECK_THAT(e.what(), Catch::Contains(names) && Catch::Contains(says));
    return;
  }
  FAIL("no ProtocolError");
}

}  // namespace

TEST_CASE("over shared memory, pushes and answers read in place train bit for bit as messages do, with the same traffic",
          "[ps][shm][train]") {
  struct Setup {
    const char* name;
    int workers, servers;
    train::ParameterServerOptions options;
    bool batch_norm = true;
  };
  // BatchNormalization's statistics travel as changes, the dense kernel in shards on two servers. Sync answers
  // name the held values; Async ones a copy lent until the next request (one worker: the same order of updates).
  // A fifth server for four variables holds nothing: nothing travels to or from it, and the epochs' statistics
  // requests still match their answers.
  const std::vector<Setup> setups = {
      {"Sync, float32", 2, 2, {.max_shard_bytes = 256}},
      {"Sync, bfloat16 pushes", 2, 2, {.max_shard_bytes = 256, .gradient_dtype = DType::BFloat16}},
      {"Async", 1, 2, {.consistency = ps::Async{}, .max_shard_bytes = 256}},
      {"a server that holds nothing", 1, 5, {.placement = ps::placement::RoundRobin{}}, false},
  };
  for (const Setup& setup : setups) {
    INFO(setup.name);
    const int ranks = setup.workers + setup.servers;
    const auto train_on = [&](const std::vector<comm::Transport*>& transports) {
      std::vector<nn::Sequential> models;
      for (int r = 0; r < ranks; ++r) models.push_back(ps_test::small_model(setup.batch_norm));
      std::vector<ps::ClientTraffic> traffic(static_cast<std::size_t>(setup.workers));
      ps_test::run_cluster(transports, setup.workers, setup.options, [&](int r, auto strategy) {
        Trainer trainer(models[static_cast<std::size_t>(r)], ps_test::momentum_sgd(), strategy);
        trainer.fit(ps_test::small_set(), {.epochs = 1000, .max_steps = 12, .batch_size = 8, .seed = 4, .verbosity = train::Verbosity::Silent});
        if (r < setup.workers) traffic[static_cast<std::size_t>(r)] = strategy->store().traffic();
      });
      return std::pair(std::move(models), std::move(traffic));
    };
    comm::InProcessGroup messages(ranks);
    std::vector<comm::Transport*> by_message;
    for (int r = 0; r < ranks; ++r) by_message.push_back(&messages.transport(r));
    const auto [expected, expected_traffic] = train_on(by_message);

    const auto group = shared_memory_group(ranks);
    std::vector<comm::Transport*> in_place;
    for (const auto& transport : group) in_place.push_back(transport.get());
    const auto [got, got_traffic] = train_on(in_place);

    for (const auto& variable : expected[0].variables())
      for (int r = 0; r < setup.workers; ++r) {
        INFO(variable->name << " of worker " << r);
        CHECK(got[static_cast<std::size_t>(r)].variable(variable->name)->value.to_vector() == variable->value.to_vector());
      }
    // Every worker read its servers' values, every server its workers' gradients, and the traffic counts the
    // floats as if they had travelled.
    for (const auto& transport : group) CHECK(peer_memory_reads(transport) >= 6);
    for (std::size_t w = 0; w < got_traffic.size(); ++w)
      for (std::size_t s = 0; s < static_cast<std::size_t>(setup.servers); ++s) {
        INFO("worker " << w << ", ps " << s);
        CHECK(got_traffic[w].servers[s].requests == expected_traffic[w].servers[s].requests);
        CHECK(got_traffic[w].servers[s].bytes_sent == expected_traffic[w].servers[s].bytes_sent);
        CHECK(got_traffic[w].servers[s].bytes_received == expected_traffic[w].servers[s].bytes_received);
      }
  }
}

TEST_CASE("a server refuses a push in place that names memory wrongly, and answers a good one in place", "[ps][shm][threads]") {
  nn::Sequential model = ps_test::small_model();
  const ps::Plan plan = ps::make_plan(train::variable_infos(model), 1, ps::placement::SizeBalanced{});
  constexpr int kServer = 4;
  const auto group = shared_memory_group(kServer + 1);
  optim::SGD sgd({.learning_rate = optim::constant(0.5)});
  ps::Server server(*group[kServer], plan, 0, {0, 1, 2, 3}, sgd);
  ps_test::ServeOnThread serving(server);

  const std::vector<float> initial = ps_test::values_in_plan_order(model, plan);
  std::vector<std::byte> answer;
  send_request(*group[0], kServer, request(plan, proto::Kind::Init, std::as_bytes(std::span(initial))), {});
  ps_test::send_pieces(*group[0], kServer, proto::kRequestPayloadTag, plan, 0, std::as_bytes(std::span(initial)));
  const proto::ReplyHeader initialized = receive_reply(*group[0], kServer, answer);
  REQUIRE(initialized.status == static_cast<std::uint16_t>(proto::Status::Ok));
  CHECK((initialized.flags & proto::kReadsYourMemory) != 0);

  const std::vector<float> gradients(initial.size(), 0.25f);
  struct Lie {
    const char* expected_reason;
    std::function<void(std::vector<proto::MemoryRange>&)> apply;
  };
  const std::vector<Lie> lies = {
      {"names 4 bytes for", [](auto& ranges) { ranges[1].bytes = 4; }},
      {"not readable memory", [](auto& ranges) { ranges.back().address = 8; }},
  };
  for (std::size_t i = 0; i < lies.size(); ++i) {
    INFO(lies[i].expected_reason);
    const int worker = static_cast<int>(i) + 1;
    auto ranges = ranges_in(plan, gradients);
    lies[i].apply(ranges);
    const auto payload = std::as_bytes(std::span(ranges));
    comm::Transport& transport = *group[static_cast<std::size_t>(worker)];
    send_request(transport, kServer, request(plan, proto::Kind::Push, payload, proto::kPayloadInPlace), payload);
    const proto::ReplyHeader refused = receive_reply(transport, kServer, answer);
    CHECK(refused.status == static_cast<std::uint16_t>(proto::Status::Refused));
    CHECK_THAT(proto::message_of(refused), Catch::Contains(lies[i].expected_reason));
  }
  send_request(*group[3], kServer, request(plan, proto::Kind::Stats, {}, proto::kAnswerInPlace), {});
  const proto::ReplyHeader stats_in_place = receive_reply(*group[3], kServer, answer);
  CHECK(stats_in_place.status == static_cast<std::uint16_t>(proto::Status::Refused));
  CHECK_THAT(proto::message_of(stats_in_place), Catch::Contains("asks for its answer in place"));

  // The chief's push in place, answered in place: plain SGD, value - 0.5 x 0.25 everywhere.
  const auto ranges = ranges_in(plan, gradients);
  const auto payload = std::as_bytes(std::span(ranges));
  send_request(*group[0], kServer, request(plan, proto::Kind::Push, payload, proto::kPayloadInPlace | proto::kAnswerInPlace), payload);
  const proto::ReplyHeader pushed = receive_reply(*group[0], kServer, answer);
  REQUIRE(pushed.status == static_cast<std::uint16_t>(proto::Status::Ok));
  REQUIRE((pushed.flags & proto::kValuesInPlace) != 0);
  REQUIRE(answer.size() == plan.shards().size() * sizeof(proto::MemoryRange));
  CHECK(crc32c_of(answer.data(), answer.size()) == pushed.payload_crc);
  std::vector<proto::MemoryRange> values_ranges(plan.shards().size());
  std::memcpy(values_ranges.data(), answer.data(), answer.size());
  std::vector<float> values(initial.size());
  std::size_t offset = 0;
  for (const auto& range : values_ranges) {
    REQUIRE(offset * sizeof(float) + range.bytes <= values.size() * sizeof(float));
    const auto into = std::span(values).subspan(offset, range.bytes / sizeof(float));
    group[0]->peer_memory()->read(kServer, range.address, std::as_writable_bytes(into));
    offset += range.bytes / sizeof(float);
  }
  REQUIRE(offset == values.size());
  for (std::size_t i = 0; i < values.size(); ++i) REQUIRE(values[i] == initial[i] - 0.5f * 0.25f);

  send_request(*group[0], kServer, request(plan, proto::Kind::Done, {}), {});
  CHECK(receive_reply(*group[0], kServer, answer).status == static_cast<std::uint16_t>(proto::Status::Ok));
  serving.join();
  CHECK_FALSE(serving.error());
  CHECK(server.stats().refused == 3);
}

TEST_CASE("a worker fails naming the server whose answer in place names unreadable memory, or that it did not ask for",
          "[ps][shm][threads]") {
  nn::Sequential model = ps_test::small_model();
  const ps::Plan plan = ps::make_plan(train::variable_infos(model), 1, ps::placement::SizeBalanced{});
  std::size_t floats = 0;
  for (const auto& shard : plan.shards()) floats += static_cast<std::size_t>(shard.shape.numel());
  std::vector<ps::LocalVariable> variables;
  for (const auto& v : model.variables()) variables.push_back({v->name, v->value, v->gradient, v->trainable});

  // The server's side by hand: it answers a Pull with ranges of the right sizes, the last at address 8.
  // Catch2 asserts on the test's thread only: what the fake server saw is checked after it ends.
  std::uint32_t request_flags = 0;
  const auto fake_server = [&](comm::Transport& transport) {
    proto::RequestHeader pull;
    transport.recv(0, proto::kRequestTag, std::as_writable_bytes(std::span(&pull, 1)))->wait(10s);
    request_flags = pull.flags;
    const std::vector<float> values(floats);
    auto ranges = ranges_in(plan, values);
    ranges.back().address = 8;
    const auto payload = std::as_bytes(std::span(ranges));
    proto::ReplyHeader reply;
    reply.flags = proto::kValuesInPlace;
    reply.payload_bytes = payload.size();
    reply.payload_crc = crc32c_of(payload.data(), payload.size());
    auto sent = transport.send(0, proto::kReplyTag, bytes_of(reply));
    transport.send(0, proto::kReplyPayloadTag, payload)->wait(10s);
    sent->wait(10s);
  };

  SECTION("unreadable memory") {
    const auto group = shared_memory_group(2);
    std::thread server([&] { fake_server(*group[1]); });
    ps::ParameterStore store(*group[0], plan, {1}, variables);
    require_protocol_error([&] { store.pull(); }, "worker 1", "not readable memory");
    server.join();
    CHECK((request_flags & proto::kAnswerInPlace) != 0);
  }
  SECTION("not asked for") {
    comm::InProcessGroup group(2, 10s, ps_test::process_names(1, 1));
    std::thread server([&] { fake_server(group.transport(1)); });
    ps::ParameterStore store(group.transport(0), plan, {1}, variables);
    require_protocol_error([&] { store.pull(); }, "ps 0", "did not ask for");
    server.join();
    CHECK((request_flags & proto::kAnswerInPlace) == 0);
  }
}
