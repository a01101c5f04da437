#pragma once
// Dataset: random access to labelled samples. Samples are float32 in the layout the model takes
// (HWC for images); labels are class indices in [0, num_classes).
//
//   class MyData : public data::Dataset { ... };   // size(), sample_shape(), num_classes(), load()

#include <cstdint>
#include <string>

#include "cohort/tensor/shape.hpp"

namespace cohort::data {

class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual std::int64_t size() const = 0;
  virtual Shape sample_shape() const = 0;
  virtual int num_classes() const = 0;
  // Writes sample `index` (sample_shape().numel() floats) to `out` and returns its label.
  // Must be safe to call from several threads at once.
  virtual int load(std::int64_t index, float* out) const = 0;
  // One line for logs: where the data came from.
  virtual std::string description() const = 0;
};

}  // namespace cohort::data
