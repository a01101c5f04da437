#include "cohort/nn/model_file.hpp"

#include <cereal/types/map.hpp>
#include <cereal/types/utility.hpp>

#include <cmath>
#include <functional>

#include "cohort/core/error.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/batch_normalization.hpp"
#include "cohort/nn/conv2d.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/dropout.hpp"
#include "cohort/nn/flatten.hpp"
#include "cohort/nn/normalization.hpp"
#include "cohort/nn/pooling2d.hpp"
#include "cohort/nn/sync_batch_normalization.hpp"
#include "core/archive_bytes.hpp"
#include "core/sealed_file.hpp"
#include "nn/named_values.hpp"
#include "tensor/tensor_archive.hpp"

namespace cohort::nn {
namespace {

constexpr std::string_view kModelFileMagic = "COHORTMD";
constexpr std::uint32_t kModelFileFormatVersion = 2;  // 2: tensors record their element type
constexpr const char* kInputNormalization = "input_normalization";

struct LayerRecord {
  std::string type, name;
  LayerConfig config;

  template <class Archive>
  void serialize(Archive& archive) {
    archive(type, name, config);
  }
};

struct ModelRecord {
  std::vector<std::int64_t> input_shape;
  std::uint64_t seed = 0;
  std::vector<LayerRecord> layers;
  NamedValues weights;

  template <class Archive>
  void serialize(Archive& archive) {
    archive(input_shape, seed, layers, weights);
  }
};

// A config value that must be a whole number in [low, high].
int whole(const LayerRecord& record, const char* key, int low, int high) {
  const auto it = record.config.find(key);
  if (it == record.config.end())
    throw DataError(fmt::format("layer '{}' ({}) has no '{}' in its config", record.name, record.type, key));
  const double value = it->second;
  if (!(value >= low && value <= high) || value != std::floor(value))
    throw DataError(fmt::format("layer '{}' ({}): '{}' is {}, not a whole number in [{}, {}]", record.name, record.type, key,
                                value, low, high));
  return static_cast<int>(value);
}

float real(const LayerRecord& record, const char* key) {
  const auto it = record.config.find(key);
  if (it == record.config.end() || !std::isfinite(it->second))
    throw DataError(fmt::format("layer '{}' ({}) has no finite '{}' in its config", record.name, record.type, key));
  return static_cast<float>(it->second);
}

Padding padding(const LayerRecord& record) { return whole(record, "same_padding", 0, 1) == 1 ? Padding::Same : Padding::Valid; }

std::unique_ptr<Layer> make_layer(const LayerRecord& r) {
  constexpr int kBig = 1 << 24;
  const std::map<std::string, std::function<std::unique_ptr<Layer>()>> makers{
      {"Conv2D", [&] { return std::make_unique<Conv2D>(whole(r, "filters", 1, kBig), whole(r, "kernel_size", 1, 1024), padding(r),
                                                       whole(r, "stride", 1, 1024), whole(r, "use_bias", 0, 1) == 1); }},
      {"Dense", [&] { return std::make_unique<Dense>(whole(r, "units", 1, kBig), whole(r, "use_bias", 0, 1) == 1); }},
      {"BatchNormalization",
       [&] { return std::make_unique<BatchNormalization>(BatchNormalizationOptions{real(r, "momentum"), real(r, "epsilon")}); }},
      {"SyncBatchNormalization",
       [&] { return std::make_unique<SyncBatchNormalization>(BatchNormalizationOptions{real(r, "momentum"), real(r, "epsilon")}); }},
      {"Dropout", [&] { return std::make_unique<Dropout>(real(r, "rate")); }},
      {"Flatten", [&] { return std::make_unique<Flatten>(); }},
      {"MaxPooling2D", [&] { return std::make_unique<MaxPooling2D>(whole(r, "pool_size", 1, 1024), whole(r, "stride", 1, 1024), padding(r)); }},
      {"AveragePooling2D",
       [&] { return std::make_unique<AveragePooling2D>(whole(r, "pool_size", 1, 1024), whole(r, "stride", 1, 1024), padding(r)); }},
      {"Activation", [&] { return std::make_unique<ActivationLayer>(Activation(static_cast<cohort::Activation>(whole(r, "activation", 0, 4)))); }},
      {"ReLU", [&] { return std::make_unique<ActivationLayer>(ReLU()); }},
      {"Sigmoid", [&] { return std::make_unique<ActivationLayer>(Sigmoid()); }},
      {"Softmax", [&] { return std::make_unique<ActivationLayer>(Softmax()); }},
      {"Normalization", [&] {
         const auto channels = static_cast<std::size_t>(whole(r, "channels", 1, kBig));
         return std::make_unique<Normalization>(std::vector<float>(channels, 0.0f), std::vector<float>(channels, 1.0f));
       }}};
  const auto maker = makers.find(r.type);
  if (maker == makers.end()) throw DataError(fmt::format("layer '{}' has the unknown type '{}'", r.name, r.type));
  try {
    auto layer = maker->second();
    layer->set_name(r.name);
    return layer;
  } catch (const InvalidArgument& e) {
    throw DataError(fmt::format("layer '{}' ({}): {}", r.name, r.type, e.what()));
  }
}

}  // namespace

void save_model(const Sequential& model, const std::filesystem::path& path, const SaveModelOptions& options) {
  ModelRecord record;
  record.input_shape = model.input_shape().dims();
  record.seed = model.seed();
  const bool adds_normalization = !options.input_mean.empty() || !options.input_stddev.empty();
  if (adds_normalization) {
    // Checked and stored as the layer load_model will put first.
    Sequential normalization(model.input_shape());
    auto layer = std::make_unique<Normalization>(options.input_mean, options.input_stddev);
    layer->set_name(kInputNormalization);
    normalization.add(std::move(layer));
    record.layers.push_back({"Normalization", kInputNormalization, *normalization.layer(0).config()});
    const auto values = named_values(normalization);
    record.weights.insert(record.weights.end(), values.begin(), values.end());
  }
  for (std::size_t i = 0; i < model.size(); ++i) {
    const Layer& layer = model.layer(i);
    const auto config = layer.config();
    if (!config)
      throw InvalidArgument(fmt::format("layer '{}' ({}) has no config to rebuild it from: a model file holds built-in "
                                        "layers only; save its weights with nn::save_weights",
                                        layer.name(), layer.type_name()));
    // A loaded model already starts with its input normalization and saves as it is.
    if (adds_normalization && layer.name() == kInputNormalization)
      throw InvalidArgument(fmt::format("the model already has its input normalization (layer '{}'): save it without "
                                        "input_mean and input_stddev",
                                        kInputNormalization));
    record.layers.push_back({layer.type_name(), layer.name(), *config});
  }
  const auto weights = named_values(model);
  record.weights.insert(record.weights.end(), weights.begin(), weights.end());
  write_sealed_file(path, kModelFileMagic, kModelFileFormatVersion, to_archive_bytes(record));
}

Sequential load_model(const std::filesystem::path& path, Device device) {
  const std::string what = fmt::format("model file {}", path.string());
  const auto record = from_archive_bytes<DataError, ModelRecord>(
      read_sealed_file(path, kModelFileMagic, kModelFileFormatVersion, "model file"), what);
  for (const auto d : record.input_shape)
    if (d <= 0 || d > (1 << 24)) throw DataError(fmt::format("{}: input shape has an extent of {}", what, d));
  Sequential model(Shape(record.input_shape), record.seed, device);
  try {
    for (const auto& layer : record.layers) model.add(make_layer(layer));
  } catch (const InvalidArgument& e) {
    throw DataError(fmt::format("{}: {}", what, e.what()));
  } catch (const DataError& e) {
    throw DataError(fmt::format("{}: {}", what, e.what()));
  }
  assign_named_values(model, record.weights, what);
  model.eval();
  return model;
}

}  // namespace cohort::nn
