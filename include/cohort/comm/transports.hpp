#pragma once
// Transports by name: the one place that maps a name to how a group's processes connect, as backend_for
// does for devices. Built in:
// - "tcp": connect_tcp(), every message over TCP (loopback between processes of one host);
// - "shared-memory": connect_group(), TCP between hosts and shared memory within one (the default).
// An application adds its own (a transport over another fabric, a test double) under a name of its own,
// which a Cluster then takes (ConnectOptions::transport, COHORT_TRANSPORT).
//
//   comm::register_transport("relay", [](const comm::GroupOptions& group) { return connect_relay(group); });
//   auto transport = comm::connect_transport("relay", options);

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/comm/group_options.hpp"
#include "cohort/comm/transport.hpp"

namespace cohort::comm {

// Makes this process's transport of the group `options` describe; returns once it is connected, as
// connect_tcp() does.
using TransportFactory = std::function<std::unique_ptr<Transport>(const GroupOptions& options)>;

// Adds `factory` under `name`. InvalidArgument for an empty name, a null factory, or a name taken.
void register_transport(const std::string& name, TransportFactory factory);
// This process's transport of the group, made by the transport registered as `name`. InvalidArgument
// naming the transports there are when none is, or when its factory returns null; what the factory
// throws passes through.
std::unique_ptr<Transport> connect_transport(std::string_view name, const GroupOptions& options);
// Every registered name, the built-in ones first.
std::vector<std::string> transport_names();

}  // namespace cohort::comm
