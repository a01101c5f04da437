#pragma once
// The parameter-server wire protocol, above an authenticated Transport. Every request and every reply is
// a fixed-size header on one tag, followed (when payload_bytes > 0) by the payload on another, so that a
// server reads the header, checks it, and only then accepts exactly the announced payload.
//
// A payload of floats follows the server's shards in plan order: gradients (trainable) and changes of
// the value since the last read (non-trainable: BatchNormalization's moving statistics) in a Push, values
// in an Init and in every answer to Init, Pull and Push. A Push may carry them as bfloat16 instead (half
// the bytes; the header says so), which the server widens before it adds them in double. A Push flagged
// kNotFinite (a loss-scaled worker's gradients overflowed) is not applied: under Sync its whole step is
// skipped, on every server alike, since every worker's flag reaches every server; the answers say so
// (kStepSkipped) and name the first worker and variable that overflowed. Headers carry the plan fingerprint, so a process
// built with another model or placement is refused, and a CRC-32C of the payload, so garbled bytes are.
// Byte order is the hosts'; cohort runs on little-endian machines.
//
// In place: where the transport lets a process read its peers' memory (every process on one host), the
// floats need not travel as messages. A server says in its answers that it reads the worker's memory
// (kReadsYourMemory); the worker's later Pushes then carry, instead of the floats, where each shard's floats
// lie in its memory (kPayloadInPlace: one MemoryRange per shard, in plan order: straight from the variables'
// gradients), and the server reads them from there. A worker that reads the servers' memory asks for its
// values in place (kAnswerInPlace), and the answer names where each shard's values lie in the server's
// memory (kValuesInPlace: one MemoryRange per shard), which the worker reads straight into its variables.
// Each side keeps the bytes it named unchanged until the other has read them: the worker until the answer,
// the server until the worker's next request. The CRC then covers the ranges; the floats never cross a wire.

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "cohort/comm/transport.hpp"

namespace cohort::ps::protocol {

static_assert(std::endian::native == std::endian::little, "the parameter-server protocol assumes little-endian hosts");

inline constexpr comm::Tag kRequestTag = 0x5053524551000000ull;         // "PSREQ"
inline constexpr comm::Tag kRequestPayloadTag = 0x5053524551000001ull;
inline constexpr comm::Tag kReplyTag = 0x5053524550000000ull;           // "PSREP"
inline constexpr comm::Tag kReplyPayloadTag = 0x5053524550000001ull;

inline constexpr std::uint32_t kRequestMagic = 0x51535043;  // "CPSQ"
inline constexpr std::uint32_t kReplyMagic = 0x52535043;    // "CPSR"
// 3: a Push may carry bfloat16 gradients; 4: replies carry the rate factor; 5: skipped loss-scaled steps;
// 6: payloads read in place
inline constexpr std::uint16_t kVersion = 6;

enum class Kind : std::uint16_t {
  Init = 1,   // the chief's starting values (payload: values)
  Pull = 2,   // current values, once initialized
  Push = 3,   // gradients of step `step` over `samples` samples (payload), answered with the new values
  Save = 4,   // write this server's snapshot for checkpoint step `step`; answered with its size and CRC
  Stats = 5,  // the server's counters
  Done = 6,   // this worker is finished; from the chief it also ends the run
};

inline std::string_view kind_name(std::uint16_t kind) {
  switch (static_cast<Kind>(kind)) {
    case Kind::Init: return "Init";
    case Kind::Pull: return "Pull";
    case Kind::Push: return "Push";
    case Kind::Save: return "Save";
    case Kind::Stats: return "Stats";
    case Kind::Done: return "Done";
  }
  return "unknown request";
}

struct RequestHeader {
  std::uint32_t magic = kRequestMagic;
  std::uint16_t version = kVersion;
  std::uint16_t kind = 0;
  std::uint64_t plan_fingerprint = 0;
  std::int64_t step = 0;
  std::int64_t samples = 0;
  std::uint64_t payload_bytes = 0;
  std::uint32_t payload_crc = 0;
  std::uint32_t payload_dtype = 0;  // its elements' DType code: float32, or bfloat16 in a Push
  double learning_rate_factor = 1;  // of a Push: the workers' agreed factor on the optimizer's schedule
  std::uint32_t flags = 0;           // kNotFinite
  std::int32_t overflow_shard = -1;  // kNotFinite: the plan's index of the first shard whose gradient overflowed
};
static_assert(sizeof(RequestHeader) == 64);

// Request flags.
inline constexpr std::uint32_t kNotFinite = 1;       // this Push's gradients are not all finite
inline constexpr std::uint32_t kPayloadInPlace = 2;  // the payload names where the server reads this Push's floats
inline constexpr std::uint32_t kAnswerInPlace = 4;   // answer a Pull or Push with where to read the values

// Where a payload's floats lie in the memory of the process that sent it.
struct MemoryRange {
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
};
static_assert(sizeof(MemoryRange) == 16);

// Failed: the server stopped serving (a worker stuck or lost); the message says why and names the process.
// It may come unasked, as the answer to a worker's next request.
enum class Status : std::uint16_t { Ok = 0, Refused = 1, Failed = 2 };

// Reply flags.
inline constexpr std::uint32_t kRunEnded = 1;         // the chief has ended the run
inline constexpr std::uint32_t kStepSkipped = 2;      // the answered Push was not applied (kNotFinite)
inline constexpr std::uint32_t kValuesInPlace = 4;    // the payload is one MemoryRange per shard (kAnswerInPlace)
inline constexpr std::uint32_t kReadsYourMemory = 8;  // this server reads the worker's memory: Push with kPayloadInPlace

struct ReplyHeader {
  std::uint32_t magic = kReplyMagic;
  std::uint16_t version = kVersion;
  std::uint16_t status = 0;
  std::int64_t step = 0;       // updates the server has applied
  std::int64_t staleness = 0;  // of the answered push
  std::uint64_t payload_bytes = 0;
  std::uint32_t payload_crc = 0;
  std::uint32_t flags = 0;
  double learning_rate_factor = 0;  // the server's updates' (the chief's), so that every worker logs the rate in use
  std::int32_t overflow_worker = -1;  // kStepSkipped: the first worker whose Push was flagged kNotFinite
  std::int32_t overflow_shard = -1;   // and its overflow_shard
  std::int64_t optimizer_iterations = 0;  // updates applied: `step` less the skipped steps
  char message[192] = {};      // why a request was refused, or serving failed
};
static_assert(sizeof(ReplyHeader) == 256);

inline void set_message(ReplyHeader& header, std::string_view text) {
  const std::size_t n = std::min(text.size(), sizeof header.message - 1);
  std::memcpy(header.message, text.data(), n);
  header.message[n] = '\0';
}

inline std::string message_of(const ReplyHeader& header) {
  return std::string(header.message, strnlen(header.message, sizeof header.message));
}

// What a Save answers with.
struct SnapshotReceipt {
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
  std::uint32_t reserved = 0;
};
static_assert(sizeof(SnapshotReceipt) == 16);

}  // namespace cohort::ps::protocol
