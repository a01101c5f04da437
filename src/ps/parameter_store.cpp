#include "cohort/ps/parameter_store.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "cohort/core/check.hpp"
#include "cohort/core/timeline.hpp"
#include "core/crc32c.hpp"
#include "ps/protocol.hpp"
#include "ps/stats_codec.hpp"

namespace cohort::ps {
namespace {

using Clock = std::chrono::steady_clock;
namespace proto = protocol;

// A server bounds its own waits for the other workers by the same deadline and answers with the culprit
// when it gives up, so a worker waits longer than that before it calls the server itself stuck.
constexpr int kReplySlack = 2;

}  // namespace

ParameterStore::ParameterStore(comm::Transport& transport, Plan plan, std::vector<int> server_ranks,
                               std::vector<LocalVariable> variables, std::chrono::milliseconds progress_timeout,
                               DType push_dtype)
    : push_dtype_(push_dtype),
      transport_(transport),
      plan_(std::move(plan)),
      variables_(std::move(variables)),
      deadline_(progress_timeout.count() > 0 ? progress_timeout : transport.timeout()) {
  COHORT_CHECK(static_cast<int>(server_ranks.size()) == plan_.servers(), "the plan places on {} servers, {} ranks given",
               plan_.servers(), server_ranks.size());
  std::map<std::string, std::size_t> by_name;
  for (std::size_t i = 0; i < variables_.size(); ++i) by_name[variables_[i].name] = i;
  for (int rank : server_ranks) links_.push_back({.rank = rank});
  for (const Shard& shard : plan_.shards()) {
    const auto it = by_name.find(shard.variable);
    COHORT_CHECK(it != by_name.end(), "the plan holds '{}', which the model lacks", shard.variable);
    const LocalVariable& variable = variables_[it->second];
    COHORT_CHECK(variable.trainable == shard.trainable && (!variable.trainable || variable.gradient.defined()),
                 "'{}' is {}trainable in the model but not in the plan", variable.name, variable.trainable ? "" : "not ");
    Link& link = links_[static_cast<std::size_t>(shard.server)];
    const std::int64_t row = row_elements(variable.value.shape());
    pieces_of_.resize(variables_.size());
    pieces_of_[it->second].emplace_back(static_cast<std::size_t>(shard.server), link.pieces.size());
    if (variable.trainable) ++link.trainable_pieces;
    link.pieces.push_back({.variable = it->second,
                           .element_begin = shard.row_begin * row,
                           .count = shard.shape.numel(),
                           .offset = link.outgoing.size()});
    link.outgoing.resize(link.outgoing.size() + static_cast<std::size_t>(shard.shape.numel()));
  }
  std::uint64_t largest_reply = 0;
  for (Link& link : links_) {
    link.last_read.resize(link.outgoing.size());
    link.request.resize(sizeof(proto::RequestHeader));
    if (push_dtype_ == DType::BFloat16) link.outgoing_bfloat16.resize(link.outgoing.size());
    link.request_ranges.resize(link.pieces.size() * sizeof(proto::MemoryRange));
    link.values_ranges.resize(link.pieces.size() * sizeof(proto::MemoryRange));
    largest_reply = std::max<std::uint64_t>(largest_reply, link.outgoing.size() * sizeof(float));
  }
  transport_.expect_messages_up_to(largest_reply);
  traffic_.servers.resize(links_.size());
}

std::span<float> ParameterStore::values_of(const Piece& piece) const {
  return {variables_[piece.variable].value.data() + piece.element_begin, static_cast<std::size_t>(piece.count)};
}

std::span<const std::byte> ParameterStore::piece_bytes(const Link& link, const Piece& piece, std::uint16_t kind) const {
  const LocalVariable& variable = variables_[piece.variable];
  const auto count = static_cast<std::size_t>(piece.count);
  // Init: the values; a Push: a float32 gradient straight from its variable, the rest as packed (changes,
  // bfloat16 narrowing).
  if (kind == static_cast<std::uint16_t>(proto::Kind::Init))
    return std::as_bytes(values_of(piece));
  if (push_dtype_ == DType::BFloat16) return std::as_bytes(std::span(link.outgoing_bfloat16.data() + piece.offset, count));
  if (variable.trainable) return std::as_bytes(std::span(variable.gradient.data() + piece.element_begin, count));
  return std::as_bytes(std::span(link.outgoing.data() + piece.offset, count));
}

void ParameterStore::send_request(Link& link, std::uint16_t kind, std::int64_t samples, bool with_payload,
                                  std::optional<std::int64_t> step, std::vector<comm::WorkPtr>& sends, std::int32_t overflow_shard) {
  const bool push = kind == static_cast<std::uint16_t>(proto::Kind::Push);
  const bool in_place = with_payload && push && link.server_reads_me;
  std::vector<std::span<const std::byte>> pieces;
  std::size_t floats_bytes = 0;
  auto* ranges = reinterpret_cast<proto::MemoryRange*>(link.request_ranges.data());
  std::uint32_t crc = 0;
  for (std::size_t i = 0; with_payload && i < link.pieces.size(); ++i) {
    const auto bytes = piece_bytes(link, link.pieces[i], kind);
    floats_bytes += bytes.size();
    if (in_place) {
      ranges[i] = {.address = reinterpret_cast<std::uintptr_t>(bytes.data()), .bytes = bytes.size()};
    } else {
      crc = crc32c_extend(crc, bytes.data(), bytes.size());
      pieces.push_back(bytes);
    }
  }
  if (in_place) {
    pieces = {link.request_ranges};
    crc = crc32c_of(link.request_ranges.data(), link.request_ranges.size());
  }
  std::erase_if(pieces, [](const auto& piece) { return piece.empty(); });  // nothing empty travels
  proto::RequestHeader header;
  header.kind = kind;
  header.plan_fingerprint = plan_.fingerprint();
  header.step = step.value_or(link.step);
  header.samples = samples;
  header.learning_rate_factor = learning_rate_factor_;
  header.payload_bytes = in_place ? link.request_ranges.size() : floats_bytes;
  header.payload_crc = crc;
  header.payload_dtype = static_cast<std::uint32_t>(with_payload && push ? push_dtype_ : DType::Float32);
  if (overflow_shard >= 0) {
    header.flags = proto::kNotFinite;
    header.overflow_shard = overflow_shard;
  }
  if (in_place) header.flags |= proto::kPayloadInPlace;
  const bool answered_with_values = push || kind == static_cast<std::uint16_t>(proto::Kind::Pull);
  if (answered_with_values) {
    if (server_memory() != nullptr) header.flags |= proto::kAnswerInPlace;
    post_value_receives(link);
  }
  // Kept in the link: the transport reads the bytes until the send completes.
  std::memcpy(link.request.data(), &header, sizeof header);
  sends.push_back(transport_.send(link.rank, proto::kRequestTag, link.request));
  for (const auto& piece : pieces) sends.push_back(transport_.send(link.rank, proto::kRequestPayloadTag, piece));
  const auto server = static_cast<std::size_t>(&link - links_.data());
  ++traffic_.servers[server].requests;
  traffic_.servers[server].bytes_sent += static_cast<std::int64_t>(sizeof header + floats_bytes);
}

void ParameterStore::send_to_all(std::uint16_t kind, std::int64_t samples, bool with_payload, std::optional<std::int64_t> step) {
  // Every server's request goes out before any is waited for, so that the transfers overlap.
  std::vector<comm::WorkPtr> sends;
  for (Link& link : links_) send_request(link, kind, samples, with_payload, step, sends);
  comm::wait_all(sends, transport_.timeout());
}

proto::ReplyHeader ParameterStore::receive_header(Link& link, std::uint16_t kind) {
  auto received = std::make_shared<proto::ReplyHeader>();
  const auto limit = kReplySlack * deadline_.limit();
  const std::string server = transport_.describe(link.rank);
  if (!deadline_.await(transport_.recv(link.rank, proto::kReplyTag, std::as_writable_bytes(std::span(received.get(), 1))), limit,
                       received))
    throw TimeoutError(comm::stuck_message(server + " is stuck", fmt::format("it did not answer {}", proto::kind_name(kind)), limit));
  const proto::ReplyHeader header = *received;
  if (header.magic != proto::kReplyMagic || header.version != proto::kVersion)
    throw ProtocolError(fmt::format("{} answered {} with a malformed header (magic {:08x}, version {})", server,
                                    proto::kind_name(kind), header.magic, header.version));
  if (header.status == static_cast<std::uint16_t>(proto::Status::Failed)) throw IoError(proto::message_of(header));
  if (header.status != static_cast<std::uint16_t>(proto::Status::Ok))
    throw ProtocolError(fmt::format("{}: {}", server, proto::message_of(header)));
  if (header.flags & proto::kRunEnded) run_ended_ = true;
  link.step = header.step;
  link.optimizer_iterations = header.optimizer_iterations;
  if (header.learning_rate_factor > 0) servers_learning_rate_factor_ = header.learning_rate_factor;
  traffic_.max_staleness = std::max(traffic_.max_staleness, header.staleness);
  const bool in_place = (header.flags & proto::kValuesInPlace) != 0;
  if (in_place && server_memory_.value_or(nullptr) == nullptr)
    throw ProtocolError(fmt::format("{} answered {} with values in place, which this worker did not ask for", server,
                                    proto::kind_name(kind)));
  link.server_reads_me = (header.flags & proto::kReadsYourMemory) != 0;
  traffic_.servers[static_cast<std::size_t>(&link - links_.data())].bytes_received +=
      static_cast<std::int64_t>(sizeof header + (in_place ? link.outgoing.size() * sizeof(float) : header.payload_bytes));
  return header;
}

void ParameterStore::receive_payload(Link& link, const proto::ReplyHeader& header, std::span<std::byte> out,
                                     const comm::WorkPtr& posted) {
  const std::string server = transport_.describe(link.rank);
  if (header.payload_bytes != out.size())
    throw ProtocolError(fmt::format("{} answered with {} payload bytes, {} expected", server, header.payload_bytes, out.size()));
  if (out.empty()) return;
  (posted ? posted : transport_.recv(link.rank, proto::kReplyPayloadTag, out))->wait(transport_.timeout());
  if (crc32c_of(out.data(), out.size()) != header.payload_crc)
    throw ProtocolError(fmt::format("the answer of {} fails its checksum (garbled in transit)", server));
}

void ParameterStore::receive_pieces(Link& link, const proto::ReplyHeader& header) {
  const std::string server = transport_.describe(link.rank);
  const std::size_t expected = link.outgoing.size() * sizeof(float);
  if (header.payload_bytes != expected)
    throw ProtocolError(fmt::format("{} answered with {} payload bytes, {} expected", server, header.payload_bytes, expected));
  // Each piece is checked into the checksum as it lands, while the next ones arrive.
  std::uint32_t crc = 0;
  for (std::size_t i = 0; i < link.pieces.size(); ++i) {
    if (link.value_receives[i]) link.value_receives[i]->wait(transport_.timeout());
    const Piece& piece = link.pieces[i];
    const auto values = values_of(piece);
    crc = crc32c_extend(crc, values.data(), values.size_bytes());
  }
  if (crc != header.payload_crc) throw ProtocolError(fmt::format("the answer of {} fails its checksum (garbled in transit)", server));
}

comm::PeerMemory* ParameterStore::server_memory() {
  if (!server_memory_) {
    comm::PeerMemory* memory = transport_.peer_memory();
    server_memory_ = memory != nullptr && memory->can_reach_every_peer() ? memory : nullptr;
  }
  return *server_memory_;
}

void ParameterStore::post_value_receives(Link& link) {
  // Before the request leaves, so that the values land straight in the variables (each piece of a server's
  // answer is a message of its own), or the ranges of an answer in place in their buffer.
  // Nothing empty travels (a server may hold no shard): no receive waits for it.
  link.value_receives.clear();
  if (server_memory() != nullptr) {
    if (!link.values_ranges.empty())
      link.value_receives.push_back(transport_.recv(link.rank, proto::kReplyPayloadTag, link.values_ranges));
    return;
  }
  for (const Piece& piece : link.pieces) {
    const auto into = values_of(piece);
    link.value_receives.push_back(into.empty() ? nullptr
                                               : transport_.recv(link.rank, proto::kReplyPayloadTag, std::as_writable_bytes(into)));
  }
}

void ParameterStore::read_values_in_place(const Link& link) {
  const auto* ranges = reinterpret_cast<const proto::MemoryRange*>(link.values_ranges.data());
  std::vector<comm::PeerCopy> copies;
  for (std::size_t i = 0; i < link.pieces.size(); ++i) {
    const Piece& piece = link.pieces[i];
    const auto bytes = static_cast<std::size_t>(piece.count) * sizeof(float);
    COHORT_CHECK_AS(ProtocolError, ranges[i].bytes == bytes, "{} named {} bytes of values in place for '{}', which has {}",
                    transport_.describe(link.rank), ranges[i].bytes, variables_[piece.variable].name, bytes);
    const auto into = values_of(piece);
    copies.push_back({.address = ranges[i].address, .into = std::as_writable_bytes(into)});
  }
  (*server_memory_)->read(link.rank, copies);
}

void ParameterStore::receive_values(std::uint16_t kind) {
  try {
    receive_values_into_variables(kind);
  } catch (...) {
    // Receives still posted for the other servers' values write into the variables, and a server may still
    // read gradients named in place: their memory stays until the process ends.
    auto tensors = std::make_shared<std::vector<Tensor>>();
    for (const LocalVariable& variable : variables_) {
      tensors->push_back(variable.value);
      if (variable.gradient.defined()) tensors->push_back(variable.gradient);
    }
    comm::keep_until_exit(std::move(tensors));
    throw;
  }
}

void ParameterStore::receive_values_into_variables(std::uint16_t kind) {
  std::vector<std::optional<std::string>> skips;
  const bool in_place = server_memory_.value_or(nullptr) != nullptr;
  for (std::size_t s = 0; s < links_.size(); ++s) {
    Link& link = links_[s];
    const auto waiting_since = timeline::Clock::now();
    const proto::ReplyHeader header = receive_header(link, kind);
    skips.push_back(skip_of(link, header));
    if (in_place) {
      COHORT_CHECK_AS(ProtocolError, (header.flags & proto::kValuesInPlace) != 0,
                      "{} answered {} with its values as a message, not in place as asked", transport_.describe(link.rank),
                      proto::kind_name(kind));
      receive_payload(link, header, link.values_ranges, link.value_receives.empty() ? nullptr : link.value_receives[0]);
      read_values_in_place(link);
    } else {
      receive_pieces(link, header);
    }
    if (timeline::recording()) timeline::record("communication", fmt::format("values from ps {}", s), waiting_since);
    // Non-trainable variables are sent back as changes since this read.
    for (const Piece& piece : link.pieces)
      if (!variables_[piece.variable].trainable)
        std::ranges::copy(values_of(piece), link.last_read.begin() + static_cast<std::ptrdiff_t>(piece.offset));
  }
  if (kind != static_cast<std::uint16_t>(proto::Kind::Push)) return;
  for (std::size_t s = 1; s < skips.size(); ++s)
    COHORT_CHECK_AS(ProtocolError, skips[s].has_value() == skips[0].has_value(), "{} {} this worker's push and {} {} it",
                    transport_.describe(links_[0].rank), skips[0] ? "skipped" : "applied", transport_.describe(links_[s].rank),
                    skips[s] ? "skipped" : "applied");
  skipped_because_ = skips.empty() ? std::nullopt : skips[0];
}

std::optional<std::string> ParameterStore::skip_of(const Link& link, const proto::ReplyHeader& header) const {
  if ((header.flags & proto::kStepSkipped) == 0) return std::nullopt;
  COHORT_CHECK_AS(ProtocolError,
                  header.overflow_worker >= 0 && header.overflow_worker < transport_.size() && header.overflow_shard >= 0 &&
                      static_cast<std::size_t>(header.overflow_shard) < plan_.shards().size(),
                  "{} skipped a step for worker {} and shard {}, which this run does not have", transport_.describe(link.rank),
                  header.overflow_worker, header.overflow_shard);
  return fmt::format("{} of {}", plan_.shards()[static_cast<std::size_t>(header.overflow_shard)].variable,
                     comm::process_name_of(transport_, header.overflow_worker));
}

void ParameterStore::exchange_values(std::uint16_t kind, std::int64_t samples, bool with_payload) {
  {
    const timeline::Span span("communication", !with_payload                    ? "pull request to every server"
                                               : push_dtype_ == DType::BFloat16 ? "bfloat16 push to every server"
                                                                                : "push to every server");
    send_to_all(kind, samples, with_payload);
  }
  receive_values(kind);
}

void ParameterStore::initialize_servers() {
  const auto kind = static_cast<std::uint16_t>(proto::Kind::Init);
  for (Link& link : links_)
    for (const Piece& piece : link.pieces)
      std::ranges::copy(values_of(piece), link.last_read.begin() + static_cast<std::ptrdiff_t>(piece.offset));
  send_to_all(kind, 0, true, 0);
  for (Link& link : links_) receive_payload(link, receive_header(link, kind), {});
}

void ParameterStore::pull() { exchange_values(static_cast<std::uint16_t>(proto::Kind::Pull), 0, false); }

void ParameterStore::pack(Link& link, const Piece& piece) {
  const LocalVariable& variable = variables_[piece.variable];
  const bool low = push_dtype_ == DType::BFloat16;
  const float* from = variable.gradient.defined() ? variable.gradient.data() + piece.element_begin : nullptr;
  if (!variable.trainable) {
    // The change this worker made since its last read: the servers add it up.
    float* change = link.outgoing.data() + piece.offset;
    const float* now = variable.value.data() + piece.element_begin;
    const float* before = link.last_read.data() + piece.offset;
    for (std::int64_t i = 0; i < piece.count; ++i) change[i] = now[i] - before[i];
    from = change;
  } else if (!low) {
    return;  // a float32 gradient goes (or is read) straight from its variable
  }
  if (!low) return;
  std::uint16_t* narrow = link.outgoing_bfloat16.data() + piece.offset;
  for (std::int64_t i = 0; i < piece.count; ++i) narrow[i] = to_bfloat16_bits(from[i]);
}

void ParameterStore::push_pull(std::int64_t samples, std::optional<std::size_t> not_finite) {
  std::int32_t overflow_shard = -1;
  if (not_finite) {
    COHORT_CHECK(*not_finite < variables_.size(), "push_pull(): variable {} is not one of the store's", *not_finite);
    const auto& shards = plan_.shards();
    const auto first = std::find_if(shards.begin(), shards.end(),
                                    [&](const Shard& shard) { return shard.variable == variables_[*not_finite].name; });
    overflow_shard = static_cast<std::int32_t>(first - shards.begin());
  }
  begin_push(samples);
  finish_push(overflow_shard);
}

void ParameterStore::begin_push(std::int64_t samples) {
  COHORT_CHECK(!push_, "begin_push() while a push is in progress");
  push_ = Push{.samples = samples, .sends = {}};
  for (Link& link : links_) {
    link.pieces_waiting = link.trainable_pieces;
    link.request_sent = false;
  }
}

void ParameterStore::gradients_ready(std::span<const std::size_t> variables) {
  COHORT_CHECK(push_.has_value(), "gradients_ready() outside begin_push() .. finish_push()");
  const auto start = Clock::now();
  for (std::size_t v : variables) {
    COHORT_CHECK(v < variables_.size() && variables_[v].trainable, "gradients_ready(): {} is not a trainable variable of the store", v);
    for (const auto& [server, index] : pieces_of_[v]) {
      Link& link = links_[server];
      COHORT_CHECK(!link.request_sent && link.pieces_waiting > 0, "the gradient of '{}' was announced twice in one step",
                   variables_[v].name);
      pack(link, link.pieces[index]);
      if (--link.pieces_waiting > 0) continue;
      // Everything this server holds is final: its request leaves now, while backward goes on.
      for (const Piece& piece : link.pieces)
        if (!variables_[piece.variable].trainable) pack(link, piece);
      const timeline::Span span("communication", "push");
      send_request(link, static_cast<std::uint16_t>(proto::Kind::Push), push_->samples, true, {}, push_->sends);
      link.request_sent = true;
    }
  }
  traffic_.communication_seconds += std::chrono::duration<double>(Clock::now() - start).count();
}

void ParameterStore::finish_push() { finish_push(-1); }

void ParameterStore::finish_push(std::int32_t overflow_shard) {
  COHORT_CHECK(push_.has_value(), "finish_push() without begin_push()");
  const auto start = Clock::now();
  Push push = std::move(*push_);
  push_.reset();
  {
    const timeline::Span span("communication", "push");
    for (Link& link : links_) {
      if (link.request_sent) continue;
      for (const Piece& piece : link.pieces) pack(link, piece);
      send_request(link, static_cast<std::uint16_t>(proto::Kind::Push), push.samples, true, {}, push.sends, overflow_shard);
    }
    comm::wait_all(push.sends, transport_.timeout());
  }
  receive_values(static_cast<std::uint16_t>(proto::Kind::Push));
  traffic_.communication_seconds += std::chrono::duration<double>(Clock::now() - start).count();
  ++traffic_.steps;
}

std::vector<SnapshotFile> ParameterStore::save(std::int64_t step) {
  const auto kind = static_cast<std::uint16_t>(proto::Kind::Save);
  send_to_all(kind, 0, false, step);  // a Save carries the checkpoint's step
  std::vector<SnapshotFile> files;
  for (std::size_t s = 0; s < links_.size(); ++s) {
    const proto::ReplyHeader header = receive_header(links_[s], kind);
    proto::SnapshotReceipt receipt;
    receive_payload(links_[s], header, std::as_writable_bytes(std::span(&receipt, 1)));
    files.push_back({.name = snapshot_name(step, static_cast<int>(s), plan_.servers()), .bytes = receipt.bytes, .crc = receipt.crc});
  }
  return files;
}

std::vector<ServerStats> ParameterStore::server_stats() {
  const auto kind = static_cast<std::uint16_t>(proto::Kind::Stats);
  send_to_all(kind, 0, false);
  std::vector<ServerStats> stats;
  for (Link& link : links_) {
    const proto::ReplyHeader header = receive_header(link, kind);
    COHORT_CHECK_AS(ProtocolError, header.payload_bytes < (1u << 24), "{} announced {} bytes of statistics",
                    transport_.describe(link.rank), header.payload_bytes);
    std::string bytes(header.payload_bytes, '\0');
    receive_payload(link, header, std::as_writable_bytes(std::span(bytes)));
    stats.push_back(decode_stats(bytes));
  }
  return stats;
}

void ParameterStore::finish() {
  const auto kind = static_cast<std::uint16_t>(proto::Kind::Done);
  send_to_all(kind, 0, false);
  for (Link& link : links_) receive_payload(link, receive_header(link, kind), {});
}

std::int64_t ParameterStore::optimizer_iterations() const {
  std::int64_t iterations = 0;
  for (const Link& link : links_) iterations = std::max(iterations, link.optimizer_iterations);
  return iterations;
}

}  // namespace cohort::ps
