#include "cohort/ps/consistency.hpp"

#include <charconv>

#include "cohort/core/error.hpp"
#include <fmt/format.h>

namespace cohort::ps {
namespace {

int parse_count(std::string_view text, std::string_view whole) {
  int value = -1;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 0)
    throw InvalidArgument(fmt::format("consistency '{}': '{}' is not a count >= 0", whole, text));
  return value;
}

}  // namespace

std::string describe(const Consistency& consistency) {
  if (const auto* sync = std::get_if<Sync>(&consistency)) {
    if (sync->backup_workers == 0) return "sync";
    return fmt::format("sync, {} backup worker{}", sync->backup_workers, sync->backup_workers == 1 ? "" : "s");
  }
  if (std::holds_alternative<Async>(consistency)) return "async";
  return fmt::format("bounded staleness {}", std::get<BoundedStaleness>(consistency).max_staleness);
}

Consistency parse_consistency(std::string_view text) {
  if (text == "sync") return Sync{};
  if (text == "async") return Async{};
  if (text.starts_with("sync:backup=")) return Sync{.backup_workers = parse_count(text.substr(12), text)};
  if (text.starts_with("stale:")) return BoundedStaleness{.max_staleness = parse_count(text.substr(6), text)};
  throw InvalidArgument(fmt::format("consistency '{}': expected sync, sync:backup=N, async or stale:N", text));
}

}  // namespace cohort::ps
