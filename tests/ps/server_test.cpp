// A parameter server spoken to by hand: garbled, foreign and lying requests are refused with a reason,
// counted, and leave the variables as they were.
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <limits>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <omp.h>
#include <cmath>
#include <thread>

#include "cohort/core/error.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/ps/server.hpp"
#include "cohort/train/variable_infos.hpp"
#include "core/crc32c.hpp"
#include "ps/protocol.hpp"
#include "ps/ps_test_util.hpp"

using namespace cohort;
namespace proto = ps::protocol;

namespace {

constexpr int kWorkers = 9;
constexpr int kServerRank = kWorkers;

struct Answer {
  proto::ReplyHeader header;
  std::vector<float> values;
};

void send(comm::Transport& transport, const ps::Plan& plan, proto::RequestHeader header, const std::vector<float>& payload) {
  auto sent = transport.send(kServerRank, proto::kRequestTag, std::as_bytes(std::span(&header, 1)));
  ps_test::send_pieces(transport, kServerRank, proto::kRequestPayloadTag, plan, 0, std::as_bytes(std::span(payload)));
  sent->wait(std::chrono::seconds(10));
}

Answer receive(comm::Transport& transport, const ps::Plan& plan) {
  Answer answer;
  transport.recv(kServerRank, proto::kReplyTag, std::as_writable_bytes(std::span(&answer.header, 1)))->wait(std::chrono::seconds(10));
  answer.values.resize(answer.header.payload_bytes / sizeof(float));
  ps_test::receive_pieces(transport, kServerRank, proto::kReplyPayloadTag, plan, 0, std::as_writable_bytes(std::span(answer.values)));
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
  ps_test::ServeOnThread serving(server);

  const std::vector<float> initial = ps_test::values_in_plan_order(model, plan);
  send(group.transport(0), plan, header_for(plan, proto::Kind::Init, initial), initial);
  REQUIRE(receive(group.transport(0), plan).header.status == static_cast<std::uint16_t>(proto::Status::Ok));

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
      {"payload element type code 7", [](auto& h, auto&) { h.payload_dtype = 7; }},
      {"holds nan", [](auto& h, auto& payload) {
         payload[1] = std::nanf("");
         h.payload_crc = crc32c_of(payload.data(), payload.size() * sizeof(float));
       }},
      {"unknown request flags 0x10", [](auto& h, auto&) { h.flags = 0x10; }},
      {"flagged as not finite names shard 1000", [](auto& h, auto&) {
         h.flags = proto::kNotFinite;
         h.overflow_shard = 1000;
       }},
  };
  for (std::size_t i = 0; i < garbles.size(); ++i) {
    const int worker = static_cast<int>(i) + 1;
    auto payload = gradients;
    auto header = header_for(plan, proto::Kind::Push, payload);
    garbles[i].apply(header, payload);
    send(group.transport(worker), plan, header, payload);
    const Answer answer = receive(group.transport(worker), plan);
    INFO(garbles[i].expected_reason);
    CHECK(answer.header.status == static_cast<std::uint16_t>(proto::Status::Refused));
    CHECK_THAT(proto::message_of(answer.header), Catch::Contains(garbles[i].expected_reason));
  }

  send(group.transport(0), plan, header_for(plan, proto::Kind::Pull, {}), {});
  const Answer pulled = receive(group.transport(0), plan);
  CHECK(pulled.header.status == static_cast<std::uint16_t>(proto::Status::Ok));
  CHECK(pulled.header.step == 0);
  CHECK(pulled.values == initial);
  CHECK(server.stats().refused == static_cast<std::int64_t>(garbles.size()));

  send(group.transport(0), plan, header_for(plan, proto::Kind::Done, {}), {});
  CHECK(receive(group.transport(0), plan).header.status == static_cast<std::uint16_t>(proto::Status::Ok));
  serving.join();
  CHECK_FALSE(serving.error());
}

namespace {

// One server of a 3-worker run spoken to by hand, with its serve() on a thread of its own.
struct HandServed {
  static constexpr int kHandWorkers = 3;
  nn::Sequential model;
  ps::Plan plan;
  comm::InProcessGroup group{kHandWorkers + 1, std::chrono::seconds(10), ps_test::process_names(kHandWorkers, 1)};
  optim::SGD sgd;
  std::unique_ptr<ps::Server> server;
  ps_test::ServeOnThread serving;

  // `optimizer`: the server's, instead of plain SGD.
  explicit HandServed(ps::ServerOptions options, bool batch_norm = false, double learning_rate = 0.01,
                      optim::Optimizer* optimizer = nullptr)
      : model(ps_test::small_model(batch_norm)),
        plan(ps::make_plan(train::variable_infos(model), 1, ps::placement::SizeBalanced{})),
        sgd({.learning_rate = optim::constant(learning_rate)}),
        server(std::make_unique<ps::Server>(group.transport(kHandWorkers), plan, 0, std::vector<int>{0, 1, 2},
                                            optimizer != nullptr ? *optimizer : sgd, std::move(options))),
        serving(*server) {}
  comm::Transport& worker(int w) { return group.transport(w); }
  std::size_t payload_floats() const {
    std::size_t n = 0;
    for (const auto& shard : plan.shards()) n += static_cast<std::size_t>(shard.shape.numel());
    return n;
  }
  // `flags` kNotFinite names the plan's first shard as the one that overflowed.
  void send_to(int w, proto::Kind kind, const std::vector<float>& payload, std::int64_t step = 0, double rate_factor = 1,
               std::uint32_t flags = 0, std::int64_t samples = 8) {
    auto header = header_for(plan, kind, payload);
    header.step = step;
    header.samples = samples;
    header.learning_rate_factor = rate_factor;
    header.flags = flags;
    if ((flags & proto::kNotFinite) != 0) header.overflow_shard = 0;
    comm::Transport& t = worker(w);
    auto sent = t.send(HandServed::kHandWorkers, proto::kRequestTag, std::as_bytes(std::span(&header, 1)));
    ps_test::send_pieces(t, kHandWorkers, proto::kRequestPayloadTag, plan, 0, std::as_bytes(std::span(payload)));
    sent->wait(std::chrono::seconds(10));
  }
  Answer answer_of(int w) {
    Answer answer;
    comm::Transport& t = worker(w);
    t.recv(kHandWorkers, proto::kReplyTag, std::as_writable_bytes(std::span(&answer.header, 1)))->wait(std::chrono::seconds(10));
    answer.values.resize(answer.header.payload_bytes / sizeof(float));
    ps_test::receive_pieces(t, kHandWorkers, proto::kReplyPayloadTag, plan, 0, std::as_writable_bytes(std::span(answer.values)));
    return answer;
  }
  // The chief's Init of `n` values, answered.
  void initialize(std::size_t n) {
    send_to(0, proto::Kind::Init, std::vector<float>(n, 0.25f));
    REQUIRE(answer_of(0).header.status == static_cast<std::uint16_t>(proto::Status::Ok));
  }
  // Waits until the server has taken `pushes` pushes from worker `w`, so that the next one arrives after.
  void await_pushes(int w, std::int64_t pushes) {
    for (int i = 0; i < 1000 && server->stats().workers[static_cast<std::size_t>(w)].pushes < pushes; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    REQUIRE(server->stats().workers[static_cast<std::size_t>(w)].pushes >= pushes);
  }
};

// Gradients of mixed magnitudes, so that float sums in different orders round differently.
std::vector<float> mixed_gradients(std::size_t n, std::uint32_t seed) {
  std::vector<float> values(n);
  std::uint32_t state = seed * 2654435761u + 1;
  for (float& v : values) {
    state = state * 1664525u + 1013904223u;
    const float unit = static_cast<float>(state >> 8) / static_cast<float>(1u << 24) - 0.5f;
    v = unit * std::ldexp(1.0f, static_cast<int>(state % 24) - 12);
  }
  return values;
}

std::vector<std::uint32_t> bits_of(const std::vector<float>& values) {
  std::vector<std::uint32_t> bits;
  for (float v : values) bits.push_back(std::bit_cast<std::uint32_t>(v));
  return bits;
}

}  // namespace

TEST_CASE("a Sync step gives the same bits whatever order the workers' gradients arrive in", "[ps][threads]") {
  std::vector<int> order{0, 1, 2};
  std::vector<std::uint32_t> first;
  int orders = 0;
  do {
    HandServed served({.consistency = ps::Sync{}});
    const std::size_t n = served.payload_floats();
    served.initialize(n);
    for (int w : order) {
      served.send_to(w, proto::Kind::Push, mixed_gradients(n, static_cast<std::uint32_t>(w)));
      served.await_pushes(w, 1);
    }
    std::vector<std::vector<std::uint32_t>> answers;
    for (int w = 0; w < HandServed::kHandWorkers; ++w) {
      const Answer answer = served.answer_of(w);
      REQUIRE(answer.header.status == static_cast<std::uint16_t>(proto::Status::Ok));
      answers.push_back(bits_of(answer.values));
    }
    for (int w = 0; w < HandServed::kHandWorkers; ++w) served.send_to(w, proto::Kind::Done, {});
    for (int w = 0; w < HandServed::kHandWorkers; ++w) served.answer_of(w);
    served.serving.join();
    REQUIRE_FALSE(served.serving.error());
    INFO("arrival order " << order[0] << order[1] << order[2]);
    CHECK(answers[1] == answers[0]);
    CHECK(answers[2] == answers[0]);
    if (first.empty()) first = answers[0];
    CHECK(answers[0] == first);
    ++orders;
  } while (std::next_permutation(order.begin(), order.end()));
  CHECK(orders == 6);
}

TEST_CASE("a Sync step applies the samples-weighted mean gradient and the workers' mean change of the moving statistics",
          "[ps][threads]") {
  // The sum in double, in worker order, from 0.0, scaled once and rounded once: the bits the server must give,
  // with one contribution (the others said Done first) and with three. A learning rate of 1 makes SGD's step
  // the gradient itself. The moving statistics start at -0.0 and their changes are -0.0: a sum from 0.0 makes
  // them +0.0. A Pull before the step has the server publish its values, which the step must not answer with.
  for (const int contributors : {1, 3}) {
    HandServed served({.consistency = ps::Sync{}}, true, 1.0);
    const std::size_t n = served.payload_floats();
    std::vector<float> initial(n, 0.25f);
    std::vector<char> trainable(n);
    for (std::size_t offset = 0; const ps::Shard& shard : served.plan.shards())
      for (std::int64_t i = 0; i < shard.shape.numel(); ++i, ++offset) {
        trainable[offset] = shard.trainable ? 1 : 0;
        if (!shard.trainable) initial[offset] = -0.0f;
      }
    served.send_to(0, proto::Kind::Init, initial);
    REQUIRE(served.answer_of(0).header.status == static_cast<std::uint16_t>(proto::Status::Ok));
    served.send_to(0, proto::Kind::Pull, {});
    REQUIRE(bits_of(served.answer_of(0).values) == bits_of(initial));
    for (int w = contributors; w < HandServed::kHandWorkers; ++w) {
      served.send_to(w, proto::Kind::Done, {});
      served.answer_of(w);
    }
    const std::vector<std::int64_t> samples{8, 5, 3};
    std::vector<std::vector<float>> pushed;
    for (int w = 0; w < contributors; ++w) {
      pushed.push_back(mixed_gradients(n, static_cast<std::uint32_t>(w) + 7));
      for (std::size_t i = 0; i < n; ++i)
        if (!trainable[i]) pushed.back()[i] = -0.0f;
      served.send_to(w, proto::Kind::Push, pushed.back(), 0, 1, 0, samples[static_cast<std::size_t>(w)]);
    }
    std::vector<float> expected(n);
    std::int64_t all_samples = 0;
    for (int w = 0; w < contributors; ++w) all_samples += samples[static_cast<std::size_t>(w)];
    std::size_t offset = 0;
    int non_trainable = 0;
    for (const ps::Shard& shard : served.plan.shards()) {
      non_trainable += shard.trainable ? 0 : 1;
      for (std::int64_t i = 0; i < shard.shape.numel(); ++i, ++offset) {
        double sum = 0.0;
        for (int w = 0; w < contributors; ++w)
          sum += static_cast<double>(pushed[static_cast<std::size_t>(w)][offset]) *
                 (shard.trainable ? static_cast<double>(samples[static_cast<std::size_t>(w)]) : 1.0);
        const double scale = shard.trainable ? 1.0 / static_cast<double>(all_samples) : 1.0 / contributors;
        const float term = static_cast<float>(sum * scale);
        expected[offset] = shard.trainable ? initial[offset] - term : initial[offset] + term;
      }
    }
    REQUIRE(non_trainable > 0);
    for (int w = 0; w < contributors; ++w) {
      const Answer answer = served.answer_of(w);
      REQUIRE(answer.header.status == static_cast<std::uint16_t>(proto::Status::Ok));
      INFO(contributors << " contributors, worker " << w);
      CHECK(bits_of(answer.values) == bits_of(expected));
    }
    for (int w = 0; w < contributors; ++w) {
      served.send_to(w, proto::Kind::Done, {});
      served.answer_of(w);
    }
    served.serving.join();
    REQUIRE_FALSE(served.serving.error());
  }
}

TEST_CASE("CRC-32C gives the table's value for every length, alignment and split", "[ps]") {
  INFO("computed by " << crc32c_engine() << ", and by " << crc32c_instruction_engine());
  std::vector<unsigned char> bytes(50153 + 8);
  std::uint32_t state = 12345;
  for (unsigned char& b : bytes) b = static_cast<unsigned char>((state = state * 1664525u + 1013904223u) >> 24);
  CHECK(crc32c_of("123456789", 9) == 0xE3069283u);  // the check value of CRC-32C
  for (const std::size_t length : {0, 1, 7, 8, 255, 767, 768, 769, 8191, 24575, 24576, 24583, 49152, 50153})
    for (std::size_t offset = 0; offset < 9; ++offset) {
      INFO(length << " bytes from offset " << offset);
      const unsigned char* data = bytes.data() + offset;
      const std::uint32_t reference = crc32c_portable(0, data, length);
      REQUIRE(crc32c_of(data, length) == reference);
      REQUIRE(crc32c_instruction(0, data, length) == reference);
      REQUIRE(crc32c_extend(crc32c_of(data, length / 3), data + length / 3, length - length / 3) == reference);
      std::vector<unsigned char> copy(length + 1, 0xAB);
      REQUIRE(crc32c_copy(0, copy.data(), data, length) == reference);
      REQUIRE(std::equal(copy.begin(), copy.begin() + static_cast<std::ptrdiff_t>(length), data));
      REQUIRE(copy[length] == 0xAB);
    }
}

TEST_CASE("CRC-32C over more than 2 GiB at once equals the CRC extended over its parts", "[ps]") {
  // Zero pages, mapped for reading only: no memory is taken. Each part is under the 2^31 bytes that one
  // call of a 32-bit length could take.
  const std::size_t size = (std::size_t{1} << 31) + 5, part = std::size_t{768} << 20;
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  REQUIRE(mapped != MAP_FAILED);
  ::madvise(mapped, size, MADV_HUGEPAGE);  // fewer faults where the kernel maps its huge zero page
  const auto* bytes = static_cast<const unsigned char*>(mapped);
  std::uint32_t by_parts = 0;
  for (std::size_t at = 0; at < size; at += part) by_parts = crc32c_extend(by_parts, bytes + at, std::min(part, size - at));
  INFO("computed by " << crc32c_engine());
  CHECK(crc32c_of(bytes, size) == by_parts);
  CHECK(by_parts != crc32c_of(bytes, size - 1));
  ::munmap(mapped, size);
}

TEST_CASE("a server with backup workers refuses a push flagged as not finite, on which servers could disagree",
          "[ps][threads]") {
  HandServed served({.consistency = ps::Sync{.backup_workers = 1}});
  const std::size_t n = served.payload_floats();
  served.initialize(n);
  served.send_to(1, proto::Kind::Push, std::vector<float>(n, std::numeric_limits<float>::infinity()), 0, 1, proto::kNotFinite);
  const Answer answer = served.answer_of(1);
  CHECK(answer.header.status == static_cast<std::uint16_t>(proto::Status::Refused));
  CHECK_THAT(proto::message_of(answer.header), Catch::Contains("under backup workers"));
  for (const int w : {0, 2}) served.send_to(w, proto::Kind::Done, {});
  for (const int w : {0, 2}) served.answer_of(w);
  served.serving.join();
  CHECK_FALSE(served.serving.error());
}

// SGD that records how many OpenMP threads its update could use.
class TeamSizeRecordingSgd : public optim::SGD {
 public:
  using SGD::SGD;
  void update(const std::vector<VariableState>& variables, const Tensor& step_size) override {
    team_size = omp_get_max_threads();
    SGD::update(variables, step_size);
  }
  std::atomic<int> team_size{0};
};

TEST_CASE("a server updates with its update_threads OpenMP threads, and refuses a negative count", "[ps][threads]") {
  const int process_threads = omp_get_max_threads();
  for (const int threads : {1, 2}) {
    INFO("update_threads " << threads);
    TeamSizeRecordingSgd sgd({.learning_rate = optim::constant(0.01)});
    HandServed served({.consistency = ps::Async{}, .update_threads = threads}, false, 0.01, &sgd);
    const std::size_t n = served.payload_floats();
    served.initialize(n);
    served.send_to(1, proto::Kind::Push, std::vector<float>(n, 0.5f));
    CHECK(served.answer_of(1).header.status == static_cast<std::uint16_t>(proto::Status::Ok));
    CHECK(sgd.team_size == threads);
    for (const int w : {0, 1, 2}) served.send_to(w, proto::Kind::Done, {});
    for (const int w : {0, 1, 2}) served.answer_of(w);
    served.serving.join();
    CHECK_FALSE(served.serving.error());
  }
  CHECK(omp_get_max_threads() == process_threads);  // the caller's own count is left alone
  CHECK_THROWS_WITH(HandServed({.update_threads = -1}), Catch::Contains("update_threads") && Catch::Contains("-1"));
}

TEST_CASE("a step takes the chief's learning rate, not that of the worker whose push came last", "[ps][threads]") {
  // Where the processes do not agree (backup workers), a worker's own rate request must not steer the servers.
  const auto step_with_worker_factor = [](double factor) {
    HandServed served({.consistency = ps::Sync{}});
    const std::size_t n = served.payload_floats();
    served.initialize(n);
    for (int w = 0; w < HandServed::kHandWorkers; ++w) {
      served.send_to(w, proto::Kind::Push, std::vector<float>(n, 0.5f), 0, w == 0 ? 1.0 : factor);
      served.await_pushes(w, 1);
    }
    std::vector<float> values;
    for (int w = 0; w < HandServed::kHandWorkers; ++w) {
      const Answer answer = served.answer_of(w);
      CHECK(answer.header.learning_rate_factor == 1.0);  // every worker learns the rate in use
      values = answer.values;
    }
    for (int w = 0; w < HandServed::kHandWorkers; ++w) served.send_to(w, proto::Kind::Done, {});
    for (int w = 0; w < HandServed::kHandWorkers; ++w) served.answer_of(w);
    served.serving.join();
    REQUIRE_FALSE(served.serving.error());
    return values;
  };
  const std::vector<float> agreed = step_with_worker_factor(1.0);
  REQUIRE_FALSE(agreed.empty());
  CHECK(agreed[0] != 0.25f);  // the step moved the variables
  CHECK(step_with_worker_factor(100.0) == agreed);
}

TEST_CASE("once the chief has ended the run, a server names a worker that never says it is done within the deadline",
          "[ps][threads]") {
  // Worker 2 took its last step and then froze: no other server's step waits on it, so this server does not
  // leave another one the time to name it first (1.5 deadlines), which would outlast cohort-launch's grace.
  HandServed served({.consistency = ps::Sync{}, .wait_timeout = std::chrono::milliseconds(600)});
  const std::size_t n = served.payload_floats();
  served.initialize(n);
  for (int w = 0; w < HandServed::kHandWorkers; ++w) served.send_to(w, proto::Kind::Push, std::vector<float>(n, 0.5f));
  for (int w = 0; w < HandServed::kHandWorkers; ++w) REQUIRE(served.answer_of(w).header.status == 0);
  for (int w : {0, 1}) {
    served.send_to(w, proto::Kind::Done, {});
    served.answer_of(w);
  }
  served.serving.join();
  REQUIRE(served.serving.error());
  CHECK_THROWS_WITH(std::rethrow_exception(served.serving.error()),
                    Catch::Contains("worker 2 is stuck: connected, but ps 0 got no request after its Push of step 0 within 0.6 s"));
}

TEST_CASE("a parameter server names a worker that is connected but sends no gradients, and every other worker learns it",
          "[ps][threads]") {
  const auto started = std::chrono::steady_clock::now();
  HandServed served({.consistency = ps::Sync{}, .wait_timeout = std::chrono::milliseconds(400)});
  const std::size_t n = served.payload_floats();
  served.initialize(n);
  // Workers 0 and 1 push step 0; worker 2 stays connected and silent, as a worker whose training thread
  // is blocked while its transport goes on.
  served.send_to(0, proto::Kind::Push, std::vector<float>(n, 0.5f));
  served.send_to(1, proto::Kind::Push, std::vector<float>(n, 0.5f));
  for (int w : {0, 1}) {
    const Answer answer = served.answer_of(w);
    CHECK(answer.header.status == static_cast<std::uint16_t>(proto::Status::Failed));
    CHECK_THAT(proto::message_of(answer.header), Catch::StartsWith("ps 0 failed: worker 2 is stuck: connected, but"));
  }
  served.serving.join();  // serve() does not wait for the stuck worker's next request
  REQUIRE(served.serving.error());
  CHECK_THROWS_WITH(std::rethrow_exception(served.serving.error()), Catch::Contains("worker 2 is stuck"));
  CHECK_THROWS_AS(std::rethrow_exception(served.serving.error()), TimeoutError);
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
}

TEST_CASE("an asynchronous parameter server names a worker that sends no next request", "[ps][threads]") {
  HandServed served({.consistency = ps::Async{}, .wait_timeout = std::chrono::milliseconds(400)});
  const std::size_t n = served.payload_floats();
  served.initialize(n);
  // The chief and worker 1 go on pushing well within the deadline; worker 2 never sends a request.
  std::string told;
  for (int step = 0; step < 40 && told.empty(); ++step) {
    for (int w : {0, 1}) {
      served.send_to(w, proto::Kind::Push, std::vector<float>(n, 0.5f), step);
      const Answer answer = served.answer_of(w);
      if (answer.header.status == static_cast<std::uint16_t>(proto::Status::Failed)) told = proto::message_of(answer.header);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK_THAT(told, Catch::Contains("worker 2 is stuck") && Catch::Contains("no request after the start"));
  served.serving.join();
  REQUIRE(served.serving.error());
  CHECK_THROWS_WITH(std::rethrow_exception(served.serving.error()), Catch::Contains("worker 2 is stuck"));
  CHECK_THROWS_AS(std::rethrow_exception(served.serving.error()), TimeoutError);
}

TEST_CASE("a parameter server names a worker that stops between a request's header and its payload", "[ps][threads]") {
  HandServed served({.consistency = ps::Async{}, .wait_timeout = std::chrono::milliseconds(400)});
  const std::size_t n = served.payload_floats();
  served.initialize(n);
  // Worker 2 sends the header of a Push, and then nothing, as a worker frozen between the two sends.
  const std::vector<float> gradients(n, 0.5f);
  const auto header = header_for(served.plan, proto::Kind::Push, gradients);
  served.worker(2).send(HandServed::kHandWorkers, proto::kRequestTag, std::as_bytes(std::span(&header, 1)))->wait(std::chrono::seconds(10));
  std::string told;
  for (int step = 0; step < 40 && told.empty(); ++step) {
    for (int w : {0, 1}) {
      served.send_to(w, proto::Kind::Push, gradients, step);
      const Answer answer = served.answer_of(w);
      if (answer.header.status == static_cast<std::uint16_t>(proto::Status::Failed)) told = proto::message_of(answer.header);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK_THAT(told, Catch::Contains("worker 2 is stuck") &&
                       Catch::Contains(fmt::format("got the header of its Push of step 0 but not the {} bytes", n * sizeof(float))));
  served.serving.join();
  REQUIRE(served.serving.error());
  CHECK_THROWS_AS(std::rethrow_exception(served.serving.error()), TimeoutError);
}

TEST_CASE("a parameter server that loses a worker names the one its step has long waited for", "[ps][threads]") {
  // Worker 2 is stuck; another process named it first and left, so this server sees worker 1 lost. The step
  // it has waited for since points at worker 2.
  HandServed served({.consistency = ps::Sync{}, .wait_timeout = std::chrono::seconds(2)});
  const std::size_t n = served.payload_floats();
  served.initialize(n);
  served.send_to(0, proto::Kind::Push, std::vector<float>(n, 0.5f));
  served.send_to(1, proto::Kind::Push, std::vector<float>(n, 0.5f));
  served.await_pushes(1, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // beyond half the deadline
  served.group.kill(1);
  served.serving.join();
  REQUIRE(served.serving.error());
  CHECK_THROWS_WITH(std::rethrow_exception(served.serving.error()),
                    Catch::Contains("lost worker 1") && Catch::Contains("meanwhile worker 2 is stuck: connected, but ps 0 got no "
                                                                       "gradients of step 0"));
  CHECK_THROWS_WITH(std::rethrow_exception(served.serving.error()), !Catch::Contains("chief 0 is stuck"));
}

TEST_CASE("backup workers that leave no gradient to count are refused by every process before it connects", "[ps]") {
  comm::InProcessGroup group(3);
  for (int rank = 0; rank < 3; ++rank)
    CHECK_THROWS_WITH(train::ParameterServer(group.transport(rank), 2, {.consistency = ps::Sync{.backup_workers = 2}}),
                      Catch::Contains("2 backup workers among 2 workers"));
}
