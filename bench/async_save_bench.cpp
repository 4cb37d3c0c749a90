// Benchmark: how long dcp::async_save blocks the caller, against the wall time of a synchronous
// dcp::save of the same state, once staging buffers are warm. One process, real files.
//
//   async_save_bench [dir] [MiB=1024] [repeats=3] [copy_threads=0 (the machine's)]
//
// Prints both times and their ratio (target: blocking <= 10% of the synchronous save), and the
// blocking time against one plain memcpy of the state's bytes into warm buffers, measured in the
// same run (target: <= 1.2x; staging copies CPU tensors on StagingOptions::copy_threads).
// Then the same with StagingOptions::use_async_staging (Python's): how long async_save blocks
// when the copies run on the staging thread, and how long until staging_completion(). Last,
// how long CheckpointManager::save blocks in a loop of async saves that keeps one step, each
// save dropping an older one.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "dcp/dcp.h"

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);
  const std::string dir = argc > 1 ? argv[1] : "async_bench_ckpt";
  const int64_t mib = argc > 2 ? std::stoll(argv[2]) : 1024;
  const int repeats = argc > 3 ? std::stoi(argv[3]) : 3;
  // 16 tensors of mib/16 MiB each, float32.
  dcp::StateDict state;
  const int64_t per = mib * 1024 * 1024 / 16 / 4;
  for (int i = 0; i < 16; ++i) state["layer" + std::to_string(i)] = at::randn({per});
  state["step"] = 0;

  dcp::StagingOptions staging;
  staging.copy_threads = argc > 4 ? std::stoi(argv[4]) : 0;
  auto stager = std::make_shared<dcp::DefaultStager>(staging);
  dcp::AsyncSaveOptions options;
  options.stager = stager;
  dcp::async_save(state, dir + "/warmup", options).get();  // allocates the staging buffers
  dcp::StagingOptions async_staging = staging;
  async_staging.use_async_staging = true;
  dcp::AsyncSaveOptions async_options;
  async_options.stager = std::make_shared<dcp::DefaultStager>(async_staging);
  dcp::async_save(state, dir + "/warmup_async", async_options).get();

  // One plain memcpy of the same bytes into buffers already touched once (as warm staging is).
  std::vector<at::Tensor> copies;
  for (const auto& [k, v] : state) {
    if (v.is_tensor()) copies.push_back(at::empty_like(v.tensor()).fill_(0));
  }
  double memcpy_total = 0;
  double blocked = 0, async_total = 0, sync_total = 0, async_blocked = 0, async_staged = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto tm = std::chrono::steady_clock::now();
    size_t c = 0;
    for (const auto& [k, v] : state) {
      if (!v.is_tensor()) continue;
      const at::Tensor& src = v.tensor();
      std::memcpy(copies[c++].data_ptr(), src.data_ptr(), src.numel() * src.element_size());
    }
    memcpy_total += seconds_since(tm);

    const auto t0 = std::chrono::steady_clock::now();
    auto pending = dcp::async_save(state, dir + "/async_" + std::to_string(r), options);
    blocked += pending.blocking_seconds();
    pending.get();
    async_total += seconds_since(t0);

    auto pending_async =
        dcp::async_save(state, dir + "/async_staging_" + std::to_string(r), async_options);
    async_blocked += pending_async.blocking_seconds();
    async_staged += pending_async.staging_seconds();
    pending_async.get();

    const auto t1 = std::chrono::steady_clock::now();
    dcp::save(state, dir + "/sync_" + std::to_string(r));
    sync_total += seconds_since(t1);
  }
  memcpy_total /= repeats;
  blocked /= repeats;
  async_total /= repeats;
  sync_total /= repeats;
  async_blocked /= repeats;
  async_staged /= repeats;
  std::printf("state: %lld MiB in 16 tensors; %d repeats; staging buffers warm\n",
              static_cast<long long>(mib), repeats);
  std::printf("synchronous save wall time : %8.3f s  (%.2f GB/s)\n", sync_total,
              mib * 1048576.0 / sync_total / 1e9);
  std::printf("async_save blocking time   : %8.3f s\n", blocked);
  std::printf("async_save until committed : %8.3f s\n", async_total);
  std::printf("plain memcpy of the bytes   : %8.3f s  (%.2f GB/s, one thread)\n", memcpy_total,
              mib * 1048576.0 / memcpy_total / 1e9);
  std::printf("ratio blocking / synchronous save: %.3f (target <= 0.10)\n", blocked / sync_total);
  std::printf("ratio blocking / plain memcpy    : %.3f (target <= 1.2)\n", blocked / memcpy_total);
  std::printf("use_async_staging: async_save blocking %.4f s, staging complete after %.3f s "
              "(%.3f of the blocking staging)\n",
              async_blocked, async_staged, async_blocked / blocked);

  // A training loop's saves through CheckpointManager (async, keep_last_n = 1): from the third
  // save on, each save() also drops the step before last. The loop "trains" between saves for
  // twice the synchronous save's time, so the previous async save has long committed and the
  // time save() blocks is what the loop pays: staging, plus whatever retention does on its
  // thread (Note [Background retention] in src/checkpoint_manager.cpp).
  dcp::CheckpointManagerOptions manager_options;
  manager_options.async = true;
  manager_options.keep_last_n = 1;
  manager_options.save_options.stager = stager;
  double manager_blocked = 0;
  int manager_saves = 0;
  {
    dcp::CheckpointManager manager(dir + "/manager", manager_options);
    for (int step = 0; step < repeats + 2; ++step) {
      const auto t2 = std::chrono::steady_clock::now();
      manager.save(step, state);
      if (step >= 2) {  // a step to drop
        manager_blocked += seconds_since(t2);
        ++manager_saves;
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(2 * sync_total));
    }
    manager.wait_until_finished();
  }
  manager_blocked /= manager_saves;
  std::printf("CheckpointManager (async, keep_last_n=1): save() blocks %.3f s (%.3f of "
              "async_save's blocking time), dropping a %lld MiB step each time\n",
              manager_blocked, manager_blocked / blocked, static_cast<long long>(mib));
  std::filesystem::remove_all(dir);
  return 0;
}
