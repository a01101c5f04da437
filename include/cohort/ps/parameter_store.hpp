#pragma once
// ParameterStore: a worker's view of the variables held by the parameter servers. The store maps every
// variable of the worker's model, row range by row range, onto the servers of the placement plan; per step
// it sends each server one message with all the gradients it holds and receives the fresh values in the
// same round trip, straight into the model's tensors. Non-trainable variables (BatchNormalization's moving
// statistics) travel as their change since the last read, so the servers keep one consistent copy.
//
//   ps::ParameterStore store(transport, plan, /*server_ranks=*/{2, 3}, ps::bind(model_variables));
//   fmt::print("{}", store.placement().table());
//   store.initialize_servers();           // the chief; every other worker calls store.pull()
//   store.push_pull(batch_samples);        // after backward(): gradients out, new values in

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cohort/comm/progress_deadline.hpp"
#include "cohort/comm/transport.hpp"
#include "cohort/ps/placement.hpp"
#include "cohort/ps/snapshot.hpp"
#include "cohort/ps/stats.hpp"
#include "cohort/tensor/tensor.hpp"

namespace cohort::ps {

namespace protocol {
struct ReplyHeader;
}

// A model variable as the store sees it; the tensors are shared with the model, not copied.
struct LocalVariable {
  std::string name;
  Tensor value;
  Tensor gradient;  // trainable variables only
  bool trainable = true;
};

// What this worker saw of each server, and its time spent communicating.
struct ClientTraffic {
  struct PerServer {
    std::int64_t requests = 0;
    std::int64_t bytes_sent = 0;
    std::int64_t bytes_received = 0;
  };
  std::vector<PerServer> servers;
  std::int64_t steps = 0;
  double communication_seconds = 0;  // inside push_pull(), waiting for the other workers included
  std::int64_t max_staleness = 0;    // of this worker's gradients, as the servers reported
};

class ParameterStore {
 public:
  // `transport` must outlive the store; server_ranks[k] is the rank of ps k. An answer may take twice the
  // servers' progress deadline (`progress_timeout`, as ServerOptions::wait_timeout; 0: the transport's
  // timeout()) before the server is named stuck.
  // `push_dtype`: what pushes carry, float32 or bfloat16 (half the bytes; values always come back float32).
  ParameterStore(comm::Transport& transport, Plan plan, std::vector<int> server_ranks, std::vector<LocalVariable> variables,
                 std::chrono::milliseconds progress_timeout = {}, DType push_dtype = DType::Float32);

  const Plan& placement() const { return plan_; }

  // The chief sends its values to every server.
  void initialize_servers();
  // Reads every variable from the servers (waiting until the chief has initialized them).
  void pull();
  // Sends the gradients of a step over `samples` samples (0: none) and reads the new values.
  // `not_finite`: the index of the first variable whose gradient overflowed (a loss-scaled step): the push
  // asks the servers to skip the step, which they do alike (server.hpp), and skipped_because() says so.
  void push_pull(std::int64_t samples, std::optional<std::size_t> not_finite = {});
  // push_pull() in parts, so that requests leave while backward runs: begin_push() before backward,
  // gradients_ready() as variables' gradients become final (a server's request leaves as soon as every
  // gradient it holds is), finish_push() after backward: the requests not yet sent go, the values come.
  void begin_push(std::int64_t samples);
  // `variables`: indices into the variables the store was given.
  void gradients_ready(std::span<const std::size_t> variables);
  void finish_push();
  // The factor on the servers' learning-rate schedule that the next pushes carry (1 by default).
  void set_learning_rate_factor(double factor) { learning_rate_factor_ = factor; }
  // The factor the servers' last replies said their updates use (the chief's); 0 before any reply.
  double servers_learning_rate_factor() const { return servers_learning_rate_factor_; }
  // Every server writes its snapshot for checkpoint step `step`; returns the files for the manifest.
  std::vector<SnapshotFile> save(std::int64_t step);
  std::vector<ServerStats> server_stats();
  // This worker is finished; from the chief it also ends the run for everybody.
  void finish();

  // Updates the servers have applied (the most of any server): their steps less the skipped ones (loss
  // scaling), which decide the learning rate.
  std::int64_t optimizer_iterations() const;
  // True once a server said the chief has ended the run.
  bool run_ended() const { return run_ended_; }
  // After a push the servers skipped: whose gradient overflowed ("dense/bias of worker 1"); else nullopt.
  const std::optional<std::string>& skipped_because() const { return skipped_because_; }
  const ClientTraffic& traffic() const { return traffic_; }

 private:
  struct Piece {
    std::size_t variable;
    std::int64_t element_begin, count;
    std::size_t offset;  // in the server's payload
  };
  struct Link {
    int rank;
    std::vector<Piece> pieces{};
    std::vector<float> outgoing{}, last_read{};      // outgoing: non-trainable variables' changes
    std::vector<std::uint16_t> outgoing_bfloat16{};  // a bfloat16 push while it is being sent
    std::vector<comm::WorkPtr> value_receives{};     // of the answer with values: one per piece, or the ranges
    std::vector<std::byte> request{};  // the request header while it is being sent
    // In place: where this Push's shards lie in this process, and where the answer's values lie in the
    // server's (MemoryRanges, one per piece). The server said it reads this process's memory.
    std::vector<std::byte> request_ranges{}, values_ranges{};
    bool server_reads_me = false;
    std::int64_t step = 0, optimizer_iterations = 0;
    std::size_t trainable_pieces = 0;
    // During a pipelined push: pieces whose gradients are not final yet, and whether the request left.
    std::size_t pieces_waiting = 0;
    bool request_sent = false;
  };
  // A pipelined push between begin_push() and finish_push().
  struct Push {
    std::int64_t samples = 0;
    std::vector<comm::WorkPtr> sends;
  };

  // Readies piece `piece` of `link` for a Push: a non-trainable variable's change since the last read, and
  // the bfloat16 narrowing of what is pushed (a float32 gradient goes as it is, from its variable).
  void pack(Link& link, const Piece& piece);
  // Where `piece`'s values lie in its variable.
  std::span<float> values_of(const Piece& piece) const;
  // The bytes a request of `kind` carries for `piece`: a message of its own, or a range read in place.
  std::span<const std::byte> piece_bytes(const Link& link, const Piece& piece, std::uint16_t kind) const;
  // Reads the values an answer named in the server's memory straight into the variables.
  void read_values_in_place(const Link& link);
  // Where this worker reads the servers' memory (asking for answers in place); null where it cannot.
  comm::PeerMemory* server_memory();
  // Queues `link`'s request; `sends` gets the works that complete once its bytes are out. `overflow_shard`
  // >= 0 flags a Push as not finite.
  void send_request(Link& link, std::uint16_t kind, std::int64_t samples, bool with_payload, std::optional<std::int64_t> step,
                    std::vector<comm::WorkPtr>& sends, std::int32_t overflow_shard = -1);
  // Posts the receives of `link`'s answer with values (link.value_receives).
  void post_value_receives(Link& link);
  // Reads every server's answer with values into the model's variables; after a Push, notes whether the
  // servers skipped it (all alike, else ProtocolError).
  void receive_values(std::uint16_t kind);
  void receive_values_into_variables(std::uint16_t kind);
  // Waits for the pieces of an answer with values, which land in the variables, and checks their CRC.
  void receive_pieces(Link& link, const protocol::ReplyHeader& header);
  // finish_push() with every request flagged by `overflow_shard` (-1: none).
  void finish_push(std::int32_t overflow_shard);
  // What a Push answer says of a skipped step: whose gradient overflowed; nullopt when it was applied.
  std::optional<std::string> skip_of(const Link& link, const protocol::ReplyHeader& header) const;

  // Sends one request to every server (a payload: each link's outgoing values); step defaults to each
  // link's last answered step. Returns once every request is out.
  void send_to_all(std::uint16_t kind, std::int64_t samples, bool with_payload, std::optional<std::int64_t> step = {});
  // Waits for one answer's header; throws ProtocolError for a refusal or a malformed header.
  protocol::ReplyHeader receive_header(Link& link, std::uint16_t kind);
  // Receives an answer's payload of exactly header.payload_bytes into `out` (through `posted` when its
  // receive was posted early) and checks its CRC.
  void receive_payload(Link& link, const protocol::ReplyHeader& header, std::span<std::byte> out,
                       const comm::WorkPtr& posted = nullptr);
  // A request to every server answered with values (Pull, Push), written into the model's variables.
  void exchange_values(std::uint16_t kind, std::int64_t samples, bool with_payload);

  DType push_dtype_;
  comm::Transport& transport_;
  Plan plan_;
  std::vector<LocalVariable> variables_;
  std::vector<Link> links_;
  // Per variable, its pieces: (server, index in that link's pieces).
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> pieces_of_;
  std::optional<Push> push_;
  std::optional<comm::PeerMemory*> server_memory_;  // asked once, at the first answer with values
  comm::ProgressDeadline deadline_;  // of an answer: the servers' own deadline, kReplySlack times over
  bool run_ended_ = false;
  std::optional<std::string> skipped_because_;
  double learning_rate_factor_ = 1;
  double servers_learning_rate_factor_ = 0;
  ClientTraffic traffic_;
};

}  // namespace cohort::ps
