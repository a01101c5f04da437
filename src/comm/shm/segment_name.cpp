// Without the library's logging or errors: cohort-launch compiles this file on its own.
#include "segment_name.hpp"

#include <charconv>
#include <fmt/format.h>

namespace cohort::comm::shm {
namespace {

constexpr std::string_view kPrefix = "/cohort-";
constexpr std::size_t kRandomDigits = 16;

}  // namespace

std::string segment_name(pid_t creator, std::uint64_t random) {
  return fmt::format("{}{}-{:0{}x}", kPrefix, creator, random, kRandomDigits);
}

pid_t creator_of(std::string_view name) {
  if (!name.starts_with(kPrefix)) return 0;
  name.remove_prefix(kPrefix.size());
  pid_t pid = 0;
  const auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), pid);
  if (error != std::errc{} || pid <= 0) return 0;
  const std::string_view random(end, name.data() + name.size() - end);
  if (random.size() != kRandomDigits + 1 || random[0] != '-' ||
      random.find_first_not_of("0123456789abcdef", 1) != std::string_view::npos)
    return 0;
  return pid;
}

}  // namespace cohort::comm::shm
