// Without the library's logging or errors: cohort-launch compiles this file on its own.
#include "cohort/comm/stale_shared_memory.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <filesystem>
#include <string>
#include <string_view>

namespace cohort::comm {
namespace {

// The creator's process id in "cohort-<pid>-<16 hex digits>", or 0 for any other name.
pid_t creator_of(std::string_view name) {
  constexpr std::string_view kPrefix = "cohort-";
  if (!name.starts_with(kPrefix)) return 0;
  name.remove_prefix(kPrefix.size());
  pid_t pid = 0;
  const auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), pid);
  if (error != std::errc{} || pid <= 0) return 0;
  const std::string_view random(end, name.data() + name.size() - end);
  if (random.size() != 17 || random[0] != '-' || random.find_first_not_of("0123456789abcdef", 1) != std::string_view::npos) return 0;
  return pid;
}

}  // namespace

std::size_t remove_stale_shared_memory() {
  std::size_t removed = 0;
  std::error_code error;
  for (std::filesystem::directory_iterator entries("/dev/shm", error), end; !error && entries != end; entries.increment(error)) {
    const std::filesystem::directory_entry& entry = *entries;
    const std::string name = entry.path().filename().string();
    const pid_t creator = creator_of(name);
    struct stat status {};
    if (creator == 0 || ::lstat(entry.path().c_str(), &status) != 0 || status.st_uid != ::geteuid()) continue;
    if (::kill(creator, 0) == 0 || errno != ESRCH) continue;  // running, or another user's process
    if (::shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace cohort::comm
