// The benchmark's state dicts, every tensor row-sharded over the ranks like FSDP / DTensor
// Shard(0); bench/python_dcp_bench.py builds the same shapes for Python DCP:
//   "model": a transformer-like model (embedding, attention and MLP weights, norms) with its
//            Adam state, about the MiB asked for;
//   "small": many small tensors, as real models have (norms, biases, per-layer scalars):
//            20,000 1-D tensors of 1-64 KiB (620 MiB in all) plus 4 large ones of 32 MiB,
//            without optimizer state, whatever the MiB.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "dcp/dcp.h"

namespace dcp::bench {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

/// Parameter shapes for about `mib` MiB of parameters + Adam state (float32), width 1024.
inline std::vector<TensorSpec> model_specs(int64_t mib) {
  const int64_t d = 1024, vocab = 8192;
  const int64_t per_layer_mib = (12 * d * d + 2 * d) * 4 * 3 / (1024 * 1024);
  const int64_t layers = std::max<int64_t>(1, (mib - vocab * d * 4 * 3 / (1024 * 1024)) / per_layer_mib);
  std::vector<TensorSpec> specs = {{"embed.weight", {vocab, d}}};
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    specs.push_back({p + "attn.qkv.weight", {3 * d, d}});
    specs.push_back({p + "attn.out.weight", {d, d}});
    specs.push_back({p + "mlp.up.weight", {4 * d, d}});
    specs.push_back({p + "mlp.down.weight", {d, 4 * d}});
    specs.push_back({p + "norm1.weight", {d}});
    specs.push_back({p + "norm2.weight", {d}});
  }
  return specs;
}

/// The "small" state's shapes: tensor i of the 20,000 holds 256 * (1 + (i * 7919) % 64) floats
/// (1-64 KiB, every size about equally often), grouped 10 to a layer; then 4 of 2048 x 4096.
inline std::vector<TensorSpec> small_specs() {
  std::vector<TensorSpec> specs;
  for (int64_t i = 0; i < 20000; ++i) {
    specs.push_back({"layers." + std::to_string(i / 10) + ".p" + std::to_string(i % 10),
                     {256 * (1 + (i * 7919) % 64)}});
  }
  for (int i = 0; i < 4; ++i) specs.push_back({"large." + std::to_string(i), {2048, 4096}});
  return specs;
}

/// The shapes of state `kind` ("model" or "small", see the top of this file).
inline std::vector<TensorSpec> state_specs(const std::string& kind, int64_t mib) {
  return kind == "small" ? small_specs() : model_specs(mib);
}

/// This rank's shards of model + Adam state (random values, or zeros as a load destination).
/// With `replicated`, every rank holds every tensor whole and alike (DDP: the values come from
/// one seed). Without `adam`, the state holds only the model. Returns the state and adds its
/// tensor bytes to *bytes.
inline StateDict make_state(const std::vector<TensorSpec>& specs, int rank, int world, bool zeros,
                            int64_t* bytes, bool replicated = false, bool adam = true) {
  Dict model, optim_state;
  if (replicated) at::manual_seed(1234);
  auto shard = [&](const TensorSpec& s) -> Value {
    if (replicated) {
      at::Tensor t = zeros ? at::zeros(s.shape) : at::randn(s.shape);
      *bytes += t.numel() * 4;
      return t;
    }
    auto box = compute_local_box(s.shape, {world}, {rank}, {Placement::Shard(0)});
    at::Tensor t = zeros ? at::zeros(box.sizes) : at::randn(box.sizes);
    *bytes += t.numel() * 4;
    return ShardedTensor(s.shape, at::kFloat, {Shard{t, box.offsets}});
  };
  for (const auto& s : specs) {
    model[s.name] = shard(s);
    if (!adam) continue;
    optim_state[s.name] = Dict{{std::string("exp_avg"), shard(s)},
                               {std::string("exp_avg_sq"), shard(s)}};
  }
  StateDict sd;
  sd["model"] = model;
  if (adam) sd["optim"] = Dict{{std::string("state"), Value(optim_state)}};
  sd["step"] = 1000;
  return sd;
}

}  // namespace dcp::bench
