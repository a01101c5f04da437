#include "cohort/tensor/shape.hpp"

namespace cohort {

std::string Shape::to_string() const {
  std::string out = "(";
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(dims_[i]);
  }
  if (dims_.size() == 1) out += ",";
  return out + ")";
}

}  // namespace cohort
