// From LibTorch modules and optimizers to state dicts and back: the C++ counterpart of Python's
// torch.distributed.checkpoint.state_dict (get_state_dict, set_state_dict,
// get_model_state_dict, get_optimizer_state_dict, StateDictOptions), with keys and values laid
// out exactly as Python's, so that a checkpoint moves between a Python and a C++ trainer:
//
//   model:     {"fc1.weight": Tensor, "fc1.bias": Tensor, ...}  (parameters, then buffers; the
//              FQNs of named_parameters / named_buffers)
//   optimizer: {"state": {"fc1.weight": {"step": 0-d float32 Tensor, "exp_avg": ..., ...}, ...},
//               "param_groups": [{"lr": 0.001, "betas": (0.9, 0.999), ..., "params": [FQNs]}]}
//
// Optimizers: Adam, AdamW, SGD, RMSprop and Adagrad, with the hyper-parameter names, flags and
// value types Python 2.13 writes for each (docs/training.md has the table). Sharded
// (FSDP-style) modules whose tensors are local pieces describe each piece's DTensor layout in
// StateDictOptions; the state dicts then hold ShardedTensors of the global tensors, and the
// optimizer's state follows its parameter's layout.
//
// Tensors of the returned dicts share storage with the module and the optimizer (except the
// optimizer's `step`, which LibTorch keeps as an integer), so dcp::load fills them in place;
// the set_* functions then copy whatever does not already share storage, and apply the
// non-tensor values.
//
// Thread-safety: as the module and the optimizer (no concurrent training step).
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dcp/sharded_tensor.h"
#include "dcp/state_dict.h"
#include "dcp/stateful.h"

namespace dcp {

/// How a module's local tensor is this rank's piece of a global tensor: the layout that
/// distribute_tensor uses (and DTensor's compute_local_shape_and_global_offset).
struct TensorSharding {
  std::vector<int64_t> global_shape;
  std::vector<int64_t> mesh_shape;
  std::vector<Placement> placements;  // one per mesh dimension
  int rank = 0;                       // this process's rank in the mesh (row-major)
};

struct StateDictOptions {
  /// Leave parameters with requires_grad == false out of the model state dict (Python's
  /// option of the same name); set_model_state_dict then does not miss them either.
  bool ignore_frozen_params = false;
  /// set_model_state_dict: raise on missing or unexpected keys instead of returning them.
  bool strict = true;
  /// Tensors of the module that are local pieces of a global tensor, by FQN.
  std::map<std::string, TensorSharding> sharding;
  /// Asked for the FQNs that `sharding` lacks: the layout, or nullopt when not sharded.
  std::function<std::optional<TensorSharding>(const std::string& fqn, const at::Tensor& local)>
      sharding_rule;
};

/// Python's _IncompatibleKeys.
struct IncompatibleKeys {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

/// The module's parameters and buffers by FQN (ShardedTensors where sharded). Values share
/// storage with the module.
Dict get_model_state_dict(const torch::nn::Module& model, const StateDictOptions& options = {});

/// Copies `state` (Tensors or ShardedTensors by FQN) into the module. Throws on a shape
/// mismatch, naming the key; missing and unexpected keys raise when options.strict, and are
/// returned otherwise.
IncompatibleKeys set_model_state_dict(torch::nn::Module& model, const Dict& state,
                                      const StateDictOptions& options = {});

/// The optimizer's state keyed by parameter FQN, and its param_groups, as Python's
/// get_optimizer_state_dict. An optimizer without state is first initialized the way Python
/// does it (one step with zero gradients and learning rate 0), so the result can be a load
/// destination. Throws for an optimizer type other than Adam, AdamW, SGD, RMSprop and Adagrad,
/// and for an optimizer parameter that is not a parameter of `model`.
Dict get_optimizer_state_dict(const torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                              const StateDictOptions& options = {});

/// Applies an optimizer state dict (as get_optimizer_state_dict lays it out, loaded or from
/// another run): hyper-parameters of each group, per-parameter state by FQN. Throws naming the
/// key for a group or parameter that does not match the optimizer, a shape that does not fit,
/// or a flag LibTorch's optimizer cannot honour (maximize, Adam's decoupled_weight_decay).
void set_optimizer_state_dict(const torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                              const Dict& state, const StateDictOptions& options = {});

/// Both at once: {model state dict, optimizer state dict}.
std::pair<Dict, Dict> get_state_dict(const torch::nn::Module& model,
                                     torch::optim::Optimizer& optimizer,
                                     const StateDictOptions& options = {});
IncompatibleKeys set_state_dict(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                                const Dict& model_state, const Dict& optimizer_state,
                                const StateDictOptions& options = {});

/// Replaces every parameter and buffer of `model` for which `placements_for` gives placements
/// by this rank's piece of it (distribute_tensor over `mesh_shape`), and returns the layouts to
/// put in StateDictOptions::sharding. Call it before building the optimizer.
std::map<std::string, TensorSharding> shard_module(
    torch::nn::Module& model, const std::vector<int64_t>& mesh_shape, int rank,
    const std::function<std::optional<std::vector<Placement>>(const std::string& fqn,
                                                              const at::Tensor& full)>&
        placements_for);

// ---------------------------------------------------------------------------------------------
// Stateful adapters (dcp/stateful.h). They borrow the module and optimizer: both must outlive
// the adapter's use in save and load.

/// A module as a Stateful: get_model_state_dict / set_model_state_dict.
class ModelStateful : public Stateful {
 public:
  explicit ModelStateful(torch::nn::Module& model, StateDictOptions options = {})
      : model_(model), options_(std::move(options)) {}
  StateDict state_dict() override;
  void load_state_dict(const StateDict& state) override;

 private:
  torch::nn::Module& model_;
  StateDictOptions options_;
};

/// An optimizer (of `model`'s parameters) as a Stateful.
class OptimizerStateful : public Stateful {
 public:
  OptimizerStateful(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                    StateDictOptions options = {})
      : model_(model), optimizer_(optimizer), options_(std::move(options)) {}
  StateDict state_dict() override;
  void load_state_dict(const StateDict& state) override;

 protected:
  torch::nn::Module& model_;
  torch::optim::Optimizer& optimizer_;
  StateDictOptions options_;
};

/// A module and its optimizer as one Stateful: {"model": ..., "optim": ...}, the layout of
/// Python DCP's documented AppState.
class ModelOptimizerStateful : public OptimizerStateful {
 public:
  using OptimizerStateful::OptimizerStateful;
  StateDict state_dict() override;
  void load_state_dict(const StateDict& state) override;
};

}  // namespace dcp
