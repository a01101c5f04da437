#include "host_memory.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

namespace cohort::comm::shm {
namespace {

std::optional<std::uint64_t> meminfo_available() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kibibytes = 0;
  std::string unit;
  while (meminfo >> key >> kibibytes >> unit)
    if (key == "MemAvailable:") return kibibytes * 1024;
  return std::nullopt;
}

std::optional<std::uint64_t> read_number(const std::string& path) {
  std::ifstream file(path);
  std::uint64_t value = 0;
  if (file >> value) return value;
  return std::nullopt;  // absent, or "max"
}

// memory.max less memory.current of this process's cgroup (v2); none without a limit.
std::optional<std::uint64_t> cgroup_headroom() {
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroups, line)) {
    if (!line.starts_with("0::")) continue;
    const std::string directory = "/sys/fs/cgroup" + line.substr(3);
    const auto limit = read_number(directory + "/memory.max");
    const auto usage = read_number(directory + "/memory.current");
    if (!limit || !usage) return std::nullopt;
    return *limit > *usage ? *limit - *usage : 0;
  }
  return std::nullopt;
}

std::string gibibytes(std::uint64_t bytes) { return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1ull << 30)); }

}  // namespace

std::optional<std::uint64_t> available_memory_bytes() {
  const auto host = meminfo_available();
  const auto cgroup = cgroup_headroom();
  if (host && cgroup) return std::min(*host, *cgroup);
  return host ? host : cgroup;
}

std::optional<std::string> reservation_refusal(std::uint64_t host_bytes, std::uint64_t available) {
  if (host_bytes <= available / 2) return std::nullopt;
  return fmt::format("the ranks on this host would reserve {} of shared memory, more than half of the {} available "
                     "(SharedMemoryOptions::mailbox_bytes)",
                     gibibytes(host_bytes), gibibytes(available));
}

}  // namespace cohort::comm::shm
