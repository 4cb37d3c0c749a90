// Example: an FSDP-style trainer under mpirun that checkpoints with dcp::save and resumes on a
// different number of ranks with dcp::load.
//
// Every rank holds row shards (DTensor Shard(0) over all ranks) of each parameter and of its
// Adam state. A step all-gathers the parameters over MPI, runs forward/backward on the rank's
// slice of the global batch, reduce-scatters the gradients over MPI (each rank receives the
// summed gradient of its own rows) and updates its shards with Adam. The math does not depend
// on the number of ranks beyond floating-point summation order, so a run resumed on 4 or 8
// ranks from a checkpoint written on 16 continues the same loss trajectory (in float64, equal
// to ~1e-12 relative).
//
//   mpirun -np 16 fsdp_train --steps 12 --save-every 6 --ckpt-dir /shared/run
//   mpirun -np 4  fsdp_train --steps 12 --resume /shared/run/step_6
//
// Rank 0 prints one line per step: "step <n> loss <value>".
#include <ATen/Parallel.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "dcp/dcp.h"

namespace {

constexpr int64_t kIn = 32, kHidden = 64, kOut = 8, kBatch = 64;
constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;

struct Options {
  int steps = 12;
  int save_every = 0;
  std::string ckpt_dir;
  std::string resume;
  double lr = 1e-2;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      TORCH_CHECK(i + 1 < argc, "missing value after ", a);
      return argv[++i];
    };
    if (a == "--steps") o.steps = std::stoi(next());
    else if (a == "--save-every") o.save_every = std::stoi(next());
    else if (a == "--ckpt-dir") o.ckpt_dir = next();
    else if (a == "--resume") o.resume = next();
    else if (a == "--lr") o.lr = std::stod(next());
    else TORCH_CHECK(false, "unknown argument ", a);
  }
  return o;
}

// One parameter, sharded by rows over the ranks, with its Adam state.
struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int64_t row_offset = 0;
  at::Tensor shard, exp_avg, exp_avg_sq;  // local rows
  std::vector<int> counts, displs;        // elements per rank, for MPI v-collectives
};

class FsdpTrainer {
 public:
  FsdpTrainer(MPI_Comm comm, const Options& options) : comm_(comm), options_(options) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_);
    // Identical full initialisation on every world size; each rank keeps its rows.
    torch::manual_seed(0);
    add("fc1.weight", torch::randn({kHidden, kIn}, torch::kDouble) / std::sqrt(double(kIn)));
    add("fc1.bias", torch::zeros({kHidden}, torch::kDouble));
    add("fc2.weight", torch::randn({kOut, kHidden}, torch::kDouble) / std::sqrt(double(kHidden)));
    add("fc2.bias", torch::zeros({kOut}, torch::kDouble));
    torch::manual_seed(1234);
    teacher_ = torch::randn({kOut, kIn}, torch::kDouble);
  }

  int step() const { return step_; }

  // The checkpoint: sharded parameters and Adam state, plus step and learning rate.
  dcp::StateDict state_dict() {
    dcp::Dict model, optim_state;
    for (auto& p : params_) {
      model[p.name] = sharded(p, p.shard);
      optim_state[p.name] = dcp::Dict{{std::string("exp_avg"), dcp::Value(sharded(p, p.exp_avg))},
                                      {std::string("exp_avg_sq"), dcp::Value(sharded(p, p.exp_avg_sq))}};
    }
    dcp::Dict group{{std::string("lr"), dcp::Value(options_.lr)},
                    {std::string("betas"), dcp::Value(dcp::Tuple{{kBeta1, kBeta2}})},
                    {std::string("eps"), dcp::Value(kEps)}};
    dcp::StateDict sd;
    sd["model"] = model;
    sd["optim"] = dcp::Dict{{std::string("state"), dcp::Value(optim_state)},
                            {std::string("param_groups"), dcp::Value(dcp::List{dcp::Value(group)})}};
    sd["step"] = int64_t{step_};
    return sd;
  }

  // After dcp::load filled `sd` (tensors in place), take over the non-tensor values.
  void restore(const dcp::StateDict& sd) {
    step_ = static_cast<int>(sd.at("step").get<int64_t>());
    const auto& group = sd.at("optim").dict().at("param_groups").list().at(0).dict();
    options_.lr = group.at("lr").get<double>();
  }

  double train_step() {
    ++step_;
    // Parameter all-gather.
    std::vector<at::Tensor> full;
    for (auto& p : params_) {
      at::Tensor t = torch::empty(p.shape, torch::kDouble);
      MPI_Allgatherv(p.shard.data_ptr<double>(), p.counts[rank_], MPI_DOUBLE, t.data_ptr<double>(),
                     p.counts.data(), p.displs.data(), MPI_DOUBLE, comm_);
      full.push_back(t.requires_grad_(true));
    }
    // This rank's slice of the step's global batch (the same batch on every world size).
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step_);
    at::Tensor x = at::randn({kBatch, kIn}, gen, torch::kDouble);
    at::Tensor y = at::tanh(x.matmul(teacher_.t()));
    const auto box = dcp::compute_local_box({kBatch}, {world_}, {rank_}, {dcp::Placement::Shard(0)});
    const int64_t start = std::min(box.offsets[0], kBatch);
    x = x.narrow(0, start, box.sizes[0]);
    y = y.narrow(0, start, box.sizes[0]);

    at::Tensor h = torch::relu(x.matmul(full[0].t()) + full[1]);
    at::Tensor out = h.matmul(full[2].t()) + full[3];
    at::Tensor loss = (out - y).pow(2).sum() / double(kBatch * kOut);
    loss.backward();

    // Gradient reduce-scatter, then Adam on the local rows.
    const double bias1 = 1 - std::pow(kBeta1, step_), bias2 = 1 - std::pow(kBeta2, step_);
    for (size_t i = 0; i < params_.size(); ++i) {
      Param& p = params_[i];
      at::Tensor grad_full = full[i].grad().contiguous();
      at::Tensor grad = torch::empty_like(p.shard);
      MPI_Reduce_scatter(grad_full.data_ptr<double>(), grad.data_ptr<double>(), p.counts.data(),
                         MPI_DOUBLE, MPI_SUM, comm_);
      p.exp_avg.mul_(kBeta1).add_(grad, 1 - kBeta1);
      p.exp_avg_sq.mul_(kBeta2).addcmul_(grad, grad, 1 - kBeta2);
      p.shard.addcdiv_(p.exp_avg / bias1, (p.exp_avg_sq / bias2).sqrt_().add_(kEps), -options_.lr);
    }
    double local = loss.item<double>(), total = 0;
    MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, comm_);
    return total;
  }

 private:
  void add(const std::string& name, const at::Tensor& full) {
    Param p;
    p.name = name;
    p.shape = full.sizes().vec();
    const int64_t row_elems = full.numel() / p.shape[0];
    for (int r = 0; r < world_; ++r) {
      const auto box = dcp::compute_local_box(p.shape, {world_}, {r}, {dcp::Placement::Shard(0)});
      p.counts.push_back(static_cast<int>(box.sizes[0] * row_elems));
      p.displs.push_back(r == 0 ? 0 : p.displs[r - 1] + p.counts[r - 1]);
      if (r == rank_) {
        p.row_offset = box.offsets[0];
        p.shard = full.narrow(0, std::min(box.offsets[0], p.shape[0]), box.sizes[0]).clone();
      }
    }
    p.exp_avg = torch::zeros_like(p.shard);
    p.exp_avg_sq = torch::zeros_like(p.shard);
    params_.push_back(std::move(p));
  }

  dcp::ShardedTensor sharded(const Param& p, const at::Tensor& local) const {
    std::vector<int64_t> offsets(p.shape.size(), 0);
    offsets[0] = p.row_offset;
    return dcp::ShardedTensor(p.shape, at::kDouble, {dcp::Shard{local, offsets}});
  }

  MPI_Comm comm_;
  Options options_;
  int rank_ = 0, world_ = 1, step_ = 0;
  std::vector<Param> params_;
  at::Tensor teacher_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  at::set_num_threads(1);
  int rc = 0;
  {
    MPI_Comm train_comm;  // the trainer's own traffic
    MPI_Comm_dup(MPI_COMM_WORLD, &train_comm);
    dcp::MpiCommunicator ckpt_comm(MPI_COMM_WORLD);  // the checkpoint's (its own duplicate)
    const int rank = ckpt_comm.rank();
    try {
      const Options options = parse(argc, argv);
      FsdpTrainer trainer(train_comm, options);
      if (!options.resume.empty()) {
        dcp::StateDict sd = trainer.state_dict();  // this world's shards, filled in place
        dcp::LoadOptions load_options;
        load_options.comm = &ckpt_comm;
        dcp::load(sd, options.resume, load_options);
        trainer.restore(sd);
        if (rank == 0) {
          std::printf("resumed from %s at step %d on %d ranks\n", options.resume.c_str(),
                      trainer.step(), ckpt_comm.size());
        }
      } else if (rank == 0) {
        std::printf("training from scratch on %d ranks\n", ckpt_comm.size());
      }
      while (trainer.step() < options.steps) {
        const double loss = trainer.train_step();
        if (rank == 0) std::printf("step %d loss %.15e\n", trainer.step(), loss);
        if (options.save_every > 0 && trainer.step() % options.save_every == 0) {
          TORCH_CHECK(!options.ckpt_dir.empty(), "--save-every needs --ckpt-dir");
          const std::string dir = options.ckpt_dir + "/step_" + std::to_string(trainer.step());
          dcp::SaveOptions save_options;
          save_options.comm = &ckpt_comm;
          dcp::save(trainer.state_dict(), dir, save_options);
          if (rank == 0) std::printf("saved %s\n", dir.c_str());
        }
        std::fflush(stdout);
      }
    } catch (const c10::Error& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what_without_backtrace());
      rc = 1;
    }
    MPI_Comm_free(&train_comm);
  }
  MPI_Finalize();
  return rc;
}
