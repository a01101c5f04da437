#include "tensor/float32_stand_ins.hpp"

#include <algorithm>

#include "cohort/tensor/ops.hpp"

namespace cohort {
namespace {

bool needs_stand_in(const Tensor* t) { return t->defined() && t->dtype() != DType::Float32; }

}  // namespace

Float32StandIns::Float32StandIns(std::initializer_list<const Tensor*> inputs, std::initializer_list<const Tensor*> outputs) {
  const auto find = [this](const Tensor* t) {
    return std::find_if(stand_ins_.begin(), stand_ins_.end(), [t](const StandIn& s) { return s.operand == t; });
  };
  for (const Tensor* t : inputs)
    if (needs_stand_in(t) && find(t) == stand_ins_.end()) stand_ins_.push_back({t, t->to(DType::Float32), false});
  for (const Tensor* t : outputs) {
    if (!needs_stand_in(t)) continue;
    if (auto known = find(t); known != stand_ins_.end()) known->written = true;
    else stand_ins_.push_back({t, Tensor::uninitialized(t->shape(), DType::Float32, t->device()), true});
  }
}

const Tensor& Float32StandIns::operator()(const Tensor& operand) const {
  for (const StandIn& s : stand_ins_)
    if (s.operand == &operand) return s.wide;
  return operand;
}

void Float32StandIns::write_back() const {
  for (const StandIn& s : stand_ins_)
    if (s.written) ops::convert(s.wide, *s.operand);
}

}  // namespace cohort
