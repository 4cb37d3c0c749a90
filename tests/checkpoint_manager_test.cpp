// dcp::CheckpointManager: save intervals, retention (keep_last_n, keep_every_n_steps), latest
// and load, async saves, several ranks, a save killed midway (a forked child ends at a file
// operation): the previous step stays the latest and loads, and the debris is removed; and
// retention's removal of a dropped step's files off the caller's thread.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "dcp/dcp.h"
#include "io/fault_injection.h"
#include "testing/test_util.h"

namespace dcp {
namespace {

using testing::make_tensor;
using testing::TempDir;

StateDict state_at(int64_t step) {
  return StateDict{{"w", make_tensor(at::kFloat, {8, 4}, step)}, {"step", step}};
}

void expect_state_of(const StateDict& state, int64_t step) {
  EXPECT_TRUE(torch::equal(state.at("w").tensor(), make_tensor(at::kFloat, {8, 4}, step)));
  EXPECT_EQ(state.at("step"), Value(step));
}

StateDict blank() { return StateDict{{"w", torch::zeros({8, 4})}, {"step", -1}}; }

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(CheckpointManagerTest, IntervalsRetentionLatestAndLoad) {
  TempDir root;
  CheckpointManagerOptions options;
  options.save_interval_steps = 2;
  options.keep_last_n = 2;
  options.keep_every_n_steps = 4;
  CheckpointManager manager(root.sub("run"), options);
  EXPECT_FALSE(manager.latest_step().has_value());
  for (int64_t step = 0; step <= 10; ++step) {
    EXPECT_EQ(manager.save(step, state_at(step)), step % 2 == 0) << step;
  }
  // The last two (8, 10) and every multiple of 4 (0, 4, 8).
  EXPECT_EQ(manager.all_steps(), (std::vector<int64_t>{0, 4, 8, 10}));
  manager.wait_until_finished();  // dropped steps' files go in the background
  EXPECT_EQ(entries(root.sub("run")),
            (std::vector<std::string>{"step_0", "step_10", "step_4", "step_8"}));
  EXPECT_EQ(manager.latest_step(), 10);
  StateDict state = blank();
  EXPECT_EQ(manager.load(state), 10);
  expect_state_of(state, 10);
  EXPECT_EQ(manager.load(state, 4), 4);
  expect_state_of(state, 4);
  EXPECT_TRUE(manager.save(11, state_at(11), /*force=*/true));
  EXPECT_EQ(manager.all_steps(), (std::vector<int64_t>{0, 4, 8, 10, 11}));
  EXPECT_EQ(manager.latest_step(), 11);
  // One more commit drops 10 (the last two are now 11 and 12; 8 is a multiple of 4).
  manager.save(12, state_at(12));
  EXPECT_EQ(manager.all_steps(), (std::vector<int64_t>{0, 4, 8, 11, 12}));
}

TEST(CheckpointManagerTest, LoadErrorsNameTheRootAndStep) {
  TempDir root;
  CheckpointManager manager(root.sub("run"));
  StateDict state = blank();
  try {
    manager.load(state);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no committed checkpoint under " + root.sub("run")),
              std::string::npos)
        << e.what();
  }
  manager.save(3, state_at(3));
  try {
    manager.load(state, 4);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 4 has no committed checkpoint"), std::string::npos)
        << e.what();
  }
}

TEST(CheckpointManagerTest, AsyncSavesCommitAndRetentionFollows) {
  TempDir root;
  CheckpointManagerOptions options;
  options.async = true;
  options.keep_last_n = 1;
  CheckpointManager manager(root.sub("run"), options);
  for (int64_t step = 1; step <= 3; ++step) {
    StateDict state = state_at(step);
    manager.save(step, state);
    state.at("w").tensor().fill_(-1);  // the save staged a copy
  }
  manager.wait_until_finished();
  EXPECT_EQ(manager.all_steps(), std::vector<int64_t>{3});
  StateDict state = blank();
  EXPECT_EQ(manager.load(state), 3);
  expect_state_of(state, 3);
}

TEST(CheckpointManagerTest, EveryRankCallsAndTheyAgree) {
  TempDir root;
  const at::Tensor full = make_tensor(at::kFloat, {6, 4}, 5);
  run_in_process(3, [&](Communicator& comm) {
    CheckpointManagerOptions options;
    options.comm = &comm;
    options.keep_last_n = 1;
    CheckpointManager manager(root.sub("run"), options);
    for (int64_t step = 1; step <= 2; ++step) {
      manager.save(step, StateDict{{"w", distribute_tensor(full * step, {3}, comm.rank(),
                                                           {Placement::Shard(0)})}});
    }
    EXPECT_EQ(manager.all_steps(), std::vector<int64_t>{2});
    StateDict state{{"w", zeros_sharded({6, 4}, at::kFloat, {3}, comm.rank(),
                                        {Placement::Shard(1)})}};
    EXPECT_EQ(manager.load(state), 2);
    const Shard& shard = state.at("w").get<ShardedTensor>().local_shards().at(0);
    EXPECT_TRUE(torch::equal(shard.tensor, (full * 2).narrow(1, shard.offsets[1], shard.tensor.size(1))));
  });
}

// Ends the process at the first rename (the commit of .metadata comes after the data files'
// writes and before the checkpoint is visible).
class CrashAtRename : public detail::FaultInjector {
 public:
  int before(detail::FileOp op, const std::string& path) override {
    if (op == detail::FileOp::kRename) _exit(42);
    return 0;
  }
};

TEST(CheckpointManagerTest, SaveKilledMidwayLeavesThePreviousStepLatest) {
  TempDir root;
  const std::string run = root.sub("run");
  {
    CheckpointManager manager(run);
    manager.save(1, state_at(1));
  }
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    CheckpointManager manager(run);
    CrashAtRename crash;
    detail::set_fault_injector(&crash);
    manager.save(2, state_at(2));
    _exit(0);  // not reached
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 42);
  // The killed save left a step directory with data files and no .metadata.
  ASSERT_TRUE(std::filesystem::exists(run + "/step_2"));
  EXPECT_FALSE(std::filesystem::exists(run + "/step_2/.metadata"));
  EXPECT_FALSE(entries(run + "/step_2").empty());

  CheckpointManager manager(run);  // removes the uncommitted step_2
  EXPECT_FALSE(std::filesystem::exists(run + "/step_2"));
  EXPECT_EQ(manager.latest_step(), 1);
  StateDict state = blank();
  EXPECT_EQ(manager.load(state), 1);
  expect_state_of(state, 1);
  manager.save(2, state_at(2));  // and the run continues
  EXPECT_EQ(manager.all_steps(), (std::vector<int64_t>{1, 2}));
}

// Holds every removal of a file under `dir` other than its .metadata until release(), or for
// at most 10 s (then records that it timed out), so a test can see which thread removes what.
class HoldRemovals : public detail::FaultInjector {
 public:
  explicit HoldRemovals(std::string dir) : dir_(std::move(dir)) {}
  ~HoldRemovals() override { release(); }
  int before(detail::FileOp op, const std::string& path) override {
    if (op != detail::FileOp::kUnlink || path.rfind(dir_, 0) != 0) return 0;
    if (path == dir_ + ".metadata") return 0;
    std::unique_lock<std::mutex> lock(mu_);
    held_ = true;
    cv_.notify_all();
    if (!cv_.wait_for(lock, std::chrono::seconds(10), [&] { return released_; })) {
      timed_out_ = true;
    }
    return 0;
  }
  bool wait_until_held() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return held_; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  bool timed_out() {
    std::lock_guard<std::mutex> lock(mu_);
    return timed_out_;
  }

 private:
  const std::string dir_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false, released_ = false, timed_out_ = false;
};

// Note [Background retention]: a step that retention drops is invisible when save() returns,
// and its files are removed off the caller's thread; the next save() or wait_until_finished()
// waits for them.
TEST(CheckpointManagerTest, RetentionHidesAStepAtOnceAndRemovesItsFilesInTheBackground) {
  TempDir root;
  const std::string run = root.sub("run");
  CheckpointManagerOptions options;
  options.keep_last_n = 1;
  CheckpointManager manager(run, options);
  manager.save(1, state_at(1));
  const std::vector<std::string> step1_files = entries(run + "/step_1");
  ASSERT_GE(step1_files.size(), 2u);  // .metadata and a data file at least

  HoldRemovals hold(run + "/step_1/");
  detail::set_fault_injector(&hold);
  manager.save(2, state_at(2));  // returns while step_1's files are held
  ASSERT_TRUE(hold.wait_until_held());
  // Invisible at once: no .metadata, not listed; its other files are still there.
  EXPECT_FALSE(std::filesystem::exists(run + "/step_1/.metadata"));
  EXPECT_EQ(manager.all_steps(), std::vector<int64_t>{2});
  EXPECT_EQ(entries(run + "/step_1").size(), step1_files.size());  // the held file, the lock
  hold.release();
  manager.wait_until_finished();
  detail::set_fault_injector(nullptr);
  EXPECT_FALSE(hold.timed_out()) << "save() waited for the removal of step_1's files";
  EXPECT_FALSE(std::filesystem::exists(run + "/step_1"));
  StateDict state = blank();
  EXPECT_EQ(manager.load(state), 2);
  expect_state_of(state, 2);
}

TEST(CheckpointManagerTest, OptionsAreChecked) {
  TempDir root;
  CheckpointManagerOptions options;
  options.save_interval_steps = 0;
  EXPECT_THROW(CheckpointManager(root.sub("run"), options), c10::Error);
}

}  // namespace
}  // namespace dcp
