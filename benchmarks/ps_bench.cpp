// Push+pull throughput of one parameter server: one worker and one server, each on its own thread, over
// the authenticated TCP transport on 127.0.0.1. A round trip sends every gradient the server holds and
// receives every value back; GB/s counts both directions' payload. The server applies plain SGD, so the
// figure is the transport and the protocol (header checks, CRC-32 both ways), not optimizer arithmetic.
// With --tls every connection runs over TLS 1.3 keyed from the secret, as under COHORT_TLS=1; with
// --shared-memory the two talk through shared memory (comm::connect_group), as a worker and a server on one
// host of a Cluster do. Each row also gives one thread's memcpy of the same bytes, the ceiling of any copy,
// and a last line how fast the payloads' CRC-32C runs, by the engine the build uses and by the instruction.
//   usage: cohort_ps_bench [--round-trips N] [--tls | --shared-memory]
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <string_view>
#include <thread>

#include "cohort/comm/shared_memory.hpp"
#include "cohort/comm/tcp.hpp"
#include "cohort/nn/zoo.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/ps/parameter_store.hpp"
#include "cohort/ps/server.hpp"
#include "cohort/train/variable_infos.hpp"
#include "core/crc32c.hpp"

using namespace cohort;

namespace {

struct Result {
  double milliseconds_per_round_trip;
  double gigabytes_per_second;
};

enum class Link { Tcp, Tls, SharedMemory };

Result measure(const std::vector<ps::VariableInfo>& infos, std::vector<ps::LocalVariable> variables, int round_trips,
               Link link) {
  const ps::Plan plan = ps::make_plan(infos, 1, ps::placement::RoundRobin{});
  const std::string secret = "benchmark-secret";
  // Two free loopback ports: let the OS pick by binding port 0 is not possible through the factory, so pick
  // from a range keyed by the process id.
  const auto base = static_cast<std::uint16_t>(20000 + (::getpid() * 7 + round_trips) % 30000);
  const std::vector<comm::Address> addresses{{"127.0.0.1", base}, {"127.0.0.1", static_cast<std::uint16_t>(base + 1)}};
  std::int64_t payload = 0;
  for (const auto& info : infos) payload += info.bytes();

  const auto connect = [&](int rank) {
    const comm::GroupOptions options{.rank = rank, .addresses = addresses, .secret = secret, .tls = {.enabled = link == Link::Tls}};
    return link == Link::SharedMemory ? comm::connect_group(options) : comm::connect_tcp(options);
  };
  std::unique_ptr<comm::Transport> server_transport;
  std::thread server_thread([&] {
    server_transport = connect(1);
    optim::SGD sgd({.learning_rate = optim::constant(1e-6)});
    ps::Server server(*server_transport, plan, 0, {0}, sgd);
    server.serve();
  });
  auto worker_transport = connect(0);
  ps::ParameterStore store(*worker_transport, plan, {1}, std::move(variables));
  store.initialize_servers();
  for (int i = 0; i < 3; ++i) store.push_pull(1);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < round_trips; ++i) store.push_pull(1);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  store.finish();
  server_thread.join();
  return {1000.0 * seconds / round_trips, 2.0 * static_cast<double>(payload) * round_trips / seconds / 1e9};
}

// The best of five timings of `work`, which handles `bytes` a call, in GB/s.
template <typename Work>
double best_gigabytes_per_second(std::size_t bytes, Work&& work) {
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    const auto start = std::chrono::steady_clock::now();
    work();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(bytes) / seconds / 1e9);
  }
  return best;
}

// One thread's memcpy of `bytes` (both directions' payload of a round trip: twice).
double memcpy_gigabytes_per_second(std::size_t bytes) {
  std::vector<std::byte> from(bytes, std::byte{1}), to(bytes, std::byte{0});
  return best_gigabytes_per_second(2 * bytes, [&] {
    std::memcpy(to.data(), from.data(), bytes);
    std::memcpy(from.data(), to.data(), bytes);
  });
}

// One thread's CRC-32C of `bytes` by `crc`.
template <typename Crc>
double crc_gigabytes_per_second(Crc&& crc, std::size_t bytes) {
  std::vector<std::byte> data(bytes, std::byte{7});
  std::uint32_t sum = 0;
  const double rate = best_gigabytes_per_second(bytes, [&] { sum ^= crc(0, data.data(), bytes); });
  return sum == 0xFFFFFFFFu ? 0 : rate;  // the sum keeps the calls
}

}  // namespace

int main(int argc, char** argv) {
  int round_trips = 50;
  Link link = Link::Tcp;
  bool usable = true;
  for (int i = 1; i < argc && usable; ++i) {
    const std::string_view argument = argv[i];
    if (argument == "--round-trips" && i + 1 < argc) {
      const std::string_view count = argv[++i];
      const auto parsed = std::from_chars(count.data(), count.data() + count.size(), round_trips);
      usable = parsed.ec == std::errc{} && parsed.ptr == count.data() + count.size() && round_trips > 0;
    } else if ((argument == "--tls" || argument == "--shared-memory") && link == Link::Tcp) {
      link = argument == "--tls" ? Link::Tls : Link::SharedMemory;
    } else {
      usable = false;
    }
  }
  if (!usable) {
    fmt::print(stderr, "usage: {} [--round-trips N (at least 1)] [--tls | --shared-memory]\n", argv[0]);
    return 2;
  }
  nn::Sequential flagship = nn::cifar10_cnn({32, 32, 3});
  std::vector<ps::LocalVariable> variables;
  for (const auto& v : flagship.variables()) variables.push_back({v->name, v->value, v->gradient, v->trainable});
  const Result model = measure(train::variable_infos(flagship), std::move(variables), round_trips, link);

  const Shape big{16384, 1024};  // 64 MiB of float32
  const ps::VariableInfo info{.name = "big/kernel", .shape = big};
  Tensor value(big), gradient(big);
  const Result large = measure({info}, {{"big/kernel", value, gradient, true}}, std::max(5, round_trips / 5), link);

  const char* title = link == Link::Tls            ? "push+pull over TLS, 1 worker -> 1 server"
                      : link == Link::SharedMemory ? "push+pull, shared memory, 1 worker -> 1 server"
                                                   : "push+pull over TCP, 1 worker -> 1 server";
  std::size_t model_bytes = 0;
  for (const auto& info : train::variable_infos(flagship)) model_bytes += static_cast<std::size_t>(info.bytes());
  fmt::print("{:<48} {:>14} {:>14} {:>14}\n", title, "ms/round trip", "GB/s", "memcpy GB/s");
  fmt::print("{:<48} {:>14.3f} {:>14.3f} {:>14.3f}\n", "flagship CIFAR-10 variables (2.2 MB)", model.milliseconds_per_round_trip,
             model.gigabytes_per_second, memcpy_gigabytes_per_second(model_bytes));
  const auto big_bytes = static_cast<std::size_t>(big.numel()) * sizeof(float);
  fmt::print("{:<48} {:>14.3f} {:>14.3f} {:>14.3f}\n", "one 64 MiB variable", large.milliseconds_per_round_trip,
             large.gigabytes_per_second, memcpy_gigabytes_per_second(big_bytes));
  fmt::print("CRC-32C by {}: {:.1f} GB/s on the flagship's bytes, {:.1f} on 64 MiB; by {}: {:.1f} and {:.1f}\n",
             crc32c_engine(), crc_gigabytes_per_second(crc32c_extend, model_bytes), crc_gigabytes_per_second(crc32c_extend, big_bytes),
             crc32c_instruction_engine(), crc_gigabytes_per_second(crc32c_instruction, model_bytes),
             crc_gigabytes_per_second(crc32c_instruction, big_bytes));
  return 0;
}
