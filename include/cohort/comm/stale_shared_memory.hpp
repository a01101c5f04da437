#pragma once
// Shared-memory segments left behind. A rank unlinks its segment once its peers have mapped it, so only a
// rank killed during set-up leaves one in /dev/shm. Its name carries the creator's process id; a segment of
// this user whose creator no longer runs is removed (connect_group does it before creating its own, and
// cohort-launch once its processes have ended).
#include <cstddef>

namespace cohort::comm {

// Returns how many segments were removed.
std::size_t remove_stale_shared_memory();

}  // namespace cohort::comm
