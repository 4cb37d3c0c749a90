// LibTorch modules and optimizers to state dicts and back (dcp/torch_state_dict.h), Stateful
// values (dcp/stateful.h), and load's key mapping and strict handling (LoadOptions): layouts as
// Python's, bitwise round trips through dcp::save / dcp::load for every supported optimizer,
// sharded modules over in-process ranks, and the errors for bad input.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "dcp/dcp.h"
#include "testing/test_util.h"

namespace dcp {
namespace {

using testing::TempDir;
using testing::make_tensor;

struct Net : torch::nn::Module {
  explicit Net(int64_t hidden = 12) {
    fc1 = register_module("fc1", torch::nn::Linear(6, hidden));
    norm = register_module("norm", torch::nn::BatchNorm1d(hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2->forward(torch::relu(norm->forward(fc1->forward(x))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};

std::vector<std::string> keys_of(const Dict& d) {
  std::vector<std::string> out;
  for (const auto& e : d) out.push_back(key_to_string(e.first));
  return out;
}

double train_step(Net& net, torch::optim::Optimizer& opt, int64_t seed) {
  torch::manual_seed(seed);
  const auto x = torch::randn({16, 6});
  const auto y = torch::randn({16, 3});
  opt.zero_grad();
  auto loss = torch::mse_loss(net.forward(x), y);
  loss.backward();
  opt.step();
  return loss.item<double>();
}

void expect_modules_equal(Net& a, Net& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  for (const auto& p : pa) EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
  auto ba = a.named_buffers(), bb = b.named_buffers();
  for (const auto& p : ba) EXPECT_TRUE(torch::equal(p.value(), bb[p.key()])) << p.key();
}

// ---------------------------------------------------------------------------------------------
// Model

TEST(ModelStateDictTest, KeysAreParameterThenBufferFqnsSharingStorage) {
  Net net;
  const Dict sd = get_model_state_dict(net);
  EXPECT_EQ(keys_of(sd),
            (std::vector<std::string>{"fc1.weight", "fc1.bias", "norm.weight", "norm.bias",
                                      "fc2.weight", "fc2.bias", "norm.running_mean",
                                      "norm.running_var", "norm.num_batches_tracked"}));
  EXPECT_EQ(sd.at("fc1.weight").tensor().data_ptr(), net.fc1->weight.data_ptr());
  EXPECT_FALSE(sd.at("fc1.weight").tensor().requires_grad());
  EXPECT_EQ(sd.at("norm.num_batches_tracked").tensor().scalar_type(), at::kLong);
}

TEST(ModelStateDictTest, FrozenParametersAreLeftOutWhenAsked) {
  Net net;
  net.fc1->weight.set_requires_grad(false);
  StateDictOptions options;
  options.ignore_frozen_params = true;
  const Dict sd = get_model_state_dict(net, options);
  EXPECT_FALSE(sd.contains("fc1.weight"));
  EXPECT_TRUE(sd.contains("fc1.bias"));
  Net other;
  other.fc1->weight.set_requires_grad(false);
  // Not missing either: set_model_state_dict with the same options accepts the dict.
  const IncompatibleKeys keys = set_model_state_dict(other, sd, options);
  EXPECT_TRUE(keys.missing_keys.empty());
  EXPECT_TRUE(torch::equal(other.fc2->weight, net.fc2->weight));
}

TEST(ModelStateDictTest, StrictReportsMissingAndUnexpectedKeysByName) {
  Net net;
  Dict sd = get_model_state_dict(Net());
  sd.erase("fc2.bias");
  sd["head.weight"] = torch::zeros({2});
  try {
    set_model_state_dict(net, sd);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fc2.bias'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'head.weight'"), std::string::npos) << e.what();
  }
  StateDictOptions lax;
  lax.strict = false;
  const IncompatibleKeys keys = set_model_state_dict(net, sd, lax);
  EXPECT_EQ(keys.missing_keys, std::vector<std::string>{"fc2.bias"});
  EXPECT_EQ(keys.unexpected_keys, std::vector<std::string>{"head.weight"});
}

TEST(ModelStateDictTest, CheckpointOfAnotherArchitectureNamesTheKeyAndShapes) {
  TempDir dir;
  Net wide(20);
  save(StateDict{{"model", get_model_state_dict(wide)}}, dir.path());
  Net narrow(12);
  StateDict state{{"model", get_model_state_dict(narrow)}};
  try {
    load(state, dir.path());
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("model.fc1.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("20"), std::string::npos) << msg;
  }
}

// ---------------------------------------------------------------------------------------------
// Optimizers

struct OptimizerCase {
  const char* name;
  std::function<std::unique_ptr<torch::optim::Optimizer>(Net&)> make;
  std::vector<std::string> group_keys;  // Python 2.13's, in order
  std::vector<std::string> state_keys;  // Python 2.13's, in order
};

std::vector<OptimizerCase> optimizer_cases() {
  using namespace torch::optim;
  return {
      {"Adam",
       [](Net& n) { return std::make_unique<Adam>(n.parameters(), AdamOptions(1e-2)); },
       {"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable",
        "differentiable", "fused", "decoupled_weight_decay", "params"},
       {"step", "exp_avg", "exp_avg_sq"}},
      {"AdamAmsgrad",
       [](Net& n) {
         return std::make_unique<Adam>(n.parameters(), AdamOptions(1e-2).amsgrad(true));
       },
       {"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable",
        "differentiable", "fused", "decoupled_weight_decay", "params"},
       {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}},
      {"AdamW",
       [](Net& n) { return std::make_unique<AdamW>(n.parameters(), AdamWOptions(1e-2)); },
       {"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable",
        "differentiable", "fused", "decoupled_weight_decay", "params"},
       {"step", "exp_avg", "exp_avg_sq"}},
      {"SGD",
       [](Net& n) {
         return std::make_unique<SGD>(n.parameters(), SGDOptions(0.1).momentum(0.9));
       },
       {"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach",
        "differentiable", "fused", "params"},
       {"momentum_buffer"}},
      {"RMSprop",
       [](Net& n) {
         return std::make_unique<RMSprop>(n.parameters(),
                                          RMSpropOptions(1e-2).momentum(0.5).centered(true));
       },
       {"lr", "momentum", "alpha", "eps", "centered", "weight_decay", "capturable", "foreach",
        "maximize", "differentiable", "params"},
       {"step", "square_avg", "momentum_buffer", "grad_avg"}},
      {"Adagrad",
       [](Net& n) { return std::make_unique<Adagrad>(n.parameters(), AdagradOptions(1e-1)); },
       {"lr", "lr_decay", "eps", "weight_decay", "initial_accumulator_value", "foreach",
        "maximize", "differentiable", "fused", "params"},
       {"step", "sum"}},
  };
}

TEST(OptimizerStateDictTest, LayoutIsPythonsForEveryOptimizer) {
  for (const OptimizerCase& c : optimizer_cases()) {
    SCOPED_TRACE(c.name);
    torch::manual_seed(0);
    Net net;
    auto opt = c.make(net);
    train_step(net, *opt, 1);
    const Dict sd = get_optimizer_state_dict(net, *opt);
    EXPECT_EQ(keys_of(sd), (std::vector<std::string>{"state", "param_groups"}));
    const List& groups = sd.at("param_groups").list();
    ASSERT_EQ(groups.size(), 1u);
    const Dict& g = groups[0].dict();
    EXPECT_EQ(keys_of(g), c.group_keys);
    EXPECT_EQ(g.at("params").list(),
              (List{"fc1.weight", "fc1.bias", "norm.weight", "norm.bias", "fc2.weight",
                    "fc2.bias"}));
    EXPECT_TRUE(g.at("lr").is<double>());
    if (g.contains("foreach")) EXPECT_TRUE(g.at("foreach").is_none());
    const Dict& per_param = sd.at("state").dict();
    EXPECT_EQ(keys_of(per_param), (std::vector<std::string>{"fc1.weight", "fc1.bias",
                                                            "norm.weight", "norm.bias",
                                                            "fc2.weight", "fc2.bias"}));
    const Dict& s = per_param.at("fc2.weight").dict();
    EXPECT_EQ(keys_of(s), c.state_keys);
    if (s.contains("step")) {
      EXPECT_EQ(s.at("step").tensor().dim(), 0);
      EXPECT_EQ(s.at("step").tensor().scalar_type(), at::kFloat);  // as Python stores it
      EXPECT_EQ(s.at("step").tensor().item<float>(), 1.0f);
    }
  }
}

TEST(OptimizerStateDictTest, ValueTypesFollowPython) {
  Net net;
  torch::optim::Adam adam(net.parameters(), torch::optim::AdamOptions(1e-3));
  const Dict g = get_optimizer_state_dict(net, adam).at("param_groups").list()[0].dict();
  ASSERT_TRUE(g.at("betas").is<Tuple>());
  EXPECT_EQ(g.at("betas").get<Tuple>().items, (std::vector<Value>{0.9, 0.999}));
  EXPECT_TRUE(g.at("weight_decay").is<int64_t>());  // Python's default is the int 0
  EXPECT_EQ(g.at("amsgrad"), Value(false));
  EXPECT_EQ(g.at("decoupled_weight_decay"), Value(false));
  torch::optim::AdamW adamw(net.parameters(), torch::optim::AdamWOptions(1e-3));
  const Dict gw = get_optimizer_state_dict(net, adamw).at("param_groups").list()[0].dict();
  EXPECT_EQ(gw.at("weight_decay"), Value(1e-2));
  EXPECT_EQ(gw.at("decoupled_weight_decay"), Value(true));
}

TEST(OptimizerStateDictTest, FreshOptimizerIsInitializedAsPythonDoes) {
  Net net;
  const auto before = net.fc1->weight.clone();
  torch::optim::Adam adam(net.parameters(), torch::optim::AdamOptions(1e-2));
  const Dict sd = get_optimizer_state_dict(net, adam);
  // One step with zero gradients and learning rate 0: step 1, zero moments, weights unchanged.
  const Dict& s = sd.at("state").dict().at("fc1.weight").dict();
  EXPECT_EQ(s.at("step").tensor().item<float>(), 1.0f);
  EXPECT_EQ(s.at("exp_avg").tensor().abs().sum().item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(net.fc1->weight, before));
  EXPECT_EQ(adam.param_groups()[0].options().get_lr(), 1e-2);
  EXPECT_FALSE(net.fc1->weight.grad().defined());
}

TEST(OptimizerStateDictTest, SaveLoadResumesBitwiseForEveryOptimizer) {
  for (const OptimizerCase& c : optimizer_cases()) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    torch::manual_seed(0);
    Net net;
    auto opt = c.make(net);
    for (int s = 0; s < 3; ++s) train_step(net, *opt, s);
    {
      auto [model_sd, optim_sd] = get_state_dict(net, *opt);
      save(StateDict{{"model", model_sd}, {"optim", optim_sd}}, dir.path());
    }
    torch::manual_seed(99);
    Net fresh;
    auto fresh_opt = c.make(fresh);
    fresh_opt->param_groups()[0].options().set_lr(123.0);  // restored from the checkpoint
    auto [model_sd, optim_sd] = get_state_dict(fresh, *fresh_opt);
    StateDict state{{"model", model_sd}, {"optim", optim_sd}};
    load(state, dir.path());
    set_state_dict(fresh, *fresh_opt, state.at("model").dict(), state.at("optim").dict());
    expect_modules_equal(net, fresh);
    EXPECT_EQ(fresh_opt->param_groups()[0].options().get_lr(),
              opt->param_groups()[0].options().get_lr());
    for (int s = 3; s < 6; ++s) {
      EXPECT_EQ(train_step(net, *opt, s), train_step(fresh, *fresh_opt, s)) << "step " << s;
    }
    expect_modules_equal(net, fresh);
  }
}

TEST(OptimizerStateDictTest, OptimizerOverParametersOutsideTheModuleIsRefused) {
  Net net;
  auto stray = torch::zeros({4}, torch::requires_grad());
  std::vector<torch::Tensor> params = net.parameters();
  params.push_back(stray);
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1));
  try {
    get_optimizer_state_dict(net, sgd);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer parameter 6 of param_groups[0] (shape [4]) "
                                         "is not a parameter of the module"),
              std::string::npos)
        << e.what();
  }
}

TEST(OptimizerStateDictTest, UnsupportedOptimizerIsRefusedByName) {
  Net net;
  torch::optim::LBFGS lbfgs(net.parameters(), torch::optim::LBFGSOptions(1));
  try {
    get_optimizer_state_dict(net, lbfgs);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("LBFGS"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Adam, AdamW, SGD, RMSprop and Adagrad"),
              std::string::npos);
  }
}

TEST(OptimizerStateDictTest, MismatchesAreNamed) {
  Net net;
  torch::optim::Adam adam(net.parameters(), torch::optim::AdamOptions(1e-2));
  train_step(net, adam, 0);
  Dict sd = get_optimizer_state_dict(net, adam);
  {  // a state of the wrong shape
    Dict bad = sd;
    bad.at("state").dict().at("fc2.weight").dict()["exp_avg"] = torch::zeros({3, 5});
    EXPECT_THROW(
        {
          try {
            set_optimizer_state_dict(net, adam, bad);
          } catch (const c10::Error& e) {
            EXPECT_NE(std::string(e.what()).find("'state.fc2.weight.exp_avg' has shape [3, 5]"),
                      std::string::npos)
                << e.what();
            throw;
          }
        },
        c10::Error);
  }
  {  // an AdamW checkpoint into Adam
    Dict bad = sd;
    bad.at("param_groups").list()[0].dict()["decoupled_weight_decay"] = true;
    EXPECT_THROW(set_optimizer_state_dict(net, adam, bad), c10::Error);
  }
  {  // Python's maximize, which LibTorch lacks
    Dict bad = sd;
    bad.at("param_groups").list()[0].dict()["maximize"] = true;
    EXPECT_THROW(set_optimizer_state_dict(net, adam, bad), c10::Error);
  }
  {  // a parameter list of another model
    Dict bad = sd;
    bad.at("param_groups").list()[0].dict()["params"] = List{"encoder.weight"};
    try {
      set_optimizer_state_dict(net, adam, bad);
      FAIL() << "expected an error";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("'encoder.weight'"), std::string::npos) << e.what();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Sharded modules

TEST(ShardedModuleTest, ShardedTrainingSavesGlobalTensorsAndLoadsUnsharded) {
  TempDir dir;
  torch::manual_seed(0);
  Net reference;
  torch::optim::Adam reference_adam(reference.parameters(), torch::optim::AdamOptions(1e-2));
  const Dict full = get_model_state_dict(reference);
  // Two ranks hold row shards (Shard(0)) of every parameter with 2 dimensions or more.
  run_in_process(2, [&](Communicator& comm) {
    Net net;
    set_model_state_dict(net, full);
    auto sharding = shard_module(net, {2}, comm.rank(),
                                 [](const std::string&, const at::Tensor& t)
                                     -> std::optional<std::vector<Placement>> {
                                   if (t.dim() < 2) return std::nullopt;
                                   return std::vector<Placement>{Placement::Shard(0)};
                                 });
    EXPECT_EQ(net.fc1->weight.size(0), 6);  // 12 rows over 2 ranks
    torch::optim::Adam adam(net.parameters(), torch::optim::AdamOptions(1e-2));
    StateDictOptions options;
    options.sharding = sharding;
    auto [model_sd, optim_sd] = get_state_dict(net, adam, options);
    ASSERT_TRUE(model_sd.at("fc1.weight").is_sharded_tensor());
    EXPECT_EQ(model_sd.at("fc1.weight").get<ShardedTensor>().global_shape(),
              (std::vector<int64_t>{12, 6}));
    ASSERT_TRUE(
        optim_sd.at("state").dict().at("fc1.weight").dict().at("exp_avg").is_sharded_tensor());
    SaveOptions save_options;
    save_options.comm = &comm;
    save(StateDict{{"model", model_sd}, {"optim", optim_sd}}, dir.path(), save_options);
  });
  // One process, unsharded: the global tensors come back whole.
  Net whole;
  torch::optim::Adam adam(whole.parameters(), torch::optim::AdamOptions(1e-2));
  auto [model_sd, optim_sd] = get_state_dict(whole, adam);
  StateDict state{{"model", model_sd}, {"optim", optim_sd}};
  load(state, dir.path());
  set_state_dict(whole, adam, state.at("model").dict(), state.at("optim").dict());
  expect_modules_equal(reference, whole);
}

TEST(ShardedModuleTest, LocalShapeThatDoesNotFitTheShardingIsNamed) {
  Net net;
  StateDictOptions options;
  options.sharding["fc1.weight"] = TensorSharding{{12, 6}, {4}, {Placement::Shard(0)}, 0};
  try {
    get_model_state_dict(net, options);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fc1.weight': the local tensor has shape [12, 6]"),
              std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Stateful

struct DataLoaderPosition : Stateful {
  int64_t epoch = 0, batch = 0;
  std::vector<std::string>* calls = nullptr;
  StateDict state_dict() override {
    if (calls) calls->push_back("state_dict");
    return Dict{{"epoch", epoch}, {"batch", batch}};
  }
  void load_state_dict(const StateDict& s) override {
    if (calls) calls->push_back("load_state_dict");
    epoch = s.at("epoch").get<int64_t>();
    batch = s.at("batch").get<int64_t>();
  }
};

TEST(StatefulTest, SaveAsksAndLoadFillsThenHandsBackInPythonsOrder) {
  TempDir dir;
  torch::manual_seed(0);
  Net net;
  torch::optim::Adam adam(net.parameters(), torch::optim::AdamOptions(1e-2));
  train_step(net, adam, 0);
  auto position = std::make_shared<DataLoaderPosition>();
  position->epoch = 3;
  position->batch = 17;
  StateDict state{{"app", std::make_shared<ModelOptimizerStateful>(net, adam)},
                  {"loader", position},
                  {"step", 5}};
  const Metadata md = save(state, dir.path());
  EXPECT_TRUE(md.state_dict_metadata.count("app.model.fc1.weight"));
  EXPECT_TRUE(md.state_dict_metadata.count("app.optim.state.fc1.weight.exp_avg"));
  EXPECT_TRUE(md.state_dict_metadata.count("loader.epoch"));

  Net fresh(12);
  torch::optim::Adam fresh_adam(fresh.parameters(), torch::optim::AdamOptions(1.0));
  auto restored = std::make_shared<DataLoaderPosition>();
  std::vector<std::string> calls;
  restored->calls = &calls;
  StateDict target{{"app", std::make_shared<ModelOptimizerStateful>(fresh, fresh_adam)},
                   {"loader", restored},
                   {"step", 0}};
  load(target, dir.path());
  EXPECT_EQ(calls, (std::vector<std::string>{"state_dict", "load_state_dict"}));
  EXPECT_EQ(restored->epoch, 3);
  EXPECT_EQ(restored->batch, 17);
  EXPECT_EQ(target.at("step"), Value(5));
  EXPECT_TRUE(target.at("loader").is_stateful());  // the caller's object stays
  expect_modules_equal(net, fresh);
  EXPECT_EQ(train_step(net, adam, 1), train_step(fresh, fresh_adam, 1));
}

TEST(StatefulTest, NestedStatefulIsRefusedWithItsKey) {
  TempDir dir;
  StateDict state{{"outer", Dict{{"loader", std::make_shared<DataLoaderPosition>()}}}};
  try {
    save(state, dir.path());
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'outer.loader' is a Stateful below the top level"),
              std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Key mapping and strict handling

StateDict saved_state() {
  return StateDict{{"module", Dict{{"fc", Dict{{"weight", make_tensor(at::kFloat, {4, 3}, 1)},
                                                {"bias", make_tensor(at::kFloat, {4}, 2)}}}}},
                   {"epoch", 7}};
}

TEST(KeyMappingTest, PrefixRuleLoadsARenamedModule) {
  TempDir dir;
  save(saved_state(), dir.path());
  StateDict state{{"fc", Dict{{"weight", torch::zeros({4, 3})}, {"bias", torch::zeros({4})}}},
                  {"epoch", 0}};
  LoadOptions options;
  options.key_mapping.prefixes = {{"module.", ""}};
  load(state, dir.path(), options);
  EXPECT_TRUE(torch::equal(state.at("fc").dict().at("weight").tensor(),
                           make_tensor(at::kFloat, {4, 3}, 1)));
  EXPECT_EQ(state.at("epoch"), Value(7));
}

TEST(KeyMappingTest, ExplicitKeysAndFunctionApplyAndReshardThroughTheRename) {
  TempDir dir;
  const at::Tensor full = make_tensor(at::kFloat, {6, 4}, 3);
  run_in_process(3, [&](Communicator& comm) {
    SaveOptions o;
    o.comm = &comm;
    save(StateDict{{"encoder.proj", distribute_tensor(full, {3}, comm.rank(),
                                                      {Placement::Shard(0)})},
                   {"encoder.scale", 2.5}},
         dir.path(), o);
  });
  run_in_process(2, [&](Communicator& comm) {
    StateDict state{{"proj", zeros_sharded({6, 4}, at::kFloat, {2}, comm.rank(),
                                           {Placement::Shard(1)})},
                    {"temperature", 0.0}};
    LoadOptions o;
    o.comm = &comm;
    o.key_mapping.keys = {{"encoder.scale", "temperature"}};
    o.key_mapping.function = [](const std::string& k) {
      return k.rfind("encoder.", 0) == 0 ? k.substr(8) : k;
    };
    load(state, dir.path(), o);
    const Shard& shard = state.at("proj").get<ShardedTensor>().local_shards().at(0);
    EXPECT_TRUE(torch::equal(shard.tensor, full.narrow(1, 2 * comm.rank(), 2)));
    EXPECT_EQ(state.at("temperature"), Value(2.5));
  });
}

TEST(KeyMappingTest, UnusedRulesAndCollisionsAreErrors) {
  TempDir dir;
  save(saved_state(), dir.path());
  auto message = [&](const KeyMapping& mapping) {
    StateDict state{{"fc", Dict{{"weight", torch::zeros({4, 3})}}}};
    LoadOptions options;
    options.key_mapping = mapping;
    try {
      load(state, dir.path(), options);
    } catch (const c10::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  KeyMapping unused;
  unused.prefixes = {{"module.", ""}, {"model.", ""}};
  EXPECT_NE(message(unused).find("the prefix rule 'model.' -> '' matches no key"),
            std::string::npos);
  KeyMapping missing_key;
  missing_key.keys = {{"module.head", "head"}};
  EXPECT_NE(message(missing_key).find("the checkpoint has no key 'module.head'"),
            std::string::npos);
  KeyMapping collision;
  collision.keys = {{"module.fc.weight", "w"}, {"module.fc.bias", "w"}};
  const std::string m = message(collision);
  EXPECT_NE(m.find("would both load into 'w'"), std::string::npos) << m;
}

TEST(StrictHandlingTest, MissingAndUnexpectedAreRaisedWarnedOrReturned) {
  TempDir dir;
  save(saved_state(), dir.path());
  auto make_state = [] {
    return StateDict{{"module", Dict{{"fc", Dict{{"weight", torch::zeros({4, 3})}}},
                                     {"head", torch::zeros({2})}}}};
  };
  {  // the default (Python's): missing raises
    StateDict s = make_state();
    EXPECT_THROW(load(s, dir.path()), c10::Error);
  }
  {
    StateDict s = make_state();
    LoadOptions o;
    o.strict = StrictHandling::kReturnAll;
    const LoadResult r = load(s, dir.path(), o);
    EXPECT_EQ(r.missing_keys, std::vector<std::string>{"module.head"});
    EXPECT_EQ(r.unexpected_keys, (std::vector<std::string>{"epoch", "module.fc.bias"}));
    EXPECT_TRUE(torch::equal(s.at("module").dict().at("fc").dict().at("weight").tensor(),
                             make_tensor(at::kFloat, {4, 3}, 1)));
  }
  {
    StateDict s = make_state();
    LoadOptions o;
    o.strict = StrictHandling::kWarnAll;
    ::testing::internal::CaptureStderr();
    const LoadResult r = load(s, dir.path(), o);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("1 missing key(s) left as they were: 'module.head'"), std::string::npos)
        << err;
    EXPECT_NE(err.find("2 unexpected key(s)"), std::string::npos) << err;
    EXPECT_EQ(r.missing_keys.size(), 1u);
  }
  {
    StateDict s = StateDict{{"module", Dict{{"fc", Dict{{"weight", torch::zeros({4, 3})},
                                                        {"bias", torch::zeros({4})}}}}}};
    LoadOptions o;
    o.strict = StrictHandling::kRaiseAll;
    try {
      load(s, dir.path(), o);
      FAIL() << "expected an error";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("1 unexpected key(s) ['epoch']"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace dcp
