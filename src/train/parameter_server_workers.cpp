#include "train/parameter_server_workers.hpp"

#include "cohort/core/check.hpp"
#include "train/position_codec.hpp"

namespace cohort::train {
namespace {

constexpr comm::Tag kAgreementTag = 0x5053414752454500ull;  // "PSAGREE"
constexpr comm::Tag kHistoryTag = 0x5053484953540000ull;    // "PSHIST"
constexpr comm::Tag kRunEndTag = 0x5053454e44000000ull;     // "PSEND"
constexpr std::uint64_t kMaxHistoryBytes = 64ull << 20;

}  // namespace

void ParameterServerWorkers::receive_agreement(int peer, std::span<double> out) {
  // The peer is connected (a lost one is reported sooner) but may make no progress towards the agreement,
  // nor wait on another process that does.
  const auto limit = synchronizer_.progress_limit();
  auto received = std::make_shared<std::vector<double>>(out.size());
  const auto arriving = transport_.recv(peer, kAgreementTag, std::as_writable_bytes(std::span(*received)));
  if (!comm::await_peer(transport_, peer, arriving, synchronizer_.steps_taken(), limit, received))
    throw TimeoutError(comm::stuck_message(transport_.describe(peer) + " is stuck", "it did not reach the agreement of the workers", limit));
  std::copy(received->begin(), received->end(), out.begin());
}

bool ParameterServerWorkers::sum_over_replicas(std::span<double> values) {
  if (workers_ == 1 || synchronizer_.has_backup_workers()) return false;
  if (!is_chief()) {
    transport_.send(0, kAgreementTag, std::as_bytes(values))->wait(transport_.timeout());
    receive_agreement(0, values);
    return true;
  }
  std::vector<double> theirs(values.size());
  for (int worker = 1; worker < workers_; ++worker) {
    receive_agreement(worker, theirs);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] += theirs[i];
  }
  std::vector<comm::WorkPtr> sends;
  for (int worker = 1; worker < workers_; ++worker) sends.push_back(transport_.send(worker, kAgreementTag, std::as_bytes(values)));
  comm::wait_all(sends, transport_.timeout());
  return true;
}

void ParameterServerWorkers::end_run(const History& history) {
  if (!is_chief()) {
    await_end_of_run();
    return;
  }
  TrainingPosition summary;
  summary.history = history;
  const std::string encoded = encode_position(summary, 0);
  const std::uint64_t bytes = encoded.size();
  std::vector<comm::WorkPtr> sends;
  for (int server = workers_; server < transport_.size(); ++server) {
    sends.push_back(transport_.send(server, kHistoryTag, std::as_bytes(std::span(&bytes, 1))));
    sends.push_back(transport_.send(server, kHistoryTag, std::as_bytes(std::span(encoded))));
  }
  const std::uint64_t steps = synchronizer_.steps_taken();
  for (int worker = 1; worker < workers_; ++worker)
    sends.push_back(transport_.send(worker, kRunEndTag, std::as_bytes(std::span(&steps, 1))));
  comm::wait_all(sends, transport_.timeout());
}

void ParameterServerWorkers::await_end_of_run() {
  // The chief may train on for long after this worker's share is done (asynchronous updates, backup
  // workers): the wait is legitimate while it completes steps.
  auto chief_steps = std::make_shared<std::uint64_t>(0);
  const auto ended = transport_.recv(0, kRunEndTag, std::as_writable_bytes(std::span(chief_steps.get(), 1)));
  const auto limit = synchronizer_.progress_limit();
  if (!comm::await_peer(transport_, 0, ended, synchronizer_.steps_taken(), limit, chief_steps))
    throw TimeoutError(comm::stuck_message(transport_.describe(0) + " is stuck",
                                           "it completed no step while " + process_name(rank()) + " waited for the end of the run", limit));
}

History ParameterServerWorkers::receive_history(std::chrono::milliseconds limit) {
  // The chief sends it as soon as every server has answered its Done: a chief that does not is stuck.
  const auto receive = [&](std::span<std::byte> out, std::shared_ptr<void> buffer) {
    if (!comm::await_peer(transport_, 0, transport_.recv(0, kHistoryTag, out), 0, limit, std::move(buffer)))
      throw TimeoutError(comm::stuck_message(transport_.describe(0) + " is stuck",
                                             "it did not send the run's history to " + process_name(rank()), limit));
  };
  auto bytes = std::make_shared<std::uint64_t>(0);
  receive(std::as_writable_bytes(std::span(bytes.get(), 1)), bytes);
  COHORT_CHECK_AS(ProtocolError, *bytes <= kMaxHistoryBytes, "{} announced a history of {} bytes", transport_.describe(0), *bytes);
  auto encoded = std::make_shared<std::string>(*bytes, '\0');
  receive(std::as_writable_bytes(std::span(*encoded)), encoded);
  return decode_position(*encoded).first.history;
}

}  // namespace cohort::train
