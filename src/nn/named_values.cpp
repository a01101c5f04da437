#include "nn/named_values.hpp"

#include <map>

#include "cohort/core/error.hpp"
#include "cohort/tensor/ops.hpp"

namespace cohort::nn {
namespace {

std::map<std::string, const Tensor*> by_name(const NamedValues& values) {
  std::map<std::string, const Tensor*> found;
  for (const auto& [name, tensor] : values) found[name] = &tensor;
  return found;
}

}  // namespace

NamedValues named_values(const Sequential& model) {
  NamedValues values;
  for (const auto& v : model.variables()) values.emplace_back(v->name, v->value);
  return values;
}

void check_named_values(const Sequential& model, const NamedValues& values, const std::string& what) {
  const auto saved = by_name(values);
  const auto variables = model.variables();
  for (const auto& v : variables) {
    const auto it = saved.find(v->name);
    if (it == saved.end()) throw DataError(fmt::format("{}: has no variable '{}' of this model", what, v->name));
    if (it->second->shape() != v->value.shape())
      throw DataError(fmt::format("{}: variable '{}' has shape {}, the model {}", what, v->name, it->second->shape(),
                                  v->value.shape()));
  }
  if (saved.size() != variables.size() || values.size() != variables.size())
    throw DataError(fmt::format("{}: holds {} variables, the model {}", what, values.size(), variables.size()));
}

void assign_named_values(Sequential& model, const NamedValues& values, const std::string& what) {
  check_named_values(model, values, what);
  const auto saved = by_name(values);
  for (const auto& v : model.variables()) ops::copy(*saved.at(v->name), v->value);
}

}  // namespace cohort::nn
