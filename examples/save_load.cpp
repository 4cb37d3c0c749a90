// Example: train a small torch::nn model a few steps with Adam, save model + optimizer state +
// step + learning rate with dcp::save, load everything into a fresh model and optimizer with
// dcp::load, and show that both produce identical outputs and identical next steps.
//
//   save_load <checkpoint_dir>
#include <torch/torch.h>

#include <iostream>

#include "dcp/dcp.h"

namespace {

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2->forward(torch::relu(fc1->forward(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// The model's parameters and buffers as a dcp::Dict (tensors share storage with the model).
dcp::Dict model_state(Net& net) {
  dcp::Dict d;
  for (const auto& p : net.named_parameters()) d[p.key()] = p.value();
  for (const auto& b : net.named_buffers()) d[b.key()] = b.value();
  return d;
}

// Adam's per-parameter state, keyed by parameter name like Python's get_optimizer_state_dict.
// Missing entries (a fresh optimizer) are created so that load can fill them in place.
dcp::Dict optimizer_state(Net& net, torch::optim::Adam& adam) {
  dcp::Dict state;
  auto& per_param = adam.state();
  for (const auto& p : net.named_parameters()) {
    auto key = p.value().unsafeGetTensorImpl();
    if (!per_param.count(key)) {
      auto s = std::make_unique<torch::optim::AdamParamState>();
      s->step(0);
      s->exp_avg(torch::zeros_like(p.value()));
      s->exp_avg_sq(torch::zeros_like(p.value()));
      per_param[key] = std::move(s);
    }
    auto& s = static_cast<torch::optim::AdamParamState&>(*per_param[key]);
    state[p.key()] = dcp::Dict{{std::string("step"), dcp::Value(s.step())},
                               {std::string("exp_avg"), dcp::Value(s.exp_avg())},
                               {std::string("exp_avg_sq"), dcp::Value(s.exp_avg_sq())}};
  }
  return state;
}

void apply_steps(Net& net, torch::optim::Adam& adam, const dcp::Dict& state) {
  auto& per_param = adam.state();
  for (const auto& p : net.named_parameters()) {
    auto& s = static_cast<torch::optim::AdamParamState&>(*per_param[p.value().unsafeGetTensorImpl()]);
    s.step(state.at(p.key()).dict().at("step").get<int64_t>());
  }
}

double train_step(Net& net, torch::optim::Adam& adam, const torch::Tensor& x,
                  const torch::Tensor& y) {
  adam.zero_grad();
  auto loss = torch::mse_loss(net.forward(x), y);
  loss.backward();
  adam.step();
  return loss.item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " <checkpoint_dir>\n";
    return 2;
  }
  const std::string dir = argv[1];
  torch::manual_seed(0);
  at::set_num_threads(1);
  const auto x = torch::randn({64, 16});
  const auto y = torch::randn({64, 4});

  Net net;
  torch::optim::Adam adam(net.parameters(), torch::optim::AdamOptions(1e-2));
  for (int step = 1; step <= 5; ++step) {
    std::cout << "train step " << step << " loss " << train_step(net, adam, x, y) << "\n";
  }

  dcp::StateDict state;
  state["model"] = model_state(net);
  state["optim"] = dcp::Dict{{std::string("state"), dcp::Value(optimizer_state(net, adam))}};
  state["step"] = 5;
  state["lr"] = adam.param_groups()[0].options().get_lr();
  const dcp::Metadata md = dcp::save(state, dir);
  std::cout << "saved " << md.state_dict_metadata.size() << " entries to " << dir << "\n";

  // A fresh model and optimizer with different weights, filled from the checkpoint.
  torch::manual_seed(123);
  Net fresh;
  torch::optim::Adam fresh_adam(fresh.parameters(), torch::optim::AdamOptions(1.0));
  dcp::StateDict restored;
  restored["model"] = model_state(fresh);
  restored["optim"] =
      dcp::Dict{{std::string("state"), dcp::Value(optimizer_state(fresh, fresh_adam))}};
  restored["step"] = 0;
  restored["lr"] = 0.0;
  dcp::load(restored, dir);
  apply_steps(fresh, fresh_adam, restored["optim"].dict().at("state").dict());
  fresh_adam.param_groups()[0].options().set_lr(restored["lr"].get<double>());

  std::cout << "loaded step " << restored["step"].get<int64_t>() << ", lr "
            << restored["lr"].get<double>() << "\n";
  const bool same_output = torch::equal(net.forward(x), fresh.forward(x));
  const double a = train_step(net, adam, x, y);
  const double b = train_step(fresh, fresh_adam, x, y);
  const bool same_params = torch::equal(net.fc2->weight, fresh.fc2->weight);
  std::cout << "outputs identical after load: " << (same_output ? "yes" : "NO") << "\n"
            << "next step loss original " << a << ", restored " << b << "; parameters identical: "
            << (same_params ? "yes" : "NO") << "\n";
  return same_output && same_params && a == b ? 0 : 1;
}
