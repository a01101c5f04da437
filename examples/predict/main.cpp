// Serving a trained model in a program that does not have its code: loads a model file written by
// nn::save_model (e.g. `fashion_mnist --save-model fashion.model`) and reports its accuracy on the raw
// Fashion-MNIST test images; the model file holds the normalization the training data went through.
//   ./build/examples/predict fashion.model
#include <cohort/app/command_line.hpp>
#include <cohort/cohort.hpp>

using namespace cohort;

int main(int argc, char** argv) try {
  std::string model_path, data_dir;
  std::int64_t batch_size = 500;
  CLI::App cli{"Loads a model file and reports its accuracy on the Fashion-MNIST test set."};
  cli.add_option("model", model_path, "a file written by nn::save_model")->required();
  cli.add_option("--data-dir", data_dir, "Fashion-MNIST directory (default: Debian's dataset-fashion-mnist)");
  cli.add_option("--batch-size", batch_size, "images per forward pass")->check(app::whole_number(1, 1 << 20));
  app::parse_or_exit(cli, argc, argv);
  app::check_settings_or_exit();
  nn::Sequential model = nn::load_model(model_path);
  const data::ImageDataset test_set = data::FashionMnist::test(app::fashion_mnist_directory(data_dir));
  const data::DataLoader loader(test_set, {.batch_size = batch_size, .shuffle = false});
  std::int64_t correct = 0;
  auto batches = loader.epoch(0);
  while (auto batch = batches->next()) correct += ops::count_correct(model.forward(batch->images), batch->labels);
  fmt::print("{} layers from {}\n", model.size(), model_path);
  fmt::print("test accuracy: {:.4f}\n", static_cast<double>(correct) / static_cast<double>(test_set.size()));
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
