// The C++ half of tests/interop/test_optimizers.py: every optimizer that dcp's
// get_optimizer_state_dict supports, trained, saved and resumed with LibTorch, against the same
// optimizer in Python.
//
//   optimizer_tool train  <optimizer> <dir_a> <dir_b>   3 steps, save A; 1 more step, save B
//   optimizer_tool resume <optimizer> <dir_a> <dir_b>   load A (set_state_dict), 1 step, and
//                                                       compare with B: exit 0 when they agree
//
// Checkpoints hold {"model": get_model_state_dict, "optim": get_optimizer_state_dict}.
// Optimizers (the same hyper-parameters as the Python side): adam, adamw (amsgrad), sgd
// (momentum, nesterov), rmsprop (momentum, centered), adagrad (lr_decay).
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "dcp/dcp.h"

namespace {

constexpr double kRtol = 1e-5, kAtol = 1e-7;

torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                               torch::nn::Linear(32, 4));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        torch::nn::Module& model) {
  using namespace torch::optim;
  if (name == "adam") return std::make_unique<Adam>(model.parameters(), AdamOptions(1e-2));
  if (name == "adamw") {
    return std::make_unique<AdamW>(model.parameters(),
                                   AdamWOptions(1e-2).weight_decay(1e-2).amsgrad(true));
  }
  if (name == "sgd") {
    return std::make_unique<SGD>(model.parameters(),
                                 SGDOptions(5e-2).momentum(0.9).nesterov(true));
  }
  if (name == "rmsprop") {
    return std::make_unique<RMSprop>(model.parameters(),
                                     RMSpropOptions(1e-2).momentum(0.5).centered(true));
  }
  if (name == "adagrad") {
    return std::make_unique<Adagrad>(model.parameters(), AdagradOptions(1e-1).lr_decay(1e-3));
  }
  TORCH_CHECK(false, "unknown optimizer ", name);
}

void step(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, int index) {
  torch::manual_seed(1000 + index);
  const auto x = torch::randn({64, 16});
  const auto y = torch::randn({64, 4});
  optimizer.zero_grad();
  torch::mse_loss(model->forward(x), y).backward();
  optimizer.step();
}

void save_state(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer,
                const std::string& dir) {
  auto [model_sd, optim_sd] = dcp::get_state_dict(*model, optimizer);
  dcp::save(dcp::StateDict{{"model", model_sd}, {"optim", optim_sd}}, dir);
}

void load_state(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer,
                const std::string& dir) {
  auto [model_sd, optim_sd] = dcp::get_state_dict(*model, optimizer);
  dcp::StateDict state{{"model", model_sd}, {"optim", optim_sd}};
  dcp::load(state, dir);
  dcp::set_state_dict(*model, optimizer, state.at("model").dict(), state.at("optim").dict());
}

// Compares every tensor of two (flattened) state dicts; returns the number of mismatches.
int compare(const dcp::StateDict& got, const dcp::StateDict& want) {
  const dcp::FlatStateDict a = dcp::flatten_state_dict(got), b = dcp::flatten_state_dict(want);
  std::map<std::string, dcp::Value> expected(b.items.begin(), b.items.end());
  int bad = 0;
  double worst = 0;
  for (const auto& [key, value] : a.items) {
    auto it = expected.find(key);
    if (it == expected.end()) {
      std::cerr << "unexpected key " << key << "\n";
      ++bad;
      continue;
    }
    if (!value.is_tensor()) {
      if (value != it->second) {
        std::cerr << key << ": " << value << " vs " << it->second << "\n";
        ++bad;
      }
      continue;
    }
    const at::Tensor x = value.tensor().to(at::kDouble), y = it->second.tensor().to(at::kDouble);
    if (x.sizes() != y.sizes() || !torch::allclose(x, y, kRtol, kAtol)) {
      std::cerr << key << " differs\n";
      ++bad;
    }
    if (x.sizes() == y.sizes() && x.numel() > 0) {
      worst = std::max(worst, (x - y).abs().max().item<double>());
    }
  }
  std::printf("compared %zu values, largest absolute difference %.3g\n", a.items.size(), worst);
  return bad + static_cast<int>(a.items.size() != b.items.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: optimizer_tool train|resume <optimizer> <dir_a> <dir_b>\n";
    return 2;
  }
  at::set_num_threads(1);
  const std::string mode = argv[1], name = argv[2], dir_a = argv[3], dir_b = argv[4];
  try {
    torch::manual_seed(0);
    torch::nn::Sequential model = make_model();
    auto optimizer = make_optimizer(name, *model);
    if (mode == "train") {
      for (int i = 1; i <= 3; ++i) step(model, *optimizer, i);
      save_state(model, *optimizer, dir_a);
      step(model, *optimizer, 4);
      save_state(model, *optimizer, dir_b);
      return 0;
    }
    TORCH_CHECK(mode == "resume", "unknown mode ", mode);
    load_state(model, *optimizer, dir_a);
    step(model, *optimizer, 4);
    torch::manual_seed(7);
    torch::nn::Sequential reference = make_model();
    auto reference_optimizer = make_optimizer(name, *reference);
    load_state(reference, *reference_optimizer, dir_b);
    auto [m1, o1] = dcp::get_state_dict(*model, *optimizer);
    auto [m2, o2] = dcp::get_state_dict(*reference, *reference_optimizer);
    return compare(dcp::StateDict{{"model", m1}, {"optim", o1}},
                   dcp::StateDict{{"model", m2}, {"optim", o2}}) == 0
               ? 0
               : 1;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
