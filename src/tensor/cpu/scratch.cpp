#include "scratch.hpp"

#include <algorithm>
#include <array>
#include <memory>

namespace cohort::cpu {
namespace {

struct Buffer {
  std::unique_ptr<float[]> memory;
  std::size_t floats = 0;
};

}  // namespace

float* thread_scratch(ScratchSlot slot, std::size_t floats) {
  thread_local std::array<Buffer, static_cast<std::size_t>(ScratchSlot::kCount)> buffers;
  Buffer& buffer = buffers[static_cast<std::size_t>(slot)];
  if (buffer.floats < floats) {
    buffer.memory.reset(new float[floats]);  // uninitialized: callers write before they read
    buffer.floats = floats;
  }
  return buffer.memory.get();
}

void sum_thread_partials(const float* partials, int threads, std::int64_t count, float* out) {
  std::copy_n(partials, count, out);
  for (int t = 1; t < threads; ++t)
    for (std::int64_t i = 0; i < count; ++i) out[i] += partials[t * count + i];
}

}  // namespace cohort::cpu
