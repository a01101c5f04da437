// A parameter server spoken to by hand: garbled, foreign and lying requests are refused with a reason,
// counted, and leave the variables as they were.
#include <catch2/catch.hpp>
#include <cmath>
#include <thread>

#include "cohort/optim/sgd.hpp"
#include "cohort/ps/server.hpp"
#include "cohort/train/variable_infos.hpp"
#include "core/sealed_file.hpp"
#include "ps/protocol.hpp"
#include "ps/ps_test_util.hpp"

using namespace cohort;
namespace proto = ps::protocol;

namespace {

constexpr int kWorkers = 6;
constexpr int kServerRank = kWorkers;

struct Answer {
  proto::ReplyHeader header;
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
         h.payload_crc = crc32_of(payload.data(), payload.size() * sizeof(float));
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
