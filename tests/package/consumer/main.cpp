// An outside program that uses the installed cohort package: trains, saves a model file and loads it,
// and checks that the installed config.hpp says what the library was built with.
#include <cohort/cohort.hpp>

#include <cstdio>
#include <filesystem>

int main() {
  using namespace cohort;
  const auto set = data::make_synthetic({.samples = 64, .sample_shape = {4, 4, 1}, .classes = 2});
  nn::Sequential model({4, 4, 1});
  model.add(nn::Flatten()).add(nn::Dense(2)).add(nn::Softmax());
  Trainer trainer(model, optim::SGD(), std::make_shared<train::Local>(), {.metrics = {"accuracy", "top_2_accuracy"}});
  const auto history = trainer.fit(set, {.epochs = 1, .batch_size = 16, .verbosity = train::Verbosity::Silent});
  const auto path = std::filesystem::temp_directory_path() / "cohort_consumer.model";
  nn::save_model(model, path);
  const nn::Sequential loaded = nn::load_model(path);
  std::filesystem::remove(path);

  bool backend_built = true;
  try {
    Tensor probe({1}, Device::CUDA);
  } catch (const DeviceError& e) {
    backend_built = std::string(e.what()).find("has no cuda backend") == std::string::npos;
  }
  if (backend_built != static_cast<bool>(COHORT_HAS_CUDA)) {
    std::fprintf(stderr, "config.hpp says COHORT_HAS_CUDA %d, the library %s a CUDA backend\n", COHORT_HAS_CUDA,
                 backend_built ? "has" : "lacks");
    return 1;
  }
  fmt::print("consumer trained: loss {:.4f}, {} layers loaded, COHORT_HAS_CUDA {}, cohort {}\n", history.epochs.back().at("loss"),
             loaded.size(), COHORT_HAS_CUDA, COHORT_VERSION_STRING);
  return 0;
}
