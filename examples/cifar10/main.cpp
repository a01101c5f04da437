// The flagship example: the Keras CIFAR-10 CNN (as in the SageMaker parameter-server sample), trained
// on the CIFAR-10 binary files when --data-dir points at them, else on Debian's Fashion-MNIST with the
// input shape taken from the data. The same program runs alone or as any process of a cluster:
//   cohort-launch --workers 2 --ps 2 -- ./build/examples/cifar10      (parameter servers, `make demo`)
#include <cohort/cohort.hpp>

using namespace cohort;

int main(int argc, char** argv) try {
  app::TrainingOptions defaults;
  defaults.epochs = 10;
  defaults.batch_size = 128;
  auto options = app::parse_training_options(argc, argv, "Trains the flagship Keras CIFAR-10 CNN.", defaults);
  // About a minute and a half on 2 cores: one full epoch, then the test set. Shorter runs leave the
  // BatchNormalization moving statistics (momentum 0.99) too close to their initial values.
  if (options.demo) options.epochs = 1;
  set_num_threads(options.threads);
  auto cluster = cluster::Cluster::from_environment();
  const auto strategy = train::strategy_for(cluster, app::distributed_options(options));
  const bool chief = strategy->is_chief();

  const bool cifar = !options.data_dir.empty() && data::Cifar10::present(options.data_dir);
  if (!options.data_dir.empty() && !cifar) {
    if (const std::string absent = data::FashionMnist::absence(options.data_dir); !absent.empty())
      throw DataError(fmt::format("--data-dir {} holds neither the CIFAR-10 binary files (data_batch_1..5.bin, "
                                  "test_batch.bin) nor Fashion-MNIST: {} (CIFAR-10's binary version, "
                                  "cifar-10-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html, unpacks into "
                                  "cifar-10-batches-bin; without --data-dir the flagship trains on Debian's "
                                  "dataset-fashion-mnist)",
                                  options.data_dir, absent));
    log::warning("{} does not hold the CIFAR-10 binary files (data_batch_1..5.bin, test_batch.bin): training on the "
                 "Fashion-MNIST there",
                 options.data_dir);
  }
  // Without CIFAR-10 the flagship trains on Fashion-MNIST.
  const auto fashion_dir = cifar ? std::filesystem::path() : app::fashion_mnist_directory(options.data_dir);
  data::ImageDataset train_set = cifar ? data::Cifar10::train(options.data_dir) : data::FashionMnist::train(fashion_dir);
  const data::ImageDataset test_set = cifar ? data::Cifar10::test(options.data_dir) : data::FashionMnist::test(fashion_dir);
  if (options.train_samples > 0) train_set = train_set.head(options.train_samples);
  if (chief)
    fmt::print("data: {} ({} training, {} test samples of shape {})\n", cifar ? "CIFAR-10" : "Fashion-MNIST (CIFAR-10 not given)",
               train_set.size(), test_set.size(), train_set.sample_shape());

  const Device device = app::training_device(options, *strategy);
  nn::Sequential model = nn::cifar10_cnn(train_set.sample_shape(), options.seed, device, app::batch_statistics(options));
  model.set_precision(app::precision(options));
  if (chief) fmt::print("{}", model.summary());
  if (options.summary_only) return 0;

  const auto stats = data::channel_statistics(train_set);
  const auto normalize = data::normalize(stats.mean, stats.stddev);
  train::FitOptions fit = app::fit_options(options);
  // Augmented and normalized where the model trains: on a GPU the loader copies the 8-bit images.
  fit.augmentation = data::ImageAugmentation{
      .crop_padding = cifar ? 4 : 0, .flip_horizontal = cifar, .mean = stats.mean, .stddev = stats.stddev};

  // Evaluation sees the same normalization as training.
  const data::MappedDataset test_view(test_set, {normalize});
  fit.validation = &test_view;

  const int replicas = cluster.spec().replicas();
  const std::int64_t steps_per_epoch = app::steps_per_epoch(train_set.size(), replicas, options);
  const auto schedule = app::scaled_for_workers(optim::constant(options.learning_rate), replicas, steps_per_epoch, options);
  Trainer trainer(model, optim::Adam({.learning_rate = schedule}), strategy);
  const auto history = trainer.fit(train_set, fit);
  if (!chief) return 0;
  app::write_run_outputs(options, history, model, stats);
  const auto& last = history.epochs.back();
  fmt::print("final: train accuracy {:.4f}, test accuracy {:.4f}, {:.0f} images/s per worker\n", last.at("accuracy"),
             last.at("val_accuracy"), last.at("samples_per_second") / replicas);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
