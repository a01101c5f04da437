#pragma once
// The names of shared-memory segments, as shm_open takes them: "/cohort-<creator's process id>-<16 hex
// digits>". Mailbox::create makes them, Mailbox::open accepts nothing else, and
// remove_stale_shared_memory finds a segment's creator by its name.
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace cohort::comm::shm {

std::string segment_name(pid_t creator, std::uint64_t random);

// The creator's process id when `name` is a segment name, else 0.
pid_t creator_of(std::string_view name);

}  // namespace cohort::comm::shm
