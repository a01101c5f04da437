#include "scratch.hpp"

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

}  // namespace cohort::cpu
