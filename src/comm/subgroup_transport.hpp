#pragma once
// SubgroupTransport: some ranks of a transport seen as a group of their own (ranks 0..k-1 in the order
// given), so that the collectives run among them unchanged. Messages go over the underlying transport.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "cohort/comm/transport.hpp"
#include "cohort/core/check.hpp"

namespace cohort::comm {

class SubgroupTransport final : public Transport {
 public:
  // `members`: ranks of `base`, this process's among them.
  SubgroupTransport(Transport& base, std::vector<int> members) : base_(base), members_(std::move(members)) {
    const auto self = std::find(members_.begin(), members_.end(), base_.rank());
    COHORT_CHECK(self != members_.end(), "rank {} is not a member of its own subgroup", base_.rank());
    rank_ = static_cast<int>(self - members_.begin());
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  WorkPtr send(int peer, Tag tag, std::span<const std::byte> data) override { return base_.send(real(peer), tag, data); }
  WorkPtr recv(int peer, Tag tag, std::span<std::byte> out) override { return base_.recv(real(peer), tag, out); }
  std::string describe(int rank) const override { return base_.describe(real(rank)); }
  std::chrono::milliseconds timeout() const override { return base_.timeout(); }
  void report_progress(std::uint64_t collectives) override { base_.report_progress(collectives); }
  std::optional<std::uint64_t> progress_of(int peer) const override { return base_.progress_of(real(peer)); }
  void declare_stuck(int peer, const std::string& reason) override { base_.declare_stuck(real(peer), reason); }
  void expect_messages_up_to(std::uint64_t bytes) override { base_.expect_messages_up_to(bytes); }
  void announce_failure(const std::string& reason) override { base_.announce_failure(reason); }
  bool gathers_in_segments() const override { return base_.gathers_in_segments(); }
  std::size_t whole_message_bytes() const override { return base_.whole_message_bytes(); }
  bool ranks_have_own_cores() const override { return base_.ranks_have_own_cores(); }

 private:
  int real(int member) const { return members_.at(static_cast<std::size_t>(member)); }

  Transport& base_;
  std::vector<int> members_;
  int rank_ = 0;
};

}  // namespace cohort::comm
