// A parameter server's request checking on any request: after a valid Init, one request whose header and
// payload are the input's (a mode byte may set the plan fingerprint, the payload size and its CRC-32C
// right, so that inputs reach the checks behind them). The server must answer, refuse or wait for a
// payload, and end cleanly when the worker is lost; any other exception, a crash or a sanitizer report is
// a finding.
#include <cstring>
#include <thread>

#include "cohort/comm/inproc.hpp"
#include "cohort/core/error.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/sequential.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/ps/server.hpp"
#include "cohort/train/variable_infos.hpp"
#include "core/crc32c.hpp"
#include "fuzz_util.hpp"
#include "ps/protocol.hpp"

using namespace cohort;
namespace proto = ps::protocol;

namespace {

constexpr int kWorker = 0, kServer = 1;
constexpr std::size_t kMaxPayload = 1 << 20;

struct Fixture {
  nn::Sequential model{Shape{4}, 1};
  ps::Plan plan;
  std::vector<float> initial;
  std::filesystem::path checkpoints = fuzz::scratch_directory("cohort-fuzz-ps");
  Fixture() : plan(make()) {
    for (const auto& shard : plan.shards()) {
      const auto part = model.variable(shard.variable)->value.to_vector();
      initial.insert(initial.end(), part.begin(), part.end());
    }
  }
  ps::Plan make() {
    model.add(nn::Dense(3));
    return ps::make_plan(train::variable_infos(model), 1, ps::placement::RoundRobin{});
  }
};

Fixture& fixture() {
  static Fixture instance;
  return instance;
}

proto::RequestHeader init_header(const Fixture& f) {
  proto::RequestHeader header;
  header.kind = static_cast<std::uint16_t>(proto::Kind::Init);
  header.plan_fingerprint = f.plan.fingerprint();
  header.payload_bytes = f.initial.size() * sizeof(float);
  header.payload_crc = crc32c_of(f.initial.data(), header.payload_bytes);
  return header;
}

// A payload of floats goes as one message per shard, as a worker sends it, when its size allows; else whole.
std::vector<std::span<const std::byte>> pieces_of(const Fixture& f, std::span<const std::byte> payload) {
  const std::size_t floats = f.initial.size();
  if (payload.size() % floats != 0) return {payload};
  const std::size_t element_bytes = payload.size() / floats;
  std::vector<std::span<const std::byte>> pieces;
  std::size_t offset = 0;
  for (const auto& shard : f.plan.shards()) {
    const std::size_t bytes = static_cast<std::size_t>(shard.shape.numel()) * element_bytes;
    pieces.push_back(payload.subspan(offset, bytes));
    offset += bytes;
  }
  return pieces;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const Fixture& f = fixture();
  proto::RequestHeader push;
  push.kind = static_cast<std::uint16_t>(proto::Kind::Push);
  push.plan_fingerprint = f.plan.fingerprint();
  push.step = 0;
  push.samples = 8;
  const std::vector<float> gradients(f.initial.size(), 0.5f);
  push.payload_bytes = gradients.size() * sizeof(float);
  push.payload_crc = crc32c_of(gradients.data(), push.payload_bytes);
  auto as_text = [](const void* data, std::size_t size) { return std::string(static_cast<const char*>(data), size); };
  std::vector<std::string> seeds;
  for (std::uint8_t mode : {0, 7}) seeds.push_back(fuzz::mode(mode, as_text(&push, sizeof push) + as_text(gradients.data(), push.payload_bytes)));
  for (proto::Kind kind : {proto::Kind::Pull, proto::Kind::Stats, proto::Kind::Save, proto::Kind::Done}) {
    proto::RequestHeader header;
    header.kind = static_cast<std::uint16_t>(kind);
    header.plan_fingerprint = f.plan.fingerprint();
    header.step = 1;
    seeds.push_back(fuzz::mode(7, as_text(&header, sizeof header)));
  }
  fuzz::write_seeds(seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Fixture& f = fixture();
  if (size < 1 + sizeof(proto::RequestHeader)) return 0;
  const std::uint8_t mode = data[0];
  proto::RequestHeader header;
  std::memcpy(&header, data + 1, sizeof header);
  std::vector<float> payload((size - 1 - sizeof header) / sizeof(float));
  if (!payload.empty()) std::memcpy(payload.data(), data + 1 + sizeof header, payload.size() * sizeof(float));
  if (mode & 1) header.plan_fingerprint = f.plan.fingerprint();
  if (mode & 2) header.payload_bytes = payload.size() * sizeof(float);
  if (mode & 4) header.payload_crc = crc32c_of(payload.data(), payload.size() * sizeof(float));

  comm::InProcessGroup group(2, std::chrono::milliseconds(200));
  optim::SGD sgd;
  ps::Server server(group.transport(kServer), f.plan, 0, {kWorker}, sgd, {.checkpoint_dir = f.checkpoints});
  std::thread serving([&] {
    try {
      server.serve();
    } catch (const Error&) {  // the worker was lost, or a wait timed out: both name the cause
    }
  });
  comm::Transport& worker = group.transport(kWorker);
  auto request = [&](const proto::RequestHeader& h, const std::vector<float>& values) {
    worker.send(kServer, proto::kRequestTag, std::as_bytes(std::span(&h, 1)))->wait(std::chrono::seconds(5));
    // The payload goes only where the header announces one the server will take: the size it announces.
    if (h.payload_bytes > 0 && h.payload_bytes <= kMaxPayload && h.payload_bytes % sizeof(float) == 0) {
      std::vector<float> sent(h.payload_bytes / sizeof(float));
      std::copy_n(values.begin(), std::min(values.size(), sent.size()), sent.begin());
      for (const auto& piece : pieces_of(f, std::as_bytes(std::span(sent))))
        worker.send(kServer, proto::kRequestPayloadTag, piece)->wait(std::chrono::seconds(5));
    }
    proto::ReplyHeader reply;
    try {
      worker.recv(kServer, proto::kReplyTag, std::as_writable_bytes(std::span(&reply, 1)))->wait(std::chrono::seconds(2));
      if (reply.payload_bytes > 0 && reply.payload_bytes <= kMaxPayload) {
        std::vector<std::byte> values_back(reply.payload_bytes);
        worker.recv(kServer, proto::kReplyPayloadTag, std::span(values_back))->wait(std::chrono::seconds(2));
      }
    } catch (const Error&) {  // no answer: the server waits for a payload, or has stopped serving this worker
    }
  };
  request(init_header(f), f.initial);
  request(header, payload);
  group.kill(kWorker);
  serving.join();
  return 0;
}
