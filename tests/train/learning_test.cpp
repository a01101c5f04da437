// A bounded learning test on real data: a small CNN on six thousand Fashion-MNIST images must end
// far above chance (10%) on held-out test images.
#include <catch2/catch.hpp>

#include "cohort/data/idx.hpp"
#include "cohort/data/mapped_dataset.hpp"
#include "cohort/nn/zoo.hpp"
#include "cohort/optim/adam.hpp"
#include "cohort/train/trainer.hpp"

using namespace cohort;

TEST_CASE("a small CNN learns real Fashion-MNIST", "[train][learning][fashion][long]") {
  if (!data::FashionMnist::present()) {
    WARN("dataset-fashion-mnist is not installed; skipping");
    return;
  }
  const auto train_set = data::FashionMnist::train().head(6000);
  const auto test_set = data::FashionMnist::test().head(2000);
  const auto stats = data::channel_statistics(train_set);
  const auto normalize = data::normalize(stats.mean, stats.stddev);
  const data::MappedDataset test_view(test_set, {normalize});
  nn::Sequential model = nn::small_cnn({28, 28, 1}, 3);
  Trainer trainer(model, optim::Adam());
  const auto history = trainer.fit(train_set, {.epochs = 3, .batch_size = 64, .transforms = {normalize},
                                               .verbosity = train::Verbosity::Silent});
  const auto result = trainer.evaluate(test_view);
  INFO("test accuracy " << result.at("accuracy"));
  CHECK(result.at("accuracy") > 0.75);
  CHECK(history.epochs.back().at("loss") < history.epochs.front().at("loss"));
}
