#pragma once
// Per-thread scratch memory that outlives calls. The CPU kernels' temporary buffers are reused from one
// call to the next instead of being allocated, zeroed and faulted in on every call, which also made
// threads wait on each other in the kernel's page-fault handling. Contents are not initialized.
#include <cstddef>
#include <cstdint>

namespace cohort::cpu {

// The buffers a thread may hold at once; a slot's memory stays valid until the same thread asks for that
// slot again with more floats.
enum class ScratchSlot {
  TransformedKernel,
  TransformedInput,
  TransformedOutput,
  BorderPatch,
  EdgeZeros,
  EdgeSink,
  Columns,
  Partials,
  PaddedRows,
  ColumnSums,
  kCount
};

float* thread_scratch(ScratchSlot slot, std::size_t floats);

// out[i] = the sum over t of partials[t * count + i], added in thread order t = 0, 1, ...: how the threads'
// partial sums (ScratchSlot::Partials) become one result that repeats for a given thread count.
void sum_thread_partials(const float* partials, int threads, std::int64_t count, float* out);

}  // namespace cohort::cpu
