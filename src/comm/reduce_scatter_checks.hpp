#pragma once
// What every communicator's reduce_scatter() checks of its buffer before it starts.

#include <string_view>

#include "cohort/comm/communicator.hpp"
#include "cohort/core/check.hpp"

namespace cohort::comm {

// The elements travel as they are, and split into one equal block per rank.
inline void check_reduce_scatter_buffer(std::string_view communicator, const Buffer& data, int ranks) {
  COHORT_CHECK(data.wire == data.type, "{} communicator: carries {} as it is, not as {}", communicator, dtype_name(data.type),
               dtype_name(data.wire));
  COHORT_CHECK(data.count % static_cast<std::size_t>(ranks) == 0, "reduce_scatter: {} elements are not {} equal blocks",
               data.count, ranks);
}

}  // namespace cohort::comm
