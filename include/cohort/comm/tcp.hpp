#pragma once
// The TCP transport: one connection per pair of ranks that talk, over standalone Asio, authenticated by a
// shared secret (HMAC-SHA256 challenge-response in both directions), with length-prefixed frames,
// heartbeats and a deadline on everything. Only the factory is public; the implementation lives in
// src/comm/tcp/.
//
//   comm::GroupOptions options{.rank = 1, .addresses = {{"127.0.0.1", 4000}, {"127.0.0.1", 4001}},
//                              .secret = comm::load_secret()};
//   auto transport = comm::connect_tcp(options);   // returns once every rank has come

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/comm/group_options.hpp"
#include "cohort/comm/transport.hpp"

namespace cohort::comm {

// Blocks until this rank is connected to and authenticated with its ring neighbours (every other rank
// without connect_on_demand) and every rank of the group has come. Throws TimeoutError naming the peers
// still missing at the deadline, InvalidArgument for bad options. Later, a peer that cannot be reached
// within connect_timeout is lost.
std::unique_ptr<Transport> connect_tcp(const GroupOptions& options);

// How many peers `transport`, made by connect_tcp(), holds a connection to now; none for another transport.
std::optional<int> connections_of(const Transport& transport);

// Reads a variable of an environment: the process's, or one an application builds.
using VariableLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The shared secret: COHORT_SECRET, else the contents of the file named by COHORT_SECRET_FILE, as
// `variable` (by default the process's environment) gives them. Throws InvalidArgument when neither is
// set (naming `source`, where `variable` looks), both are, or the secret is too short to be one.
std::string load_secret(const VariableLookup& variable, std::string_view source = "this process's environment");
std::string load_secret();

}  // namespace cohort::comm
