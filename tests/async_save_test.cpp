// dcp::async_save: staged values are those of the call, buffers are reused, failures reach
// every rank's handle, the next save works, and pending saves survive their handles.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <filesystem>
#include <thread>

#include "dcp/dcp.h"
#include "testing/sharded_state.h"
#include "testing/test_util.h"

namespace dcp {
namespace {

StateDict load_like(const StateDict& like, MemoryStorage& storage, const std::string& id) {
  StateDict out = testing::blank_like(like);
  MemoryReader reader(storage, id);
  load(out, reader);
  return out;
}

// Options whose stager stages asynchronously (StagingOptions::use_async_staging).
AsyncSaveOptions async_staging_options(int max_in_flight = 1, int copy_threads = 0) {
  StagingOptions staging;
  staging.use_async_staging = true;
  staging.max_in_flight = max_in_flight;
  staging.copy_threads = copy_threads;
  AsyncSaveOptions options;
  options.stager = std::make_shared<DefaultStager>(staging);
  return options;
}

// An event hook under which the worker starts its first save only once `submitted` reaches
// 2, so that the second async_save finds the first slot busy and takes the other one:
// with max_in_flight 2, both slots are then used whatever the threads' timing.
EventHook hold_first_save_until_two_submitted(const std::atomic<int>& submitted) {
  return [&submitted, first = std::make_shared<std::atomic<bool>>(true)](const Event& e) {
    if (e.phase != Phase::kSave || e.end || !first->exchange(false)) return;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (submitted.load() < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
}

TEST(AsyncSaveTest, EachSaveHoldsTheValuesOfItsOwnCall) {
  MemoryStorage storage;
  auto stager = std::make_shared<DefaultStager>();
  AsyncSaveOptions options;
  options.stager = stager;
  StateDict sd;
  sd["w"] = at::zeros({64, 64});
  sd["b"] = at::zeros({64}, at::kInt);
  sd["step"] = 0;
  std::vector<AsyncSaveFuture> pending;
  for (int step = 1; step <= 4; ++step) {
    sd["w"].tensor().fill_(static_cast<double>(step));
    sd["b"].tensor().fill_(step * 10);
    sd["step"] = step;
    pending.push_back(
        async_save(sd, std::make_shared<MemoryWriter>(storage, "s" + std::to_string(step)), options));
    // Mutate everything right away: the save must not see it.
    sd["w"].tensor().fill_(-1.0);
    sd["b"].tensor().fill_(-1);
  }
  for (int step = 1; step <= 4; ++step) {
    pending[step - 1].get();
    StateDict loaded = load_like(sd, storage, "s" + std::to_string(step));
    EXPECT_TRUE(at::equal(loaded["w"].tensor(), at::full({64, 64}, static_cast<double>(step))))
        << "save " << step << " does not hold its own weights";
    EXPECT_TRUE(at::equal(loaded["b"].tensor(), at::full({64}, step * 10, at::kInt)));
    EXPECT_EQ(loaded["step"], Value(step));
  }
  // Warm buffers: one allocation per tensor, then only reuse.
  const StagingStats stats = stager->stats();
  EXPECT_EQ(stats.allocations, 2);
  EXPECT_EQ(stats.reuses, 6);
  EXPECT_EQ(stats.saves, 4);
}

// Note [Parallel staging copies]: tensors larger than a copy piece (8 MiB), split over threads,
// views with a storage offset, non-contiguous tensors (copied on their own) and empty ones are
// staged bitwise, and the caller may overwrite them as soon as async_save returns.
TEST(AsyncSaveTest, ParallelStagingCopiesEveryByteOfEveryLayout) {
  MemoryStorage storage;
  StagingOptions staging;
  staging.copy_threads = 3;
  AsyncSaveOptions options;
  options.stager = std::make_shared<DefaultStager>(staging);
  const at::Tensor big = testing::make_tensor(at::kFloat, {5 * 1024 * 1024 + 3}, 1);  // 20 MiB
  const at::Tensor base = testing::make_tensor(at::kDouble, {40, 30}, 2);
  const at::Tensor bf16 = testing::make_tensor(at::kBFloat16, {4097}, 3);
  StateDict sd;
  sd["big"] = big.clone();
  sd["offset_view"] = base.clone().narrow(0, 7, 20);  // contiguous, storage offset 210
  sd["transposed"] = base.clone().t();                // not contiguous
  sd["bf16"] = bf16.clone();
  sd["empty"] = at::empty({0, 5});
  AsyncSaveFuture pending = async_save(sd, std::make_shared<MemoryWriter>(storage, "p"), options);
  for (const char* k : {"big", "offset_view", "transposed", "bf16"}) sd[k].tensor().fill_(-7);
  pending.get();
  StateDict loaded = load_like(sd, storage, "p");
  EXPECT_TRUE(at::equal(loaded["big"].tensor(), big));
  EXPECT_TRUE(at::equal(loaded["offset_view"].tensor(), base.narrow(0, 7, 20)));
  EXPECT_TRUE(at::equal(loaded["transposed"].tensor(), base.t()));
  EXPECT_TRUE(at::equal(loaded["bf16"].tensor(), bf16));
  EXPECT_EQ(loaded["empty"].tensor().sizes(), at::IntArrayRef({0, 5}));
}

// Without use_async_staging, async_save returns once staging is done: the staging future is
// ready at once.
TEST(AsyncSaveTest, StagingIsCompleteWhenAsyncSaveReturns) {
  MemoryStorage storage;
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {128, 64}, 1);
  AsyncSaveFuture pending = async_save(sd, std::make_shared<MemoryWriter>(storage, "s"));
  EXPECT_EQ(pending.staging_completion().wait_for(std::chrono::seconds(0)),
            std::future_status::ready);
  EXPECT_LE(pending.staging_seconds(), pending.blocking_seconds());
  pending.get();
}

// Note [Asynchronous staging]: async_save returns before the staging copies are done (the end
// of the kStage event, reported on the staging thread, waits here until the call has
// returned), the staged values are those of the call once staging_completion() is ready, and a
// tensor the caller drops right after the call is still staged whole.
TEST(AsyncSaveTest, AsyncStagingReturnsBeforeTheCopiesAndSavesTheValuesOfTheCall) {
  MemoryStorage storage;
  AsyncSaveOptions options = async_staging_options(/*max_in_flight=*/1, /*copy_threads=*/2);
  std::mutex mu;
  std::condition_variable cv;
  bool returned = false;                 // guarded by mu
  bool staged_after_return = false;      // guarded by mu
  std::thread::id caller = std::this_thread::get_id(), stage_end_thread;
  options.on_event = [&](const Event& e) {
    if (e.phase != Phase::kStage || !e.end) return;
    std::unique_lock<std::mutex> lock(mu);
    stage_end_thread = std::this_thread::get_id();
    staged_after_return = cv.wait_for(lock, std::chrono::seconds(60), [&] { return returned; });
  };
  const at::Tensor big = testing::make_tensor(at::kFloat, {3 * 1024 * 1024 + 5}, 1);  // 12 MiB
  const at::Tensor base = testing::make_tensor(at::kDouble, {40, 30}, 2);
  const at::Tensor dropped = testing::make_tensor(at::kInt, {2 * 1024 * 1024}, 3);
  StateDict sd;
  sd["big"] = big.clone();
  sd["transposed"] = base.clone().t();  // a strided copy
  sd["dropped"] = dropped.clone();
  sd["step"] = 7;
  AsyncSaveFuture pending = async_save(sd, std::make_shared<MemoryWriter>(storage, "a"), options);
  sd["dropped"] = at::full({2 * 1024 * 1024}, -7, at::kInt);  // the call's tensor is released
  {
    std::lock_guard<std::mutex> lock(mu);
    returned = true;
  }
  cv.notify_all();
  pending.staging_completion().get();
  for (const char* k : {"big", "transposed"}) sd[k].tensor().fill_(-7);
  sd["step"] = 8;
  pending.get();
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(staged_after_return) << "async_save waited for the staging copies";
    EXPECT_NE(stage_end_thread, caller);
  }
  EXPECT_LT(pending.blocking_seconds(), pending.staging_seconds());
  EXPECT_LE(pending.staging_seconds(), pending.save_seconds());
  StateDict loaded = load_like(sd, storage, "a");
  EXPECT_TRUE(at::equal(loaded["big"].tensor(), big));
  EXPECT_TRUE(at::equal(loaded["transposed"].tensor(), base.t()));
  EXPECT_TRUE(at::equal(loaded["dropped"].tensor(), dropped));
  EXPECT_EQ(loaded["step"], Value(7));
}

// Asynchronous staging keeps the order of saves and the reuse of buffers, with several in
// flight.
TEST(AsyncSaveTest, AsyncStagingKeepsOrderAndReusesBuffers) {
  MemoryStorage storage;
  AsyncSaveOptions options = async_staging_options(/*max_in_flight=*/2);
  std::atomic<int> submitted{0};
  options.on_event = hold_first_save_until_two_submitted(submitted);
  StateDict sd;
  sd["w"] = at::zeros({256, 256});
  std::vector<AsyncSaveFuture> pending;
  for (int step = 1; step <= 5; ++step) {
    sd["w"].tensor().fill_(static_cast<double>(step));
    pending.push_back(async_save(
        sd, std::make_shared<MemoryWriter>(storage, "o" + std::to_string(step)), options));
    ++submitted;
    pending.back().staging_completion().get();
  }
  for (int step = 1; step <= 5; ++step) {
    pending[step - 1].get();
    StateDict loaded = load_like(sd, storage, "o" + std::to_string(step));
    EXPECT_TRUE(at::equal(loaded["w"].tensor(), at::full({256, 256}, static_cast<double>(step))))
        << "save " << step;
  }
  // One buffer per slot (both slots were used), and every other save reuses one.
  const StagingStats stats = options.stager->stats();
  EXPECT_EQ(stats.allocations, 2);
  EXPECT_EQ(stats.reuses, 3);
  EXPECT_EQ(stats.saves, 5);
}

// A staging failure with use_async_staging fails the staging future as well as the save's.
TEST(AsyncSaveTest, AsyncStagingFailureReachesBothFutures) {
  MemoryStorage storage;
  const AsyncSaveOptions options = async_staging_options();
  StateDict sd;
  sd["w"] = at::ones({8});
  sd["broken"] = at::Tensor();
  AsyncSaveFuture pending = async_save(sd, std::make_shared<MemoryWriter>(storage, "f"), options);
  EXPECT_THROW(pending.staging_completion().get(), c10::Error);
  EXPECT_THROW(pending.get(), c10::Error);
  EXPECT_FALSE(storage.get("f", ".metadata").has_value());
  sd.erase("broken");
  async_save(sd, std::make_shared<MemoryWriter>(storage, "g"), options).get();
  EXPECT_TRUE(storage.get("g", ".metadata").has_value());
}

// Note [Asynchronous staging]: a save whose staging fails at once still waits behind the
// saves submitted before it, which are still being staged: the worker runs saves in submission
// order on every rank, as their collectives must pair up across ranks.
TEST(AsyncSaveTest, AsyncStagingKeepsSubmissionOrderWhenALaterStagingFails) {
  MemoryStorage storage;
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;            // guarded by mu
  std::vector<std::string> order;  // the saves in the order the worker started them; mu
  auto hook = [&](const std::string& label) {
    return [&, label](const Event& e) {
      std::unique_lock<std::mutex> lock(mu);
      if (e.phase == Phase::kStage && e.end && label == "first") {
        cv.wait_for(lock, std::chrono::seconds(60), [&] { return release; });
      }
      if (e.phase == Phase::kSave && !e.end) order.push_back(label);
    };
  };
  AsyncSaveOptions first = async_staging_options(/*max_in_flight=*/2);
  first.on_event = hook("first");
  AsyncSaveOptions second = first;
  second.on_event = hook("second");
  StateDict good;
  good["w"] = testing::make_tensor(at::kFloat, {1024}, 1);
  StateDict bad = good;
  bad["broken"] = at::Tensor();  // staging fails in the call itself
  AsyncSaveFuture a = async_save(good, std::make_shared<MemoryWriter>(storage, "a"), first);
  AsyncSaveFuture b = async_save(bad, std::make_shared<MemoryWriter>(storage, "b"), second);
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  a.get();
  EXPECT_THROW(b.get(), c10::Error);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(order, (std::vector<std::string>{"first", "second"}));
}

TEST(AsyncSaveTest, AtMostMaxInFlightSavesAndTheirMemory) {
  StagingOptions staging;
  staging.max_in_flight = 2;
  auto stager = std::make_shared<DefaultStager>(staging);
  AsyncSaveOptions options;
  options.stager = stager;
  std::atomic<int> submitted{0};
  options.on_event = hold_first_save_until_two_submitted(submitted);
  MemoryStorage storage;
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {256, 256}, 1);
  std::vector<AsyncSaveFuture> pending;
  for (int i = 0; i < 6; ++i) {
    pending.push_back(async_save(sd, std::make_shared<MemoryWriter>(storage, "c" + std::to_string(i)), options));
    ++submitted;
  }
  for (auto& p : pending) p.get();
  // Two slots, each with its own buffer, never more.
  EXPECT_EQ(stager->stats().allocations, 2);
  EXPECT_EQ(stager->stats().bytes_allocated, 2 * 256 * 256 * 4);
}

TEST(AsyncSaveTest, AFailureOnOneRankReachesEveryHandleAndTheNextSaveWorks) {
  MemoryStorage storage;
  std::vector<std::string> messages(3);
  run_in_process(3, [&](Communicator& comm) {
    auto stager = std::make_shared<DefaultStager>();
    AsyncSaveOptions options;
    options.comm = &comm;
    options.stager = stager;
    StateDict sd = testing::sharded_state(comm.rank(), 3, testing::Layout::kRow, false);
    auto real = std::make_shared<MemoryWriter>(storage, "bad");
    auto faulty = std::make_shared<testing::FaultInjectionWriter>(
        real, comm.rank() == 1 ? testing::FaultPoint::kWriteData : testing::FaultPoint::kNone);
    AsyncSaveFuture failed = async_save(sd, faulty, options);
    try {
      failed.get();
    } catch (const c10::Error& e) {
      messages[comm.rank()] = e.what_without_backtrace();
    }
    AsyncSaveFuture next = async_save(sd, std::make_shared<MemoryWriter>(storage, "good"), options);
    next.get();
  });
  for (const auto& m : messages) {
    EXPECT_NE(m.find("failed on rank 1 of 3"), std::string::npos) << m;
  }
  EXPECT_FALSE(storage.get("bad", ".metadata").has_value());
  testing::load_in_process_and_check(storage, "good", 2, testing::Layout::kColumn);
}

TEST(AsyncSaveTest, TrainerCollectivesRunConcurrentlyOnTheUserCommunicator) {
  MemoryStorage storage;
  run_in_process(4, [&](Communicator& comm) {
    auto stager = std::make_shared<DefaultStager>();
    AsyncSaveOptions options;
    options.comm = &comm;
    options.stager = stager;
    for (int round = 0; round < 3; ++round) {
      StateDict sd = testing::sharded_state(comm.rank(), 4, testing::Layout::kRow, false);
      AsyncSaveFuture pending =
          async_save(sd, std::make_shared<MemoryWriter>(storage, "r" + std::to_string(round)), options);
      // The "trainer" keeps exchanging messages on its own communicator meanwhile.
      for (int i = 0; i < 20; ++i) {
        auto all = comm.all_gather(std::to_string(comm.rank() * 100 + i));
        for (int r = 0; r < comm.size(); ++r) TORCH_CHECK(all[r] == std::to_string(r * 100 + i));
      }
      pending.get();
    }
  });
  testing::load_in_process_and_check(storage, "r2", 3, testing::Layout::kRow);
}

TEST(AsyncSaveTest, APendingSaveCompletesWhenItsHandleAndStagerGoAway) {
  testing::TempDir dir;
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {512, 512}, 3);
  {
    AsyncSaveFuture pending = async_save(sd, dir.sub("ckpt"));  // its own stager
    // Handle destroyed here while the save may still run: destruction waits for it.
  }
  EXPECT_TRUE(std::filesystem::exists(dir.sub("ckpt/.metadata")));
  StateDict loaded;
  loaded["w"] = at::zeros({512, 512});
  load(loaded, dir.sub("ckpt"));
  EXPECT_TRUE(at::equal(loaded["w"].tensor(), sd["w"].tensor()));

  AsyncSaveOptions options;
  options.stager = std::make_shared<DefaultStager>();
  AsyncSaveFuture detached = async_save(sd, dir.sub("ckpt2"), options);
  detached = AsyncSaveFuture();  // the handle is gone; the stager still owns the save
  options.stager.reset();        // destroying the stager waits for it
  EXPECT_TRUE(std::filesystem::exists(dir.sub("ckpt2/.metadata")));
}

TEST(AsyncSaveTest, ProcessExitWithASavePendingLeavesNoPartialCheckpoint) {
  testing::TempDir dir;
  StateDict sd;
  sd["w"] = testing::make_tensor(at::kFloat, {256, 256}, 5);
  save(sd, dir.sub("earlier"));
  // A separate process (tests/async_exit_tool.cpp) starts a save and _exits while it is pending.
  const std::string cmd = std::string(DCP_ASYNC_EXIT_TOOL) + " " + dir.sub("pending");
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << "the process crashed";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the save was not pending any more";
  EXPECT_FALSE(std::filesystem::exists(dir.sub("pending/.metadata")));
  StateDict loaded;
  loaded["w"] = at::zeros({256, 256});
  load(loaded, dir.sub("earlier"));
  EXPECT_TRUE(at::equal(loaded["w"].tensor(), sd["w"].tensor()));
}

}  // namespace
}  // namespace dcp
