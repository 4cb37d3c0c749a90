// dcp::CheckpointManager: save intervals, retention (keep_last_n, keep_every_n_steps), latest
// and load, async saves, several ranks, and a save killed midway (a forked child ends at a file
// operation): the previous step stays the latest and loads, and the debris is removed.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
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

TEST(CheckpointManagerTest, OptionsAreChecked) {
  TempDir root;
  CheckpointManagerOptions options;
  options.save_interval_steps = 0;
  EXPECT_THROW(CheckpointManager(root.sub("run"), options), c10::Error);
}

}  // namespace
}  // namespace dcp
