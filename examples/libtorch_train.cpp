// Example: a torch::nn training loop with a torch::optim optimizer, checkpointed with
// dcp::CheckpointManager (async saves, retention, resume from the latest step), under mpirun.
// The checkpoints have Python DCP's layout ({"app": {"model": ..., "optim": ...}}, the AppState
// of Python's documentation), so a run can resume in Python with get_state_dict /
// set_state_dict, and a run that Python saved resumes here (tests/interop/test_resume.py does
// both).
//
// Parallelism: with --shard, every parameter is sharded by rows over the ranks (DTensor
// Shard(0), as FSDP2 lays it out) with dcp::shard_module, and the optimizer holds only the local
// rows. A step all-gathers the parameters into a full copy of the model, runs forward and
// backward on the whole batch, and steps the optimizer on the local rows of the gradient.
// Without --shard every rank holds the whole model (DDP-style, identical on every rank).
//
//   mpirun -np 4 libtorch_train --root /shared/run --steps 20 --save-every 5 --async --shard
//   mpirun -np 3 libtorch_train --root /shared/run --steps 30 --shard   # resumes from step 20
//
// Rank 0 prints "step <n> loss <value>" for every step it runs (17 significant digits).
#include <ATen/Parallel.h>
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "dcp/dcp.h"

namespace {

struct Options {
  std::string root;
  int64_t steps = 10;
  int64_t save_every = 0;  // 0: no saves
  int64_t keep_last = 0;
  bool async = false;
  bool shard = false;
  std::string optimizer = "adam";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      TORCH_CHECK(i + 1 < argc, "missing value after ", a);
      return argv[++i];
    };
    if (a == "--root") o.root = next();
    else if (a == "--steps") o.steps = std::stoll(next());
    else if (a == "--save-every") o.save_every = std::stoll(next());
    else if (a == "--keep-last") o.keep_last = std::stoll(next());
    else if (a == "--async") o.async = true;
    else if (a == "--shard") o.shard = true;
    else if (a == "--optimizer") o.optimizer = next();
    else TORCH_CHECK(false, "unknown argument ", a);
  }
  TORCH_CHECK(!o.root.empty(), "--root is required");
  return o;
}

// The model, as Python writes it: nn.Sequential(Linear(16, 32), ReLU(), Linear(32, 32),
// ReLU(), Linear(32, 4)); parameter names "0.weight", "0.bias", "2.weight", ...
torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                               torch::nn::Linear(32, 32), torch::nn::ReLU(),
                               torch::nn::Linear(32, 4));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        torch::nn::Module& model) {
  if (name == "adam") {
    return std::make_unique<torch::optim::Adam>(model.parameters(),
                                                torch::optim::AdamOptions(1e-2));
  }
  if (name == "sgd") {
    return std::make_unique<torch::optim::SGD>(model.parameters(),
                                               torch::optim::SGDOptions(5e-2).momentum(0.9));
  }
  TORCH_CHECK(false, "unknown optimizer ", name, " (adam or sgd)");
}

// The rows of every rank's `local`, concatenated in rank order: the full Shard(0) tensor.
at::Tensor all_gather_rows(const at::Tensor& local, const std::vector<int64_t>& global_shape,
                           int world) {
  const int64_t row_elements = global_shape.size() > 1 ? global_shape[1] : 1;
  std::vector<int> counts(world), displs(world);
  for (int r = 0, offset = 0; r < world; ++r) {
    const auto box = dcp::compute_local_box(global_shape, {world}, {r}, {dcp::Placement::Shard(0)});
    counts[r] = static_cast<int>(box.sizes[0] * row_elements);
    displs[r] = offset;
    offset += counts[r];
  }
  at::Tensor full = torch::empty(global_shape, local.options());
  const at::Tensor src = local.contiguous();
  MPI_Allgatherv(src.data_ptr<float>(), static_cast<int>(src.numel()), MPI_FLOAT,
                 full.data_ptr<float>(), counts.data(), displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
  return full;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  at::set_num_threads(1);
  int exit_code = 0;
  {
    dcp::MpiCommunicator comm;
    const int rank = comm.rank(), world = comm.size();
    try {
      const Options options = parse(argc, argv);
      torch::manual_seed(1234);
      const at::Tensor x = torch::randn({64, 16});
      const at::Tensor y = torch::randn({64, 4});
      torch::manual_seed(0);
      torch::nn::Sequential full = make_model();   // what forward and backward run on
      torch::manual_seed(0);
      torch::nn::Sequential local = make_model();  // what the optimizer steps: the local rows
      dcp::StateDictOptions sd_options;
      if (options.shard) {
        sd_options.sharding = dcp::shard_module(
            *local, {world}, rank, [](const std::string&, const at::Tensor&) {
              return std::optional<std::vector<dcp::Placement>>({dcp::Placement::Shard(0)});
            });
      }
      auto optimizer = make_optimizer(options.optimizer, *local);

      // A user-defined Stateful beside the model and optimizer: the training position.
      struct Progress : dcp::Stateful {
        int64_t step = 0;
        dcp::StateDict state_dict() override { return dcp::Dict{{"step", step}}; }
        void load_state_dict(const dcp::StateDict& s) override {
          step = s.at("step").get<int64_t>();
        }
      };
      auto progress = std::make_shared<Progress>();
      dcp::StateDict state{
          {"app", std::make_shared<dcp::ModelOptimizerStateful>(*local, *optimizer, sd_options)},
          {"progress", progress}};

      dcp::CheckpointManagerOptions manager_options;
      manager_options.comm = &comm;
      manager_options.async = options.async;
      manager_options.keep_last_n = options.keep_last;
      manager_options.save_interval_steps = std::max<int64_t>(options.save_every, 1);
      dcp::CheckpointManager manager(options.root, manager_options);
      if (const auto latest = manager.latest_step()) {
        manager.load(state, *latest);  // fills the model, the optimizer and `progress`
        if (rank == 0) {
          std::printf("resumed from %s at step %lld\n", manager.directory(*latest).c_str(),
                      static_cast<long long>(progress->step));
        }
      }

      for (int64_t step = progress->step + 1; step <= options.steps; ++step) {
        // Parameters: gather the local rows into the full model.
        {
          torch::NoGradGuard no_grad;
          auto full_params = full->named_parameters();
          for (const auto& p : local->named_parameters()) {
            const at::Tensor whole =
                options.shard
                    ? all_gather_rows(p.value(), full_params[p.key()].sizes().vec(), world)
                    : p.value();
            full_params[p.key()].copy_(whole);
          }
        }
        full->zero_grad();
        const at::Tensor loss = torch::mse_loss(full->forward(x), y);
        loss.backward();
        if (rank == 0) {
          std::printf("step %lld loss %.17g\n", static_cast<long long>(step), loss.item<double>());
        }
        // Gradients: this rank's rows of the full gradient.
        auto full_params = full->named_parameters();
        for (const auto& p : local->named_parameters()) {
          at::Tensor grad = full_params[p.key()].grad();
          if (options.shard) {
            const auto& s = sd_options.sharding.at(p.key());
            const auto box =
                dcp::compute_local_box(s.global_shape, s.mesh_shape, {rank}, s.placements);
            grad = grad.narrow(0, std::min(box.offsets[0], grad.size(0)), box.sizes[0]);
          }
          p.value().mutable_grad() = grad.clone();
        }
        optimizer->step();
        progress->step = step;
        if (options.save_every > 0) manager.save(step, state);
      }
      manager.wait_until_finished();
    } catch (const std::exception& e) {
      std::cerr << "rank " << rank << ": " << e.what() << "\n";
      exit_code = 1;
    }
  }
  MPI_Finalize();
  return exit_code;
}
