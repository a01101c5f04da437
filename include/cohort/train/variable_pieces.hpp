#pragma once
// A piece of a trainable variable: what one rank of a sharded update (ZeRO) owns of it.

#include <cstdint>
#include <string>

namespace cohort::train {

// The elements [begin, end) of a trainable variable, in its flat order.
struct VariablePiece {
  std::string variable;
  std::int64_t begin = 0, end = 0;
};

}  // namespace cohort::train
