// Without the library's logging or errors: cohort-launch compiles this file on its own.
#include "cohort/comm/stale_shared_memory.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>

#include "segment_name.hpp"

namespace cohort::comm {

std::size_t remove_stale_shared_memory() {
  std::size_t removed = 0;
  std::error_code error;
  for (std::filesystem::directory_iterator entries("/dev/shm", error), end; !error && entries != end; entries.increment(error)) {
    const std::filesystem::directory_entry& entry = *entries;
    std::string name = "/";  // as shm_open names it
    name += entry.path().filename().native();
    const pid_t creator = shm::creator_of(name);
    struct stat status {};
    if (creator == 0 || ::lstat(entry.path().c_str(), &status) != 0 || status.st_uid != ::geteuid()) continue;
    if (::kill(creator, 0) == 0 || errno != ESRCH) continue;  // running, or another user's process
    if (::shm_unlink(name.c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace cohort::comm
