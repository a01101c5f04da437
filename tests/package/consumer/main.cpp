// An outside program that uses the installed cohort package.
#include <cohort/cohort.hpp>

int main() {
  using namespace cohort;
  const auto set = data::make_synthetic({.samples = 64, .sample_shape = {4, 4, 1}, .classes = 2});
  nn::Sequential model({4, 4, 1});
  model.add(nn::Flatten()).add(nn::Dense(2)).add(nn::Softmax());
  Trainer trainer(model, optim::SGD());
  const auto history = trainer.fit(set, {.epochs = 1, .batch_size = 16, .verbosity = train::Verbosity::Silent});
  fmt::print("consumer trained: loss {:.4f}, cohort {}\n", history.epochs.back().at("loss"), COHORT_VERSION_STRING);
  return 0;
}
