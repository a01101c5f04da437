#include "cohort/data/dataset.hpp"

#include "cohort/core/check.hpp"

namespace cohort::data {

int Dataset::load_bytes(std::int64_t index, std::uint8_t*) const {
  throw InvalidArgument(fmt::format("{} does not store 8-bit samples (sample {} asked for as bytes); load() gives them "
                                    "as float32",
                                    description(), index));
}

}  // namespace cohort::data
