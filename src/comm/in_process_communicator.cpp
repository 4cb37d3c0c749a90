// InProcessCommunicator: every collective is one exchange round on the shared group: each rank
// deposits its buffer, the last to arrive publishes all buffers, and every rank picks what the
// collective gives it. A round ends when every rank has read the published buffers, so rounds
// never overlap.
#include "dcp/in_process_communicator.h"

#include "util/wire.h"

#include <c10/util/Exception.h>

#include <exception>
#include <thread>

namespace dcp {

InProcessGroup::InProcessGroup(int world_size)
    : size_(world_size), slots_(world_size), present_(world_size, false),
      next_child_(world_size, 0) {
  TORCH_CHECK(world_size >= 1, "InProcessGroup needs at least one rank");
}

std::vector<std::string> InProcessGroup::exchange(int rank, std::string data,
                                                  std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  TORCH_CHECK(broken_.empty(), "rank ", rank, ": this in-process group is unusable: ", broken_);
  // Wait until the previous round's readers are gone.
  cv_.wait(lock, [&] { return leaving_ == 0; });
  slots_[rank] = std::move(data);
  present_[rank] = true;
  const uint64_t my_generation = generation_;
  if (++arrived_ == size_) {
    published_ = std::move(slots_);
    slots_.assign(size_, std::string());
    present_.assign(size_, false);
    arrived_ = 0;
    leaving_ = size_;
    ++generation_;
    cv_.notify_all();
  } else {
    auto round_done = [&] { return generation_ != my_generation || !broken_.empty(); };
    if (timeout.count() <= 0) {
      cv_.wait(lock, round_done);
    } else if (!cv_.wait_for(lock, timeout, round_done)) {
      std::string missing;
      for (int r = 0; r < size_; ++r) {
        if (!present_[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      broken_ = "a collective timed out: rank(s) " + missing + " never arrived";
      cv_.notify_all();
      TORCH_CHECK(false, "rank ", rank, ": collective timed out after ",
                  std::chrono::duration<double>(timeout).count(), " s: rank(s) ", missing,
                  " never arrived (a rank died, hangs, or skipped this collective)");
    }
    TORCH_CHECK(broken_.empty(), "rank ", rank, ": this in-process group is unusable: ",
                broken_);
  }
  std::vector<std::string> result = published_;
  if (--leaving_ == 0) cv_.notify_all();
  return result;
}

std::shared_ptr<InProcessGroup> InProcessGroup::next_child(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t k = next_child_.at(rank)++;
  if (children_.size() <= k) children_.resize(k + 1);
  if (!children_[k]) children_[k] = std::make_shared<InProcessGroup>(size_);
  return children_[k];
}

InProcessCommunicator::InProcessCommunicator(std::shared_ptr<InProcessGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {
  TORCH_CHECK(rank >= 0 && rank < group_->size(), "rank ", rank, " out of range");
}

void InProcessCommunicator::barrier() { group_->exchange(rank_, std::string(), timeout_); }

std::string InProcessCommunicator::broadcast(const std::string& data, int root) {
  auto all = group_->exchange(rank_, rank_ == root ? data : std::string(), timeout_);
  return std::move(all.at(root));
}

std::vector<std::string> InProcessCommunicator::gather(const std::string& data, int root) {
  auto all = group_->exchange(rank_, data, timeout_);
  if (rank_ != root) return {};
  return all;
}

std::string InProcessCommunicator::scatter(const std::vector<std::string>& data, int root) {
  std::string packed;
  if (rank_ == root) {
    TORCH_CHECK(static_cast<int>(data.size()) == size(), "scatter: root passed ", data.size(),
                " buffers for ", size(), " ranks");
    detail::wire::Writer w;
    w.strs(data);
    packed = w.take();
  }
  auto all = group_->exchange(rank_, std::move(packed), timeout_);
  detail::wire::Reader r(all.at(root));
  return std::move(r.strs().at(rank_));
}

std::vector<std::string> InProcessCommunicator::all_gather(const std::string& data) {
  return group_->exchange(rank_, data, timeout_);
}

std::unique_ptr<Communicator> InProcessCommunicator::duplicate() {
  return std::make_unique<InProcessCommunicator>(group_->next_child(rank_), rank_);
}

void run_in_process(int world_size, const std::function<void(Communicator&)>& fn) {
  auto group = std::make_shared<InProcessGroup>(world_size);
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        InProcessCommunicator comm(group, r);
        fn(comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace dcp
