#pragma once
// Float32 stand-ins for an op's 16-bit operands, where the backend computes in float32: inputs are widened
// (exactly), outputs computed into float32 buffers and narrowed back by write_back(), rounding once, as a
// kernel that computes in float32 and stores the 16-bit type does. Float32 and undefined operands stand
// for themselves, so an op on float32 tensors costs nothing more.
//
//   Float32StandIns f({&x, &y}, {&y});     // y is read and written
//   backend.axpy(alpha, f(x), f(y));
//   f.write_back();
#include <initializer_list>
#include <utility>
#include <vector>

#include "cohort/tensor/tensor.hpp"

namespace cohort {

class Float32StandIns {
 public:
  Float32StandIns(std::initializer_list<const Tensor*> inputs, std::initializer_list<const Tensor*> outputs);

  const Tensor& operator()(const Tensor& operand) const;
  // Narrows each output's stand-in into the output.
  void write_back() const;

 private:
  struct StandIn {
    const Tensor* operand;
    Tensor wide;
    bool written;
  };
  std::vector<StandIn> stand_ins_;
};

}  // namespace cohort
