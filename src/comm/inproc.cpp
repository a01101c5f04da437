#include "cohort/comm/inproc.hpp"

#include <fmt/format.h>

#include <mutex>
#include <optional>

#include "cohort/core/check.hpp"
#include "comm/matching.hpp"

namespace cohort::comm {

struct InProcessGroup::State {
  std::mutex mutex;
  int size;
  std::chrono::milliseconds timeout;
  RankNames names;  // "rank N" for those not named
  std::vector<Matcher> inboxes;  // per destination rank: its receives and the messages sent to it

  std::string describe(int rank) const { return name_of(names, rank); }
  // A lost or stuck rank breaks the whole group: why, or nothing while it is whole.
  std::optional<std::string> broken;
  Breakage breakage = Breakage::Lost;
  std::exception_ptr failure() const { return broken_group_error(breakage, *broken); }
  void break_group(std::string why, Breakage how) {
    if (!broken) {
      broken = std::move(why);
      breakage = how;
    }
    for (Matcher& inbox : inboxes) inbox.fail_posted([this] { return failure(); });
  }
  std::vector<std::optional<std::uint64_t>> progress;  // per rank
};

namespace {

class InProcessTransport : public Transport {
 public:
  InProcessTransport(std::shared_ptr<InProcessGroup::State> state, int rank) : state_(std::move(state)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return state_->size; }
  std::string describe(int rank) const override { return state_->describe(rank); }
  std::chrono::milliseconds timeout() const override { return state_->timeout; }

  void report_progress(std::uint64_t collectives) override {
    const std::lock_guard lock(state_->mutex);
    state_->progress[static_cast<std::size_t>(rank_)] = collectives;
  }
  std::optional<std::uint64_t> progress_of(int peer) const override {
    check_peer(peer);
    const std::lock_guard lock(state_->mutex);
    return state_->progress[static_cast<std::size_t>(peer)];
  }
  // A message is a copy the sender made in this process: no peer makes this rank buffer anything.
  void expect_messages_up_to(std::uint64_t) override {}
  void announce_failure(const std::string& reason) override {
    const std::lock_guard lock(state_->mutex);
    state_->break_group(fmt::format("{} failed: {}", describe(rank_), reason), Breakage::Lost);
  }
  void declare_stuck(int peer, const std::string& reason) override {
    check_peer(peer);
    const std::lock_guard lock(state_->mutex);
    state_->break_group(reason, Breakage::Stuck);
  }

  WorkPtr send(int peer, Tag tag, std::span<const std::byte> data) override {
    check_peer(peer);
    auto work = std::make_shared<Work>(PeerOperation{"send to", state_->names, peer, tag});
    const std::lock_guard lock(state_->mutex);
    if (state_->broken) {
      work->fail(state_->failure());
      return work;
    }
    state_->inboxes[static_cast<std::size_t>(peer)].deliver(*this, rank_, tag, {data.begin(), data.end()});
    work->complete();
    return work;
  }

  WorkPtr recv(int peer, Tag tag, std::span<std::byte> out) override {
    check_peer(peer);
    auto work = std::make_shared<Work>(PeerOperation{"recv from", state_->names, peer, tag});
    const std::lock_guard lock(state_->mutex);
    if (state_->broken) {
      work->fail(state_->failure());
      return work;
    }
    Matcher& inbox = state_->inboxes[static_cast<std::size_t>(rank_)];
    if (!inbox.take_buffered(*this, peer, tag, out, *work)) inbox.post(peer, tag, {out, work});
    return work;
  }

 private:
  void check_peer(int peer) const {
    COHORT_CHECK(peer >= 0 && peer < state_->size && peer != rank_, "rank {} cannot address peer {} in a group of {}",
                 rank_, peer, state_->size);
  }

  std::shared_ptr<InProcessGroup::State> state_;
  int rank_;
};

}  // namespace

InProcessGroup::InProcessGroup(int size, std::chrono::milliseconds timeout, std::vector<std::string> names)
    : state_(std::make_shared<State>()) {
  COHORT_CHECK(size > 0, "a group needs at least one rank, got {}", size);
  state_->size = size;
  state_->timeout = timeout;
  state_->names = std::make_shared<const std::vector<std::string>>(std::move(names));
  state_->inboxes.resize(static_cast<std::size_t>(size));
  state_->progress.assign(static_cast<std::size_t>(size), 0);  // every rank is heard from at once: none started
  for (int r = 0; r < size; ++r) transports_.push_back(std::make_unique<InProcessTransport>(state_, r));
}

InProcessGroup::~InProcessGroup() = default;

Transport& InProcessGroup::transport(int rank) {
  COHORT_CHECK(rank >= 0 && rank < state_->size, "rank {} outside a group of {}", rank, state_->size);
  return *transports_[static_cast<std::size_t>(rank)];
}

void InProcessGroup::kill(int rank) {
  COHORT_CHECK(rank >= 0 && rank < state_->size, "rank {} outside a group of {}", rank, state_->size);
  const std::lock_guard lock(state_->mutex);
  state_->break_group(fmt::format("lost {}", state_->describe(rank)), Breakage::Lost);
}

}  // namespace cohort::comm
