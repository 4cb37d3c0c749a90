// Benchmark: the coordinator's share of a save at scale. Builds synthetic local plans for R
// ranks x T tensors (each tensor row-sharded over all ranks, plus one replicated byte item per
// rank), then times global planning (de-duplication, Metadata, validation), building
// storage_data from the write results, metadata serialization and parsing, and reports the
// '.metadata' size.
//
//   coordinator_bench [ranks=1024] [tensors=2000] [metadata_out]
//
// With metadata_out, the serialized '.metadata' is also written there (to time Python's
// parser on the same bytes, for example).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "dcp/dcp.h"
#include "format/metadata_codec.h"
#include "metadata_internal.h"

namespace {
double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  const int ranks = argc > 1 ? std::stoi(argv[1]) : 1024;
  const int tensors = argc > 2 ? std::stoi(argv[2]) : 2000;
  const int64_t rows = 4096, cols = 1024;

  auto t0 = std::chrono::steady_clock::now();
  std::vector<dcp::SavePlan> plans(ranks);
  for (int r = 0; r < ranks; ++r) {
    auto box = dcp::compute_local_box({rows, cols}, {ranks}, {r}, {dcp::Placement::Shard(0)});
    auto& plan = plans[r];
    plan.items.reserve(tensors + 1);
    for (int t = 0; t < tensors; ++t) {
      dcp::WriteItem item;
      item.type = dcp::WriteItemType::SHARD;
      const std::string fqn = "model.layers." + std::to_string(t / 8) + ".w" + std::to_string(t % 8);
      item.index = dcp::MetadataIndex(fqn, box.offsets);
      dcp::TensorProperties props;
      props.dtype = c10::ScalarType::BFloat16;
      item.tensor_data = dcp::TensorWriteData{{box.offsets, box.sizes}, props, {rows, cols}};
      plan.items.push_back(std::move(item));
      plan.planner_data.emplace(fqn, dcp::ObjectPath{dcp::Key(fqn)});
    }
    dcp::WriteItem step;
    step.index = dcp::MetadataIndex("step");
    plan.items.push_back(step);
    plan.planner_data.emplace("step", dcp::ObjectPath{dcp::Key("step")});
  }
  const double build_s = since(t0);

  dcp::DefaultSavePlanner planner;
  t0 = std::chrono::steady_clock::now();
  auto [final_plans, metadata] = planner.create_global_plan(std::move(plans));
  const double plan_s = since(t0);

  // What the writers' results add: one storage entry per item (as dcp::save's coordinator
  // receives them, rank by rank).
  std::vector<std::pair<dcp::MetadataIndex, dcp::StorageInfo>> results;
  for (int r = 0; r < ranks; ++r) {
    int64_t offset = 0;
    const std::string file = "__" + std::to_string(r) + "_0.distcp";
    for (const auto& item : final_plans[r].items) {
      results.emplace_back(item.index, dcp::StorageInfo{file, offset, 4096, {}});
      offset += 4096;
    }
  }
  t0 = std::chrono::steady_clock::now();
  metadata.storage_data = dcp::detail::make_storage_data(std::move(results));
  metadata.version = dcp::kDcpVersion;
  const double storage_s = since(t0);

  t0 = std::chrono::steady_clock::now();
  const std::string bytes = dcp::detail::encode_metadata(metadata);
  const double encode_s = since(t0);
  if (argc > 3) std::ofstream(argv[3], std::ios::binary).write(bytes.data(), bytes.size());
  t0 = std::chrono::steady_clock::now();
  const dcp::Metadata back = dcp::detail::decode_metadata(bytes.data(), bytes.size(), "bench");
  const double decode_s = since(t0);
  const bool same = back == metadata;

  std::printf("coordinator at %d ranks x %d tensors (%zu write items)\n", ranks, tensors,
              metadata.storage_data.size());
  std::printf("  building the local plans (not the coordinator's work): %.3f s\n", build_s);
  std::printf("  global plan (dedup + metadata + validation): %.3f s\n", plan_s);
  std::printf("  storage_data from the write results: %.3f s\n", storage_s);
  std::printf("  metadata serialization: %.3f s; parsing: %.3f s; round trip equal: %s\n",
              encode_s, decode_s, same ? "yes" : "NO");
  std::printf("  .metadata size: %.1f MiB\n", bytes.size() / 1048576.0);
  std::printf("  coordinator total (plan + storage_data + serialize): %.3f s (target <= 2 s)\n",
              plan_s + storage_s + encode_s);
  return same ? 0 : 1;
}
