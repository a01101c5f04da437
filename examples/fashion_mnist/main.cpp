// A small CNN on real Fashion-MNIST (Debian's dataset-fashion-mnist), reporting test accuracy after
// every epoch.
#include <cohort/cohort.hpp>

#include "../common/example_options.hpp"

using namespace cohort;

int main(int argc, char** argv) try {
  examples::ExampleOptions defaults;
  defaults.epochs = 5;
  defaults.batch_size = 64;
  auto options = examples::parse_options(argc, argv, "Trains a small CNN on Fashion-MNIST.", defaults);
  if (options.demo && options.train_samples == 0) {
    options.epochs = 1;
    options.train_samples = 10000;
  }
  set_num_threads(options.threads);
  const std::string dir = options.data_dir.empty() ? data::FashionMnist::kDebianDirectory : options.data_dir;
  data::ImageDataset train_set = data::FashionMnist::train(dir);
  const data::ImageDataset test_set = data::FashionMnist::test(dir);
  if (options.train_samples > 0) train_set = train_set.head(options.train_samples);

  nn::Sequential model = nn::small_cnn(train_set.sample_shape(), options.seed);
  fmt::print("{}", model.summary());
  if (options.summary_only) return 0;

  const auto stats = data::channel_statistics(train_set);
  const auto normalize = data::normalize(stats.mean, stats.stddev);
  const data::MappedDataset test_view(test_set, {normalize});
  // Cosine decay to zero over the run: the last epochs refine instead of bouncing around the minimum.
  const std::int64_t steps = options.epochs * ((train_set.size() + options.batch_size - 1) / options.batch_size);
  Trainer trainer(model, optim::Adam({.learning_rate = optim::cosine_decay(options.learning_rate, std::max<std::int64_t>(steps, 1))}));
  const auto history = trainer.fit(train_set, {.epochs = options.epochs,
                                               .max_steps = options.max_steps,
                                               .batch_size = options.batch_size,
                                               .seed = options.seed,
                                               .transforms = {normalize},
                                               .validation = &test_view,
                                               .checkpoint_dir = options.checkpoint_dir,
                                               .resume = options.resume});
  if (!options.history_csv.empty()) history.write_csv(options.history_csv);
  for (std::size_t e = 0; e < history.epochs.size(); ++e)
    fmt::print("epoch {}: test accuracy {:.4f} ({:.1f} s)\n", e + 1, history.epochs[e].at("val_accuracy"),
               history.epochs[e].at("seconds"));
  fmt::print("test accuracy: {:.4f}\n", history.epochs.back().at("val_accuracy"));
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
