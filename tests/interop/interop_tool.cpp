// The C++ side of the interop tests (test_interop.py runs it):
//   interop_tool save <dir> [--threads N] [--file-per-item] [--zstd] [--cached]
//       saves testing::reference_state_dict() with dcp::save (--cached: three times, with
//       enable_plan_caching, the last two from the cache)
//   interop_tool save-replicated <dir>
//       4 in-process ranks save the same small state (placement of replicated items)
//   interop_tool save-hf <dir> <world> [distributed|consolidated]
//       saves four tensors with HuggingFaceStorageWriter on <world> in-process ranks (two files
//       by fqn_to_index_mapping; distributed: row shards, save_distributed; consolidated: the
//       same, with enable_consolidation)
//   interop_tool hf-to-dcp <hf dir> <world> <out dir>
//       loads a Hugging Face safetensors model on <world> in-process ranks (row shards) with
//       HuggingFaceStorageReader and saves it as a DCP checkpoint
//   interop_tool load-all <dir>
//       loads every key of <dir> (EmptyStateDictLoadPlanner)
//   interop_tool load <dir>
//       loads <dir> (written by Python DCP) into a blank copy of the reference state dict and
//       compares every value bit for bit; exits 1 naming the first difference
#include <cstring>
#include <iostream>
#include <map>
#include <stdexcept>

#include "dcp/dcp.h"
#include "testing/test_util.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: interop_tool save|load <dir> [--threads N] [--file-per-item] [--zstd]\n";
    return 2;
  }
  const std::string command = argv[1];
  const std::string dir = argv[2];
  try {
    const dcp::StateDict reference = dcp::testing::reference_state_dict();
    if (command == "save") {
      dcp::FileSystemWriterOptions options;
      int saves = 1;
      for (int i = 3; i < argc; ++i) {
        if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
          options.thread_count = std::atoi(argv[++i]);
        } else if (std::strcmp(argv[i], "--file-per-item") == 0) {
          options.single_file_per_rank = false;
        } else if (std::strcmp(argv[i], "--zstd") == 0) {
          options.compression = dcp::Compression::kZstd;
        } else if (std::strcmp(argv[i], "--cached") == 0) {
          saves = 3;
        }
      }
      dcp::FileSystemWriter writer(dir, options);
      // --cached: three saves into <dir> with one enable_plan_caching planner; the last two
      // reuse the cached plan and Metadata, and the last one is what Python loads.
      dcp::DefaultSavePlannerOptions planner_options;
      planner_options.enable_plan_caching = saves > 1;
      auto planner = std::make_shared<dcp::DefaultSavePlanner>(planner_options);
      dcp::SaveOptions save_options;
      save_options.planner = planner;
      for (int k = 0; k < saves; ++k) dcp::save(reference, writer, save_options, dir);
      if (saves > 1 && planner->plan_cache_stats().global_plan_hits != saves - 1) {
        std::cerr << "expected " << saves - 1 << " cached global plans, got "
                  << planner->plan_cache_stats().global_plan_hits << "\n";
        return 1;
      }
      std::cout << "saved " << dir << "\n";
      return 0;
    }
    if (command == "save-replicated") {
      // 4 in-process ranks save the same values (test_interop.py compares which rank stores
      // each with Python's dedup_save_plans): empty tensors, 0-d tensors, byte items, tensors.
      dcp::run_in_process(4, [&](dcp::Communicator& comm) {
        dcp::StateDict state{
            {"e0", at::zeros({0})},           {"s0", at::ones({})},
            {"b0", 7},                        {"t0", at::ones({3})},
            {"e1", at::zeros({0, 5}, at::kLong)}, {"s1", at::ones({}, at::kLong)},
            {"b1", "text"},                   {"t1", at::ones({2, 2})},
            {"e2", at::zeros({0})},           {"b2", 3.5},
            {"s2", at::ones({}, at::kBFloat16)}, {"t2", at::ones({5})},
            {"s3", at::ones({})},             {"s4", at::ones({})}};
        dcp::SaveOptions options;
        options.comm = &comm;
        dcp::save(state, dir, options);
      });
      std::cout << "saved " << dir << "\n";
      return 0;
    }
    if (command == "save-hf") {
      if (argc < 4) throw std::invalid_argument("usage: interop_tool save-hf <dir> <world> [distributed|consolidated]");
      const int world = std::atoi(argv[3]);
      const bool consolidated = argc > 4 && std::string(argv[4]) == "consolidated";
      const bool distributed =
          consolidated || (argc > 4 && std::string(argv[4]) == "distributed");
      dcp::run_in_process(world, [&](dcp::Communicator& comm) {
        using dcp::testing::make_tensor;
        const std::map<std::string, at::Tensor> full{
            {"model.embed.weight", make_tensor(at::kFloat, {10, 6}, 1)},
            {"model.proj.weight", make_tensor(at::kBFloat16, {17, 5}, 2)},
            {"model.ids", make_tensor(at::kLong, {3, 4}, 3)},
            {"model.scale", make_tensor(at::kFloat, {}, 4)}};
        dcp::StateDict state;
        for (const auto& [name, t] : full) {
          if (distributed && t.dim() > 0) {
            state[name] = dcp::distribute_tensor(t, {comm.size()}, comm.rank(),
                                                 {dcp::Placement::Shard(0)});
          } else {
            state[name] = t;
          }
        }
        dcp::HuggingFaceStorageWriterOptions options;
        options.save_distributed = distributed;
        options.enable_consolidation = consolidated;
        options.thread_count_consolidation = 2;
        options.fqn_to_index_mapping = {{"model.embed.weight", 1}, {"model.proj.weight", 2},
                                        {"model.ids", 2}, {"model.scale", 1}};
        dcp::HuggingFaceStorageWriter writer(dir, options);
        dcp::SaveOptions save_options;
        save_options.comm = &comm;
        dcp::save(state, writer, save_options);
      });
      std::cout << "saved " << dir << "\n";
      return 0;
    }
    if (command == "hf-to-dcp") {  // hf-to-dcp <hf dir> <world> <out dir>
      if (argc != 5) throw std::invalid_argument("usage: interop_tool hf-to-dcp <hf> <world> <out>");
      const int world = std::atoi(argv[3]);
      const std::string out = argv[4];
      const dcp::Metadata md = dcp::HuggingFaceStorageReader(dir).read_metadata();
      dcp::run_in_process(world, [&](dcp::Communicator& comm) {
        // Every tensor of one dimension or more sharded by rows over the ranks: each rank
        // reads its rows of the model, then the ranks save them as one DCP checkpoint.
        dcp::StateDict state;
        for (const auto& [name, entry] : md.state_dict_metadata) {
          const auto& t = std::get<dcp::TensorStorageMetadata>(entry);
          if (t.size.empty()) {
            state[name] = at::zeros({}, at::TensorOptions().dtype(t.properties.dtype));
          } else {
            state[name] = dcp::zeros_sharded(t.size, t.properties.dtype, {comm.size()},
                                             comm.rank(), {dcp::Placement::Shard(0)});
          }
        }
        dcp::HuggingFaceStorageReader reader(dir);
        dcp::LoadOptions load_options;
        load_options.comm = &comm;
        dcp::load(state, reader, load_options);
        dcp::SaveOptions save_options;
        save_options.comm = &comm;
        dcp::save(state, out, save_options);
      });
      std::cout << "converted " << dir << " on " << world << " ranks to " << out << "\n";
      return 0;
    }
    if (command == "load-all") {  // every key of the checkpoint, whatever it holds
      dcp::StateDict everything;
      dcp::LoadOptions options;
      options.planner = std::make_shared<dcp::EmptyStateDictLoadPlanner>();
      dcp::load(everything, dir, options);
      std::cout << "loaded " << dir << ": " << everything.size() << " top-level keys\n";
      return 0;
    }
    if (command == "load") {
      dcp::StateDict loaded = dcp::testing::blank_like(reference);
      dcp::load(loaded, dir);
      const std::string diff =
          dcp::testing::describe_difference(dcp::Value(reference), dcp::Value(loaded));
      if (!diff.empty()) {
        std::cerr << "MISMATCH " << diff << "\n";
        return 1;
      }
      std::cout << "loaded " << dir << ": every value equal\n";
      return 0;
    }
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "unknown command " << command << "\n";
  return 2;
}
