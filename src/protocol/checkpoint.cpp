// dcp::save and dcp::load: the protocol (Python's state_dict_saver / state_dict_loader), run
// through DistWrapper so that a failure on any rank raises the same error on every rank.
//
// save, on every rank (coordinator C):
//   0. (world > 1) shared-storage check: C creates a probe through the writer; every rank must
//      see it; C removes it. Fails before any data is written.
//   1. "plan" (reduce_scatter): planner.set_up_planner, writer.set_up_storage_writer, local
//      plan = writer.prepare_local_plan(planner.create_local_plan()); C:
//      planner.create_global_plan + writer.prepare_global_plan; each rank gets its final plan.
//   2. "write" (all_reduce): planner.finish_plan, writer.write_data; C: complete the Metadata
//      (storage_data from every rank's results, storage_meta, version) and writer.finish (the
//      commit); every rank gets the committed Metadata.
// load, on every rank:
//   1. "read metadata" (broadcast): C reads '.metadata'; every rank gets it.
//   2. "plan" (reduce_scatter): planner.set_up_planner, reader.set_up_storage_reader, local
//      plan; C: planner.create_global_plan + reader.prepare_global_plan.
//      With LoadOptions::read_once, C also takes the boxes every rank reads alike out of the
//      plans and gives each a root (Note [Read once, broadcast], shared_reads.cpp).
//   3. "read" (all_gather): planner.finish_plan, reader.read_data. With shared boxes, a
//      "prepare reads" step (finish_plan, the roots' buffers) comes first, and "read" reads
//      on a second thread while this one broadcasts each shared box from its root.
#include "dcp/checkpoint.h"

#include <c10/util/Exception.h>

#include <optional>
#include <set>

#include "dcp/filesystem.h"
#include "dcp/stateful.h"
#include "protocol/key_mapping.h"
#include "protocol/dist_wrapper.h"
#include "protocol/events.h"
#include "storage_data.h"
#include "util/error_context.h"
#include "protocol/plan_codec.h"
#include "protocol/shared_reads.h"

namespace dcp {
namespace {

Communicator& communicator(Communicator* comm, bool no_dist, SingleProcessCommunicator& local) {
  return (comm != nullptr && !no_dist) ? *comm : local;
}

void check_shared_storage(detail::DistWrapper& dist, StorageWriter& writer, int coordinator) {
  const std::string probe =
      dist.broadcast("shared storage check", [&] { return writer.create_visibility_probe(); });
  if (probe.empty()) return;  // the backend has nothing to check
  const std::vector<std::string> seen = dist.all_gather(
      "shared storage check", [&] { return std::string(writer.sees_visibility_probe(probe) ? "1" : "0"); });
  if (dist.is_coordinator()) writer.remove_visibility_probe(probe);
  std::string blind;
  for (size_t r = 0; r < seen.size(); ++r) {
    if (seen[r] != "1") blind += (blind.empty() ? "" : ", ") + std::to_string(r);
  }
  TORCH_CHECK(blind.empty(), "the checkpoint storage is not shared by all ranks: rank(s) ", blind,
              " cannot see the probe '", probe, "' that rank ", coordinator,
              " (the coordinator) wrote. ", writer.visibility_probe_advice());
}

// StorageWriter::abort never throws; a writer of the user's that does must not replace the
// save's own error.
void abort_quietly(StorageWriter& writer) {
  try {
    writer.abort();
  } catch (const std::exception& e) {
    TORCH_WARN("StorageWriter::abort threw: ", e.what());
  }
}

// Bytes and distinct files of write results.
std::pair<int64_t, int64_t> bytes_and_files(const std::vector<std::vector<WriteResult>>& results) {
  int64_t bytes = 0;
  std::set<std::string> files;
  for (const auto& rank_results : results) {
    for (const auto& r : rank_results) {
      bytes += r.storage_data.length;
      files.insert(r.storage_data.relative_path);
    }
  }
  return {bytes, static_cast<int64_t>(files.size())};
}

// Bytes and distinct files of the records a load plan reads from.
std::pair<int64_t, int64_t> bytes_and_files(const LoadPlan& plan, const Metadata& metadata) {
  std::set<std::pair<std::string, int64_t>> records;
  std::set<std::string> files;
  int64_t bytes = 0;
  for (const ReadItem& item : plan.items) {
    auto it = metadata.storage_data.find(item.storage_index);
    if (it == metadata.storage_data.end()) continue;
    if (records.emplace(it->second.relative_path, it->second.offset).second) {
      bytes += it->second.length;
    }
    files.insert(it->second.relative_path);
  }
  return {bytes, static_cast<int64_t>(files.size())};
}

// "saving checkpoint '<id>'", or "saving checkpoint" when the storage was given without an id
// (the storage's own errors name its files).
std::string describe(const char* verb, const std::optional<std::string>& checkpoint_id) {
  return checkpoint_id && !checkpoint_id->empty()
             ? std::string(verb) + " checkpoint '" + *checkpoint_id + "'"
             : std::string(verb) + " checkpoint";
}

}  // namespace

namespace {

// SaveOptions::use_collectives = false (Note [Saving without collectives] in
// filesystem_writer.cpp): Python's call order on one rank, then one exchange of outcomes.
Metadata save_without_collectives(const StateDict& state, StorageWriter& writer,
                                  const SaveOptions& options,
                                  const std::optional<std::string>& checkpoint_id) {
  SingleProcessCommunicator local;
  Communicator& comm = communicator(options.comm, options.no_dist, local);
  const int rank = comm.rank();
  const std::string what = describe("saving (without collectives)", checkpoint_id);
  comm.set_timeout(options.timeout);
  detail::DistWrapper dist(comm, options.coordinator_rank);
  std::shared_ptr<SavePlanner> planner =
      options.planner ? options.planner : std::make_shared<DefaultSavePlanner>();
  detail::EventRecorder events(options.on_event, Phase::kSave, rank, dist.size(),
                              checkpoint_id.value_or(""), dist.is_coordinator());
  Metadata metadata;
  std::pair<int64_t, int64_t> written;
  detail::with_context([&] {
    dist.all_gather("save without collectives", [&] {
      try {
        if (checkpoint_id) writer.reset(checkpoint_id);
        const std::optional<StorageMeta> storage_meta = writer.storage_meta();
        events.begin(Phase::kPlan);
        // As Python: only the coordinator writes non-tensor values.
        planner->set_up_planner(state, storage_meta, dist.is_coordinator());
        writer.set_up_storage_writer_without_collectives(rank);
        std::vector<SavePlan> plans{writer.prepare_local_plan(planner->create_local_plan())};
        auto [global, md] = planner->create_global_plan(std::move(plans));
        global = writer.prepare_global_plan(std::move(global));
        events.end(Phase::kPlan);
        events.begin(Phase::kWrite);
        const SavePlan plan = planner->finish_plan(global.at(0));
        const std::vector<WriteResult> results = writer.write_data(plan, *planner).get();
        written = bytes_and_files({results});
        events.end(Phase::kWrite, true, written.first, written.second);
        std::vector<std::pair<MetadataIndex, StorageInfo>> entries;
        for (const auto& r : results) entries.emplace_back(r.index, r.storage_data);
        md.storage_data = detail::make_storage_data(std::move(entries));
        md.storage_meta = storage_meta;
        md.version = kDcpVersion;
        events.begin(Phase::kCommit);
        writer.finish(md, {results});
        events.end(Phase::kCommit);
        metadata = std::move(md);
      } catch (...) {
        abort_quietly(writer);
        throw;
      }
      return std::string();
    });
    events.finish(written.first, written.second);
  }, [&] { return c10::str("rank ", rank, ": ", what); });
  return metadata;
}

}  // namespace

Metadata save(const StateDict& state, StorageWriter& writer, const SaveOptions& options,
              const std::optional<std::string>& checkpoint_id) {
  if (has_stateful(state)) return save(resolve_stateful(state), writer, options, checkpoint_id);
  if (!options.use_collectives) {
    return save_without_collectives(state, writer, options, checkpoint_id);
  }
  SingleProcessCommunicator local;
  Communicator& comm = communicator(options.comm, options.no_dist, local);
  const int rank = comm.rank();
  const std::string what = describe("saving", checkpoint_id);
  comm.set_timeout(options.timeout);  // Note [Collective deadlines] (mpi_communicator.cpp)
  detail::DistWrapper dist(comm, options.coordinator_rank);
  const bool is_coordinator = dist.is_coordinator();
  std::shared_ptr<SavePlanner> planner =
      options.planner ? options.planner : std::make_shared<DefaultSavePlanner>();

  detail::EventRecorder events(options.on_event, Phase::kSave, rank, dist.size(),
                              checkpoint_id.value_or(""), is_coordinator);
  return detail::with_context([&] {
    try {
      if (checkpoint_id) writer.reset(checkpoint_id);
      const std::optional<StorageMeta> storage_meta = writer.storage_meta();
      events.begin(Phase::kPlan);
      if (dist.size() > 1) check_shared_storage(dist, writer, options.coordinator_rank);

      Metadata metadata;  // the coordinator's, from the global plan
      const std::string central = dist.reduce_scatter(
          "plan",
          [&] {
            planner->set_up_planner(state, storage_meta, is_coordinator);
            writer.set_up_storage_writer(is_coordinator, rank);
            return detail::encode_save_plan(writer.prepare_local_plan(planner->create_local_plan()));
          },
          [&](std::vector<std::string> encoded) {
            std::vector<SavePlan> plans = detail::decode_save_plans(encoded);
            encoded = {};  // decoded: freed before the global plan, not after it
            auto [final_plans, md] = planner->create_global_plan(std::move(plans));
            final_plans = writer.prepare_global_plan(std::move(final_plans));
            metadata = std::move(md);
            return detail::encode_save_plans(final_plans);
          });
      events.end(Phase::kPlan);

      // Every rank-local call runs inside a step, so that its failure reaches every rank
      // (finish_plan is the planner's, and may throw).
      std::pair<int64_t, int64_t> written;  // bytes, files: this rank's, then (C) everyone's
      const std::string committed = dist.all_reduce(
          "write",
          [&] {
            events.begin(Phase::kWrite);
            const SavePlan plan = planner->finish_plan(detail::decode_save_plan(central));
            const std::vector<WriteResult> results = writer.write_data(plan, *planner).get();
            written = bytes_and_files({results});
            events.end(Phase::kWrite, true, written.first, written.second);
            return detail::encode_write_results(results);
          },
          [&](std::vector<std::string> encoded) {
            std::vector<std::vector<WriteResult>> all_results;
            for (const auto& e : encoded) all_results.push_back(detail::decode_write_results(e));
            written = bytes_and_files(all_results);
            std::vector<std::pair<MetadataIndex, StorageInfo>> entries;
            for (const auto& rank_results : all_results) {
              for (const auto& r : rank_results) entries.emplace_back(r.index, r.storage_data);
            }
            metadata.storage_data = detail::make_storage_data(std::move(entries));
            metadata.storage_meta = storage_meta;
            metadata.version = kDcpVersion;
            events.begin(Phase::kCommit);
            writer.finish(metadata, all_results);
            events.end(Phase::kCommit);
            return dist.size() == 1 ? std::string() : detail::encode_metadata_message(metadata);
          });
      events.finish(written.first, written.second);
      if (is_coordinator) return metadata;
      return detail::decode_metadata_message(committed);
    } catch (...) {
      abort_quietly(writer);  // on every rank: the step's error reached them all
      throw;
    }
  }, [&] { return c10::str("rank ", rank, ": ", what); });
}

Metadata save(const StateDict& state, const std::string& checkpoint_id,
              const SaveOptions& options) {
  FileSystemWriter writer;
  return save(state, writer, options, checkpoint_id);
}

LoadResult load(StateDict& state, StorageReader& reader, const LoadOptions& options,
                const std::optional<std::string>& checkpoint_id) {
  if (has_stateful(state)) {
    // Python's order: every Stateful's state_dict() is the destination; load_state_dict()
    // gets it filled, after the whole load.
    StateDict resolved = resolve_stateful(state);
    LoadResult result = load(resolved, reader, options, checkpoint_id);
    for (auto& [key, value] : state) {
      Value& filled = resolved.at(key);
      if (value.is_stateful()) {
        value.get<std::shared_ptr<Stateful>>()->load_state_dict(filled.dict());
      } else {
        value = std::move(filled);
      }
    }
    return result;
  }
  SingleProcessCommunicator local;
  Communicator& comm = communicator(options.comm, options.no_dist, local);
  const int rank = comm.rank();
  const std::string what = describe("loading", checkpoint_id);
  comm.set_timeout(options.timeout);  // Note [Collective deadlines] (mpi_communicator.cpp)
  detail::DistWrapper dist(comm, options.coordinator_rank);
  const bool is_coordinator = dist.is_coordinator();
  const bool partial = options.strict == StrictHandling::kWarnAll ||
                       options.strict == StrictHandling::kReturnAll;
  std::shared_ptr<LoadPlanner> planner = options.planner;
  if (!planner) {
    DefaultLoadPlannerOptions planner_options = options.planner_options;
    planner_options.allow_partial_load = planner_options.allow_partial_load || partial;
    planner = std::make_shared<DefaultLoadPlanner>(planner_options);
  }
  LoadResult result;

  detail::EventRecorder events(options.on_event, Phase::kLoad, rank, dist.size(),
                              checkpoint_id.value_or(""), is_coordinator);
  detail::with_context([&] {
    if (checkpoint_id) reader.reset(checkpoint_id);
    events.begin(Phase::kPlan);  // reading the metadata included
    Metadata metadata;
    std::string bytes;  // the broadcast metadata, on the ranks other than the coordinator
    if (dist.size() == 1) {
      metadata = reader.read_metadata();
    } else {
      // The coordinator keeps what it read; only the other ranks parse the broadcast (at
      // scale a parse costs seconds and gigabytes). The coordinator's broadcast returns the
      // bytes it sent, which it drops: parsing them would redo its read_metadata.
      std::optional<Metadata> read;
      bytes = dist.broadcast("read metadata", [&] {
        read = reader.read_metadata();
        return detail::encode_metadata_message(*read);
      });
      if (read) {
        metadata = std::move(*read);
        std::string().swap(bytes);
      }
    }

    // Every rank-local call runs inside a step, so that its failure reaches every rank.
    const std::string central = dist.reduce_scatter(
        "plan",
        [&] {
          if (!bytes.empty()) {
            metadata = detail::decode_metadata_message(bytes);
          }
          detail::apply_key_mapping(metadata, options.key_mapping);
          if (options.strict != StrictHandling::kRaiseMissing) {
            result = detail::compare_keys(state, metadata);
            detail::handle_key_report(result, options.strict, rank);
          }
          planner->set_up_planner(state, metadata, is_coordinator);
          reader.set_up_storage_reader(metadata, is_coordinator, rank);
          return detail::encode_load_plan(reader.prepare_local_plan(planner->create_local_plan()));
        },
        [&](std::vector<std::string> encoded) {
          std::vector<LoadPlan> plans;
          for (const auto& e : encoded) plans.push_back(detail::decode_load_plan(e));
          plans = reader.prepare_global_plan(planner->create_global_plan(std::move(plans)));
          std::vector<std::vector<detail::SharedRead>> shared(plans.size());
          if (options.read_once) shared = detail::plan_shared_reads(plans, metadata);
          std::vector<std::string> out;
          for (size_t r = 0; r < plans.size(); ++r) {
            out.push_back(detail::encode_load_plan(plans[r], shared[r]));
          }
          return out;
        });
    events.end(Phase::kPlan);
    // The coordinator's own wire format; every rank's list of shared reads has the same length.
    // (No structured binding: lambdas below capture these, which C++17 does not allow.)
    std::pair<LoadPlan, std::vector<detail::SharedRead>> decoded =
        detail::decode_load_plan_with_shared(central);
    LoadPlan own = std::move(decoded.first);
    std::vector<detail::SharedRead> shared_reads = std::move(decoded.second);
    std::pair<int64_t, int64_t> mine;  // this rank's bytes and files read from storage
    std::vector<std::string> read;
    auto report = [&](const LoadPlan& plan) {
      mine = bytes_and_files(plan, metadata);
      events.end(Phase::kRead, true, mine.first, mine.second);
      return std::to_string(mine.first) + " " + std::to_string(mine.second);
    };
    if (shared_reads.empty()) {
      read = dist.all_gather("read", [&] {
        events.begin(Phase::kRead);
        const LoadPlan plan = planner->finish_plan(std::move(own));
        reader.read_data(plan, *planner).get();
        return report(plan);
      });
    } else {  // Note [Read once, broadcast] (shared_reads.cpp)
      detail::SharedReadExchange shared(std::move(shared_reads), *planner, rank);
      LoadPlan plan;
      dist.all_gather("prepare reads", [&] {
        events.begin(Phase::kRead);
        plan = shared.reader_plan(planner->finish_plan(std::move(own)));
        return std::string();
      });
      read = dist.all_gather("read", [&] {
        shared.read_and_exchange(comm, [&] { reader.read_data(plan, shared.planner()).get(); });
        return report(plan);
      });
    }
    int64_t read_bytes = 0, read_files = 0;
    for (const auto& r : read) {  // every rank's: what the coordinator logs
      const auto space = r.find(' ');
      read_bytes += std::stoll(r.substr(0, space));
      read_files += std::stoll(r.substr(space + 1));
    }
    events.finish(read_bytes, read_files);
  }, [&] { return c10::str("rank ", rank, ": ", what); });
  return result;
}

LoadResult load(StateDict& state, const std::string& checkpoint_id, const LoadOptions& options) {
  FileSystemReader reader;
  return load(state, reader, options, checkpoint_id);
}

}  // namespace dcp
