#include "cohort/comm/inproc.hpp"

#include <fmt/format.h>

#include <deque>
#include <map>
#include <mutex>
#include <tuple>

#include "cohort/core/check.hpp"
#include "comm/delivery.hpp"

namespace cohort::comm {

struct InProcessGroup::State {
  struct Receiver {
    std::span<std::byte> out;
    WorkPtr work;
  };
  struct Channel {
    std::deque<std::vector<std::byte>> messages;
    std::deque<Receiver> receivers;
  };

  std::mutex mutex;
  int size;
  std::chrono::milliseconds timeout;
  std::vector<std::string> names;
  std::map<std::tuple<int, int, Tag>, Channel> channels;  // (source, destination, tag)

  std::string describe(int rank) const {
    return rank < static_cast<int>(names.size()) ? names[static_cast<std::size_t>(rank)] : fmt::format("rank {}", rank);
  }
  std::exception_ptr lost(int rank) const {
    return std::make_exception_ptr(IoError(fmt::format("lost {}", describe(rank))));
  }
  // A lost rank breaks the whole group: the first one lost, or -1.
  int lost_rank = -1;

  static void deliver(const std::vector<std::byte>& bytes, const Receiver& receiver, int source, Tag tag) {
    hand_over(fmt::format("rank {}", source), tag, bytes, receiver.out, *receiver.work);
  }
};

namespace {

class InProcessTransport : public Transport {
 public:
  InProcessTransport(std::shared_ptr<InProcessGroup::State> state, int rank) : state_(std::move(state)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return state_->size; }
  std::string describe(int rank) const override { return state_->describe(rank); }
  std::chrono::milliseconds timeout() const override { return state_->timeout; }

  WorkPtr send(int peer, Tag tag, std::span<const std::byte> data) override {
    check_peer(peer);
    auto work = std::make_shared<Work>(fmt::format("send to {}, tag {}", describe(peer), tag));
    const std::lock_guard lock(state_->mutex);
    if (state_->lost_rank >= 0) {
      work->fail(state_->lost(state_->lost_rank));
      return work;
    }
    auto& channel = state_->channels[{rank_, peer, tag}];
    std::vector<std::byte> bytes(data.begin(), data.end());
    if (!channel.receivers.empty()) {
      InProcessGroup::State::deliver(bytes, channel.receivers.front(), rank_, tag);
      channel.receivers.pop_front();
    } else {
      channel.messages.push_back(std::move(bytes));
    }
    work->complete();
    return work;
  }

  WorkPtr recv(int peer, Tag tag, std::span<std::byte> out) override {
    check_peer(peer);
    auto work = std::make_shared<Work>(fmt::format("recv from {}, tag {}", describe(peer), tag));
    const std::lock_guard lock(state_->mutex);
    if (state_->lost_rank >= 0) {
      work->fail(state_->lost(state_->lost_rank));
      return work;
    }
    auto& channel = state_->channels[{peer, rank_, tag}];
    if (!channel.messages.empty()) {
      InProcessGroup::State::deliver(channel.messages.front(), {out, work}, peer, tag);
      channel.messages.pop_front();
    } else {
      channel.receivers.push_back({out, work});
    }
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
  state_->names = std::move(names);
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
  if (state_->lost_rank < 0) state_->lost_rank = rank;
  for (auto& [key, channel] : state_->channels) {
    for (auto& receiver : channel.receivers) receiver.work->fail(state_->lost(state_->lost_rank));
    channel.receivers.clear();
  }
}

}  // namespace cohort::comm
