// A small CNN on real Fashion-MNIST (Debian's dataset-fashion-mnist), reporting test accuracy after
// every epoch. Under cohort-launch (or any cluster environment) it trains data-parallel: with parameter
// servers (cohort-launch --workers 2 --ps 2 -- ./build/examples/fashion_mnist) or, without ps tasks, with
// ring allreduce (cohort-launch --workers 2 -- ./build/examples/fashion_mnist).
#include <cohort/cohort.hpp>

using namespace cohort;

int main(int argc, char** argv) try {
  app::TrainingOptions defaults;
  defaults.epochs = 5;
  defaults.batch_size = 64;
  auto options = app::parse_training_options(
      argc, argv, "Trains a small CNN on Fashion-MNIST, its learning rate decaying along a cosine to 0 at the run's end.", defaults);
  if (options.demo && options.train_samples == 0) {
    options.epochs = 1;
    options.train_samples = 10000;
  }
  set_num_threads(options.threads);
  auto cluster = cluster::Cluster::from_environment();
  const int replicas = cluster.spec().replicas();
  const auto strategy = train::strategy_for(cluster, app::distributed_options(options));
  const bool chief = strategy->is_chief();
  const auto dir = app::fashion_mnist_directory(options.data_dir);
  data::ImageDataset train_set = data::FashionMnist::train(dir);
  const data::ImageDataset test_set = data::FashionMnist::test(dir);
  if (options.train_samples > 0) train_set = train_set.head(options.train_samples);

  const Device device = app::training_device(options, *strategy);
  nn::Sequential model = nn::small_cnn(train_set.sample_shape(), options.seed, device, app::batch_statistics(options));
  model.set_precision(app::precision(options));
  if (chief) fmt::print("{}", model.summary());
  if (options.summary_only) return 0;

  const auto stats = data::channel_statistics(train_set);
  const auto normalize = data::normalize(stats.mean, stats.stddev);
  const data::MappedDataset test_view(test_set, {normalize});
  // Cosine decay to zero over the run: the last epochs refine instead of bouncing around the minimum. With
  // several replicas the global batch grows, so the rate grows with it after a one-epoch warm-up.
  const std::int64_t steps_per_epoch = app::steps_per_epoch(train_set.size(), replicas, options);
  const auto schedule = app::scaled_for_workers(
      optim::cosine_decay(options.learning_rate, std::max<std::int64_t>(options.epochs * steps_per_epoch, 1)), replicas,
      steps_per_epoch, options);
  Trainer trainer(model, optim::Adam({.learning_rate = schedule}), strategy);
  train::FitOptions fit = app::fit_options(options);
  // Normalized where the model trains: on a GPU the loader copies the 8-bit images, a quarter of the bytes.
  fit.augmentation = data::ImageAugmentation{.mean = stats.mean, .stddev = stats.stddev};
  fit.validation = &test_view;
  const auto history = trainer.fit(train_set, fit);
  if (!chief) return 0;
  app::write_run_outputs(options, history, model, stats);
  for (std::size_t e = 0; e < history.epochs.size(); ++e)
    fmt::print("epoch {}: test accuracy {:.4f} ({:.1f} s)\n", e + 1, history.epochs[e].at("val_accuracy"),
               history.epochs[e].at("seconds"));
  fmt::print("test accuracy: {:.4f}\n", history.epochs.back().at("val_accuracy"));
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
