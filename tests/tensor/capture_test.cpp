// Captured work (tensor/capture.hpp) on the emulated device, which records as a GPU's stream capture does, and
// the caching allocator's private pools that keep a capture's blocks for it.
#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/tensor/allocator.hpp"
#include "cohort/tensor/capture.hpp"
#include "cohort/tensor/copy_stream.hpp"
#include "cohort/tensor/ops.hpp"
#include "tensor/capturing_thread.hpp"

using namespace cohort;

namespace {

constexpr Device kDevice = Device::Emulated;

Tensor on_device(std::vector<float> values) {
  return Tensor::from_values({static_cast<std::int64_t>(values.size())}, values).to(kDevice);
}

}  // namespace

TEST_CASE("captured work runs only when replayed, on the buffers it was recorded with", "[capture]") {
  const Tensor input = on_device({1, 2, 3}), output(Shape{3}, kDevice);
  auto work = ops::capture(kDevice, [&] {
    ops::copy(input, output);
    ops::scale(output, 2.0f);
  });
  CHECK(output.to_vector() == std::vector<float>{0, 0, 0});  // recording ran nothing
  work->replay();
  CHECK(output.to_vector() == std::vector<float>{2, 4, 6});
  ops::copy(on_device({5, 6, 7}), input);
  work->replay();
  CHECK(output.to_vector() == std::vector<float>{10, 12, 14});
  CHECK(work->replays() == 2);
}

TEST_CASE("a step value is written before each replay: the recorded one first, then its source's", "[capture]") {
  const Tensor value = on_device({0}), gradient = on_device({1});
  const Tensor rate = ops::scalar(0.0f, kDevice);
  float source = 0.5f;
  auto step = ops::capture(kDevice, [&] {
    ops::set_step_scalar(rate, [&] { return source; });
    ops::sgd_update({{value, gradient, Tensor()}}, rate, 0.0f, false, 0.0f);
  });
  source = 2.0f;  // after recording: the recorded step still takes 0.5
  step->replay();
  CHECK(value.to_vector() == std::vector<float>{-0.5f});
  step->replay();
  CHECK(value.to_vector() == std::vector<float>{-2.5f});
  source = 0.25f;
  step->replay();
  CHECK(value.to_vector() == std::vector<float>{-2.75f});

  // Outside a capture a step value is written at once.
  ops::set_step_scalar(rate, [] { return 4.0f; });
  CHECK(rate.to_vector() == std::vector<float>{4.0f});
  const Tensor counter = ops::step_counter(kDevice);
  ops::set_step_counter(counter, [] { return (std::uint64_t{5} << 32) | 9; });
  const Tensor words = counter.to(Device::CPU);
  CHECK(words.data<std::int32_t>()[0] == 9);
  CHECK(words.data<std::int32_t>()[1] == 5);
  CHECK_THROWS_WITH(ops::set_step_scalar(counter, [] { return 1.0f; }), Catch::Contains("takes a float32 scalar"));
  CHECK_THROWS_WITH(ops::set_step_counter(rate, [] { return 1u; }), Catch::Contains("takes a step counter"));
}

TEST_CASE("work that makes the host wait cannot be captured, and nothing of it ran", "[capture]") {
  const Tensor x = on_device({1, 2});
  for (const char* wait : {"sum", "copy_to_host", "synchronize"}) {
    INFO(wait);
    CHECK_THROWS_WITH(ops::capture(kDevice,
                                   [&] {
                                     ops::scale(x, 3.0f);
                                     if (std::string_view(wait) == "sum") ops::sum(x);
                                     else if (std::string_view(wait) == "copy_to_host") (void)x.to_vector();
                                     else ops::synchronize(kDevice);
                                   }),
                      Catch::Contains(std::string(wait) + " cannot be captured on emulated") &&
                          Catch::Contains("makes the host wait"));
    CHECK_FALSE(ops::capturing(kDevice));
    CHECK(x.to_vector() == std::vector<float>{1, 2});
  }
  // A failure of the work's own ends the capture and propagates unchanged.
  CHECK_THROWS_WITH(ops::capture(kDevice, [] { throw InvalidArgument("the work's own reason"); }),
                    Catch::Equals("the work's own reason"));
  // Then ops run at once again, and a new capture works.
  ops::scale(x, 2.0f);
  CHECK(x.to_vector() == std::vector<float>{2, 4});
  auto work = ops::capture(kDevice, [&] { ops::scale(x, 2.0f); });
  work->replay();
  CHECK(x.to_vector() == std::vector<float>{4, 8});
}

TEST_CASE("the CPU cannot capture, and captures do not nest", "[capture]") {
  CHECK_THROWS_WITH(ops::capture(Device::CPU, [] {}), Catch::Contains("cpu cannot capture work"));
  CHECK_THROWS_WITH(ops::capture(kDevice, [] { ops::capture(kDevice, [] {}); }),
                    Catch::Contains("already under way"));
  CHECK_FALSE(ops::capturing(kDevice));
}

TEST_CASE("while one thread captures, another thread's ops on the device wait for the capture to end, as a GPU's "
          "would join the recording", "[capture][threads]") {
  const Tensor mine = on_device({1}), theirs = on_device({1});
  // Catch's checks are made on this thread alone.
  std::atomic<bool> scaled{false}, other_saw_capture{false}, scaled_during_capture{false};
  std::thread other;
  auto work = ops::capture(kDevice, [&] {
    ops::scale(mine, 5.0f);
    other = std::thread([&] {
      other_saw_capture = ops::capturing(kDevice);
      ops::scale(theirs, 3.0f);
      scaled = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    scaled_during_capture = scaled.load();  // false: it waits while the recording goes on
  });
  other.join();
  CHECK_FALSE(other_saw_capture);
  CHECK_FALSE(scaled_during_capture);
  CHECK(theirs.to_vector() == std::vector<float>{3});
  CHECK(mine.to_vector() == std::vector<float>{1});
  work->replay();  // their op is not part of the recording
  CHECK(mine.to_vector() == std::vector<float>{5});
  CHECK(theirs.to_vector() == std::vector<float>{3});
  // Once the capture has ended, every thread's ops run at once, replays included.
  std::thread replaying([&] {
    ops::scale(theirs, 3.0f);
    work->replay();
  });
  replaying.join();
  CHECK(theirs.to_vector() == std::vector<float>{9});
  CHECK(mine.to_vector() == std::vector<float>{25});
}

TEST_CASE("two threads capture on one device in turn, each its own work", "[capture][threads]") {
  const Tensor first = on_device({1}), second = on_device({1});
  std::unique_ptr<CapturedWork> theirs;
  std::thread other;
  auto mine = ops::capture(kDevice, [&] {
    ops::scale(first, 2.0f);
    other = std::thread([&] { theirs = ops::capture(kDevice, [&] { ops::scale(second, 3.0f); }); });
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  });
  other.join();
  mine->replay();
  theirs->replay();
  CHECK(first.to_vector() == std::vector<float>{2});
  CHECK(second.to_vector() == std::vector<float>{3});
}

TEST_CASE("a thread waits for another's capture only so long, then fails naming the device", "[capture][threads]") {
  // The same captures under a limit of 0.1 s, which the op outwaits, and one of 10 s, within which they end.
  CapturingThread impatient(std::chrono::milliseconds(100)), patient(std::chrono::seconds(10));
  impatient.name_device("emulated");
  patient.name_device("emulated");
  std::atomic<bool> claimed{false}, finished{false};
  std::thread capturer([&] {
    impatient.claim();
    patient.claim();
    claimed = true;
    while (!finished) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    impatient.release();
    patient.release();
  });
  while (!claimed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto queue_op = [](const CapturingThread& device) { const auto op = device.enter_op(); };
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(queue_op(impatient),
                    Catch::Contains("emulated has been capturing another thread's work for more than 0.1 s") &&
                        Catch::Contains("does the capturing thread wait on this one?"));
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(100));
  // A capture that ends within the wait lets the waiting thread go on.
  std::thread ender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    finished = true;
  });
  CHECK_NOTHROW(queue_op(patient));
  ender.join();
  capturer.join();
  CHECK_NOTHROW(queue_op(impatient));
}

TEST_CASE("a capture begins once other threads' ops under way are queued, and later ops wait for it",
          "[capture][threads]") {
  CapturingThread capturing;
  capturing.name_device("emulated");
  std::atomic<bool> entered{false}, claimed{false}, claimed_during_op{false}, later_op_done{false};
  std::thread op_thread([&] {
    const auto op = capturing.enter_op();
    entered = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    claimed_during_op = claimed.load();  // false: the capture waits for this op
  });
  while (!entered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  capturing.claim();
  claimed = true;
  std::thread later([&] {
    const auto op = capturing.enter_op();
    later_op_done = true;
  });
  // Within the capture, this thread's ops hold no place, and it may not wait on the later op.
  { const auto mine = capturing.enter_op(); }
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  CHECK_FALSE(later_op_done);
  CHECK_THROWS_WITH(capturing.claim(), Catch::Contains("already under way"));
  capturing.release();
  op_thread.join();
  later.join();
  CHECK_FALSE(claimed_during_op);
  CHECK(later_op_done);
  // An op's place is held once per thread, and no capture begins inside one.
  const auto outer = capturing.enter_op();
  { const auto inner = capturing.enter_op(); }
  CHECK_THROWS_WITH(capturing.claim(), Catch::Contains("cannot begin inside an op"));
}

TEST_CASE("a copy stream cannot be used in a capture, as a GPU's would join the recording", "[capture]") {
  const Tensor into = on_device({0, 0});
  const Tensor host = Tensor::from_values({2}, std::vector<float>{7, 8});
  CopyStream stream(kDevice);
  CHECK_THROWS_WITH(ops::capture(kDevice, [&] { stream.copy(host, into); }),
                    Catch::Contains("CopyStream::copy cannot be captured on emulated") &&
                        Catch::Contains("copy before the capture or after it"));
  CHECK_THROWS_WITH(ops::capture(kDevice, [&] { stream.synchronize(); }),
                    Catch::Contains("CopyStream::synchronize cannot be captured on emulated"));
  CHECK(into.to_vector() == std::vector<float>{0, 0});  // the refused copy did not run
  // The stream made before the captures works after them.
  stream.copy(host, into);
  stream.synchronize();
  CHECK(into.to_vector() == std::vector<float>{7, 8});
}

TEST_CASE("a step value is set once per capture, on a tensor made before it", "[capture]") {
  const Tensor rate = ops::scalar(1.0f, kDevice);
  CHECK_THROWS_WITH(ops::capture(kDevice,
                                 [&] {
                                   ops::set_step_scalar(rate, [] { return 1.0f; });
                                   ops::set_step_scalar(rate, [] { return 2.0f; });
                                 }),
                    Catch::Contains("sets the same step value twice"));
  CHECK_THROWS_WITH(ops::capture(kDevice, [] { (void)ops::scalar(1.0f, kDevice); }),
                    Catch::Contains("ops::scalar while work is captured on emulated: make the tensor before the capture"));
  CHECK_THROWS_WITH(ops::capture(kDevice, [] { (void)ops::step_counter(kDevice); }),
                    Catch::Contains("ops::step_counter while work is captured"));
}

TEST_CASE("captured work keeps the tensors it was recorded with", "[capture]") {
  const Tensor output(Shape{4}, kDevice);
  std::unique_ptr<CapturedWork> work;
  {
    const Tensor temporary = on_device({1, 1, 1, 1});
    work = ops::capture(kDevice, [&] {
      const Tensor doubled(Shape{4}, kDevice);  // freed before the first replay
      ops::copy(temporary, doubled);
      ops::scale(doubled, 2.0f);
      ops::copy(doubled, output);
    });
  }
  work->replay();
  work->replay();
  CHECK(output.to_vector() == std::vector<float>{2, 2, 2, 2});
}

TEST_CASE("a private pool keeps its blocks for its captured work until the work is gone", "[capture][allocator]") {
  CachingAllocator allocator(std::make_unique<HostAllocator>("test"));
  void* before = allocator.allocate(1000);
  allocator.deallocate(before, 1000);  // an ordinary cached block

  std::shared_ptr<void> hold = allocator.begin_private_pool();
  void* first = allocator.allocate(1000);
  CHECK(first == before);  // free ordinary blocks serve a capture too
  allocator.deallocate(first, 1000);
  void* again = allocator.allocate(1000);
  CHECK(again == first);  // the capture reuses what its own work freed
  void* kept = allocator.allocate(5000);
  allocator.deallocate(again, 1000);
  allocator.end_private_pool();

  CHECK(allocator.stats().in_use == CachingAllocator::size_class(5000));  // `kept`; the freed 1000 is cached
  void* outside = allocator.allocate(1000);
  CHECK(outside != first);  // the pool's free block is the captured work's alone
  allocator.deallocate(outside, 1000);
  {
    const std::shared_ptr<void> other = allocator.begin_private_pool();
    CHECK_THROWS_WITH(allocator.begin_private_pool(), Catch::Contains("a private pool is being filled already"));
    allocator.end_private_pool();
  }

  allocator.release_cached();  // the pool's free block stays the captured work's
  void* after_release = allocator.allocate(1000);
  CHECK(after_release != first);
  allocator.deallocate(after_release, 1000);
  hold.reset();  // the work is gone: its blocks are ordinary again
  void* reused = allocator.allocate(1000);
  CHECK((reused == first || reused == after_release));
  allocator.deallocate(kept, 5000);  // in use when the work went: an ordinary block once freed
  void* reused_large = allocator.allocate(5000);
  CHECK(reused_large == kept);
  allocator.deallocate(reused, 1000);
  allocator.deallocate(reused_large, 5000);
  CHECK(allocator.stats().in_use == 0);
}

TEST_CASE("out of memory while a capture fills its pool fails without returning cached blocks", "[capture][allocator]") {
  CachingAllocator allocator(std::make_unique<HostAllocator>("small", 8192));
  allocator.deallocate(allocator.allocate(4096), 4096);  // cached: 4096 of the 8192 left in use below
  {
    const std::shared_ptr<void> hold = allocator.begin_private_pool();
    // 5120 more does not fit beside the cached block; returning that block would be a GPU's free mid-capture.
    CHECK_THROWS_WITH(allocator.allocate(5000), Catch::Contains("out of memory"));
    CHECK(allocator.stats().cached == 4096);
    allocator.end_private_pool();
  }
  void* fits = allocator.allocate(5000);  // outside a capture the cached block goes back first
  CHECK(allocator.stats().cached == 0);
  allocator.deallocate(fits, 5000);
}
