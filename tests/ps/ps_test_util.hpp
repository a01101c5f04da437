#pragma once
// Parameter-server runs inside one test: every process of the run is a thread over an InProcessGroup,
// workers first (rank 0 is the chief), then the servers.

#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cohort/comm/inproc.hpp"
#include "cohort/data/synthetic.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/batch_normalization.hpp"
#include "cohort/nn/conv2d.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/flatten.hpp"
#include "cohort/nn/pooling2d.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/ps/server.hpp"
#include "cohort/train/parameter_server.hpp"
#include "cohort/train/trainer.hpp"
#include "comm/comm_test_util.hpp"

namespace ps_test {

using namespace cohort;

inline nn::Sequential small_model(bool batch_norm = false) {
  nn::Sequential model({8, 8, 2}, 5);
  model.add(nn::Conv2D(4, 3, nn::Padding::Same));
  if (batch_norm) model.add(nn::BatchNormalization());
  model.add(nn::ReLU()).add(nn::MaxPooling2D(2));
  model.add(nn::Flatten()).add(nn::Dense(4)).add(nn::Softmax());
  return model;
}

// 44 samples of 4 classes, for small_model().
inline const data::ImageDataset& small_set() {
  static const auto set = data::make_synthetic({.samples = 44, .sample_shape = {8, 8, 2}, .classes = 4, .seed = 3});
  return set;
}

inline optim::SGD momentum_sgd() { return optim::SGD({.learning_rate = optim::constant(0.1), .momentum = 0.9}); }

// Every variable of `got` equals the one of the same name in `expected`, within `tolerance`.
inline void require_same_variables(const nn::Sequential& expected, const nn::Sequential& got, double tolerance = 1e-4) {
  for (const auto& v : expected.variables()) {
    const auto want = v->value.to_vector();
    const auto have = got.variable(v->name)->value.to_vector();
    REQUIRE(have.size() == want.size());
    for (std::size_t i = 0; i < have.size(); ++i) {
      INFO(v->name << "[" << i << "]");
      REQUIRE(have[i] == Approx(want[i]).epsilon(tolerance).margin(1e-5));
    }
  }
}

// "worker 0" .. then "ps 0" ..: how errors name the processes of a run.
inline std::vector<std::string> process_names(int workers, int servers) {
  std::vector<std::string> names;
  for (int w = 0; w < workers; ++w) names.push_back(w == 0 ? "chief 0" : "worker " + std::to_string(w));
  for (int s = 0; s < servers; ++s) names.push_back("ps " + std::to_string(s));
  return names;
}

// Every shard's values in plan order, as the chief's Init carries them to a single server (the plan may order
// the shards differently from the model).
inline std::vector<float> values_in_plan_order(const nn::Sequential& model, const ps::Plan& plan) {
  std::vector<float> values;
  for (const auto& shard : plan.shards()) {
    const auto part = model.variable(shard.variable)->value.to_vector();
    values.insert(values.end(), part.begin(), part.end());
  }
  return values;
}

// A server's serve() on a thread of its own; after join(), error() says how it ended (null: cleanly).
class ServeOnThread {
 public:
  explicit ServeOnThread(ps::Server& server)
      : thread_([this, &server] {
          try {
            server.serve();
          } catch (...) {
            error_ = std::current_exception();
          }
        }) {}
  ~ServeOnThread() { join(); }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  std::exception_ptr error() const { return error_; }

 private:
  std::exception_ptr error_;  // before the thread, which may set it at once
  std::thread thread_;
};

// A payload of floats travels as one message per shard of its server, in plan order: `bytes` (all of the
// server's floats, of any element size) cut so.
template <typename Byte>
std::vector<std::span<Byte>> shard_pieces(const ps::Plan& plan, int server, std::span<Byte> bytes) {
  std::size_t floats = 0;
  for (const auto& shard : plan.shards())
    if (shard.server == server) floats += static_cast<std::size_t>(shard.shape.numel());
  std::vector<std::span<Byte>> pieces;
  if (bytes.empty()) return pieces;
  REQUIRE(bytes.size() % floats == 0);
  const std::size_t element_bytes = bytes.size() / floats;
  std::size_t offset = 0;
  for (const auto& shard : plan.shards()) {
    if (shard.server != server) continue;
    const std::size_t piece = static_cast<std::size_t>(shard.shape.numel()) * element_bytes;
    pieces.push_back(bytes.subspan(offset, piece));
    offset += piece;
  }
  return pieces;
}

// Sends `payload` on `tag` as the pieces server `server` of `plan` expects, and waits for them.
inline void send_pieces(comm::Transport& transport, int to, comm::Tag tag, const ps::Plan& plan, int server,
                        std::span<const std::byte> payload) {
  std::vector<comm::WorkPtr> sends;
  for (const auto& piece : shard_pieces(plan, server, payload)) sends.push_back(transport.send(to, tag, piece));
  comm::wait_all(sends, std::chrono::seconds(10));
}

inline void receive_pieces(comm::Transport& transport, int from, comm::Tag tag, const ps::Plan& plan, int server,
                           std::span<std::byte> payload) {
  for (const auto& piece : shard_pieces(plan, server, payload)) transport.recv(from, tag, piece)->wait(std::chrono::seconds(10));
}

// One parameter-server run over `transports`: body(rank, strategy) on every process's thread; returns the
// strategies (the chief's holds the final server statistics).
inline std::vector<std::shared_ptr<train::ParameterServer>> run_cluster(
    const std::vector<comm::Transport*>& transports, int workers, const train::ParameterServerOptions& options,
    const std::function<void(int, std::shared_ptr<train::ParameterServer>)>& body) {
  std::vector<std::shared_ptr<train::ParameterServer>> strategies;
  for (comm::Transport* transport : transports) strategies.push_back(std::make_shared<train::ParameterServer>(*transport, workers, options));
  comm_test::run_ranks(static_cast<int>(transports.size()), [&](int r) { body(r, strategies[static_cast<std::size_t>(r)]); });
  return strategies;
}

inline std::vector<std::shared_ptr<train::ParameterServer>> run_cluster(
    comm::InProcessGroup& group, int workers, int servers, const train::ParameterServerOptions& options,
    const std::function<void(int, std::shared_ptr<train::ParameterServer>)>& body) {
  std::vector<comm::Transport*> transports;
  for (int r = 0; r < workers + servers; ++r) transports.push_back(&group.transport(r));
  return run_cluster(transports, workers, options, body);
}

}  // namespace ps_test
