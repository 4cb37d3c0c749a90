// Example: a training loop under mpirun that checkpoints asynchronously every few steps and
// prints, per save, how long the loop was blocked (staging) against how long the save took.
//
//   mpirun -np 4 async_train --steps 20 --save-every 5 --ckpt-dir /shared/run --mb 64
//
// Each rank holds --mb MiB of parameters (row shards of a few large matrices) and updates them
// every step; saves run on a background worker while the loop keeps training.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "dcp/dcp.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  at::set_num_threads(1);
  int steps = 20, save_every = 5;
  int64_t mb = 64;
  std::string dir = "async_ckpt";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--steps") steps = std::stoi(argv[i + 1]);
    else if (a == "--save-every") save_every = std::stoi(argv[i + 1]);
    else if (a == "--ckpt-dir") dir = argv[i + 1];
    else if (a == "--mb") mb = std::stoll(argv[i + 1]);
  }
  int rc = 0;
  {
    dcp::MpiCommunicator comm(MPI_COMM_WORLD);
    const int rank = comm.rank(), world = comm.size();
    try {
      // Four [rows, 1024] float32 matrices, row-sharded: about `mb` MiB on each rank.
      const int64_t rows = std::max<int64_t>(1, mb * 1024 * 1024 / 4 / 1024 / 4) * world;
      std::vector<at::Tensor> params;
      dcp::Dict model;
      for (int i = 0; i < 4; ++i) {
        auto box = dcp::compute_local_box({rows, 1024}, {world}, {rank}, {dcp::Placement::Shard(0)});
        at::Tensor p = at::randn(box.sizes);
        params.push_back(p);
        model["layer" + std::to_string(i)] =
            dcp::ShardedTensor({rows, 1024}, at::kFloat, {dcp::Shard{p, box.offsets}});
      }
      auto stager = std::make_shared<dcp::DefaultStager>();
      dcp::AsyncSaveOptions options;
      options.comm = &comm;
      options.stager = stager;
      std::vector<std::pair<dcp::AsyncSaveFuture, int>> pending;
      auto t_start = std::chrono::steady_clock::now();
      for (int step = 1; step <= steps; ++step) {
        // "Training": some compute, then an update of every parameter.
        at::Tensor block = params[0].narrow(0, 0, std::min<int64_t>(256, params[0].size(0)));
        at::Tensor g = at::tanh(at::mm(block.t(), block)).mean();
        for (auto& p : params) p.mul_(0.999).add_(g * 1e-3);
        double local = params[0].sum().item<double>(), total = 0;
        MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (step % save_every == 0) {
          dcp::StateDict state;
          state["model"] = model;
          state["step"] = step;
          auto future = dcp::async_save(state, dir + "/step_" + std::to_string(step), options);
          if (rank == 0) {
            std::printf("step %d: async_save blocked the loop for %.3f s\n", step,
                        future.blocking_seconds());
          }
          pending.emplace_back(std::move(future), step);
        }
      }
      for (auto& [future, step] : pending) {
        future.get();
        if (rank == 0) {
          std::printf("save at step %d: loop blocked %.3f s, save took %.3f s until committed\n",
                      step, future.blocking_seconds(), future.save_seconds());
        }
      }
      const double total_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      // The cost of one save done synchronously, for comparison.
      dcp::StateDict state;
      state["model"] = model;
      state["step"] = steps;
      dcp::SaveOptions sync_options;
      sync_options.comm = &comm;
      const auto t0 = std::chrono::steady_clock::now();
      dcp::save(state, dir + "/sync", sync_options);
      const double sync_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      double blocked = 0;
      for (auto& [future, step] : pending) blocked += future.blocking_seconds();
      if (rank == 0) {
        std::printf("%zu async saves of %.0f MiB per rank on %d ranks: blocked %.3f s in total "
                    "(%.3f s each), a synchronous save takes %.3f s; loop wall time %.3f s\n",
                    pending.size(), double(mb), world, blocked, blocked / pending.size(), sync_s,
                    total_s);
      }
    } catch (const c10::Error& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what_without_backtrace());
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}
