#pragma once
// Dataset: random access to labelled samples. Samples are float32 in the layout the model takes
// (HWC for images); targets are class indices in [0, num_classes) (load()'s return), or, for data sets
// whose target_shape() is not (), float vectors of that shape (regression, multi-label, soft targets).
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
  // 0 when the targets are not classes.
  virtual int num_classes() const = 0;
  // Writes sample `index` (sample_shape().numel() floats) to `out` and returns its label.
  // Must be safe to call from several threads at once.
  virtual int load(std::int64_t index, float* out) const = 0;
  // () when each sample's target is a class index; otherwise the shape of its float target.
  virtual Shape target_shape() const { return {}; }
  // Writes sample `index` and its target (target_shape().numel() floats; one, the class, for ()).
  virtual void load_example(std::int64_t index, float* sample, float* target) const {
    *target = static_cast<float>(load(index, sample));
  }
  // Data sets of 8-bit samples (ImageDataset) also give them as stored: load_bytes() writes sample `index`'s
  // sample_shape().numel() bytes (the values load() scales by 1/255) and returns its label.
  virtual bool stores_bytes() const { return false; }
  virtual int load_bytes(std::int64_t index, std::uint8_t* out) const;
  // One line for logs: where the data came from.
  virtual std::string description() const = 0;
};

}  // namespace cohort::data
