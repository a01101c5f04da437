#include "cohort/ps/stats.hpp"

#include <fmt/format.h>

#include <cereal/types/vector.hpp>

#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
#include "core/archive_bytes.hpp"
#include "ps/stats_codec.hpp"

namespace cohort::ps {

template <class Archive>
void serialize(Archive& archive, WorkerCounters& c) {
  archive(c.pushes, c.dropped, c.staleness_sum, c.max_staleness, c.max_lead);
}

template <class Archive>
void serialize(Archive& archive, ServerStats& s) {
  archive(s.server, s.bytes_in, s.bytes_out, s.requests, s.refused, s.updates, s.mean_latency_ms, s.p99_latency_ms, s.workers);
}

std::string encode_stats(const ServerStats& stats) { return to_archive_bytes(stats); }

ServerStats decode_stats(const std::string& bytes) {
  return from_archive_bytes<ProtocolError, ServerStats>(bytes, "server statistics");
}

std::string traffic_table(const std::vector<ServerStats>& servers, const std::vector<std::string>& worker_names) {
  std::string out = fmt::format("{:<6} {:>14} {:>14} {:>9} {:>8} {:>10} {:>10} {:>8}\n", "server", "bytes in",
                                "bytes out", "requests", "updates", "mean ms", "p99 ms", "refused");
  for (const auto& s : servers)
    out += fmt::format("ps {:<3} {:>14} {:>14} {:>9} {:>8} {:>10.3f} {:>10.3f} {:>8}\n", s.server,
                       with_thousands(s.bytes_in), with_thousands(s.bytes_out), s.requests, s.updates,
                       s.mean_latency_ms, s.p99_latency_ms, s.refused);
  if (servers.empty()) return out;
  out += fmt::format("{:<10} {:>8} {:>9} {:>15} {:>14} {:>9}\n", "worker", "pushes", "dropped", "mean staleness",
                     "max staleness", "max lead");
  for (std::size_t w = 0; w < servers.front().workers.size(); ++w) {
    // Every server sees every push of a worker; report the largest counts over the servers.
    WorkerCounters worst;
    double mean = 0;
    for (const auto& s : servers) {
      if (w >= s.workers.size()) continue;
      const auto& c = s.workers[w];
      worst.pushes = std::max(worst.pushes, c.pushes);
      worst.dropped = std::max(worst.dropped, c.dropped);
      worst.max_staleness = std::max(worst.max_staleness, c.max_staleness);
      worst.max_lead = std::max(worst.max_lead, c.max_lead);
      mean = std::max(mean, c.mean_staleness());
    }
    const std::string name = w < worker_names.size() ? worker_names[w] : fmt::format("worker {}", w);
    out += fmt::format("{:<10} {:>8} {:>9} {:>15.2f} {:>14} {:>9}\n", name, worst.pushes, worst.dropped, mean,
                       worst.max_staleness, worst.max_lead);
  }
  return out;
}

}  // namespace cohort::ps
