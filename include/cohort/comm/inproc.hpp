#pragma once
// InProcessGroup: a transport for ranks that are threads of one process (tests, single-host
// simulation). Messages are copied once, from the sender's buffer into the receiver's. kill(rank)
// simulates a lost process as every rank of a fully connected group sees it: all pending and later
// operations of every rank fail with IoError naming the lost rank, since no collective can complete.
//
//   comm::InProcessGroup group(4);
//   std::thread t([&] { run_rank(group.transport(1)); });

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cohort/comm/transport.hpp"

namespace cohort::comm {

class InProcessGroup {
 public:
  explicit InProcessGroup(int size, std::chrono::milliseconds timeout = std::chrono::seconds(30),
                          std::vector<std::string> names = {});
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  // The transport of `rank`; valid while the group lives.
  Transport& transport(int rank);
  void kill(int rank);

  struct State;

 private:
  std::shared_ptr<State> state_;
  std::vector<std::unique_ptr<Transport>> transports_;
};

}  // namespace cohort::comm
