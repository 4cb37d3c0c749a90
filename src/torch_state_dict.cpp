// LibTorch modules and optimizers to state dicts and back (dcp/torch_state_dict.h). The layouts
// follow Python 2.13's torch.distributed.checkpoint.state_dict and each optimizer's
// state_dict(); docs/training.md lists them.
#include "dcp/torch_state_dict.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <c10/util/Type.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cmath>
#include <set>
#include <unordered_map>

#include "util/names.h"

namespace dcp {

namespace {

namespace optim = torch::optim;

// ---------------------------------------------------------------------------------------------
// Sharding

std::optional<TensorSharding> sharding_of(const StateDictOptions& options, const std::string& fqn,
                                          const at::Tensor& local) {
  if (auto it = options.sharding.find(fqn); it != options.sharding.end()) return it->second;
  if (options.sharding_rule) return options.sharding_rule(fqn, local);
  return std::nullopt;
}

// `local` as a state-dict value: a detached alias, or a ShardedTensor of the global tensor.
Value wrap(const at::Tensor& local, const std::string& key,
           const std::optional<TensorSharding>& sharding) {
  if (!sharding) return local.detach();
  const std::vector<int64_t> coordinate = mesh_coordinate(sharding->mesh_shape, sharding->rank);
  if (coordinate.empty()) return ShardedTensor(sharding->global_shape, local.scalar_type(), {});
  const LocalBox box =
      compute_local_box(sharding->global_shape, sharding->mesh_shape, coordinate,
                        sharding->placements);
  TORCH_CHECK_VALUE(local.sizes() == c10::IntArrayRef(box.sizes), "'", key, "': the local tensor ",
                    "has shape ", local.sizes(), " but its sharding gives rank ", sharding->rank,
                    " the shape ", c10::IntArrayRef(box.sizes), " of global shape ",
                    c10::IntArrayRef(sharding->global_shape));
  return ShardedTensor(sharding->global_shape, local.scalar_type(),
                       {Shard{local.detach(), box.offsets}});
}

// The local tensor of a state-dict value: a Tensor, or the one local shard of a ShardedTensor.
// An undefined tensor when the ShardedTensor has no local shard.
at::Tensor local_tensor(const Value& value, const std::string& key) {
  if (value.is_tensor()) return value.tensor();
  if (value.is_sharded_tensor()) {
    const auto& shards = value.get<ShardedTensor>().local_shards();
    TORCH_CHECK_VALUE(shards.size() <= 1, "'", key, "' has ", shards.size(),
                      " local shards; a module tensor takes one");
    return shards.empty() ? at::Tensor() : shards[0].tensor;
  }
  TORCH_CHECK_TYPE(false, "'", key, "' should be a tensor, got a value of type ",
                   value.type_name());
}

// Copies `src` into `dst` unless they are already the same memory.
void copy_into(at::Tensor& dst, const at::Tensor& src, const std::string& key) {
  TORCH_CHECK_VALUE(src.sizes() == dst.sizes(), "'", key, "': the state has shape ", src.sizes(),
                    " but the destination has shape ", dst.sizes());
  if (src.data_ptr() == dst.data_ptr() && src.strides() == dst.strides() &&
      src.scalar_type() == dst.scalar_type()) {
    return;
  }
  torch::NoGradGuard no_grad;
  dst.copy_(src);
}

// ---------------------------------------------------------------------------------------------
// Optimizer kinds

enum class Kind { kAdam, kAdamW, kSGD, kRMSprop, kAdagrad };

Kind kind_of(const optim::Optimizer& o) {
  if (dynamic_cast<const optim::AdamW*>(&o)) return Kind::kAdamW;
  if (dynamic_cast<const optim::Adam*>(&o)) return Kind::kAdam;
  if (dynamic_cast<const optim::SGD*>(&o)) return Kind::kSGD;
  if (dynamic_cast<const optim::RMSprop*>(&o)) return Kind::kRMSprop;
  if (dynamic_cast<const optim::Adagrad*>(&o)) return Kind::kAdagrad;
  TORCH_CHECK_TYPE(false, "dcp's optimizer state dicts support LibTorch's Adam, AdamW, SGD, ",
                   "RMSprop and Adagrad; this optimizer is a ", c10::demangle(typeid(o).name()));
}

double number(const Value& v, const std::string& key) {
  if (v.is<int64_t>()) return static_cast<double>(v.get<int64_t>());
  if (v.is<double>()) return v.get<double>();
  if (v.is<bool>()) return v.get<bool>() ? 1.0 : 0.0;
  if (v.is_tensor() && v.tensor().numel() == 1) return v.tensor().item<double>();
  TORCH_CHECK_TYPE(false, "'", key, "' should be a number, got a value of type ", v.type_name());
}

bool flag(const Value& v, const std::string& key) {
  if (v.is<bool>()) return v.get<bool>();
  if (v.is<int64_t>()) return v.get<int64_t>() != 0;
  TORCH_CHECK_TYPE(false, "'", key, "' should be a bool, got a value of type ", v.type_name());
}

// Python's defaults for these are the int 0; keep that type when the value is 0.
Value int_zero_or(double v) { return v == 0.0 ? Value(int64_t{0}) : Value(v); }

Dict group_options(Kind kind, optim::OptimizerOptions& o) {
  switch (kind) {
    case Kind::kAdam:
    case Kind::kAdamW: {
      double lr, eps, wd;
      std::tuple<double, double> betas;
      bool amsgrad;
      if (kind == Kind::kAdam) {
        auto& a = static_cast<optim::AdamOptions&>(o);
        lr = a.lr(), eps = a.eps(), wd = a.weight_decay(), betas = a.betas(), amsgrad = a.amsgrad();
      } else {
        auto& a = static_cast<optim::AdamWOptions&>(o);
        lr = a.lr(), eps = a.eps(), wd = a.weight_decay(), betas = a.betas(), amsgrad = a.amsgrad();
      }
      return Dict{{"lr", lr},
                  {"betas", Tuple{{std::get<0>(betas), std::get<1>(betas)}}},
                  {"eps", eps},
                  {"weight_decay", kind == Kind::kAdam ? int_zero_or(wd) : Value(wd)},
                  {"amsgrad", amsgrad},
                  {"maximize", false},
                  {"foreach", None{}},
                  {"capturable", false},
                  {"differentiable", false},
                  {"fused", None{}},
                  {"decoupled_weight_decay", kind == Kind::kAdamW}};
    }
    case Kind::kSGD: {
      auto& s = static_cast<optim::SGDOptions&>(o);
      return Dict{{"lr", s.lr()},
                  {"momentum", int_zero_or(s.momentum())},
                  {"dampening", int_zero_or(s.dampening())},
                  {"weight_decay", int_zero_or(s.weight_decay())},
                  {"nesterov", s.nesterov()},
                  {"maximize", false},
                  {"foreach", None{}},
                  {"differentiable", false},
                  {"fused", None{}}};
    }
    case Kind::kRMSprop: {
      auto& r = static_cast<optim::RMSpropOptions&>(o);
      return Dict{{"lr", r.lr()},
                  {"momentum", int_zero_or(r.momentum())},
                  {"alpha", r.alpha()},
                  {"eps", r.eps()},
                  {"centered", r.centered()},
                  {"weight_decay", int_zero_or(r.weight_decay())},
                  {"capturable", false},
                  {"foreach", None{}},
                  {"maximize", false},
                  {"differentiable", false}};
    }
    case Kind::kAdagrad: {
      auto& a = static_cast<optim::AdagradOptions&>(o);
      return Dict{{"lr", a.lr()},
                  {"lr_decay", int_zero_or(a.lr_decay())},
                  {"eps", a.eps()},
                  {"weight_decay", int_zero_or(a.weight_decay())},
                  {"initial_accumulator_value", int_zero_or(a.initial_accumulator_value())},
                  {"foreach", None{}},
                  {"maximize", false},
                  {"differentiable", false},
                  {"fused", None{}}};
    }
  }
  TORCH_INTERNAL_ASSERT(false);
}

void set_group_options(Kind kind, optim::OptimizerOptions& o, const Dict& g,
                       const std::string& where) {
  auto num = [&](const char* name, const std::function<void(double)>& set) {
    if (const Value* v = g.find(name)) set(number(*v, where + "." + name));
  };
  auto boolean = [&](const char* name, const std::function<void(bool)>& set) {
    if (const Value* v = g.find(name)) set(flag(*v, where + "." + name));
  };
  boolean("maximize", [&](bool v) {
    TORCH_CHECK_VALUE(!v, "'", where, ".maximize' is True, which LibTorch's optimizers do not ",
                      "support");
  });
  boolean("decoupled_weight_decay", [&](bool v) {
    TORCH_CHECK_VALUE(v == (kind == Kind::kAdamW), "'", where, ".decoupled_weight_decay' is ",
                      v ? "True" : "False", ": load it into ", v ? "AdamW" : "Adam",
                      ", not into LibTorch's ", kind == Kind::kAdamW ? "AdamW" : "Adam");
  });
  num("lr", [&](double v) { o.set_lr(v); });
  auto betas = [&](std::tuple<double, double>& out) {
    const Value* v = g.find("betas");
    if (v == nullptr) return;
    const std::vector<Value>* items = v->is<Tuple>() ? &v->get<Tuple>().items
                                      : v->is_list() ? &v->list()
                                                     : nullptr;
    TORCH_CHECK_TYPE(items != nullptr && items->size() == 2, "'", where,
                     ".betas' should be a tuple of two numbers, got ", *v);
    out = {number((*items)[0], where + ".betas"), number((*items)[1], where + ".betas")};
  };
  switch (kind) {
    case Kind::kAdam:
    case Kind::kAdamW: {
      auto apply = [&](auto& a) {
        betas(a.betas());
        num("eps", [&](double v) { a.eps(v); });
        num("weight_decay", [&](double v) { a.weight_decay(v); });
        boolean("amsgrad", [&](bool v) { a.amsgrad(v); });
      };
      if (kind == Kind::kAdam) apply(static_cast<optim::AdamOptions&>(o));
      else apply(static_cast<optim::AdamWOptions&>(o));
      break;
    }
    case Kind::kSGD: {
      auto& s = static_cast<optim::SGDOptions&>(o);
      num("momentum", [&](double v) { s.momentum(v); });
      num("dampening", [&](double v) { s.dampening(v); });
      num("weight_decay", [&](double v) { s.weight_decay(v); });
      boolean("nesterov", [&](bool v) { s.nesterov(v); });
      break;
    }
    case Kind::kRMSprop: {
      auto& r = static_cast<optim::RMSpropOptions&>(o);
      num("momentum", [&](double v) { r.momentum(v); });
      num("alpha", [&](double v) { r.alpha(v); });
      num("eps", [&](double v) { r.eps(v); });
      boolean("centered", [&](bool v) { r.centered(v); });
      num("weight_decay", [&](double v) { r.weight_decay(v); });
      break;
    }
    case Kind::kAdagrad: {
      auto& a = static_cast<optim::AdagradOptions&>(o);
      num("lr_decay", [&](double v) { a.lr_decay(v); });
      num("eps", [&](double v) { a.eps(v); });
      num("weight_decay", [&](double v) { a.weight_decay(v); });
      num("initial_accumulator_value", [&](double v) { a.initial_accumulator_value(v); });
      break;
    }
  }
}

// A parameter's state as (name, tensor) pairs in Python's order; `step` as LibTorch's integer.
struct ParamState {
  std::optional<int64_t> step;
  std::vector<std::pair<const char*, at::Tensor>> tensors;
};

ParamState param_state(Kind kind, optim::OptimizerParamState& s) {
  ParamState out;
  auto add = [&](const char* name, const at::Tensor& t) {
    if (t.defined()) out.tensors.emplace_back(name, t);
  };
  switch (kind) {
    case Kind::kAdam: {
      auto& a = static_cast<optim::AdamParamState&>(s);
      out.step = a.step();
      add("exp_avg", a.exp_avg());
      add("exp_avg_sq", a.exp_avg_sq());
      add("max_exp_avg_sq", a.max_exp_avg_sq());
      break;
    }
    case Kind::kAdamW: {
      auto& a = static_cast<optim::AdamWParamState&>(s);
      out.step = a.step();
      add("exp_avg", a.exp_avg());
      add("exp_avg_sq", a.exp_avg_sq());
      add("max_exp_avg_sq", a.max_exp_avg_sq());
      break;
    }
    case Kind::kSGD:
      add("momentum_buffer", static_cast<optim::SGDParamState&>(s).momentum_buffer());
      break;
    case Kind::kRMSprop: {
      auto& r = static_cast<optim::RMSpropParamState&>(s);
      out.step = r.step();
      add("square_avg", r.square_avg());
      add("momentum_buffer", r.momentum_buffer());
      add("grad_avg", r.grad_avg());
      break;
    }
    case Kind::kAdagrad: {
      auto& a = static_cast<optim::AdagradParamState&>(s);
      out.step = a.step();
      add("sum", a.sum());
      break;
    }
  }
  return out;
}

std::unique_ptr<optim::OptimizerParamState> new_param_state(Kind kind) {
  switch (kind) {
    case Kind::kAdam: return std::make_unique<optim::AdamParamState>();
    case Kind::kAdamW: return std::make_unique<optim::AdamWParamState>();
    case Kind::kSGD: return std::make_unique<optim::SGDParamState>();
    case Kind::kRMSprop: return std::make_unique<optim::RMSpropParamState>();
    case Kind::kAdagrad: return std::make_unique<optim::AdagradParamState>();
  }
  TORCH_INTERNAL_ASSERT(false);
}

// Sets field `name` of a parameter state; returns false for a name the kind does not have.
bool set_state_field(Kind kind, optim::OptimizerParamState& s, const std::string& name,
                     const at::Tensor& t, int64_t step) {
  const bool is_step = name == "step";
  switch (kind) {
    case Kind::kAdam:
    case Kind::kAdamW: {
      auto apply = [&](auto& a) {
        if (is_step) a.step(step);
        else if (name == "exp_avg") a.exp_avg(t);
        else if (name == "exp_avg_sq") a.exp_avg_sq(t);
        else if (name == "max_exp_avg_sq") a.max_exp_avg_sq(t);
        else return false;
        return true;
      };
      return kind == Kind::kAdam ? apply(static_cast<optim::AdamParamState&>(s))
                                 : apply(static_cast<optim::AdamWParamState&>(s));
    }
    case Kind::kSGD:
      if (name != "momentum_buffer") return false;
      static_cast<optim::SGDParamState&>(s).momentum_buffer(t);
      return true;
    case Kind::kRMSprop: {
      auto& r = static_cast<optim::RMSpropParamState&>(s);
      if (is_step) r.step(step);
      else if (name == "square_avg") r.square_avg(t);
      else if (name == "momentum_buffer") r.momentum_buffer(t);
      else if (name == "grad_avg") r.grad_avg(t);
      else return false;
      return true;
    }
    case Kind::kAdagrad: {
      auto& a = static_cast<optim::AdagradParamState&>(s);
      if (is_step) a.step(step);
      else if (name == "sum") a.sum(t);
      else return false;
      return true;
    }
  }
  return false;
}

// Parameter identity -> FQN, over the module's parameters.
std::unordered_map<const c10::TensorImpl*, std::string> parameter_names(
    const torch::nn::Module& model) {
  std::unordered_map<const c10::TensorImpl*, std::string> out;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    out.emplace(p.value().unsafeGetTensorImpl(), p.key());
  }
  return out;
}

std::string fqn_of(const std::unordered_map<const c10::TensorImpl*, std::string>& names,
                   const at::Tensor& p, size_t group, size_t index) {
  auto it = names.find(p.unsafeGetTensorImpl());
  TORCH_CHECK_VALUE(it != names.end(), "optimizer parameter ", index, " of param_groups[", group,
                    "] (shape ", p.sizes(), ") is not a parameter of the module");
  return it->second;
}

// Python's _init_optim_state: one step with zero gradients and learning rate 0 creates the
// state of an optimizer that has not stepped yet, so that it can be saved or loaded into.
void init_optimizer_state(optim::Optimizer& optimizer) {
  if (!optimizer.state().empty()) return;
  std::vector<double> lrs;
  for (auto& group : optimizer.param_groups()) {
    lrs.push_back(group.options().get_lr());
    group.options().set_lr(0.0);
    for (auto& p : group.params()) {
      if (p.requires_grad()) p.mutable_grad() = torch::zeros_like(p);
    }
  }
  optimizer.step();
  for (size_t i = 0; i < lrs.size(); ++i) optimizer.param_groups()[i].options().set_lr(lrs[i]);
  optimizer.zero_grad(/*set_to_none=*/true);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Model

Dict get_model_state_dict(const torch::nn::Module& model, const StateDictOptions& options) {
  Dict out;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    if (options.ignore_frozen_params && !p.value().requires_grad()) continue;
    out.insert_or_assign(p.key(), wrap(p.value(), p.key(), sharding_of(options, p.key(), p.value())));
  }
  for (const auto& b : model.named_buffers(/*recurse=*/true)) {
    out.insert_or_assign(b.key(), wrap(b.value(), b.key(), sharding_of(options, b.key(), b.value())));
  }
  return out;
}

IncompatibleKeys set_model_state_dict(torch::nn::Module& model, const Dict& state,
                                      const StateDictOptions& options) {
  IncompatibleKeys out;
  std::set<std::string> used;
  auto apply = [&](const std::string& fqn, at::Tensor target, bool frozen) {
    const Value* value = state.find(fqn);
    if (value == nullptr) {
      if (!(frozen && options.ignore_frozen_params)) out.missing_keys.push_back(fqn);
      return;
    }
    used.insert(fqn);
    const at::Tensor src = local_tensor(*value, fqn);
    if (!src.defined()) return;  // this rank holds no piece of it
    copy_into(target, src, fqn);
  };
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    apply(p.key(), p.value(), !p.value().requires_grad());
  }
  for (const auto& b : model.named_buffers(/*recurse=*/true)) apply(b.key(), b.value(), false);
  for (const auto& entry : state) {
    const std::string key = key_to_string(entry.first);
    if (!used.count(key)) out.unexpected_keys.push_back(key);
  }
  TORCH_CHECK_VALUE(!options.strict || (out.missing_keys.empty() && out.unexpected_keys.empty()),
                    "set_model_state_dict (strict): ", out.missing_keys.size(),
                    " missing key(s) [", detail::quoted_names(out.missing_keys), "] and ",
                    out.unexpected_keys.size(), " unexpected key(s) [",
                    detail::quoted_names(out.unexpected_keys), "]");
  return out;
}

// ---------------------------------------------------------------------------------------------
// Optimizer

Dict get_optimizer_state_dict(const torch::nn::Module& model, optim::Optimizer& optimizer,
                              const StateDictOptions& options) {
  const Kind kind = kind_of(optimizer);
  const auto names = parameter_names(model);
  // Every parameter is checked before the optimizer is touched.
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const auto& params = optimizer.param_groups()[g].params();
    for (size_t i = 0; i < params.size(); ++i) fqn_of(names, params[i], g, i);
  }
  init_optimizer_state(optimizer);

  Dict state;
  List groups;
  auto& per_param = optimizer.state();
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    auto& group = optimizer.param_groups()[g];
    List fqns;
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& p = group.params()[i];
      const std::string fqn = fqn_of(names, p, g, i);
      fqns.emplace_back(fqn);
      auto it = per_param.find(p.unsafeGetTensorImpl());
      if (it == per_param.end()) continue;
      const std::optional<TensorSharding> sharding = sharding_of(options, fqn, p);
      const ParamState s = param_state(kind, *it->second);
      Dict entry;
      if (s.step) entry["step"] = at::scalar_tensor(static_cast<double>(*s.step), at::kFloat);
      for (const auto& [name, t] : s.tensors) {
        entry.insert_or_assign(name, wrap(t, fqn + "." + name, sharding));
      }
      state.insert_or_assign(fqn, std::move(entry));
    }
    Dict options_dict = group_options(kind, group.options());
    options_dict["params"] = std::move(fqns);
    groups.emplace_back(std::move(options_dict));
  }
  return Dict{{"state", std::move(state)}, {"param_groups", std::move(groups)}};
}

void set_optimizer_state_dict(const torch::nn::Module& model, optim::Optimizer& optimizer,
                              const Dict& state, const StateDictOptions& options) {
  const Kind kind = kind_of(optimizer);
  const auto names = parameter_names(model);
  const List& groups = state.at("param_groups").list();
  const Dict& per_param_in = state.at("state").dict();
  TORCH_CHECK_VALUE(groups.size() == optimizer.param_groups().size(), "the optimizer state has ",
                    groups.size(), " param_groups but the optimizer has ",
                    optimizer.param_groups().size());
  // Check everything first, so that a mismatch leaves the optimizer as it was.
  std::map<std::string, std::pair<size_t, size_t>> where;  // fqn -> (group, index)
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string group_key = "param_groups." + std::to_string(g);
    const Dict& group = groups[g].dict();
    const List& fqns = group.at("params").list();
    const auto& params = optimizer.param_groups()[g].params();
    std::vector<std::string> expected;
    for (size_t i = 0; i < params.size(); ++i) expected.push_back(fqn_of(names, params[i], g, i));
    std::vector<std::string> given;
    for (const Value& v : fqns) given.push_back(v.get<std::string>());
    TORCH_CHECK_VALUE(std::set<std::string>(given.begin(), given.end()) ==
                          std::set<std::string>(expected.begin(), expected.end()),
                      "'", group_key, ".params' lists [", detail::quoted_names(given),
                      "] but the optimizer's group holds [", detail::quoted_names(expected), "]");
    for (size_t i = 0; i < expected.size(); ++i) where[expected[i]] = {g, i};
  }
  for (const auto& entry : per_param_in) {
    const std::string fqn = key_to_string(entry.first);
    TORCH_CHECK_VALUE(where.count(fqn), "the optimizer state has an entry 'state.", fqn,
                      "' for a parameter that is not in any param_groups");
  }

  for (size_t g = 0; g < groups.size(); ++g) {
    set_group_options(kind, optimizer.param_groups()[g].options(), groups[g].dict(),
                      "param_groups." + std::to_string(g));
  }
  auto& per_param = optimizer.state();
  for (const auto& [fqn, gi] : where) {
    const at::Tensor& p = optimizer.param_groups()[gi.first].params()[gi.second];
    void* key = p.unsafeGetTensorImpl();
    const Value* in = per_param_in.find(fqn);
    if (in == nullptr) {  // as Python's load_state_dict: no saved state, no state
      per_param.erase(key);
      continue;
    }
    auto it = per_param.find(key);
    std::unique_ptr<optim::OptimizerParamState> fresh;
    optim::OptimizerParamState* target = nullptr;
    if (it != per_param.end()) {
      target = it->second.get();
    } else {
      fresh = new_param_state(kind);
      target = fresh.get();
    }
    const ParamState current = param_state(kind, *target);
    for (const auto& [name_key, value] : in->dict()) {
      const std::string name = key_to_string(name_key);
      const std::string full = "state." + fqn + "." + name;
      if (name == "step") {
        TORCH_CHECK_VALUE(set_state_field(kind, *target, name, at::Tensor(),
                                          std::llround(number(value, full))),
                          "'", full, "' is not a state of this optimizer");
        continue;
      }
      at::Tensor src = local_tensor(value, full);
      if (!src.defined()) continue;
      TORCH_CHECK_VALUE(src.sizes() == p.sizes(), "'", full, "' has shape ", src.sizes(),
                        " but its parameter has shape ", p.sizes());
      at::Tensor dst;
      for (const auto& [n, t] : current.tensors) {
        if (name == n) dst = t;
      }
      if (dst.defined() && dst.sizes() == src.sizes()) {
        copy_into(dst, src, full);
        src = dst;
      } else {
        src = src.to(p.device(), p.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
      }
      TORCH_CHECK_VALUE(set_state_field(kind, *target, name, src, 0), "'", full,
                        "' is not a state of this optimizer");
    }
    if (fresh) per_param[key] = std::move(fresh);
  }
}

std::pair<Dict, Dict> get_state_dict(const torch::nn::Module& model, optim::Optimizer& optimizer,
                                     const StateDictOptions& options) {
  return {get_model_state_dict(model, options),
          get_optimizer_state_dict(model, optimizer, options)};
}

IncompatibleKeys set_state_dict(torch::nn::Module& model, optim::Optimizer& optimizer,
                                const Dict& model_state, const Dict& optimizer_state,
                                const StateDictOptions& options) {
  IncompatibleKeys keys = set_model_state_dict(model, model_state, options);
  set_optimizer_state_dict(model, optimizer, optimizer_state, options);
  return keys;
}

std::map<std::string, TensorSharding> shard_module(
    torch::nn::Module& model, const std::vector<int64_t>& mesh_shape, int rank,
    const std::function<std::optional<std::vector<Placement>>(const std::string&,
                                                              const at::Tensor&)>& placements_for) {
  TORCH_CHECK_VALUE(!mesh_coordinate(mesh_shape, rank).empty(), "shard_module: rank ", rank,
                    " is not in the mesh ", c10::IntArrayRef(mesh_shape));
  std::map<std::string, TensorSharding> out;
  auto shard = [&](const std::string& fqn, at::Tensor t) {
    const std::optional<std::vector<Placement>> placements = placements_for(fqn, t);
    if (!placements) return;
    const std::vector<int64_t> global_shape = t.sizes().vec();
    ShardedTensor piece = distribute_tensor(t.detach(), mesh_shape, rank, *placements);
    torch::NoGradGuard no_grad;
    t.set_data(piece.local_shards().at(0).tensor);
    out.emplace(fqn, TensorSharding{global_shape, mesh_shape, *placements, rank});
  };
  for (const auto& p : model.named_parameters(/*recurse=*/true)) shard(p.key(), p.value());
  for (const auto& b : model.named_buffers(/*recurse=*/true)) shard(b.key(), b.value());
  return out;
}

// ---------------------------------------------------------------------------------------------
// Stateful adapters

StateDict ModelStateful::state_dict() { return get_model_state_dict(model_, options_); }

void ModelStateful::load_state_dict(const StateDict& state) {
  set_model_state_dict(model_, state, options_);
}

StateDict OptimizerStateful::state_dict() {
  return get_optimizer_state_dict(model_, optimizer_, options_);
}

void OptimizerStateful::load_state_dict(const StateDict& state) {
  set_optimizer_state_dict(model_, optimizer_, state, options_);
}

StateDict ModelOptimizerStateful::state_dict() {
  auto [model, optim] = get_state_dict(model_, optimizer_, options_);
  return Dict{{"model", std::move(model)}, {"optim", std::move(optim)}};
}

void ModelOptimizerStateful::load_state_dict(const StateDict& state) {
  set_state_dict(model_, optimizer_, state.at("model").dict(), state.at("optim").dict(), options_);
}

}  // namespace dcp
