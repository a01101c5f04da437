#include "cohort/data/loader.hpp"

#include <algorithm>
#include <limits>

#include "cohort/core/check.hpp"
#include "cohort/core/seed.hpp"

namespace cohort::data {

DataLoader::DataLoader(const Dataset& dataset, LoaderOptions options, std::shared_ptr<const Sampler> sampler)
    : dataset_(dataset), options_(std::move(options)), sampler_(std::move(sampler)) {
  COHORT_CHECK(options_.batch_size > 0, "batch size must be positive, got {}", options_.batch_size);
  COHORT_CHECK(options_.prefetch >= 0, "prefetch must be >= 0, got {}", options_.prefetch);
  COHORT_CHECK(options_.replicas >= 1 && options_.replica >= 0 && options_.replica < options_.replicas,
               "replica {} of {} is not a valid share", options_.replica, options_.replicas);
  if (options_.byte_images) {
    COHORT_CHECK(dataset_.stores_bytes() && dataset_.target_shape().rank() == 0,
                 "byte images need a data set that gives its class-labelled samples as 8-bit values (an ImageDataset); "
                 "'{}' does not (stores_bytes() is false, or its targets are not classes)",
                 dataset_.description());
    COHORT_CHECK(options_.transforms.empty(),
                 "byte images and host transforms both given: the image augmentation describes the whole pipeline");
    transforms_of(*options_.byte_images);  // its parameters checked now, not in the first batch
  }
  COHORT_CHECK(!options_.sample_indices_only || options_.byte_images,
               "batches of sample indices only are for byte images (byte_images unset)");
  COHORT_CHECK(dataset_.size() <= std::numeric_limits<std::int32_t>::max() || !options_.sample_indices_only,
               "{} has {} samples, more than an int32 index reaches", dataset_.description(), dataset_.size());
  if (!sampler_) {
    if (options_.shuffle) sampler_ = std::make_shared<ShuffleSampler>(dataset_.size(), options_.seed);
    else sampler_ = std::make_shared<SequentialSampler>(dataset_.size());
  }
  order_size_ = static_cast<std::int64_t>(sampler_->indices(0).size());
}

std::int64_t DataLoader::batches_per_epoch() const {
  const std::int64_t global_batch = options_.batch_size * options_.replicas;
  return options_.drop_remainder ? order_size_ / global_batch : (order_size_ + global_batch - 1) / global_batch;
}

std::int64_t DataLoader::samples_per_epoch() const {
  return options_.drop_remainder ? batches_per_epoch() * options_.batch_size * options_.replicas : order_size_;
}

Tensor DataLoader::host_tensor(Shape shape, DType type) const {
  return options_.pinned ? Tensor::pinned(std::move(shape), type) : Tensor(std::move(shape), type);
}

Batch DataLoader::make_batch(const std::vector<std::int64_t>& order, std::int64_t epoch, std::int64_t batch_index) const {
  const std::int64_t begin = (batch_index * options_.replicas + options_.replica) * options_.batch_size;
  const std::int64_t count =
      std::clamp<std::int64_t>(static_cast<std::int64_t>(order.size()) - begin, 0, options_.batch_size);
  const std::span<const std::int64_t> samples =
      std::span(order).subspan(static_cast<std::size_t>(count > 0 ? begin : 0), static_cast<std::size_t>(count));
  const std::uint64_t epoch_seed = derive_seed(options_.seed, static_cast<std::uint64_t>(epoch));
  if (options_.byte_images) return make_byte_batch(samples, epoch_seed, batch_index);
  const Shape sample_shape = dataset_.sample_shape();
  const std::int64_t sample_size = sample_shape.numel();
  const Shape target_shape = dataset_.target_shape();
  const std::int64_t target_size = target_shape.numel();
  Batch batch{host_tensor(sample_shape.batched(count)), host_tensor(target_shape.batched(count)), batch_index, {}, {}};
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t index = samples[static_cast<std::size_t>(i)];
    float* sample = batch.images.data() + i * sample_size;
    dataset_.load_example(index, sample, batch.labels.data() + i * target_size);
    if (options_.transforms.empty()) continue;
    std::mt19937_64 rng(derive_seed(epoch_seed, static_cast<std::uint64_t>(index)));
    for (const auto& transform : options_.transforms)
      transform({sample, static_cast<std::size_t>(sample_size)}, sample_shape, rng);
  }
  return batch;
}

Batch DataLoader::make_byte_batch(std::span<const std::int64_t> samples, std::uint64_t epoch_seed,
                                  std::int64_t batch_index) const {
  const auto count = static_cast<std::int64_t>(samples.size());
  const std::int64_t sample_size = dataset_.sample_shape().numel();
  Batch batch{{}, host_tensor({count}), batch_index, host_tensor({count, 3}, DType::Int32), {}};
  // Without images in the batch, each sample's bytes pass through one buffer on their way to its label.
  std::vector<std::uint8_t> passing(options_.sample_indices_only ? static_cast<std::size_t>(sample_size) : 0);
  if (options_.sample_indices_only) batch.indices = host_tensor({count}, DType::Int32);
  else batch.images = host_tensor(dataset_.sample_shape().batched(count), DType::UInt8);
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t index = samples[static_cast<std::size_t>(i)];
    std::uint8_t* bytes = options_.sample_indices_only ? passing.data() : batch.images.data<std::uint8_t>() + i * sample_size;
    batch.labels.data()[i] = static_cast<float>(dataset_.load_bytes(index, bytes));
    if (options_.sample_indices_only) batch.indices.data<std::int32_t>()[i] = static_cast<std::int32_t>(index);
    std::mt19937_64 rng(derive_seed(epoch_seed, static_cast<std::uint64_t>(index)));
    const auto drawn = draw(*options_.byte_images, rng);
    std::copy(drawn.begin(), drawn.end(), batch.draws.data<std::int32_t>() + i * 3);
  }
  return batch;
}

std::unique_ptr<DataLoader::Epoch> DataLoader::epoch(std::int64_t epoch, std::int64_t first_batch) const {
  COHORT_CHECK(first_batch >= 0 && first_batch <= batches_per_epoch(), "first batch {} outside [0, {}]", first_batch,
               batches_per_epoch());
  return std::unique_ptr<Epoch>(new Epoch(*this, epoch, first_batch));
}

DataLoader::Epoch::Epoch(const DataLoader& loader, std::int64_t epoch, std::int64_t first_batch)
    : loader_(loader),
      epoch_(epoch),
      order_(loader.sampler_->indices(epoch)),
      next_to_produce_(first_batch),
      next_to_return_(first_batch) {
  if (loader_.options_.prefetch > 0) producer_ = std::thread([this] { produce(); });
}

DataLoader::Epoch::~Epoch() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (producer_.joinable()) producer_.join();
}

void DataLoader::Epoch::produce() {
  const std::int64_t end = loader_.batches_per_epoch();
  try {
    for (;;) {
      std::int64_t index;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] {
          return stopping_ || static_cast<int>(ready_.size()) < loader_.options_.prefetch;
        });
        if (stopping_ || next_to_produce_ >= end) return;
        index = next_to_produce_++;
      }
      Batch batch = loader_.make_batch(order_, epoch_, index);
      {
        const std::lock_guard lock(mutex_);
        ready_.push_back(std::move(batch));
      }
      changed_.notify_all();
    }
  } catch (...) {
    {
      const std::lock_guard lock(mutex_);
      failure_ = std::current_exception();
    }
    changed_.notify_all();
  }
}

std::optional<Batch> DataLoader::Epoch::next() {
  const std::int64_t end = loader_.batches_per_epoch();
  if (next_to_return_ >= end) return std::nullopt;
  if (!producer_.joinable()) return loader_.make_batch(order_, epoch_, next_to_return_++);
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !ready_.empty() || failure_ != nullptr; });
  if (ready_.empty()) std::rethrow_exception(failure_);
  Batch batch = std::move(ready_.front());
  ready_.pop_front();
  ++next_to_return_;
  lock.unlock();
  changed_.notify_all();
  return batch;
}

}  // namespace cohort::data
