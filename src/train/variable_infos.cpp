#include "cohort/train/variable_infos.hpp"

namespace cohort::train {

std::vector<ps::VariableInfo> variable_infos(const nn::Sequential& model) {
  std::vector<ps::VariableInfo> out;
  for (const auto& v : model.variables()) out.push_back({v->name, v->value.shape(), v->creation_order, v->trainable});
  return out;
}

}  // namespace cohort::train
