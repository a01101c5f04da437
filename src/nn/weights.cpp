#include "cohort/nn/weights.hpp"

#include <cereal/types/utility.hpp>

#include "cohort/core/error.hpp"
#include "core/archive_bytes.hpp"
#include "core/sealed_file.hpp"
#include "nn/named_values.hpp"
#include "tensor/tensor_archive.hpp"

namespace cohort::nn {
namespace {

constexpr std::string_view kMagic = "COHORTWT";
constexpr std::uint32_t kFormatVersion = 2;  // 2: tensors record their element type

}  // namespace

void save_weights(const Sequential& model, const std::filesystem::path& path) {
  write_sealed_file(path, kMagic, kFormatVersion, to_archive_bytes(named_values(model)));
}

void load_weights(Sequential& model, const std::filesystem::path& path) {
  const auto values = from_archive_bytes<DataError, NamedValues>(read_sealed_file(path, kMagic, kFormatVersion, "weights file"),
                                                                 fmt::format("weights file {}", path.string()));
  assign_named_values(model, values, fmt::format("weights file {}", path.string()));
}

}  // namespace cohort::nn
