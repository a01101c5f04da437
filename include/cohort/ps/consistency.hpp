#pragma once
// Consistency modes of parameter-server training, chosen per run.
//
//   Sync{b}              the server averages the gradients of all W workers for step t (or the first W - b,
//                        dropping and counting the late ones), applies once, and answers everybody with the
//                        values of step t + 1. With b = 0, W workers at batch B take the steps of one process
//                        at batch W x B.
//   Async                each gradient is applied on arrival; a worker's gradient may be computed on values
//                        that others have updated since (its staleness).
//   BoundedStaleness{s}  asynchronous, but a worker more than s steps ahead of the slowest one waits.
//
//   auto mode = ps::parse_consistency("stale:2");   // or ps::Sync{}, ps::Async{}, ps::BoundedStaleness{2}

#include <string>
#include <string_view>
#include <variant>

namespace cohort::ps {

struct Sync {
  int backup_workers = 0;
};
struct Async {};
struct BoundedStaleness {
  int max_staleness = 1;
};

using Consistency = std::variant<Sync, Async, BoundedStaleness>;

// "sync", "sync, 1 backup worker", "async", "bounded staleness 2"
std::string describe(const Consistency& consistency);
// "sync", "sync:backup=N", "async", "stale:N"; throws InvalidArgument naming the text otherwise.
Consistency parse_consistency(std::string_view text);

}  // namespace cohort::ps
