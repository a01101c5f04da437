// A parameter server spoken to by hand: garbled, foreign and lying requests are refused with a reason,
// counted, and leave the variables as they were.
#include <catch2/catch.hpp>
#include <cmath>
#include <thread>

#include "cohort/optim/sgd.hpp"
#include "cohort/ps/server.hpp"
#include "cohort/train/variable_infos.hpp"
#include "core/crc32c.hpp"
#include "ps/protocol.hpp"
#include "ps/ps_test_util.hpp"

using namespace cohort;
namespace proto = ps::protocol;

namespace {

constexpr int kWorkers = 6;
constexpr int kServerRank = kWorkers;

struct Answer {
  proto::ReplyHeader header;
  std::vector<float> values;
};

void send(comm::Transport& transport, proto::RequestHeader header, const std::vector<float>& payload) {
  auto sent = transport.send(kServerRank, proto::kRequestTag, std::as_bytes(std::span(&header, 1)));
  if (!payload.empty())
    transport.send(kServerRank, proto::kRequestPayloadTag, std::as_bytes(std::span(payload)))->wait(std::chrono::seconds(10));
  sent->wait(std::chrono::seconds(10));
}

Answer receive(comm::Transport& transport) {
  Answer answer;
  transport.recv(kServerRank, proto::kReplyTag, std::as_writable_bytes(std::span(&answer.header, 1)))->wait(std::chrono::seconds(10));
  answer.values.resize(answer.header.payload_bytes / sizeof(float));
  if (!answer.values.empty())
    transport.recv(kServerRank, proto::kReplyPayloadTag, std::as_writable_bytes(std::span(answer.values)))->wait(std::chrono::seconds(10));
  return answer;
}

proto::RequestHeader header_for(const ps::Plan& plan, proto::Kind kind, const std::vector<float>& payload) {
  proto::RequestHeader header;
  header.kind = static_cast<std::uint16_t>(kind);
  header.plan_fingerprint = plan.fingerprint();
  header.samples = 8;
  header.payload_bytes = payload.size() * sizeof(float);
  header.payload_crc = crc32c_of(payload.data(), header.payload_bytes);
  return header;
}

}  // namespace

TEST_CASE("a parameter server refuses garbled and foreign requests and keeps its variables", "[ps][threads]") {
  nn::Sequential model = ps_test::small_model();
  const ps::Plan plan = ps::make_plan(train::variable_infos(model), 1, ps::placement::SizeBalanced{});
  comm::InProcessGroup group(kWorkers + 1);
  optim::SGD sgd;
  std::vector<int> workers;
  for (int w = 0; w < kWorkers; ++w) workers.push_back(w);
  ps::Server server(group.transport(kServerRank), plan, 0, workers, sgd);
  std::exception_ptr serve_error;
  std::thread serving([&] {
    try {
      server.serve();
    } catch (...) {
      serve_error = std::current_exception();
    }
  });

  // The plan may order the shards differently from the model: send what the server expects, in its order.
  std::vector<float> initial;
  for (const auto& shard : plan.shards()) {
    const auto part = model.variable(shard.variable)->value.to_vector();
    initial.insert(initial.end(), part.begin(), part.end());
  }
  send(group.transport(0), header_for(plan, proto::Kind::Init, initial), initial);
  REQUIRE(receive(group.transport(0)).header.status == static_cast<std::uint16_t>(proto::Status::Ok));

  std::vector<float> gradients(initial.size(), 0.5f);
  struct Garble {
    const char* expected_reason;
    std::function<void(proto::RequestHeader&, std::vector<float>&)> apply;
  };
  const std::vector<Garble> garbles = {
      {"not a parameter-server request", [](auto& h, auto&) { h.magic = 0x54534F50; /* "POST" */ }},
      {"fails its checksum", [](auto&, auto& payload) { payload[3] += 1.0f; }},
      {"placement plan", [](auto& h, auto&) { h.plan_fingerprint ^= 1; }},
      {"announces", [](auto& h, auto&) { h.payload_bytes -= 4; }},
      {"holds nan", [](auto& h, auto& payload) {
         payload[1] = std::nanf("");
         h.payload_crc = crc32c_of(payload.data(), payload.size() * sizeof(float));
       }},
  };
  for (std::size_t i = 0; i < garbles.size(); ++i) {
    const int worker = static_cast<int>(i) + 1;
    auto payload = gradients;
    auto header = header_for(plan, proto::Kind::Push, payload);
    garbles[i].apply(header, payload);
    send(group.transport(worker), header, payload);
    const Answer answer = receive(group.transport(worker));
    INFO(garbles[i].expected_reason);
    CHECK(answer.header.status == static_cast<std::uint16_t>(proto::Status::Refused));
    CHECK_THAT(proto::message_of(answer.header), Catch::Contains(garbles[i].expected_reason));
  }

  send(group.transport(0), header_for(plan, proto::Kind::Pull, {}), {});
  const Answer pulled = receive(group.transport(0));
  CHECK(pulled.header.status == static_cast<std::uint16_t>(proto::Status::Ok));
  CHECK(pulled.header.step == 0);
  CHECK(pulled.values == initial);
  CHECK(server.stats().refused == static_cast<std::int64_t>(garbles.size()));

  send(group.transport(0), header_for(plan, proto::Kind::Done, {}), {});
  CHECK(receive(group.transport(0)).header.status == static_cast<std::uint16_t>(proto::Status::Ok));
  serving.join();
  CHECK_FALSE(serve_error);
}
