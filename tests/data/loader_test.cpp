#include <catch2/catch.hpp>
#include <chrono>
#include <set>

#include "cohort/core/error.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/data/mapped_dataset.hpp"
#include "cohort/data/synthetic.hpp"

using namespace cohort;

namespace {

// Sample i is filled with the value i, so batches reveal which samples they hold.
struct IndexDataset : data::Dataset {
  std::int64_t count;
  std::int64_t fail_at = -1;
  explicit IndexDataset(std::int64_t n) : count(n) {}
  std::int64_t size() const override { return count; }
  Shape sample_shape() const override { return {2, 2, 1}; }
  int num_classes() const override { return 10; }
  std::string description() const override { return "index"; }
  int load(std::int64_t index, float* out) const override {
    if (index == fail_at) throw DataError("sample " + std::to_string(index) + " is unreadable");
    std::fill_n(out, 4, static_cast<float>(index));
    return static_cast<int>(index % 10);
  }
};

std::vector<std::int64_t> epoch_indices(const data::DataLoader& loader, std::int64_t epoch, std::int64_t first = 0) {
  std::vector<std::int64_t> seen;
  auto batches = loader.epoch(epoch, first);
  while (auto batch = batches->next())
    for (std::int64_t i = 0; i < batch->labels.numel(); ++i) seen.push_back(static_cast<std::int64_t>(batch->images.data()[i * 4]));
  return seen;
}

}  // namespace

TEST_CASE("an epoch visits every sample exactly once, in a seeded order", "[data][loader]") {
  const IndexDataset set(103);
  const data::DataLoader loader(set, {.batch_size = 10, .seed = 7});
  CHECK(loader.batches_per_epoch() == 11);
  const auto order = epoch_indices(loader, 0);
  CHECK(order.size() == 103);
  CHECK(std::set<std::int64_t>(order.begin(), order.end()).size() == 103);
  CHECK(order == epoch_indices(data::DataLoader(set, {.batch_size = 10, .seed = 7}), 0));
  CHECK(order != epoch_indices(loader, 1));
  CHECK(order != epoch_indices(data::DataLoader(set, {.batch_size = 10, .seed = 8}), 0));
  const data::DataLoader sequential(set, {.batch_size = 10, .shuffle = false});
  const auto in_order = epoch_indices(sequential, 0);
  CHECK(in_order.front() == 0);
  CHECK(in_order.back() == 102);
}

TEST_CASE("the tail batch is kept or dropped on request, resuming mid-epoch continues the same order", "[data][loader]") {
  const IndexDataset set(25);
  const data::DataLoader keep(set, {.batch_size = 10, .seed = 1});
  const data::DataLoader drop(set, {.batch_size = 10, .seed = 1, .drop_remainder = true});
  CHECK(keep.batches_per_epoch() == 3);
  CHECK(drop.batches_per_epoch() == 2);
  CHECK(epoch_indices(drop, 0).size() == 20);
  const auto full = epoch_indices(keep, 3);
  const auto tail = epoch_indices(keep, 3, 1);
  CHECK(std::vector<std::int64_t>(full.begin() + 10, full.end()) == tail);
  CHECK(epoch_indices(keep, 3, 3).empty());
  CHECK_THROWS_AS(keep.epoch(0, 4), InvalidArgument);
}

TEST_CASE("prefetching and inline loading give the same batches", "[data][loader]") {
  const auto set = data::make_synthetic({.samples = 50, .sample_shape = {6, 6, 2}});
  const data::DataLoader ahead(set, {.batch_size = 8, .seed = 3, .transforms = {data::random_crop(2), data::random_flip_horizontal()}, .prefetch = 3});
  const data::DataLoader inline_(set, {.batch_size = 8, .seed = 3, .transforms = {data::random_crop(2), data::random_flip_horizontal()}, .prefetch = 0});
  auto a = ahead.epoch(2);
  auto b = inline_.epoch(2);
  for (;;) {
    auto x = a->next();
    auto y = b->next();
    REQUIRE(x.has_value() == y.has_value());
    if (!x) break;
    CHECK(x->images.to_vector() == y->images.to_vector());
    CHECK(x->labels.to_vector() == y->labels.to_vector());
  }
}

TEST_CASE("a failing sample surfaces as the dataset's error from next(), never a hang", "[data][loader]") {
  IndexDataset set(40);
  set.fail_at = 33;
  const data::DataLoader loader(set, {.batch_size = 4, .shuffle = false, .prefetch = 2});
  auto epoch = loader.epoch(0);
  int good = 0;
  CHECK_THROWS_WITH(([&] { while (epoch->next()) ++good; })(), Catch::Contains("sample 33"));
  CHECK(good == 8);
}

TEST_CASE("dropping an epoch early stops its producer promptly", "[data][loader]") {
  const IndexDataset set(100000);
  const data::DataLoader loader(set, {.batch_size = 16, .prefetch = 4});
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) {
    auto epoch = loader.epoch(i);
    epoch->next();
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

TEST_CASE("augmentation: crops shift with zero fill, flips mirror, normalization standardizes", "[data][transforms]") {
  const Shape shape{2, 3, 1};
  std::vector<float> image = {1, 2, 3, 4, 5, 6};
  std::mt19937_64 rng(1);
  auto flip = data::random_flip_horizontal();
  std::set<std::vector<float>> outcomes;
  for (int i = 0; i < 20; ++i) {
    auto copy = image;
    flip(copy, shape, rng);
    outcomes.insert(copy);
  }
  CHECK(outcomes == std::set<std::vector<float>>{{1, 2, 3, 4, 5, 6}, {3, 2, 1, 6, 5, 4}});

  auto crop = data::random_crop(1);
  for (int i = 0; i < 20; ++i) {
    auto copy = image;
    crop(copy, shape, rng);
    double total = 0;
    for (float v : copy) {
      CHECK((v == 0 || std::find(image.begin(), image.end(), v) != image.end()));
      total += v;
    }
    CHECK(total <= 21);
  }

  const auto set = data::make_synthetic({.samples = 200, .sample_shape = {4, 4, 3}});
  const auto stats = data::channel_statistics(set);
  const data::MappedDataset normalized(set, {data::normalize(stats.mean, stats.stddev)});
  const auto after = data::channel_statistics(normalized);
  for (int c = 0; c < 3; ++c) {
    CHECK(after.mean[c] == Approx(0.0).margin(1e-4));
    CHECK(after.stddev[c] == Approx(1.0).epsilon(1e-3));
  }
  CHECK_THROWS_AS(data::normalize({0.5f}, {0.0f}), InvalidArgument);
}
