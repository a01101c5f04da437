// TLS 1.3 records sealed and opened on one core by each engine this build and processor run (OpenSSL's
// EVP first, the peer; then Intel ipsec-mb for each instruction set), through the record layer the TLS
// transport uses: 1 MiB of data as full 16 KiB records of TLS_AES_128_GCM_SHA256, in the cache and, for
// the cold rows, out of it (256 MiB of data and as much of records).
//
//   ./build/benchmarks/cohort_tls_bench
//   ./build/benchmarks/cohort_tls_bench --benchmark_filter=Open
#include <benchmark/benchmark.h>

#include <optional>
#include <system_error>
#include <vector>

#include "comm/tcp/record_cipher.hpp"
#include "comm/tcp/tls_keys.hpp"
#include "comm/tcp/tls_records.hpp"

using namespace cohort::comm::tcp;

namespace {

constexpr std::size_t kMessageBytes = std::size_t{1} << 20;
constexpr std::size_t kColdBytes = std::size_t{256} << 20;
const std::vector<RecordEngine> kEngines = record_engines();

TrafficKeys keys() { return traffic_keys(CipherSuite::Aes128Gcm, std::vector<unsigned char>(32, 0x5a)); }

// Plaintext and room for its records: one message, or (cold) as many as fill kColdBytes.
struct Buffers {
  explicit Buffers(bool cold)
      : messages(cold ? kColdBytes / kMessageBytes : 1), data(messages * kMessageBytes, 0x42),
        records(messages * (kMessageBytes / kMaxRecordData) * RecordWriter::kMaxSealBytes) {}
  std::size_t messages;
  std::vector<unsigned char> data, records;
  std::span<unsigned char> message(std::size_t i) { return std::span(data).subspan(i % messages * kMessageBytes, kMessageBytes); }
  unsigned char* records_of(std::size_t i) { return records.data() + i % messages * (records.size() / messages); }
};

std::size_t seal_message(RecordWriter& writer, std::span<const unsigned char> message, unsigned char* out) {
  std::size_t written = 0;
  for (std::size_t at = 0; at < message.size(); at += kMaxRecordData)
    written += writer.seal(message.subspan(at, kMaxRecordData), out + written);
  return written;
}

// The engine of the benchmark's first argument, named in its label; none (the run skipped) where this
// processor or build lacks it.
std::optional<RecordEngine> engine_of(benchmark::State& state) {
  const auto index = static_cast<std::size_t>(state.range(0));
  if (index < kEngines.size()) {
    state.SetLabel(describe(kEngines[index]));
    return kEngines[index];
  }
  state.SkipWithError("this processor or build lacks the engine");
  for (auto _ : state) {
  }
  return std::nullopt;
}

void BM_SealRecords(benchmark::State& state) {
  const auto engine = engine_of(state);
  if (!engine) return;
  Buffers buffers(state.range(1) != 0);
  RecordWriter writer(keys(), *engine);
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(seal_message(writer, buffers.message(i), buffers.records_of(i)));
    ++i;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kMessageBytes));
}

void BM_OpenRecords(benchmark::State& state) {
  const auto engine = engine_of(state);
  if (!engine) return;
  Buffers buffers(state.range(1) != 0);
  RecordWriter writer(keys(), *engine);
  std::vector<std::size_t> sealed_bytes;
  for (std::size_t m = 0; m < buffers.messages; ++m) sealed_bytes.push_back(seal_message(writer, buffers.message(m), buffers.records_of(m)));
  // Each record's nonce counts on, so a reader opens the messages once, in order; then a fresh one starts
  // over (outside the timing) with the same keys, which sealed the same records.
  std::optional<RecordReader> reader;
  std::size_t m = buffers.messages;
  for (auto _ : state) {
    if (m == buffers.messages) {
      state.PauseTiming();
      reader.emplace(keys(), *engine);
      m = 0;
      state.ResumeTiming();
    }
    std::error_code error;
    const auto progress = reader->read({buffers.records_of(m), sealed_bytes[m]}, buffers.message(m), error);
    if (error || progress.given != kMessageBytes || progress.consumed != sealed_bytes[m]) {
      state.SkipWithError("the records did not open");
      break;
    }
    ++m;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kMessageBytes));
}

}  // namespace

BENCHMARK(BM_SealRecords)->ArgsProduct({{0, 1, 2, 3, 4}, {0, 1}})->ArgNames({"engine", "cold"})->UseRealTime();
BENCHMARK(BM_OpenRecords)->ArgsProduct({{0, 1, 2, 3, 4}, {0, 1}})->ArgNames({"engine", "cold"})->UseRealTime();

BENCHMARK_MAIN();
