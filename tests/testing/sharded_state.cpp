// Multi-rank test states (see sharded_state.h).
#include "testing/sharded_state.h"

#include <ATen/ATen.h>

#include <cmath>

#include "testing/test_util.h"

namespace dcp::testing {
namespace {

std::vector<int64_t> mesh_of(int world, Layout layout) {
  if (layout != Layout::kMesh2d) return {world};
  int a = static_cast<int>(std::sqrt(static_cast<double>(world)));
  while (world % a != 0) --a;
  return {a, world / a};
}

std::vector<Placement> placements_of(Layout layout) {
  switch (layout) {
    case Layout::kRow: return {Placement::Shard(0)};
    case Layout::kColumn: return {Placement::Shard(1)};
    case Layout::kMesh2d: return {Placement::Shard(0), Placement::Shard(1)};
  }
  return {};
}

}  // namespace

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::kRow: return "row";
    case Layout::kColumn: return "column";
    case Layout::kMesh2d: return "mesh2d";
  }
  return "?";
}

StateDict full_state() {
  StateDict sd;
  Dict model;
  model["embed"] = make_tensor(at::kFloat, {10, 6}, 1);     // uneven over most worlds
  model["proj"] = make_tensor(at::kBFloat16, {17, 5}, 2);
  model["tiny"] = make_tensor(at::kLong, {3, 4}, 3);        // empty shards beyond 3 ranks
  model["big"] = make_tensor(at::kFloat, {64, 32}, 4);
  sd["model"] = model;
  sd["replicated"] = make_tensor(at::kFloat, {7, 3}, 5);   // whole tensor on every rank
  sd["step"] = 42;
  sd["lr"] = 0.5;
  sd["tags"] = List{Value("a"), Value("b")};
  return sd;
}

StateDict sharded_state(int rank, int world, Layout layout, bool zeros) {
  const StateDict full = full_state();
  const auto mesh = mesh_of(world, layout);
  const auto placements = placements_of(layout);
  StateDict sd;
  Dict model;
  for (const auto& [k, v] : full.at("model").dict()) {
    const at::Tensor& t = v.tensor();
    model.insert_or_assign(
        k, zeros ? zeros_sharded(t.sizes().vec(), t.scalar_type(), mesh, rank, placements)
                 : distribute_tensor(t, mesh, rank, placements));
  }
  sd["model"] = model;
  sd["replicated"] = zeros ? at::zeros_like(full.at("replicated").tensor())
                           : full.at("replicated").tensor().clone();
  for (const char* k : {"step", "lr", "tags"}) sd[k] = zeros ? Value(None{}) : full.at(k);
  return sd;
}

std::string check_sharded_state(const StateDict& actual, int rank, int world, Layout layout) {
  const StateDict expected = sharded_state(rank, world, layout, false);
  const std::string diff = describe_difference(Value(expected), Value(actual));
  return diff.empty() ? "" : "rank " + std::to_string(rank) + "/" + std::to_string(world) + " " +
                                 layout_name(layout) + ": " + diff;
}

void load_in_process_and_check(MemoryStorage& storage, const std::string& id, int world,
                               Layout layout) {
  run_in_process(world, [&](Communicator& comm) {
    StateDict sd = sharded_state(comm.rank(), world, layout, true);
    MemoryReader reader(storage, id);
    LoadOptions options;
    options.comm = &comm;
    load(sd, reader, options);
    const std::string diff = check_sharded_state(sd, comm.rank(), world, layout);
    TORCH_CHECK(diff.empty(), diff);
  });
}

}  // namespace dcp::testing
