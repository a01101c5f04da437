#pragma once
// RunningSums: sums kept on a device. Losses and counts add each batch's sum to a slot without waiting
// for the device; read() brings every slot to the host in one transfer. A training loop that reads them
// only when it shows or reports them never makes the host wait for the device within a step, and an
// evaluation waits once at its end.
// Values a caller computes on the host go in with add(); read() includes them.
// A label that is not a class index, met by a GPU kernel, is recorded and reported by the next read() (the
// CPU and the emulated device, which runs the CPU's kernels, report it at once).
//
//   RunningSums sums(Device::CUDA, 2);                            // slot 0: the rows' losses summed, slot 1: right rows
//   ops::softmax_cross_entropy(logits, labels, dlogits, sums, 0);
//   ops::count_correct(logits, labels, sums, 1);
//   std::vector<double> totals = sums.read();                     // waits for the device here, once

#include <vector>

#include "cohort/tensor/tensor.hpp"

namespace cohort {

class RunningSums {
 public:
  RunningSums() = default;
  // `size` slots, each zero.
  RunningSums(Device device, int size);
  // Move-only: a copy would share the device's sums but not the host's.
  RunningSums(RunningSums&&) = default;
  RunningSums& operator=(RunningSums&&) = default;
  RunningSums(const RunningSums&) = delete;
  RunningSums& operator=(const RunningSums&) = delete;

  Device device() const { return storage_.device(); }
  int size() const { return static_cast<int>(host_.size()); }
  // Whether read() costs nothing: the sums are in host memory, where the device's work is already done.
  bool read_is_free() const { return device() == Device::CPU; }

  // Adds a value computed on the host to `slot`.
  void add(int slot, double value);
  // Every slot: the device's sums plus the host's additions. Waits for the device's queued work; throws
  // InvalidArgument for a label that a device kernel found outside the classes since the last reset().
  std::vector<double> read() const;
  // Every slot back to zero.
  void reset();

 private:
  friend class detail::BackendAccess;
  static constexpr int kBadLabelRecord = 3;  // after the slots: the first bad label's row + 1, its value, the classes

  Tensor storage_;  // (size + kBadLabelRecord) doubles on the device, as bytes
  std::vector<double> host_;
};

}  // namespace cohort
