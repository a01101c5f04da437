#pragma once
// Runs one function per rank on its own thread and collects the first failure, for transport tests.
// Catch2's assertions are not thread-safe: rank bodies check with expect() / expect_throws(), which
// throw, and run_ranks() rethrows the first failure on the test's own thread.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <exception>
#include <fmt/format.h>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cohort/comm/tcp.hpp"

namespace comm_test {

// A transport that passes every call on to another: a test derives from it to change one behaviour.
struct ForwardingTransport : cohort::comm::Transport {
  cohort::comm::Transport& inner;
  explicit ForwardingTransport(cohort::comm::Transport& t) : inner(t) {}
  int rank() const override { return inner.rank(); }
  int size() const override { return inner.size(); }
  cohort::comm::WorkPtr send(int p, cohort::comm::Tag t, std::span<const std::byte> d) override { return inner.send(p, t, d); }
  cohort::comm::WorkPtr recv(int p, cohort::comm::Tag t, std::span<std::byte> o) override { return inner.recv(p, t, o); }
  std::string describe(int r) const override { return inner.describe(r); }
  std::chrono::milliseconds timeout() const override { return inner.timeout(); }
  void report_progress(std::uint64_t collectives) override { inner.report_progress(collectives); }
  std::optional<std::uint64_t> progress_of(int p) const override { return inner.progress_of(p); }
  void declare_stuck(int p, const std::string& reason) override { inner.declare_stuck(p, reason); }
  void expect_messages_up_to(std::uint64_t bytes) override { inner.expect_messages_up_to(bytes); }
  void announce_failure(const std::string& reason) override { inner.announce_failure(reason); }
};

// Forwards to a rank's transport, its peers' memory included, saying whether its host has a core per rank
// as told.
struct ToldCores : ForwardingTransport {
  ToldCores(cohort::comm::Transport& t, bool own_cores) : ForwardingTransport(t), own_cores(own_cores) {}
  bool own_cores;
  cohort::comm::PeerMemory* peer_memory() override { return inner.peer_memory(); }
  std::size_t whole_message_bytes() const override { return inner.whole_message_bytes(); }
  bool ranks_have_own_cores() const override { return own_cores; }
};

// Keeps `buffers` until the process exits when the scope holding it is left by an exception: a send or
// receive whose wait failed may still read or write them (Work's contract), and freeing them would turn the
// test's failure into a crash.
class KeepOnFailure {
 public:
  explicit KeepOnFailure(std::shared_ptr<void> buffers) : buffers_(std::move(buffers)), unwinding_(std::uncaught_exceptions()) {}
  KeepOnFailure(const KeepOnFailure&) = delete;
  KeepOnFailure& operator=(const KeepOnFailure&) = delete;
  ~KeepOnFailure() {
    if (std::uncaught_exceptions() > unwinding_) cohort::comm::keep_until_exit(std::move(buffers_));
  }

 private:
  std::shared_ptr<void> buffers_;
  int unwinding_;
};

inline void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("expectation failed: " + what);
}

// As expect(), for a call that must throw Error whose message contains every one of `naming`.
template <typename Error, typename Call>
void expect_throws(Call&& call, const std::string& what, std::initializer_list<std::string> naming = {}) {
  try {
    call();
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const std::string& part : naming)
      if (message.find(part) == std::string::npos)
        throw std::runtime_error(fmt::format("{}: \"{}\" does not say \"{}\"", what, message, part));
    return;
  }
  throw std::runtime_error("expected an exception: " + what);
}

// Calls body(rank) for every rank concurrently; rethrows the first exception after all threads end.
inline void run_ranks(int ranks, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::exception_ptr first;
  std::mutex mutex;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        const std::lock_guard lock(mutex);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// Options for rank `rank` of a loopback group: short deadlines, a heartbeat every 100 ms, and names as a
// cluster gives them ("chief 0 (127.0.0.1:PORT)", "worker 1 (...)").
inline cohort::comm::GroupOptions tcp_options(int rank, const std::vector<cohort::comm::Address>& addresses,
                                            std::chrono::milliseconds peer_timeout, std::string secret) {
  cohort::comm::GroupOptions options;
  options.rank = rank;
  options.addresses = addresses;
  options.secret = std::move(secret);
  options.connect_timeout = std::chrono::seconds(10);
  options.timeout = std::chrono::seconds(10);
  options.heartbeat_interval = std::chrono::milliseconds(100);
  options.peer_timeout = peer_timeout;
  for (int r = 0; r < static_cast<int>(addresses.size()); ++r)
    options.names.push_back((r == 0 ? "chief " : "worker ") + std::to_string(r) + " (127.0.0.1:" +
                            std::to_string(addresses[static_cast<std::size_t>(r)].port) + ")");
  return options;
}

// Loopback addresses with ports that were free a moment ago, all different.
inline std::vector<cohort::comm::Address> free_addresses(int n) {
  std::vector<cohort::comm::Address> addresses;
  std::vector<int> held;
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    socklen_t length = sizeof address;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
    addresses.push_back({"127.0.0.1", ntohs(address.sin_port)});
    held.push_back(fd);
  }
  for (int fd : held) ::close(fd);
  return addresses;
}

}  // namespace comm_test
