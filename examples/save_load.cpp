// Example: train a small torch::nn model a few steps with Adam, save model + optimizer state
// (dcp::get_state_dict: Python's layout, learning rate and betas included) + the step with
// dcp::save, load everything into a fresh model and optimizer with dcp::load +
// dcp::set_state_dict, and show that both produce identical outputs and identical next steps.
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

  auto [model_sd, optim_sd] = dcp::get_state_dict(net, adam);
  dcp::StateDict state{{"model", model_sd}, {"optim", optim_sd}, {"step", 5}};
  const dcp::Metadata md = dcp::save(state, dir);
  std::cout << "saved " << md.state_dict_metadata.size() << " entries to " << dir << "\n";

  // A fresh model and optimizer with different weights and learning rate, filled from the
  // checkpoint: get_state_dict gives the destination, load fills it, set_state_dict applies it.
  torch::manual_seed(123);
  Net fresh;
  torch::optim::Adam fresh_adam(fresh.parameters(), torch::optim::AdamOptions(1.0));
  auto [fresh_model_sd, fresh_optim_sd] = dcp::get_state_dict(fresh, fresh_adam);
  dcp::StateDict restored{{"model", fresh_model_sd}, {"optim", fresh_optim_sd}, {"step", 0}};
  dcp::load(restored, dir);
  dcp::set_state_dict(fresh, fresh_adam, restored.at("model").dict(), restored.at("optim").dict());

  std::cout << "loaded step " << restored.at("step").get<int64_t>() << ", lr "
            << fresh_adam.param_groups()[0].options().get_lr() << "\n";
  const bool same_output = torch::equal(net.forward(x), fresh.forward(x));
  const double a = train_step(net, adam, x, y);
  const double b = train_step(fresh, fresh_adam, x, y);
  const bool same_params = torch::equal(net.fc2->weight, fresh.fc2->weight);
  std::cout << "outputs identical after load: " << (same_output ? "yes" : "NO") << "\n"
            << "next step loss original " << a << ", restored " << b << "; parameters identical: "
            << (same_params ? "yes" : "NO") << "\n";
  return same_output && same_params && a == b ? 0 : 1;
}
