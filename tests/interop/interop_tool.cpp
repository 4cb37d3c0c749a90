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
//   interop_tool local-boxes -
//       reads layouts on stdin and prints every rank's compute_local_box (test_interop.py
//       compares them with DTensor's own), _StridedShard included
//   interop_tool save-strided <dir>
//       4 in-process ranks save tensors laid out as FSDP2 over tensor parallelism
//       (_StridedShard(0, 2), Shard(0) on a 2 x 2 mesh)
//   interop_tool load-all <dir>
//       loads every key of <dir> (EmptyStateDictLoadPlanner)
//   interop_tool load <dir>
//       loads <dir> (written by Python DCP) into a blank copy of the reference state dict and
//       compares every value bit for bit; exits 1 naming the first difference
//   interop_tool decoders <file>...
//       decodes each '.metadata' file with both decoders (format/metadata_codec.h); exits 1
//       unless the direct one reads it and gets the tree decoder's Metadata
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "dcp/dcp.h"
#include "format/metadata_codec.h"
#include "io/file.h"
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
        options.thread_count = 2;  // two files per rank, written at once
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
            state[name] = dcp::zeros_sharded(c10::IntArrayRef(t.size).vec(), t.properties.dtype,
                                             {comm.size()},
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
    if (command == "local-boxes") {  // local-boxes - : layouts on stdin, boxes on stdout
      // Each line "shape|mesh|placements" (e.g. "8,3|2,2|SS0x2,S0"; R, S<d>, SS<d>x<f>) gets
      // one line: for every rank of the mesh "offsets/sizes" (comma lists), or "E", joined
      // by ";".
      auto ints = [](const std::string& text) {
        std::vector<int64_t> out;
        std::stringstream in(text);
        for (std::string part; std::getline(in, part, ',');) {
          if (!part.empty()) out.push_back(std::stoll(part));
        }
        return out;
      };
      auto join = [](const std::vector<int64_t>& v) {
        std::string out;
        for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
        return out;
      };
      for (std::string line; std::getline(std::cin, line);) {
        std::stringstream fields(line);
        std::string shape, mesh, spec;
        std::getline(fields, shape, '|');
        std::getline(fields, mesh, '|');
        std::getline(fields, spec, '|');
        std::vector<dcp::Placement> placements;
        std::stringstream specs(spec);
        for (std::string p; std::getline(specs, p, ',');) {
          if (p == "R") {
            placements.push_back(dcp::Placement::Replicate());
          } else if (p.rfind("SS", 0) == 0) {
            const size_t x = p.find('x');
            placements.push_back(dcp::Placement::StridedShard(std::stoll(p.substr(2, x - 2)),
                                                              std::stoll(p.substr(x + 1))));
          } else {
            placements.push_back(dcp::Placement::Shard(std::stoll(p.substr(1))));
          }
        }
        const std::vector<int64_t> mesh_shape = ints(mesh);
        int64_t ranks = 1;
        for (int64_t m : mesh_shape) ranks *= m;
        std::string out;
        for (int r = 0; r < ranks; ++r) {
          if (r) out += ";";
          try {
            const dcp::LocalBox box = dcp::compute_local_box(
                ints(shape), mesh_shape, dcp::mesh_coordinate(mesh_shape, r), placements);
            out += join(box.offsets) + "/" + join(box.sizes);
          } catch (const c10::Error&) {
            out += "E";
          }
        }
        std::cout << out << "\n";
      }
      return 0;
    }
    if (command == "save-strided") {
      // 4 in-process ranks, mesh (2, 2), placements (_StridedShard(0, 2), Shard(0)) (FSDP2 on
      // top of row-wise tensor parallelism), save two tensors; Python loads them whole.
      dcp::run_in_process(4, [&](dcp::Communicator& comm) {
        const std::vector<dcp::Placement> fsdp_tp{dcp::Placement::StridedShard(0, 2),
                                                  dcp::Placement::Shard(0)};
        dcp::StateDict state;
        state["even"] = dcp::distribute_tensor(
            dcp::testing::make_tensor(at::kFloat, {8, 3}, 11), {2, 2}, comm.rank(), fsdp_tp);
        state["wide"] = dcp::distribute_tensor(
            dcp::testing::make_tensor(at::kBFloat16, {16, 5}, 12), {2, 2}, comm.rank(), fsdp_tp);
        dcp::SaveOptions options;
        options.comm = &comm;
        dcp::save(state, dir, options);
      });
      std::cout << "saved " << dir << "\n";
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
    if (command == "decoders") {  // decoders <file>...: each '.metadata' through both decoders
      for (int k = 2; k < argc; ++k) {
        const std::string bytes = dcp::detail::read_file(argv[k]);
        const dcp::Metadata tree =
            dcp::detail::decode_metadata_tree(bytes.data(), bytes.size(), argv[k]);
        const auto direct = dcp::detail::decode_metadata_direct(bytes.data(), bytes.size());
        if (!direct || !(*direct == tree)) {
          std::cerr << argv[k] << ": the direct decoder "
                    << (direct ? "read a different Metadata" : "gave up") << "\n";
          return 1;
        }
        std::cout << argv[k] << ": direct decoder equal to the tree decoder ("
                  << tree.storage_data.size() << " storage entries)\n";
      }
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
