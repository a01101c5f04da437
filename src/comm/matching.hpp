#pragma once
// Matching as every transport does it: receives posted before their message, and messages that came
// before their receive, per (peer, tag) in arrival order, handed over with one size check (delivery.hpp).
// Not synchronized: a transport calls it on its I/O thread or under its own lock.
//
//   if (!matcher.take_buffered(transport, peer, tag, out, *work)) matcher.post(peer, tag, {out, work});
//   matcher.deliver(transport, peer, tag, std::move(bytes));   // a whole message that arrived
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/delivery.hpp"

namespace cohort::comm {

class Matcher {
 public:
  struct Receiver {
    std::span<std::byte> out;
    WorkPtr work;
  };

  // Hands the oldest message buffered from (peer, tag) to `out` and `work`; false when none waits. The
  // message's buffer, now spent, goes to `spent` where given, for the transport to reuse. `transport`, whose
  // peer sent it, names the peer in an error.
  bool take_buffered(const Transport& transport, int peer, Tag tag, std::span<std::byte> out, Work& work,
                     std::vector<std::byte>* spent = nullptr) {
    const auto queued = buffered_.find({peer, tag});
    if (queued == buffered_.end() || queued->second.empty()) return false;
    std::vector<std::byte> bytes = std::move(queued->second.front());
    queued->second.pop_front();
    hand_over(transport, peer, tag, bytes, out, work);
    if (spent != nullptr) *spent = std::move(bytes);
    return true;
  }

  void post(int peer, Tag tag, Receiver receiver) { receivers_[{peer, tag}].push_back(std::move(receiver)); }

  // The oldest receive posted for (peer, tag), left posted; null when none.
  const Receiver* first_posted(int peer, Tag tag) const {
    const auto waiting = receivers_.find({peer, tag});
    return waiting == receivers_.end() || waiting->second.empty() ? nullptr : &waiting->second.front();
  }

  // Takes the oldest receive posted for (peer, tag); nullopt when none.
  std::optional<Receiver> take_posted(int peer, Tag tag) {
    const auto waiting = receivers_.find({peer, tag});
    if (waiting == receivers_.end() || waiting->second.empty()) return std::nullopt;
    Receiver receiver = std::move(waiting->second.front());
    waiting->second.pop_front();
    return receiver;
  }

  // A whole message from (peer, tag): to the oldest posted receive, else kept for the next one.
  void deliver(const Transport& transport, int peer, Tag tag, std::vector<std::byte> bytes) {
    if (auto receiver = take_posted(peer, tag)) return hand_over(transport, peer, tag, bytes, receiver->out, *receiver->work);
    buffered_[{peer, tag}].push_back(std::move(bytes));
  }

  // Fails every posted receive, or only those from `peer`, each with a fresh error().
  void fail_posted(const std::function<std::exception_ptr()>& error, std::optional<int> peer = std::nullopt) {
    for (auto& [key, queue] : receivers_) {
      if (peer && key.first != *peer) continue;
      for (Receiver& receiver : queue) receiver.work->fail(error());
      queue.clear();
    }
  }

 private:
  std::map<std::pair<int, Tag>, std::deque<Receiver>> receivers_;
  std::map<std::pair<int, Tag>, std::deque<std::vector<std::byte>>> buffered_;
};

}  // namespace cohort::comm
