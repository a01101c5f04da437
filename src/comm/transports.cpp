// The one place that maps a transport's name to the code that connects a group.
#include "cohort/comm/transports.hpp"

#include <fmt/ranges.h>

#include <mutex>
#include <utility>

#include "cohort/comm/shared_memory.hpp"
#include "cohort/comm/tcp.hpp"
#include "cohort/core/error.hpp"

namespace cohort::comm {
namespace {

class Registry {
 public:
  Registry() {
    factories_.emplace_back("shared-memory", [](const GroupOptions& options) { return connect_group(options); });
    factories_.emplace_back("tcp", [](const GroupOptions& options) { return connect_tcp(options); });
  }

  void add(const std::string& name, TransportFactory factory) {
    if (name.empty()) throw InvalidArgument("a transport needs a name");
    if (!factory) throw InvalidArgument(fmt::format("transport '{}': the factory is empty", name));
    const std::scoped_lock lock(mutex_);
    if (find(name) != nullptr) throw InvalidArgument(fmt::format("a transport named '{}' is registered already", name));
    factories_.emplace_back(name, std::move(factory));
  }

  TransportFactory factory(std::string_view name) {
    const std::scoped_lock lock(mutex_);
    if (const TransportFactory* found = find(name)) return *found;
    throw InvalidArgument(fmt::format("no transport named '{}'; there are {} (comm::register_transport adds one)", name,
                                      fmt::join(names_locked(), ", ")));
  }

  std::vector<std::string> names() {
    const std::scoped_lock lock(mutex_);
    return names_locked();
  }

 private:
  const TransportFactory* find(std::string_view name) const {
    for (const auto& [registered, factory] : factories_)
      if (registered == name) return &factory;
    return nullptr;
  }
  std::vector<std::string> names_locked() const {
    std::vector<std::string> names;
    for (const auto& entry : factories_) names.push_back(entry.first);
    return names;
  }

  std::mutex mutex_;
  std::vector<std::pair<std::string, TransportFactory>> factories_;
};

Registry& registry() {
  static Registry transports;
  return transports;
}

}  // namespace

void register_transport(const std::string& name, TransportFactory factory) { registry().add(name, std::move(factory)); }

std::unique_ptr<Transport> connect_transport(std::string_view name, const GroupOptions& options) {
  // The factory is copied out, so that connecting (which may take a minute) holds no lock.
  std::unique_ptr<Transport> transport = registry().factory(name)(options);
  if (!transport) throw InvalidArgument(fmt::format("the transport '{}' made no transport: its factory returned null", name));
  return transport;
}

std::vector<std::string> transport_names() { return registry().names(); }

}  // namespace cohort::comm
