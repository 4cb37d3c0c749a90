// dcp::save and dcp::load: the protocol (Python's state_dict_saver / state_dict_loader).
//
// save, on every rank (coordinator steps marked C):
//   1. planner.set_up_planner; writer.set_up_storage_writer; local plan =
//      writer.prepare_local_plan(planner.create_local_plan())
//   2. gather local plans to C; C: planner.create_global_plan, writer.prepare_global_plan;
//      scatter the final plans
//   3. planner.finish_plan; writer.write_data -> write results
//   4. gather results to C; C: complete Metadata (storage_data, storage_meta, version) and
//      writer.finish (the commit); broadcast the outcome
// load, on every rank:
//   1. reader.read_metadata; planner.set_up_planner; reader.set_up_storage_reader;
//      local plan = reader.prepare_local_plan(planner.create_local_plan())
//   2. gather to C; C: planner.create_global_plan, reader.prepare_global_plan; scatter
//   3. planner.finish_plan; reader.read_data
//
// This build runs the protocol over one rank (SingleProcessCommunicator); the collectives in
// steps 2 and 4 are then identities.
#include "dcp/checkpoint.h"

#include <c10/util/Exception.h>

#include "dcp/filesystem.h"

namespace dcp {
namespace {

Communicator& communicator(Communicator* comm, bool no_dist, SingleProcessCommunicator& local) {
  Communicator& c = (comm != nullptr && !no_dist) ? *comm : local;
  TORCH_CHECK_NOT_IMPLEMENTED(c.size() == 1, "dcp::save/load over ", c.size(),
                              " ranks is not supported by this build yet");
  return c;
}

// Adds "rank r: <what>" to an error without changing its type.
template <typename F>
auto with_context(int rank, const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (c10::Error& e) {
    e.add_context(c10::str("rank ", rank, ": ", what));
    throw;
  }
}

}  // namespace

Metadata save(const StateDict& state, StorageWriter& writer, const SaveOptions& options,
              const std::optional<std::string>& checkpoint_id) {
  SingleProcessCommunicator local;
  Communicator& comm = communicator(options.comm, options.no_dist, local);
  const int rank = comm.rank();
  const bool is_coordinator = rank == options.coordinator_rank;
  std::shared_ptr<SavePlanner> planner =
      options.planner ? options.planner : std::make_shared<DefaultSavePlanner>();
  const std::string what = "saving checkpoint '" + checkpoint_id.value_or("") + "'";

  return with_context(rank, what, [&] {
    if (checkpoint_id) writer.reset(checkpoint_id);
    const std::optional<StorageMeta> storage_meta = writer.storage_meta();
    planner->set_up_planner(state, storage_meta, is_coordinator);
    writer.set_up_storage_writer(is_coordinator, rank);
    SavePlan local_plan = writer.prepare_local_plan(planner->create_local_plan());

    std::vector<SavePlan> all_plans{std::move(local_plan)};
    auto [final_plans, metadata] = planner->create_global_plan(std::move(all_plans));
    final_plans = writer.prepare_global_plan(std::move(final_plans));
    SavePlan central_plan = planner->finish_plan(std::move(final_plans.at(rank)));

    std::vector<WriteResult> results = writer.write_data(central_plan, *planner).get();

    std::vector<std::vector<WriteResult>> all_results{std::move(results)};
    for (const auto& rank_results : all_results) {
      for (const auto& r : rank_results) {
        metadata.storage_data.insert_or_assign(r.index, r.storage_data);
      }
    }
    metadata.storage_meta = storage_meta;
    metadata.version = kDcpVersion;
    writer.finish(metadata, all_results);
    return metadata;
  });
}

Metadata save(const StateDict& state, const std::string& checkpoint_id,
              const SaveOptions& options) {
  FileSystemWriter writer;
  return save(state, writer, options, checkpoint_id);
}

void load(StateDict& state, StorageReader& reader, const LoadOptions& options,
          const std::optional<std::string>& checkpoint_id) {
  SingleProcessCommunicator local;
  Communicator& comm = communicator(options.comm, options.no_dist, local);
  const int rank = comm.rank();
  const bool is_coordinator = rank == options.coordinator_rank;
  std::shared_ptr<LoadPlanner> planner =
      options.planner ? options.planner
                      : std::make_shared<DefaultLoadPlanner>(options.planner_options);
  const std::string what = "loading checkpoint '" + checkpoint_id.value_or("") + "'";

  with_context(rank, what, [&] {
    if (checkpoint_id) reader.reset(checkpoint_id);
    const Metadata metadata = reader.read_metadata();
    planner->set_up_planner(state, metadata, is_coordinator);
    reader.set_up_storage_reader(metadata, is_coordinator, rank);
    LoadPlan local_plan = reader.prepare_local_plan(planner->create_local_plan());

    std::vector<LoadPlan> all_plans{std::move(local_plan)};
    all_plans = reader.prepare_global_plan(planner->create_global_plan(std::move(all_plans)));
    LoadPlan central_plan = planner->finish_plan(std::move(all_plans.at(rank)));
    reader.read_data(central_plan, *planner).get();
  });
}

void load(StateDict& state, const std::string& checkpoint_id, const LoadOptions& options) {
  FileSystemReader reader;
  load(state, reader, options, checkpoint_id);
}

}  // namespace dcp
